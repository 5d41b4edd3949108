"""``/metrics`` of ``ragwatch serve``: Prometheus metric families built from Redis per scrape.

A custom collector (prometheus/client_python's pattern for proxies and exporters): nothing
is cached between scrapes, every ``collect()`` reads the fleet status from Redis and
turns it into gauges. :func:`families` does the conversion and is pure, so tests feed it
a status dict. ``ALERTS`` follows Prometheus: one series per pending or firing alert,
value 1, with the alert's labels plus ``alertname``, ``alertstate`` and ``severity``.

``ragwatch_redis_writable`` is not read but found by writing: :class:`RedisWrites` sets a
test key every ``WRITE_PROBE_S`` (the worker and the notifier cannot report a Redis that
refuses their writes through that Redis).

Per-process series (label ``pid``) exist only for processes that have an active alert:
pids are high-cardinality (every restart is a new one) and belong in Redis, not in a
time-series database.

>>> status = {"hosts": [{"host": "h1", "gpus": [{"index": 0, "fb_used_bytes": 5e9}]}]}
>>> fams = {m.name: m for m in families(status)}
>>> fams["ragwatch_gpu_memory_used_bytes"].samples[0].labels
{'host': 'h1', 'gpu': '0', 'mig': ''}
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ragwatch.catalog import DELIVERY_LATENCY_BUCKETS_S as LATENCY_BUCKETS_S
from ragwatch.catalog import POD_LABELS, PROCESS_POD_LABELS
from ragwatch.chart_ids import series_prefix

# every family /metrics can export: name -> help. Names follow Prometheus' conventions
# (docs/console.md): base units, counters end in _total, everything under ragwatch_.
METRICS: dict[str, str] = {
    "ragwatch_alerts": "Active alerts (value 1) with their labels, alertname, alertstate "
    "(pending, firing) and severity: Prometheus' ALERTS, in ragwatch's own namespace",
    "ragwatch_redis_up": "1 if the last read of Redis succeeded, else 0",
    "ragwatch_redis_writable": "1 if Redis took serve's last test write (one every 2 s), 0 "
    "if it refused it (out of memory, read-only replica, ACL); absent while Redis does not "
    "answer",
    "ragwatch_gpu_memory_used_bytes": "GPU framebuffer memory in use",
    "ragwatch_gpu_memory_total_bytes": "GPU framebuffer memory in total",
    "ragwatch_gpu_memory_growth_bytes_per_second": "Robust (Theil-Sen) slope of GPU memory",
    "ragwatch_gpu_time_to_exhaustion_seconds": "Seconds until GPU memory is full at that "
    "slope (+Inf: not growing)",
    "ragwatch_gpu_utilization_ratio": "GPU utilisation, 0..1",
    "ragwatch_process_gpu_memory_bytes": "GPU memory of a process with an active alert",
    "ragwatch_process_memory_growth_bytes_per_second": "GPU memory slope of an alerted process",
    "ragwatch_process_leak_score": "Leak detector score (0..1) of an alerted process",
    "ragwatch_engine_generation_tokens_total": "Tokens a scraped inference engine generated, "
    "as ragwatch counted them from its counters (resets accounted for)",
    "ragwatch_engine_tokens_per_second_forecast": "Seasonal baseline of engine tokens/s",
    "ragwatch_engine_requests_waiting": "Requests waiting in the engine's queue",
    "ragwatch_engine_kv_cache_usage_ratio": "KV cache usage of the engine, 0..1",
    "ragwatch_engine_anomaly_score": "Anomaly score (0..1) of engine tokens/s",
    "ragwatch_service_requests_total": "Requests of a service instance the worker counted",
    "ragwatch_service_request_errors_total": "Failed requests of a service instance",
    "ragwatch_service_output_tokens_total": "Output tokens of a service instance's requests",
    "ragwatch_service_requests_per_second_forecast": "Seasonal baseline of requests/s",
    "ragwatch_service_errors_ratio": "Share of failed requests of a service instance (over "
    "the worker's adaptive window)",
    "ragwatch_service_tokens_per_request": "Output tokens per request of a service instance",
    "ragwatch_service_tokens_per_request_forecast": "Seasonal baseline of tokens/request",
    "ragwatch_service_tokens_per_second_forecast": "Seasonal baseline of output tokens/s",
    "ragwatch_service_anomaly_score": "Anomaly score (0..1) of a service signal",
    "ragwatch_service_stage_latency_seconds": "Latency quantile of one RAG stage",
    "ragwatch_service_e2e_latency_seconds": "End-to-end request latency quantile",
    "ragwatch_service_queue_latency_seconds": "Queueing latency quantile",
    "ragwatch_service_ttft_seconds": "Time-to-first-token quantile",
    "ragwatch_service_latency_baseline_seconds": "Seasonal baseline of a latency signal",
    "ragwatch_anomaly_score": "The generic detector's anomaly score (0..1) of a signal "
    "(label signal) of a series, labelled like the series (vmanomaly's anomaly_score)",
    "ragwatch_anomaly_yhat": "The value the generic detector expected of a signal (the "
    "signal's own unit; vmanomaly's yhat)",
    "ragwatch_anomaly_yhat_lower": "Lower end of the band the generic detector expected a "
    "signal in (vmanomaly's yhat_lower)",
    "ragwatch_anomaly_yhat_upper": "Upper end of the band the generic detector expected a "
    "signal in (vmanomaly's yhat_upper)",
    "ragwatch_alert_flaps_total": "Times an alert fired again within 6 h of resolving",
    "ragwatch_notifier_outbox_pending": "Notifications waiting in the outbox",
    "ragwatch_notifier_dead_letters": "Notifications that failed for good, kept for review",
    "ragwatch_notifier_last_seen_timestamp_seconds": "Wall time the notifier last reported",
    "ragwatch_notifier_notifications_total": "Notification attempts since the notifier "
    "started, by receiver and outcome (delivered, retried, failed)",
    "ragwatch_notifier_delivery_latency_seconds": "Seconds from a notification's entering "
    "the outbox to its delivery",
    "ragwatch_notifier_alertmanager_posts_total": "Posts to Alertmanager's /api/v2/alerts "
    "(RAGWATCH_ALERTMANAGER_URLS) since the notifier started, by outcome (ok, failed)",
    "ragwatch_notifier_alertmanager_alerts_sent_total": "Alerts Alertmanager accepted from "
    "the notifier (resends included)",
    "ragwatch_silences": "Silences that are not expired, by state (active, pending)",
    "ragwatch_worker_last_seen_timestamp_seconds": "Wall time a worker last wrote its status",
    "ragwatch_worker_messages_total": "Messages a worker consumed since it started",
    "ragwatch_worker_deadletter_messages_total": "Messages a worker sent to the dead-letter "
    "topic (undecodable, invalid, clock ahead, processing error) since it started",
    "ragwatch_worker_dropped_samples_total": "Samples a worker dropped at a series cap "
    "(RAGWATCH_MAX_SERIES, or per host) since it started",
    "ragwatch_worker_clock_jumps_back_samples_total": "GPU samples a worker refused: stamped "
    "more than 5 minutes behind their host's newest (its clock went back)",
    "ragwatch_worker_too_old_samples_total": "GPU samples a worker refused: stamped before "
    "2000 or a day behind the fleet",
    "ragwatch_worker_facts_records_total": "Records a worker read from the facts topic, by "
    "outcome (ok, bad: not a facts record, skipped)",
    "ragwatch_worker_hints_total": "Alerts whose hint read another worker's facts, by how "
    "(waited: for a worker behind; incomplete: sent after RAGWATCH_HINT_WAIT without it)",
    "ragwatch_worker_gpu_peer_minutes_total": "Minutes of event time a worker compared its "
    "GPUs with their like GPUs, by outcome (complete; incomplete: a worker still behind)",
}
log = logging.getLogger(__name__)
WRITE_PROBE_S = 2.0  # serve's test write, this often (RedisWrites); METRICS says it too
PROBE_TTL_S = 10  # the test key expires this long after the last one
# what a refused write's error class means, said in public (/healthz); Redis's words go
# to the log only
REFUSALS = {
    "OutOfMemoryError": "OOM: used memory is above maxmemory and nothing may be evicted",
    "ReadOnlyError": "READONLY: a read-only replica",
    "NoPermissionError": "NOPERM: the ACL user may not write",
}
HISTOGRAMS = frozenset({"ragwatch_notifier_delivery_latency_seconds"})
# what scrapers see: counter families are named without _total, their samples with it;
# a histogram's samples end in _bucket, _sum and _count
METRIC_NAMES = (
    frozenset(METRICS)
    | {n.removesuffix("_total") for n in METRICS}
    | {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)
# labels Prometheus sets on every scraped sample: ours are renamed so that no scrape config
# needs honor_labels (a service's instance is ``service_instance``)
TARGET_LABELS = {"instance": "service_instance", "job": "exported_job"}

GB_PER_HOUR = 1e9 / 3600.0  # in bytes per second (the status' GB is 10**9 bytes)
GPU_GAUGES = (
    ("fb_used_bytes", "ragwatch_gpu_memory_used_bytes", 1.0),
    ("fb_total_bytes", "ragwatch_gpu_memory_total_bytes", 1.0),
    ("gb_per_hour", "ragwatch_gpu_memory_growth_bytes_per_second", GB_PER_HOUR),
    ("tte_h", "ragwatch_gpu_time_to_exhaustion_seconds", 3600.0),
    ("gpu_util", "ragwatch_gpu_utilization_ratio", 0.01),
)
ENGINE_GAUGES = (
    ("generation_tokens_total", "ragwatch_engine_generation_tokens_total"),
    ("tps_forecast", "ragwatch_engine_tokens_per_second_forecast"),
    ("requests_waiting", "ragwatch_engine_requests_waiting"),
    ("kv_cache_usage_ratio", "ragwatch_engine_kv_cache_usage_ratio"),
)
SERVICE_GAUGES = (
    ("requests_total", "ragwatch_service_requests_total"),
    ("errors_total", "ragwatch_service_request_errors_total"),
    ("output_tokens_total", "ragwatch_service_output_tokens_total"),
    ("rps_forecast", "ragwatch_service_requests_per_second_forecast"),
    ("errors_ratio", "ragwatch_service_errors_ratio"),
    ("tokens_per_request", "ragwatch_service_tokens_per_request"),
    ("tpr_forecast", "ragwatch_service_tokens_per_request_forecast"),
    ("tps_forecast", "ragwatch_service_tokens_per_second_forecast"),
)
SERVICE_SCORES = (("tpr_score", "tokens_per_request"), ("tps_score", "tokens_per_second"))
LATENCY_FAMILIES = {
    "e2e": "ragwatch_service_e2e_latency_seconds",
    "queue": "ragwatch_service_queue_latency_seconds",
    "ttft": "ragwatch_service_ttft_seconds",
}
DELIVERY_OUTCOMES = ("delivered", "retried", "failed")
# a status entry's scores: signal -> [score, yhat, lower, upper] (streams/pipelines/scoring.py)
ANOMALY_FAMILIES = (
    "ragwatch_anomaly_score",
    "ragwatch_anomaly_yhat",
    "ragwatch_anomaly_yhat_lower",
    "ragwatch_anomaly_yhat_upper",
)
_QUANTILE = re.compile(r"^(?P<name>[a-z0-9_]+?)_p(?P<q>50|90|95|99)_ms$")
_BASELINE = re.compile(r"^(?P<name>[a-z0-9_]+)_baseline_ms$")
_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def gpu_where(host: str, gpu: Any, mig: Any) -> dict[str, str]:
    return {"host": str(host), "gpu": str(gpu), "mig": str(mig or "")}


def process_series_id(labels: Mapping[str, str]) -> str:
    """The chart series id of an alerted process (``series_prefix``'s layout)."""
    return series_prefix("process", labels) + "gpu_mem"


def alert_labels(alert: Mapping[str, Any]) -> dict[str, str]:
    """Prometheus labels of ``ALERTS`` for one alert (names made valid, ``__`` dropped)."""
    out: dict[str, str] = {}
    for k, v in (alert.get("labels") or {}).items():
        name = _LABEL_NAME.sub("_", str(k))
        name = "_" + name if name[:1].isdigit() else name
        if name and not name.startswith("__"):
            out[TARGET_LABELS.get(name, name)] = str(v)
    out["alertname"] = out.get("alertname") or str(alert.get("rule", ""))
    out["severity"] = out.get("severity") or str(alert.get("severity", ""))
    out["alertstate"] = str(alert.get("status", ""))
    return out


class _Families:
    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}

    def histogram(self, name: str, labels: dict[str, str], h: Mapping[str, Any]) -> None:
        """A histogram from cumulative ``latency_buckets`` (one per ``LATENCY_BUCKETS_S``),
        ``latency_sum`` and ``latency_count`` (streams/notifier/delivery_stats.py)."""
        counts, total = h.get("latency_buckets"), h.get("latency_count")
        if not isinstance(counts, list) or len(counts) != len(LATENCY_BUCKETS_S):
            return
        m = self.metrics.get(name)
        if m is None:
            m = self.metrics[name] = Metric(name, METRICS[name], "histogram")
        for le, n in zip((*LATENCY_BUCKETS_S, math.inf), (*counts, total), strict=True):
            bound = "+Inf" if le == math.inf else repr(le)
            m.add_sample(name + "_bucket", {**labels, "le": bound}, float(n or 0))
        m.add_sample(name + "_sum", labels, float(h.get("latency_sum") or 0.0))
        m.add_sample(name + "_count", labels, float(total or 0))

    def add(self, name: str, labels: dict[str, str], value: Any, scale: float = 1.0) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        m = self.metrics.get(name)
        if m is None:
            if name.endswith("_total"):  # a counter: the family is named without _total
                m = self.metrics[name] = Metric(name[: -len("_total")], METRICS[name], "counter")
            elif "quantile" in labels:  # quantiles over the worker's window: a summary's
                m = self.metrics[name] = Metric(name, METRICS[name], "summary")
            else:
                m = self.metrics[name] = Metric(name, METRICS[name], "gauge")
        m.add_sample(name, labels, float(value) * scale)


