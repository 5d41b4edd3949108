"""``ragwatch agent``: one command for every telemetry source, one publisher for all.

Sources: ``sim`` (the simulated fleet), ``nvml`` (this host's GPUs through NVML) and
``prom`` (Prometheus ``/metrics`` of vLLM, SGLang, llama.cpp, TGI, Text Embeddings
Inference, Triton, dcgm-exporter). Every source supports ``--once --json``: take one
sample and print its envelopes, one JSON object per line, instead of publishing.
Otherwise envelopes go through the :class:`~ragwatch.agents.publisher.KafkaPublisher`
(memory queue, optional ``--spool-dir``), which SIGTERM flushes.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ragwatch.commands.argtypes import (
    nonnegative_float,
    nonnegative_int,
    positive_duration,
    positive_int,
)
from ragwatch.commands.helptext import command, settings_epilog
from ragwatch.config import Settings
from ragwatch.errors import ConfigError
from ragwatch.progress import Progress
from ragwatch.schema import MAX_LABEL_LEN, Envelope, is_label

if TYPE_CHECKING:
    from ragwatch.agents.podresources import PodResources
    from ragwatch.agents.runner import RunStats

log = logging.getLogger("ragwatch.agent")
DEFAULT_INTERVAL = {"sim": 10.0, "nvml": 1.0, "prom": 15.0}
AGENT_TOPICS = ("gpu", "events", "metrics", "requests")  # what agents publish to


def add_parser(sub: Any) -> None:
    a = command(
        sub,
        "agent",
        "sample telemetry and publish it to Kafka",
        "Sample telemetry and publish it to Kafka: this host's GPUs through NVML "
        "(--source nvml), Prometheus /metrics of vLLM, SGLang, llama.cpp, TGI, Text "
        "Embeddings Inference, Triton or dcgm-exporter "
        "(--source prom), or a simulated fleet (--source sim). Creates its topics if "
        "they do not exist yet (else keeps its records until they do). Sampling never "
        "waits for the network: a memory queue and an optional spool (--spool-dir) keep "
        "what the broker cannot take yet. SIGTERM or Ctrl-C flushes and stops; the last "
        "line counts what was delivered, dropped and spooled.\n\n"
        "  ragwatch agent --source nvml --spool-dir /var/lib/ragwatch/spool\n"
        "  ragwatch agent --source prom --target gpu-node-01=http://vllm:8000/metrics\n"
        "  ragwatch agent --source sim --scenario leak --speed 720 --duration 12h",
        epilog=settings_epilog(
            "RAGWATCH_KAFKA_BOOTSTRAP", "RAGWATCH_TOPIC_PREFIX", "RAGWATCH_TOPIC_PARTITIONS"
        ),
    )
    a.add_argument(
        "--source",
        choices=("sim", "nvml", "prom"),
        default="sim",
        help="sim: the simulated fleet; nvml: this host's GPUs; prom: /metrics (default: sim)",
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
    a.add_argument(
        "--host",
        default=None,
        help="host name in envelopes (default: this machine's hostname; for prom, see --target)",
    )
    a.add_argument(
        "--spool-dir",
        type=Path,
        default=None,
        help="keep what the broker cannot take on disk, and send it later; a directory "
        "that cannot be created or written is refused at start, exit 2 (default: none, "
        "beyond --queue-max the oldest records are dropped and counted)",
    )
    a.add_argument(
        "--spool-max",
        type=positive_int,
        default=256 << 20,
        help="spool size cap in bytes; beyond it the oldest records are dropped and counted "
        "(default: 268435456, 256 MiB)",
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
    )  # validated by agents.scenario.build, which names the choices
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
    sim.add_argument("--seed", type=int, default=0, help="RNG seed: same seed, same data")
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
        help="the host's /proc, where process names and containers are read (e.g. "
        "/host/proc in a container)",
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
        type=target_spec,
        default=[],
        metavar="[HOST=]URL",
        help="a /metrics URL to scrape (repeat for several). HOST= names the host its "
        "telemetry is filed under, as the NVML agent and the SDK on that machine name it "
        "(their hostname), so alerts join them: gpu-node-01=http://10.0.0.7:8000/metrics. "
        "Without HOST=, a --host-label in the samples names it (dcgm-exporter's "
        "Hostname), else --host, else this machine's hostname for a target on loopback "
        "and the URL's host name for one elsewhere (default: none; --source prom needs one)",
    )
    prom.add_argument(
        "--host-label",
        action="append",
        default=None,
        metavar="LABEL",
        help="a label of the scraped samples that names their host, for targets without "
        "HOST= (repeatable; default: Hostname, hostname: dcgm-exporter's)",
    )
    prom.add_argument(
        "--series-cap",
        type=positive_int,
        default=2000,
        help="series kept per target; the rest are dropped and counted",
    )


def target_spec(v: str) -> tuple[str | None, str]:
    """``--target [HOST=]URL`` as (HOST or None, URL); the URL is checked by the source.

    >>> target_spec("gpu-node-01=http://10.0.0.7:8000/metrics")
    ('gpu-node-01', 'http://10.0.0.7:8000/metrics')
    >>> target_spec("http://vllm:8000/metrics?format=text")
    (None, 'http://vllm:8000/metrics?format=text')
    """
    head, sep, url = v.partition("=")
    if not sep or "://" in head:
        return None, v.strip()
    host = head.strip()
    if not host or not is_label(host):
        raise argparse.ArgumentTypeError(
            f"expected [HOST=]URL with a printable HOST of at most {MAX_LABEL_LEN} "
            f"characters, got {v!r}"
        )
    return host, url.strip()


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.json and not args.once and not (args.source == "sim" and args.duration):
        raise ConfigError("--json prints one sample (--once), or with --source sim a --duration")
    topics = {name: settings.topic(name) for name in AGENT_TOPICS}
    interval = args.interval or DEFAULT_INTERVAL[args.source]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.source == "sim":
        return _run_sim(args, settings, topics, interval, stop)
    source = _open_source(args)
    try:
        if args.json:
            _print(source.sample())
            _once_read(source.unread)
            return 0
        from ragwatch.agents.runner import run_polling

        publisher = _publisher(args, settings)
        for line in source.describe(interval, _destination(settings, topics)):
            log.info("%s", line)
        stats = run_polling(
            source.sample,
            publisher,
            topics=topics,
            interval_s=interval,
            stop=stop,
            max_ticks=1 if args.once else None,
        )
        code = _report(stats.ticks, stats.envelopes, stats.events, publisher)
        if args.once:
            _once_read(source.unread, failed=stats.errors > 0)
        return code
    finally:
        source.close()


def _destination(settings: Settings, topics: dict[str, str]) -> str:
    return f"Kafka {settings.kafka_bootstrap}, topics {', '.join(topics.values())}"


def _once_read(unread: Callable[[], str | None], *, failed: bool = False) -> None:
    """--once that read nothing is a failure (exit 2), not an empty success."""
    why = "sampling failed (logged above)" if failed else unread()
    if why is not None:
        raise ConfigError(f"agent --once: {why}")


@dataclass(frozen=True)
class _Source:
    """A polled source: take a sample, close it, say why nothing was read (None if
    something was), and describe itself in the start lines."""

    sample: Callable[[], list[Envelope]]
    close: Callable[[], None]
    unread: Callable[[], str | None]
    describe: Callable[[float, str], list[str]]


def _open_source(args: argparse.Namespace) -> _Source:
    if args.source == "nvml":
        return _open_nvml(args, args.host or socket.gethostname())
    return _open_prom(args)


def _open_nvml(args: argparse.Namespace, host: str) -> _Source:
    from ragwatch.agents.nvml import NvmlSource
    from ragwatch.agents.procinfo import ProcInfo

    src = NvmlSource(host, proc=ProcInfo(args.proc_root), pods=_pod_resources(args))
    src.open()  # NvmlUnavailable (a ConfigError) names NVML and the way out
    started = [src.start_event()]
    attrs = started[0].attrs

    def sample_nvml() -> list[Envelope]:
        env, events = src.sample()
        first = [] if args.json else started[:]  # agent_start goes out with the 1st tick
        started.clear()
        return [*first, env, *events]

    def describe(interval: float, dest: str) -> list[str]:
        return [
            f"agent: nvml: host {host}, sampling every {interval:g}s -> {dest}",
            f"agent: nvml: {attrs}",
        ]

    return _Source(sample_nvml, src.close, lambda: None, describe)


def _open_prom(args: argparse.Namespace) -> _Source:
    from ragwatch.agents.prom import PromSource
    from ragwatch.agents.prom_map import HOST_LABELS

    if not args.target:
        raise ConfigError("--source prom needs at least one --target [HOST=]URL")
    targets = [_target(name, url, args.host) for name, url in args.target]
    try:
        prom = PromSource(
            [t for t, _ in targets],
            host=args.host or socket.gethostname(),
            host_labels=tuple(args.host_label or HOST_LABELS),
            series_cap=args.series_cap,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    def unscraped() -> str | None:
        if any(st.scrapes for st in prom.stats.values()):
            return None
        return "no --target could be scraped: " + "; ".join(
            f"{url} ({st.last_error})" for url, st in prom.stats.items()
        )

    def describe(interval: float, dest: str) -> list[str]:
        head = f"agent: prom: scraping {len(targets)} target(s) every {interval:g}s -> {dest}"
        by_label = " or ".join(prom.host_labels)
        return [head] + [
            f"agent: prom: {t.url} as host {t.host or prom.host} ({why}"
            + ("" if t.pinned else f"; samples with a {by_label} label: that host")
            + ")"
            for t, why in targets
        ]

    return _Source(prom.sample, lambda: None, unscraped, describe)


def _target(name: str | None, url: str, host: str | None) -> tuple[Any, str]:
    """The :class:`~ragwatch.agents.prom.Target` of ``--target [NAME=]URL`` and why it is
    filed under its host: named on the command line, ``--host``, this machine (a loopback
    URL) or the URL's host name (another machine)."""
    from ragwatch.agents.prom import Target

    if name:
        return Target(url, name, pinned=True), "named by --target"
    if host:
        return Target(url, host), "--host"
    machine = urlsplit(url).hostname or ""
    if _loopback(machine):
        return Target(url), "this machine"
    return Target(url, machine), "the URL's host; name it with --target HOST=URL"


