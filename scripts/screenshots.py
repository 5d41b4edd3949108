#!/usr/bin/env python3
"""Screenshots of the live page and of the leak alert's page, during the leak demo.

Starts what ``ragwatch demo`` starts (an embedded Tansu broker and redis-server on free
loopback ports, one ``ragwatch worker``, one ``ragwatch notify`` with a local webhook
receiver, a simulated fleet of 4 hosts x 2 GPUs and 2 RAG services playing the leak
scenario at 720x) plus ``ragwatch serve``, waits until ``GpuMemoryLeak`` is firing in
Redis and the fleet has played ``--hours`` of telemetry, then shoots ``/`` and
``/alerts/<fingerprint>`` at 1400x1000 in headless Chromium (and the alert's page at
1400x2800, down to its small multiples and its requests)::

    make setup chromium
    .venv/bin/python scripts/screenshots.py            # docs/screenshots/*.png
    .venv/bin/python scripts/screenshots.py --keep     # and leave it all running (Ctrl-C)

Everything it started is stopped again, whatever happens; the logs of a failed run are
kept (the path is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ragwatch.commands.children import Children
from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack, free_port
from ragwatch.kafka_admin import ensure_topics
from ragwatch.receiver import WebhookReceiver
from ragwatch.store import Keys, blocking_client, read_alerts

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1400, 1000)
TALL = (1400, 2800)  # an alert's page down to its small multiples and requests
DAY = 86400.0
NOTIFY_YAML = """\
receivers:
  - {{name: webhook, type: webhook, url: "{hook}"}}
route: {{receiver: webhook, group_by: ['...'], group_wait: 0s, group_interval: 0s}}
"""


def say(msg: str) -> None:
    print(f"[screenshots] {msg}", file=sys.stderr, flush=True)


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("screenshots: no chromium on PATH: make chromium (apt-get install chromium)")


def shoot(url: str, png: Path, profile: Path, window: tuple[int, int] = WINDOW) -> None:
    """``url`` as headless Chromium draws it in a ``window`` (width, height) viewport."""
    out = subprocess.run(
        [
            chromium_binary(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={window[0]},{window[1]}",
            "--virtual-time-budget=8000",
            f"--screenshot={png}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0 or not png.exists():
        raise SystemExit(f"screenshots: chromium failed on {url}:\n{out.stderr[-2000:]}")


def fail_if_dead(children: Children) -> None:
    """Stop with the log of a child (other than the agent) that exited."""
    for name in children.dead():
        tail = children.log_tail(name, 2000)
        raise SystemExit(f"screenshots: {name} exited:\n{tail}")


def wait_for(what: str, check: Callable[[], Any], children: Children, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fail_if_dead(children)
        if found := check():
            return found
        time.sleep(0.3)
    raise SystemExit(f"screenshots: timed out after {timeout_s:.0f}s waiting for {what}")


def leak_firing(client: Any, prefix: str) -> str | None:
    """The fingerprint of the firing GpuMemoryLeak alert, if there is one."""
    for a in read_alerts(client, prefix):
        if a.get("rule") == "GpuMemoryLeak" and a.get("status") == "firing":
            return str(a["fingerprint"])
    return None


def played_until(client: Any, prefix: str) -> float:
    """The newest GPU sample time in the hosts' status (0 before any)."""
    rows = [orjson.loads(v) for v in client.hvals(Keys(prefix).hosts)]
    return min((max((g["ts"] for g in r.get("gpus", [])), default=0.0) for r in rows), default=0.0)


@contextlib.contextmanager
def demo(
    run_dir: Path, hours: float, speed: float
) -> Iterator[tuple[str, dict[str, str], float, Children]]:
    """The leak demo and ``ragwatch serve``: yields the page's URL, the environment, the
    fleet's last event time and the children."""
    stack = EmbeddedStack(run_dir / "stack")
    hook = WebhookReceiver().start()
    children = Children(run_dir, {})
    try:
        stack.up()
        run = uuid.uuid4().hex[:8]
        notify_file = run_dir / "notify.yaml"
        notify_file.write_text(NOTIFY_YAML.format(hook=hook.url))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RAGWATCH_")},
            **stack.env(),
            "RAGWATCH_APP_ID": f"ragwatch-screenshots-{run}",
            "RAGWATCH_KAFKA_SESSION_TIMEOUT": "6",
            "RAGWATCH_STATE_DIR": str(run_dir),
            "RAGWATCH_NOTIFY_FILE": str(notify_file),
        }
        children.env = env
        ensure_topics(Settings.from_env(env), command="screenshots")
        # a fixed time of day, as the demo: the same telemetry on every run
        start = (time.time() - hours * 3600) // DAY * DAY - DAY
        port = free_port()
        children.start("worker", "worker")
        children.start("notify", "notify")
        children.start("serve", "serve", "--port", str(port))
        children.start(
            "agent",
            *("agent", "--source", "sim", "--scenario", "leak"),
            *("--hosts", "4", "--gpus", "2", "--services", "2", "--interval", "10"),
            *("--speed", f"{speed:g}", "--duration", f"{hours * 3600:.0f}s"),
            *("--start", f"{start:.0f}"),
        )
        say(f"leak demo: {hours:g} h of telemetry at {speed:g}x; logs in {run_dir}")
        yield f"http://127.0.0.1:{port}", env, start + hours * 3600, children
    finally:
        children.stop_all()
        hook.stop()
        stack.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="folder")
    p.add_argument("--hours", type=float, default=3.0, help="telemetry played (default 3)")
    p.add_argument("--speed", type=float, default=720.0, help="replay speed (default 720)")
    p.add_argument("--keep", action="store_true", help="keep it all running until Ctrl-C")
    args = p.parse_args(argv)
    chromium_binary()
    run_dir = Path(tempfile.mkdtemp(prefix="ragwatch-screenshots-"))
    ok = False
    try:
        with contextlib.ExitStack() as stack:
            url, env, end, children = stack.enter_context(demo(run_dir, args.hours, args.speed))
            client = blocking_client(env["RAGWATCH_REDIS_URL"])
            stack.callback(client.close)
            prefix = Settings.from_env(env).redis_prefix
            timeout = 120 + args.hours * 3600 / args.speed
            fp = wait_for(
                "GpuMemoryLeak firing", lambda: leak_firing(client, prefix), children, timeout
            )
            say(f"GpuMemoryLeak firing ({fp}); waiting for the rest of the {args.hours:g} h")
            wait_for(
                "the end of the telemetry",
                lambda: played_until(client, prefix) >= end - 60,
                children,
                timeout,
            )
            time.sleep(2.0)  # the worker's next chart and status writes (every second)
            args.out.mkdir(parents=True, exist_ok=True)
            pages = {
                "live-page.png": (url + "/", WINDOW),
                "alert-detail.png": (f"{url}/alerts/{fp}", WINDOW),
                "alert-around.png": (f"{url}/alerts/{fp}", TALL),  # the small multiples too
            }
            for name, (page, window) in pages.items():
                shoot(page, args.out / name, run_dir / f"profile-{name}", window)
                say(f"{args.out / name}: {(args.out / name).stat().st_size / 1024:.0f} KB")
            ok = True
            if args.keep:
                say(f"live page: {url}/  (Ctrl-C to stop)")
                with contextlib.suppress(KeyboardInterrupt):
                    signal.pause()
    finally:
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            say(f"logs kept in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