def families(
    status: Mapping[str, Any],
    last_points: Mapping[str, list[Any]] | None = None,
    writable: bool | None = None,
) -> Iterator[Metric]:
    """Metric families from a :func:`~ragwatch.store.read_status` dict, the
    newest points of alerted processes' series (for their leak score) and whether Redis
    takes writes (None: not known, no ``ragwatch_redis_writable``)."""
    f = _Families()
    f.add("ragwatch_redis_up", {}, 1)
    f.add("ragwatch_redis_writable", {}, None if writable is None else int(writable))
    alerts = [a for a in status.get("alerts") or [] if a.get("status") in ("pending", "firing")]
    for a in alerts:
        f.add("ragwatch_alerts", alert_labels(a), 1)
    alerted = {
        (lab.get("host"), lab.get("gpu"), lab.get("mig") or "", lab.get("pid"))
        for lab in (a.get("labels") or {} for a in alerts)
        if lab.get("pid")
    }
    for host in status.get("hosts") or []:
        _host(f, host, alerted, last_points or {})
    for svc in status.get("services") or []:
        for inst in svc.get("instances") or []:
            _instance(f, str(svc.get("service", "")), inst)
    _notifier(f, status.get("notifier") or {})
    for flap in status.get("flaps") or []:
        labels = {"alertname": str(flap.get("rule")), "fingerprint": str(flap.get("fingerprint"))}
        f.add("ragwatch_alert_flaps_total", labels, flap.get("count"))
    states = Counter(s.get("state") for s in status.get("silences") or [])
    for state in ("active", "pending"):
        f.add("ragwatch_silences", {"state": state}, states.get(state, 0))
    for wid, w in sorted((status.get("workers") or {}).items()):
        f.add("ragwatch_worker_last_seen_timestamp_seconds", {"worker": wid}, w.get("seen"))
        f.add("ragwatch_worker_messages_total", {"worker": wid}, w.get("messages"))
        f.add("ragwatch_worker_deadletter_messages_total", {"worker": wid}, w.get("deadletter"))
        dropped = (w.get("dropped_samples") or 0) + (w.get("dropped_host_cap") or 0)
        f.add("ragwatch_worker_dropped_samples_total", {"worker": wid}, dropped)
        f.add(
            "ragwatch_worker_clock_jumps_back_samples_total",
            {"worker": wid},
            w.get("clock_jumps_back"),
        )
        f.add("ragwatch_worker_too_old_samples_total", {"worker": wid}, w.get("too_old"))
        _fleet_view(f, wid, w)
    yield from f.metrics.values()