def _loopback(name: str) -> bool:
    if name in ("localhost", "localhost.localdomain", ""):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


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
    progress = _sim_progress(duration if not args.once else None)
    if args.json:
        with progress:
            run_simulation(
                world.fleet,
                StreamSink(sys.stdout),
                topics=topics,
                duration_s=duration,
                requests=requests,
                on_tick=_on_tick(progress),
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
        _destination(settings, topics),
    )
    with progress:
        stats = run_simulation(
            world.fleet,
            publisher,
            topics=topics,
            speed=args.speed,
            duration_s=duration,
            stop=stop,
            requests=requests,
            on_tick=_on_tick(progress),
        )
    return _report(stats.ticks, stats.envelopes, stats.events, publisher)


def _sim_progress(duration_s: float | None) -> Progress:
    """How much of --duration is played, on stderr (nothing without a --duration)."""
    total = None if duration_s is None else duration_s / 3600
    return Progress("agent", "h of event time", total=total, enabled=duration_s is not None)


def _on_tick(progress: Progress) -> Callable[[RunStats], None]:
    def on_tick(stats: RunStats) -> None:
        if stats.first_ts is not None and stats.last_ts is not None:
            progress.note(lambda: f"{stats.envelopes:,} envelopes, {stats.events:,} events")
            progress.update((stats.last_ts - stats.first_ts) / 3600)

    return on_tick


