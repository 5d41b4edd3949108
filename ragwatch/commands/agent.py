"""``ragwatch agent``: one command for every telemetry source, one publisher for all.

Sources: ``sim`` (the simulated fleet), ``nvml`` (this host's GPUs through NVML) and
``prom`` (Prometheus ``/metrics`` of vLLM, TGI, Triton, dcgm-exporter). Every source
supports ``--once --json``: take one sample and print its envelopes, one JSON object per
line, instead of publishing. Otherwise envelopes go through the
:class:`~ragwatch.agents.publisher.KafkaPublisher` (memory queue, optional
``--spool-dir``), which SIGTERM flushes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragwatch.commands.argtypes import (
    nonnegative_float,
    nonnegative_int,
    positive_duration,
    positive_int,
)
from ragwatch.config import Settings
from ragwatch.errors import ConfigError
from ragwatch.schema import Envelope

if TYPE_CHECKING:
    from ragwatch.agents.podresources import PodResources

log = logging.getLogger("ragwatch.agent")
DEFAULT_INTERVAL = {"sim": 10.0, "nvml": 1.0, "prom": 15.0}


def add_parser(sub: Any) -> None:
    a = sub.add_parser("agent", help="sample telemetry and publish it to Kafka")
    a.add_argument(
        "--source",
        choices=("sim", "nvml", "prom"),
        default="sim",
        help="sim: the simulated fleet; nvml: this host's GPUs; prom: /metrics",
    )
    a.add_argument(
        "--interval",
        type=positive_duration,
        default=None,
        help="time between samples (default: sim 10s of event time, nvml 1s, prom 15s)",
    )
    a.add_argument("--once", action="store_true", help="take one sample and stop")
    a.add_argument(
        "--json",
        action="store_true",
        help="print the envelopes (JSON lines) instead of publishing them: one sample with "
        "--once, or with --source sim all of --duration (a recording for 'ragwatch replay')",
    )
    a.add_argument("--host", default=None, help="host name in envelopes (default: hostname)")
    a.add_argument(
        "--spool-dir",
        type=Path,
        default=None,
        help="keep what the broker cannot take on disk, and send it later",
    )
    a.add_argument(
        "--spool-max", type=positive_int, default=256 << 20, help="spool size cap, bytes"
    )
    a.add_argument(
        "--queue-max",
        type=positive_int,
        default=100_000,
        help="records kept in memory while the broker is slow or away (beyond them: the "
        "spool, or dropped without one); also caps the records in flight to the broker",
    )
    _add_sim_arguments(a.add_argument_group("sim"))
    _add_source_arguments(a)


def _add_sim_arguments(sim: Any) -> None:
    sim.add_argument(
        "--scenario",
        default="leak",
        help="healthy, leak, throughput, retrieval, outliers, oom or all",
    )
    sim.add_argument(
        "--services",
        type=nonnegative_int,
        default=2,
        help="simulated RAG services (2 instances each) sending request "
        "telemetry; 0 = GPU telemetry only",
    )
    sim.add_argument("--hosts", type=positive_int, default=4, help="simulated hosts (default 4)")
    sim.add_argument(
        "--gpus", type=positive_int, default=2, help="GPUs per simulated host (default 2)"
    )
    sim.add_argument(
        "--speed",
        type=nonnegative_float,
        default=1.0,
        help="event-time seconds per wall second; 0 = as fast as possible",
    )
    sim.add_argument("--seed", type=int, default=0, help="RNG seed (same seed, same data)")
    sim.add_argument(
        "--duration",
        type=positive_duration,
        default=None,
        help="event time to simulate, e.g. 3600, 90m or 6h (default: forever)",
    )
    sim.add_argument(
        "--heal-after",
        type=positive_duration,
        default=None,
        help="the request faults end this long after they start (default: never)",
    )
    sim.add_argument(
        "--start",
        type=nonnegative_float,
        default=None,
        help="event time of the first sample, epoch seconds (default: now minus "
        "--duration, so a fast replay ends near the present)",
    )


def _add_source_arguments(a: Any) -> None:
    nvml = a.add_argument_group("nvml")
    nvml.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        help="the host's /proc (e.g. /host/proc in a container)",
    )
    nvml.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="the kubelet's PodResources socket, to label GPUs and processes with their "
        "Kubernetes namespace, pod and container (default: "
        "/var/lib/kubelet/pod-resources/kubelet.sock, used when it exists)",
    )
    nvml.add_argument(
        "--no-pod-resources",
        action="store_true",
        help="do not ask the kubelet which pods hold the GPUs",
    )
    prom = a.add_argument_group("prom")
    prom.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="a /metrics URL to scrape (repeat for several)",
    )
    prom.add_argument(
        "--series-cap",
        type=positive_int,
        default=2000,
        help="series kept per target; the rest are dropped and counted",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.json and not args.once and not (args.source == "sim" and args.duration):
        raise ConfigError("--json prints one sample (--once), or with --source sim a --duration")
    topics = {name: settings.topic(name) for name in ("gpu", "events", "metrics", "requests")}
    interval = args.interval or DEFAULT_INTERVAL[args.source]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.source == "sim":
        return _run_sim(args, settings, topics, interval, stop)
    sample, close, unread = _open_source(args)
    try:
        if args.json:
            _print(sample())
            _once_read(unread)
            return 0
        from ragwatch.agents.runner import run_polling

        publisher = _publisher(args, settings)
        stats = run_polling(
            sample,
            publisher,
            topics=topics,
            interval_s=interval,
            stop=stop,
            max_ticks=1 if args.once else None,
        )
        code = _report(stats.ticks, stats.envelopes, stats.events, publisher)
        if args.once:
            _once_read(unread, failed=stats.errors > 0)
        return code
    finally:
        close()


def _once_read(unread: Callable[[], str | None], *, failed: bool = False) -> None:
    """--once that read nothing is a failure (exit 2), not an empty success."""
    why = "sampling failed (logged above)" if failed else unread()
    if why is not None:
        raise ConfigError(f"agent --once: {why}")


def _open_source(
    args: argparse.Namespace,
) -> tuple[Callable[[], list[Envelope]], Callable[[], None], Callable[[], str | None]]:
    """The source's sample and close functions, and one that says why nothing was read
    (None if something was)."""
    host = args.host or socket.gethostname()
    if args.source == "nvml":
        from ragwatch.agents.nvml import NvmlSource
        from ragwatch.agents.procinfo import ProcInfo

        src = NvmlSource(host, proc=ProcInfo(args.proc_root), pods=_pod_resources(args))
        src.open()  # NvmlUnavailable (a ConfigError) names NVML and the way out
        started = [src.start_event()]
        if not args.json:
            log.info("nvml: %s", started[0].attrs)

        def sample_nvml() -> list[Envelope]:
            env, events = src.sample()
            first = [] if args.json else started[:]  # agent_start goes out with the 1st tick
            started.clear()
            return [*first, env, *events]

        return sample_nvml, src.close, lambda: None
    from ragwatch.agents.prom import PromSource

    if not args.target:
        raise ConfigError("--source prom needs at least one --target URL")
    try:
        prom = PromSource(args.target, host=host, series_cap=args.series_cap)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    def unscraped() -> str | None:
        if any(st.scrapes for st in prom.stats.values()):
            return None
        return "no --target could be scraped: " + "; ".join(
            f"{url} ({st.last_error})" for url, st in prom.stats.items()
        )

    return prom.sample, lambda: None, unscraped


def _pod_resources(args: argparse.Namespace) -> PodResources | None:
    """The kubelet client of ``--source nvml``, or None with ``--no-pod-resources``."""
    if args.no_pod_resources:
        if args.pod_resources_socket is not None:
            raise ConfigError("--pod-resources-socket and --no-pod-resources exclude each other")
        return None
    from ragwatch.agents.podresources import DEFAULT_SOCKET, PodResources

    socket_path = args.pod_resources_socket or DEFAULT_SOCKET
    if args.pod_resources_socket is not None and not socket_path.exists():
        raise ConfigError(f"--pod-resources-socket {socket_path}: no such socket")
    return PodResources(socket_path)


def _run_sim(
    args: argparse.Namespace,
    settings: Settings,
    topics: dict[str, str],
    interval: float,
    stop: threading.Event,
) -> int:
    from ragwatch.agents.publisher import StreamSink
    from ragwatch.agents.runner import run_simulation
    from ragwatch.agents.scenario import build

    start = args.start
    if start is None:
        start = float(int(time.time() - (args.duration or 0.0)))
    try:
        world = build(
            args.scenario,
            hosts=args.hosts,
            gpus=args.gpus,
            services=args.services,
            seed=args.seed,
            interval_s=interval,
            start_ts=start,
            heal_after_s=args.heal_after,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg, requests = world.fleet.config, world.requests
    duration = interval if args.once else args.duration
    if args.json:
        run_simulation(
            world.fleet,
            StreamSink(sys.stdout),
            topics=topics,
            duration_s=duration,
            requests=requests,
        )
        return 0
    publisher = _publisher(args, settings)
    log.info(
        "agent: sim scenario=%s hosts=%d gpus=%d services=%d speed=%g -> %s",
        args.scenario,
        cfg.hosts,
        cfg.gpus,
        args.services,
        args.speed,
        settings.kafka_bootstrap,
    )
    stats = run_simulation(
        world.fleet,
        publisher,
        topics=topics,
        speed=args.speed,
        duration_s=duration,
        stop=stop,
        requests=requests,
    )
    return _report(stats.ticks, stats.envelopes, stats.events, publisher)


def _publisher(args: argparse.Namespace, settings: Settings) -> Any:
    """The Kafka sink, once the broker has answered: an unreachable one is one line and
    exit 2, unless a spool keeps what is sampled until it answers (not with --once)."""
    from ragwatch.agents.publisher import KafkaPublisher
    from ragwatch.agents.spool import Spool
    from ragwatch.kafka_admin import check_kafka

    try:
        check_kafka(settings, "agent")
    except ConfigError as exc:
        if args.spool_dir is None or args.once:
            raise
        log.warning("%s; spooling to %s until it answers", exc, args.spool_dir)

    spool = None if args.spool_dir is None else Spool(args.spool_dir, max_bytes=args.spool_max)
    return KafkaPublisher(
        settings.kafka_config(),
        queue_max=args.queue_max,
        max_in_flight=min(10_000, args.queue_max),
        spool=spool,
    )


def _print(envelopes: list[Envelope]) -> None:
    from ragwatch.codec import encode

    sys.stdout.write("".join(encode(e).decode() + "\n" for e in envelopes))
    sys.stdout.flush()


def _report(ticks: int, envelopes: int, events: int, publisher: Any) -> int:
    ps = publisher.stats
    log.info(
        "agent done: ticks=%d envelopes=%d events=%d produced=%d delivered=%d failed=%d "
        "dropped=%d spooled=%d",
        ticks,
        envelopes,
        events,
        ps.produced,
        ps.delivered,
        ps.failed,
        ps.dropped,
        ps.spooled,
    )
    return 0 if ps.dropped == 0 and publisher.queued == 0 else 1