def _fleet_view(f: _Families, wid: str, w: Mapping[str, Any]) -> None:
    """A worker's counters of the facts topic, its hints and its like-GPU comparisons."""
    records, bad = w.get("facts_records"), w.get("facts_bad") or 0
    if records is not None:
        f.add(
            "ragwatch_worker_facts_records_total", {"worker": wid, "outcome": "ok"}, records - bad
        )
        f.add("ragwatch_worker_facts_records_total", {"worker": wid, "outcome": "bad"}, bad)
    for how in ("waited", "incomplete"):
        f.add("ragwatch_worker_hints_total", {"worker": wid, "how": how}, w.get(f"hints_{how}"))
    minutes, incomplete = w.get("gpu_peer_minutes"), w.get("gpu_peer_incomplete") or 0
    if minutes is not None:
        labels = {"worker": wid, "outcome": "complete"}
        f.add("ragwatch_worker_gpu_peer_minutes_total", labels, minutes - incomplete)
        labels = {"worker": wid, "outcome": "incomplete"}
        f.add("ragwatch_worker_gpu_peer_minutes_total", labels, incomplete)


def _host(
    f: _Families, host: Mapping[str, Any], alerted: set[Any], points: Mapping[str, list[Any]]
) -> None:
    name = str(host.get("host", ""))
    for g in host.get("gpus") or []:
        where = gpu_where(name, g.get("index"), g.get("mig"))
        pod = {k: str(g[k]) for k in POD_LABELS if g.get(k)}
        for key, metric, scale in GPU_GAUGES:
            value = g.get(key)
            if key == "tte_h" and value is None and g.get("gb_per_hour") is not None:
                value = math.inf  # not growing: never runs out (JSON has no infinity)
            f.add(metric, {**where, **pod}, value, scale)
        _scores(f, {**where, **pod}, g.get("scores"))
        for p in g.get("procs") or []:
            if (where["host"], where["gpu"], where["mig"], str(p.get("pid"))) not in alerted:
                continue
            labels = {
                **where,
                "pid": str(p.get("pid")),
                "process": str(p.get("name", "")),
                "container": str(p.get("container", "")),
                **{k: str(p[k]) for k in PROCESS_POD_LABELS if p.get(k)},
            }
            f.add("ragwatch_process_gpu_memory_bytes", labels, p.get("gpu_mem_bytes"))
            growth = "ragwatch_process_memory_growth_bytes_per_second"
            f.add(growth, labels, p.get("gb_per_hour"), GB_PER_HOUR)
            point = points.get(process_series_id(labels))
            if point and len(point) >= 4:
                f.add("ragwatch_process_leak_score", labels, point[3])
            _scores(f, labels, p.get("scores"))
    for e in host.get("engines") or []:
        labels = {"host": name, "target": str(e.get("target", ""))}
        signals = e.get("signals") or {}
        for key, metric in ENGINE_GAUGES:
            f.add(metric, labels, signals.get(key))
        f.add("ragwatch_engine_anomaly_score", labels, signals.get("tps_score"))
        _scores(f, labels, e.get("scores"))


