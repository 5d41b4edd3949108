"""Fake receivers for the sender tests: real threaded HTTP servers on 127.0.0.1.

- :class:`FakeServer` records every POST (path, headers, raw body, arrival time) and
  answers what its queue says, else its default (200 "ok");
- :class:`FakeSlack` answers like a Slack incoming webhook: 200 "ok", 429 with
  ``Retry-After`` (or ``retry_after`` in JSON) for the next N requests, 400
  ``invalid_blocks`` for a message over Slack's block limits;
- :class:`FakePagerDuty` answers like the Events API v2: 202 with
  ``{"status": "success", "dedup_key": ...}``, 400 for an invalid event, and 429 / 500 /
  400 on demand;
- :class:`SlowServer` sleeps longer than the client's timeout before answering.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, str], bytes]


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when the request arrived

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeServer:
    """Records POSTs; answers the queued replies first, then ``default``."""

    path: str = "/hook"
    default: Reply = (200, {"Content-Type": "text/plain"}, b"ok")
    received: list[Received] = field(default_factory=list)
    queue: deque[Reply] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.monotonic()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                req = Received(self.path, dict(self.headers.items()), raw, at)
                with server._cond:
                    server.received.append(req)
                    server._cond.notify_all()
                status, headers, body = server.reply(req)
                try:
                    self.send_response(status)
                    for k, v in {**headers, "Content-Length": str(len(body))}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.path}"

    def reply(self, req: Received) -> Reply:
        with self._cond:
            if self.queue:
                return self.queue.popleft()
        return self.answer(req)

    def answer(self, req: Received) -> Reply:
        return self.default

    def then(self, status: int, body: bytes = b"", **headers: str) -> FakeServer:
        """Queue one reply (``Retry_After="3"`` becomes the ``Retry-After`` header)."""
        with self._cond:
            self.queue.append((status, {k.replace("_", "-"): v for k, v in headers.items()}, body))
        return self

    def bodies(self) -> list[Any]:
        with self._cond:
            return [r.json for r in self.received]

    def wait_for(self, n: int, timeout_s: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.received) < n and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            return list(self.received)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


SLACK_TOKEN = "T0RAGWATCH/B0RAGWATCH/xoxb-s3cret-webhook-path-24"


@dataclass
class FakeSlack(FakeServer):
    """A Slack incoming webhook whose URL path is the secret ``SLACK_TOKEN``."""

    path: str = f"/services/{SLACK_TOKEN}"

    def rate_limit_next(self, n: int, retry_after: int = 1, *, in_body: bool = False) -> None:
        for _ in range(n):
            if in_body:  # alertmanager#2111: {"retry_after":1,"ok":false,"error":"rate_limited"}
                body = json.dumps(
                    {"retry_after": retry_after, "ok": False, "error": "rate_limited"}
                )
                self.then(429, body.encode(), Content_Type="application/json")
            else:
                self.then(429, b"rate_limited", Retry_After=str(retry_after))

    def answer(self, req: Received) -> Reply:
        try:
            msg = req.json
        except ValueError:
            return 400, {}, b"invalid_payload"
        if not msg.get("text") and not msg.get("blocks"):
            return 400, {}, b"no_text"
        if block_problems(msg.get("blocks", [])):
            return 400, {}, b"invalid_blocks"
        return self.default


def utf16(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def block_problems(blocks: list[dict[str, Any]]) -> list[str]:
    """What Slack would refuse in ``blocks`` (its documented limits)."""
    bad = [f"{len(blocks)} blocks > 50"] if len(blocks) > 50 else []
    for i, b in enumerate(blocks):
        texts = [b["text"]] if "text" in b else []
        if b["type"] == "header" and utf16(b["text"]["text"]) > 150:
            bad.append(f"blocks[{i}]: header over 150")
        if b["type"] == "section":
            if "text" in b and utf16(b["text"]["text"]) > 3000:
                bad.append(f"blocks[{i}]: section text over 3000")
            fields = b.get("fields", [])
            texts += fields
            if len(fields) > 10 or any(utf16(f["text"]) > 2000 for f in fields):
                bad.append(f"blocks[{i}]: fields over 10 or over 2000")
        if b["type"] == "context":
            texts += b["elements"]
            if len(b["elements"]) > 10:
                bad.append(f"blocks[{i}]: context over 10 elements")
        if b["type"] == "rich_text":
            bad += [f"blocks[{i}]: {why}" for why in _rich_text_problems(b["elements"])]
        if any(not t["text"] for t in texts):
            bad.append(f"blocks[{i}]: empty text")
        for t in texts:  # text objects: emoji is plain_text's, verbatim mrkdwn's
            if t["type"] not in ("plain_text", "mrkdwn"):
                bad.append(f"blocks[{i}]: text type {t['type']!r}")
            if ("emoji" in t and t["type"] != "plain_text") or (
                "verbatim" in t and t["type"] != "mrkdwn"
            ):
                bad.append(f"blocks[{i}]: emoji or verbatim on the wrong text type")
    return bad


RICH_STYLES = frozenset({"bold", "italic", "strike", "code"})


def _rich_text_problems(sections: list[dict[str, Any]]) -> list[str]:
    """What Slack would refuse in a ``rich_text`` block's paragraphs (the elements used)."""
    bad = []
    for sec in sections:
        if sec.get("type") != "rich_text_section" or not sec.get("elements"):
            bad.append(f"rich_text element {sec.get('type')!r} without elements")
            continue
        for e in sec["elements"]:
            kind = e.get("type")
            if kind == "text" and (not e.get("text") or not set(e.get("style", {})) <= RICH_STYLES):
                bad.append(f"rich text element {e!r}")
            elif kind == "emoji" and not e.get("name"):
                bad.append("emoji without a name")
            elif kind == "link" and not str(e.get("url", "")).startswith(("http://", "https://")):
                bad.append(f"link to {e.get('url')!r}")
            elif kind not in ("text", "emoji", "link"):
                bad.append(f"rich text element type {kind!r}")
    return bad


