"""A tiny local webhook receiver: records every JSON body POSTed to it.

Used by ``ragwatch demo`` (standing in for Slack/PagerDuty/Alertmanager receivers) and
by the integration tests. Set ``status`` to make it answer with errors.

>>> import urllib.request
>>> with WebhookReceiver() as rx:
...     req = urllib.request.Request(rx.url, data=b'{"a": 1}', method="POST")
...     urllib.request.urlopen(req).status
...     rx.bodies
200
[{'a': 1}]
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1024 * 1024


class WebhookReceiver:
    """A threaded HTTP server on 127.0.0.1 that keeps the JSON bodies it receives.

    ``fail_first`` answers the first N requests with HTTP 503 (to exercise retries);
    ``status`` is the answer after that.
    """

    def __init__(self, port: int = 0, *, fail_first: int = 0) -> None:
        self.bodies: list[Any] = []
        self.requests = 0
        self.status = 200
        self.fail_first = fail_first
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(min(length, MAX_BODY))
                with receiver._cond:
                    receiver.requests += 1
                    failing = receiver.requests <= receiver.fail_first
                    status = 503 if failing else receiver.status
                    if status < 300:
                        try:
                            receiver.bodies.append(json.loads(raw))
                        except ValueError:
                            status = 400
                    receiver._cond.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, predicate: Any, timeout_s: float) -> Any:
        """Block until some body satisfies ``predicate``; return it (None on timeout)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for body in self.bodies:
                    if predicate(body):
                        return body
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