def _instance(f: _Families, service: str, inst: Mapping[str, Any]) -> None:
    labels = {"service": service, "service_instance": str(inst.get("instance", ""))}
    signals: Mapping[str, Any] = inst.get("signals") or {}
    for key, metric in SERVICE_GAUGES:
        f.add(metric, labels, signals.get(key))
    _scores(f, labels, inst.get("scores"))
    for key, signal in SERVICE_SCORES:
        f.add("ragwatch_service_anomaly_score", {**labels, "signal": signal}, signals.get(key))
    for key in sorted(signals):
        if m := _QUANTILE.match(key):
            stage, q = m.group("name"), f"0.{m.group('q')}"
            if stage in LATENCY_FAMILIES:
                f.add(LATENCY_FAMILIES[stage], {**labels, "quantile": q}, signals[key], 0.001)
            else:
                stage_labels = {**labels, "stage": stage, "quantile": q}
                f.add("ragwatch_service_stage_latency_seconds", stage_labels, signals[key], 0.001)
        elif m := _BASELINE.match(key):
            base_labels = {**labels, "signal": m.group("name")}
            f.add("ragwatch_service_latency_baseline_seconds", base_labels, signals[key], 0.001)


def _scores(f: _Families, labels: dict[str, str], scores: Any) -> None:
    """A series' scored signals (``{signal: [score, yhat, lower, upper, ...]}``,
    :data:`~ragwatch.catalog.SCORE_FIELDS`), each as the four anomaly families, labelled
    like the series plus ``signal``."""
    if not isinstance(scores, Mapping):
        return
    for signal, values in sorted(scores.items()):
        if isinstance(values, list) and len(values) >= len(ANOMALY_FAMILIES):
            for name, value in zip(ANOMALY_FAMILIES, values, strict=False):
                f.add(name, {**labels, "signal": str(signal)}, value)