def slack_texts(node: Any, *, parsed: bool = False) -> list[str]:
    """Every ``text`` string in a Slack message; with ``parsed`` only those Slack parses as
    mrkdwn (not ``plain_text`` objects nor ``rich_text`` elements: shown as they are)."""
    out: list[str] = []
    if isinstance(node, dict):
        if parsed and node.get("type") in ("plain_text", "text", "link"):
            return out
        for k, v in node.items():
            out += [v] if k == "text" and isinstance(v, str) else slack_texts(v, parsed=parsed)
    elif isinstance(node, list):
        for v in node:
            out += slack_texts(v, parsed=parsed)
    return out


@dataclass
class FakePagerDuty(FakeServer):
    """The Events API v2 (``/v2/enqueue``), checking events as PagerDuty documents them."""

    path: str = "/v2/enqueue"

    def answer(self, req: Received) -> Reply:
        try:
            ev = req.json
        except ValueError:
            return self.invalid("Event object is invalid")
        if not isinstance(ev.get("routing_key"), str) or len(ev["routing_key"]) != 32:
            return self.invalid("'routing_key' is invalid")
        if ev.get("event_action") not in ("trigger", "acknowledge", "resolve"):
            return self.invalid("'event_action' is invalid")
        if len(ev.get("dedup_key") or "") > 255:
            return self.invalid("'dedup_key' is too long")
        if ev["event_action"] == "trigger":
            p = ev.get("payload") or {}
            if not p.get("summary") or len(p["summary"]) > 1024 or not p.get("source"):
                return self.invalid("'payload.summary' or 'payload.source' is invalid")
            if p.get("severity") not in ("critical", "error", "warning", "info"):
                return self.invalid("'payload.severity' is invalid")
        body = {"status": "success", "message": "Event processed", "dedup_key": ev["dedup_key"]}
        return 202, {"Content-Type": "application/json"}, json.dumps(body).encode()

    @staticmethod
    def invalid(why: str) -> Reply:
        body = {"status": "invalid event", "message": "Event object is invalid", "errors": [why]}
        return 400, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def events(self) -> list[dict[str, Any]]:
        return self.bodies()


@dataclass
class SlowServer(FakeServer):
    """Answers 200 only after ``delay_s``: longer than the client's timeout."""

    delay_s: float = 2.0

    def answer(self, req: Received) -> Reply:
        time.sleep(self.delay_s)
        return self.default


def closed_port_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"
