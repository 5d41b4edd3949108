"""The ``ragwatch`` command line: worker, agent, notify, status, serve, silence, demo, dev,
replay, record.

``main()`` is the only place that reads the environment and configures logging.
Errors ragwatch can explain (bad settings, a missing binary, an unreachable service)
print one ``ragwatch: error: ...`` line and exit 2, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragwatch import __version__
from ragwatch.commands import agent as agent_command
from ragwatch.commands.argtypes import fraction, port, positive_duration, positive_int
from ragwatch.config import Settings, env_names
from ragwatch.errors import ConfigError

log = logging.getLogger("ragwatch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ragwatch",
        description="Anomaly detection for GPU fleets serving LLM/RAG traffic. "
        "Connections come from RAGWATCH_* environment variables (see 'ragwatch settings').",
    )
    p.add_argument("--version", action="version", version=f"ragwatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("worker", help="run the stream worker (Faust) until SIGTERM")

    agent_command.add_parser(sub)

    s = sub.add_parser("status", help="hosts, GPUs, slopes and alerts, read from Redis")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--watch", action="store_true", help="refresh until interrupted")
    s.add_argument(
        "--interval",
        type=positive_duration,
        default=2.0,
        help="refresh period with --watch (2s; at least 0.1s)",
    )

    v = sub.add_parser("serve", help="HTTP API, /metrics and the live status page")
    v.add_argument("--host", default=None, help="bind address (default RAGWATCH_SERVE_HOST)")
    v.add_argument("--port", type=port, default=None, help="port (default RAGWATCH_SERVE_PORT)")

    sub.add_parser("notify", help="route, group and deliver alerts to Slack, PagerDuty, webhooks")

    sil = sub.add_parser("silence", help="add, list or expire silences (stored in Redis)")
    sil_sub = sil.add_subparsers(dest="action", required=True)
    add = sil_sub.add_parser("add", help="silence alerts whose labels match")
    add.add_argument(
        "--match",
        action="append",
        required=True,
        metavar="LABEL=VALUE",
        help="label matcher (repeatable; LABEL=~REGEX for a regular expression)",
    )
    add.add_argument(
        "--duration", type=positive_duration, default=None, help="e.g. 2h (default 1h)"
    )
    add.add_argument(
        "--cron",
        default=None,
        help="recurring window: a cron expression for its start, e.g. '0 2 * * 6' (with "
        "--duration: how long each window lasts)",
    )
    add.add_argument("--comment", required=True, help="why (shown in status)")
    add.add_argument("--author", default=None, help="who (default: $USER)")
    lst = sil_sub.add_parser("list", help="active, pending and recurring silences")
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--all", action="store_true", help="include expired silences")
    exp = sil_sub.add_parser("expire", help="end a silence now")
    exp.add_argument("id")

    d = sub.add_parser("demo", help="replay the GPU memory-leak incident end to end")
    d.add_argument(
        "--scenario",
        default="leak",
        choices=("leak", "throughput", "retrieval", "outliers", "oom", "all", "healthy"),
    )
    d.add_argument(
        "--json", action="store_true", help="print each delivered alert as one JSON object per line"
    )
    d.add_argument(
        "--timeout",
        type=positive_duration,
        default=None,
        help="give up after this long (default 150s; 300s for healthy, which plays 3 days)",
    )

    dev = sub.add_parser("dev", help="embedded Tansu broker + redis-server for development")
    dev.add_argument("action", choices=("up", "down", "status"))

    _add_replay_parsers(sub)

    sub.add_parser("settings", help="list every RAGWATCH_* setting with its current value")
    return p


def _add_replay_parsers(sub: Any) -> None:
    r = sub.add_parser(
        "replay",
        help="recorded telemetry through the worker's pipelines and rules, offline, in event time",
    )
    r.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="FILE|DIR",
        help="JSONL of envelopes (.jsonl, .jsonl.gz) or timestamp,value CSV; a DIR = its "
        "*.jsonl, *.jsonl.gz and *.csv",
    )
    r.add_argument(
        "--rules", type=Path, default=None, help="rules file (default: RAGWATCH_RULES_FILE)"
    )
    r.add_argument("--json", action="store_true", help="one JSON object per transition")
    r.add_argument(
        "--pending", action="store_true", help="also print pending alerts and dropped ones"
    )
    r.add_argument("--detector", default="default", help="scores CSV series (default: default)")
    r.add_argument(
        "--threshold", type=fraction, default=0.5, help="CSV score that fires, in (0, 1] (0.5)"
    )

    rec = sub.add_parser("record", help="write the telemetry topics to a JSONL file for replay")
    rec.add_argument("--out", type=Path, required=True, help="JSONL file (gzip if it ends .gz)")
    rec.add_argument(
        "--topics", default="gpu,requests,events,metrics", help="comma-separated topic names"
    )
    stop = rec.add_mutually_exclusive_group()
    stop.add_argument(
        "--duration", type=positive_duration, default=None, help="stop after this long"
    )
    stop.add_argument(
        "--max-messages", type=positive_int, default=None, help="stop after N envelopes written"
    )


def cmd_worker(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.streams.worker.main import run_worker

    return run_worker(settings)


def cmd_agent(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    return agent_command.run(args, settings)


def cmd_status(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    import signal
    import threading

    from ragwatch.console.status import show_status

    stop = threading.Event()  # --watch: SIGTERM or Ctrl-C ends the wait, exit 0
    if args.watch:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return show_status(
        settings,
        as_json=args.json,
        out=sys.stdout,
        watch=args.watch,
        interval_s=args.interval,
        sleep=stop.wait,
    )


def cmd_serve(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.console.serve import serve

    return serve(settings, host=args.host, port=args.port)


def cmd_notify(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.commands.notify import run_notifier

    return run_notifier(settings)


def cmd_silence(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.commands.notify import silence_command

    return silence_command(args, settings, environ, out=sys.stdout)


def cmd_demo(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.commands.demo import run_demo

    return run_demo(
        settings, environ, scenario=args.scenario, as_json=args.json, timeout_s=args.timeout
    )


def cmd_dev(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.embedded import EmbeddedStack

    stack = EmbeddedStack(settings.state_dir)
    if args.action == "up":
        stack.up()
        from ragwatch.kafka_admin import ensure_topics

        ensure_topics(Settings.from_env({**environ, **stack.env()}), command="dev up")
    elif args.action == "down":
        stopped = stack.down()
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    services = stack.services()
    if not services:
        print(f"no dev stack in {settings.state_dir} (start one with 'ragwatch dev up')")
        return 1 if args.action == "status" else 0
    for svc in services.values():
        state = "up" if svc.alive else "DOWN"
        print(f"# {svc.name}: {state} pid={svc.pid} port={svc.port} log={svc.log}")
    for k, v in stack.env().items():
        print(f"export {k}={v}")
    return 0 if all(s.alive for s in services.values()) else 1


def cmd_replay(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.commands.replay import replay
    from ragwatch.streams.alerting.rules import load_rules

    rules = load_rules(args.rules or settings.rules_file)
    try:
        return replay(
            args.paths,
            rules,
            sys.stdout,
            as_json=args.json,
            pending=args.pending,
            detector=args.detector,
            threshold=args.threshold,
        )
    except BrokenPipeError:  # piped into head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def cmd_record(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    import signal
    import threading

    from ragwatch.commands.replay import record

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    stats = record(
        settings,
        args.out,
        topics=topics,
        duration_s=args.duration,
        max_messages=args.max_messages,
        stop=stop,
    )
    print(
        f"recorded {stats.written} envelopes to {args.out} ({stats.consumed} messages, "
        f"{stats.invalid} invalid skipped)",
        file=sys.stderr,
    )
    return 0


def cmd_settings(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    docs = env_names()
    for name, value in settings.describe().items():
        print(f"{name}={value}    # {docs[name]}")
    return 0


COMMANDS: dict[str, Any] = {
    "worker": cmd_worker,
    "agent": cmd_agent,
    "status": cmd_status,
    "demo": cmd_demo,
    "dev": cmd_dev,
    "settings": cmd_settings,
    "serve": cmd_serve,
    "notify": cmd_notify,
    "silence": cmd_silence,
    "replay": cmd_replay,
    "record": cmd_record,
}


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = os.environ if environ is None else environ
    try:
        settings = Settings.from_env(environ)
    except ConfigError as exc:
        print(f"ragwatch: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = COMMANDS[args.command](args, settings, environ)
        return code
    except ConfigError as exc:
        print(f"ragwatch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