def _notifier(f: _Families, notifier: Mapping[str, Any]) -> None:
    f.add("ragwatch_notifier_outbox_pending", {}, notifier.get("outbox_pending", 0))
    f.add("ragwatch_notifier_dead_letters", {}, notifier.get("dead_letters", 0))
    f.add("ragwatch_notifier_last_seen_timestamp_seconds", {}, notifier.get("seen"))
    counters = notifier.get("counters") or {}
    forward = counters.get("alertmanager")
    if isinstance(forward, Mapping):
        posts, failed = forward.get("posts") or 0, forward.get("failures") or 0
        family = "ragwatch_notifier_alertmanager_posts_total"
        f.add(family, {"outcome": "ok"}, posts - failed)
        f.add(family, {"outcome": "failed"}, failed)
        f.add("ragwatch_notifier_alertmanager_alerts_sent_total", {}, forward.get("alerts_sent"))
    deliveries = counters.get("deliveries") or {}
    for receiver, d in sorted(deliveries.items()):
        if not isinstance(d, Mapping):
            continue
        for outcome in DELIVERY_OUTCOMES:
            labels = {"receiver": str(receiver), "outcome": outcome}
            f.add("ragwatch_notifier_notifications_total", labels, d.get(outcome))
        f.histogram("ragwatch_notifier_delivery_latency_seconds", {"receiver": str(receiver)}, d)