def _publisher(args: argparse.Namespace, settings: Settings) -> Any:
    """The Kafka sink, once the broker has answered: an unreachable one is one line and
    exit 2, unless a spool keeps what is sampled until it answers (not with --once)."""
    from ragwatch.agents.publisher import KafkaPublisher
    from ragwatch.agents.spool import Spool
    from ragwatch.kafka_admin import check_kafka

    # an unwritable spool is refused before anything connects
    spool = None if args.spool_dir is None else Spool(args.spool_dir, max_bytes=args.spool_max)
    try:
        check_kafka(settings, "agent")
    except ConfigError as exc:
        if spool is None or args.once:
            raise
        log.warning("%s; spooling to %s until it answers", exc, args.spool_dir)
    else:
        _ensure_topics(settings)
    return KafkaPublisher(
        settings.kafka_config(),
        queue_max=args.queue_max,
        max_in_flight=min(10_000, args.queue_max),
        spool=spool,
    )


def _ensure_topics(settings: Settings) -> None:
    """Create the topics the agent publishes to if they do not exist yet (with
    RAGWATCH_TOPIC_PARTITIONS partitions, as the worker would), so an agent started
    first loses nothing. Where the agent may not create topics, its records wait in its
    queue (and spool) until they exist: said once."""
    from ragwatch.kafka_admin import ensure_topics

    try:
        created = ensure_topics(settings, AGENT_TOPICS, command="agent")
    except ConfigError as exc:
        log.warning(
            "agent: %s; records wait until the topics exist ('ragwatch worker' creates them)",
            exc,
        )
        return
    if created:
        log.info("agent: created topics %s", ", ".join(created))


def _print(envelopes: list[Envelope]) -> None:
    from ragwatch.codec import encode

    sys.stdout.write("".join(encode(e).decode() + "\n" for e in envelopes))
    sys.stdout.flush()


def _report(ticks: int, envelopes: int, events: int, publisher: Any) -> int:
    """The last line: what was sampled and what became of it. Exit 1 when anything was
    lost (dropped: memory or spool full, refused, shutdown) or is still queued; records a
    rebuilt producer re-sent (possible duplicates, not losses) are counted and said."""
    ps = publisher.stats
    log.info(
        "agent done: ticks=%d envelopes=%d events=%d produced=%d delivered=%d failed=%d "
        "dropped=%d spooled=%d recoveries=%d resent=%d spool_errors=%d",
        ticks,
        envelopes,
        events,
        ps.produced,
        ps.delivered,
        ps.failed,
        ps.dropped,
        ps.spooled,
        ps.recoveries,
        ps.resent,
        ps.spool_errors,
    )
    if ps.resent:
        log.warning(
            "agent: %d record(s) re-sent after a producer rebuild may be stored twice", ps.resent
        )
    return 0 if ps.dropped == 0 and publisher.queued == 0 else 1