class RedisCollector(Collector):
    """Reads Redis on every scrape; if Redis does not answer, only ``ragwatch_redis_up 0``.
    ``ragwatch_redis_writable`` is what ``writes`` last found."""

    def __init__(self, client: Any, prefix: str, writes: RedisWrites | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self.writes = writes

    def collect(self) -> Iterator[Metric]:
        from redis.exceptions import RedisError

        from ragwatch.store import read_last_points, read_status

        try:
            status = read_status(self.client, self.prefix, history=0)
            ids = sorted(
                {
                    process_series_id(a["labels"])
                    for a in status["alerts"]
                    if isinstance(a.get("labels"), dict) and a["labels"].get("pid")
                }
            )
            points = read_last_points(self.client, self.prefix, ids)
        except RedisError:
            down = Metric("ragwatch_redis_up", METRICS["ragwatch_redis_up"], "gauge")
            down.add_sample("ragwatch_redis_up", {}, 0.0)
            yield down
            return
        yield from families(status, points, self.writes.ok if self.writes else None)


# ---------------------------------------------------------------------------- writes


@dataclass(frozen=True, slots=True)
class Writable:
    """What a test write found: ``ok`` None when Redis did not answer; ``reason`` says
    why in public words (``/healthz``), ``detail`` in Redis's (the log)."""

    ok: bool | None
    reason: str = ""
    detail: str = ""


def refusal(exc: Exception) -> str:
    """The public reason of a write Redis refused with ``exc``: a known kind, else the
    error code Redis answered with (``MISCONF``...), else the error's class.

    >>> from redis.exceptions import OutOfMemoryError, ResponseError
    >>> refusal(OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
    'OOM: used memory is above maxmemory and nothing may be evicted'
    >>> refusal(ResponseError("MISCONF Redis is configured to save RDB snapshots, but..."))
    'MISCONF'
    >>> refusal(ResponseError("something else"))
    'ResponseError'
    """
    known = REFUSALS.get(type(exc).__name__)
    if known is not None:
        return known
    code = str(exc).partition(" ")[0]
    return code if code.isalpha() and code.isupper() else type(exc).__name__


class RedisWrites:
    """Whether Redis takes writes, found by writing: a SET of ``<prefix>:serve:probe``
    with a ``PROBE_TTL_S`` expiry every ``WRITE_PROBE_S`` (:meth:`run`). The worker and
    the notifier cannot report a Redis that refuses their writes through it, and a PING
    or a read succeeds on a Redis out of memory, a read-only replica or under an ACL
    without write rights. Each change is logged once: a refusal and a Redis that does not
    answer as warnings, the way back as info (the first probe is logged only when it
    finds a problem).

    ``client`` is a blocking ``redis.Redis`` (the probe runs in a worker thread);
    ``where`` names Redis in the log (a URL without its password).
    """

    def __init__(self, client: Any, prefix: str, where: str) -> None:
        self.client = client
        self.key = f"{prefix}:serve:probe"
        self.where = where
        self.state: Writable | None = None  # None: not probed yet

    @property
    def ok(self) -> bool | None:
        """Whether the last probe's write was taken; None before one or when Redis did
        not answer."""
        return None if self.state is None else self.state.ok

    def probe(self) -> Writable:
        """One test write (blocking)."""
        from redis.exceptions import RedisError, ResponseError

        try:
            self.client.set(self.key, b"1", ex=PROBE_TTL_S)
        except ResponseError as exc:
            return Writable(False, refusal(exc), str(exc))
        except RedisError as exc:
            return Writable(None, type(exc).__name__, str(exc))
        return Writable(True)

    def update(self, new: Writable) -> None:
        """Keep what a probe found; log it if it differs from what the last one found."""
        old, self.state = self.state, new
        if old is not None and (old.ok, old.reason) == (new.ok, new.reason):
            return
        if new.ok is False:
            log.warning(
                "redis at %s refuses writes (%s); workers and the notifier cannot store "
                "alerts or state until it takes them. Redis says: %s",
                self.where,
                new.reason,
                new.detail,
            )
        elif new.ok is None:
            log.warning("redis at %s does not answer: %s", self.where, new.detail or new.reason)
        elif old is not None:
            log.info("redis at %s takes writes again", self.where)

    async def run(self, every_s: float = WRITE_PROBE_S) -> None:
        """Probe every ``every_s`` seconds until cancelled."""
        while True:
            self.update(await asyncio.to_thread(self.probe))
            await asyncio.sleep(every_s)
