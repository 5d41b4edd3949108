"""From ``ragwatch.gpu`` envelopes to per-GPU and per-process signals and alert transitions.

Plain Python (no Faust): the Faust agent in :mod:`ragwatch.streams.worker.app` feeds decoded
envelopes into :meth:`GpuPipeline.process`, and so can a test or a replay.

Series:

- ``gpu``: one per (host, GPU index, MIG instance), a leak detector on ``fb_used``;
- ``process``: one per (host, GPU, MIG, pid), a leak detector on its GPU memory. A new
  pid is a new series, so a restart resets the detector.

A series not seen for ``stale_s`` of event time (the process exited, the GPU vanished)
is forgotten and its active alerts resolve. A host that goes silent altogether is swept
the same way once the pipeline's event-time high-water mark is ``12 * stale_s`` past its
last sample (the margin tolerates partitions that are consumed at different paces).
Samples of new series beyond ``max_series`` (in all; with a shared ``budget``, the worker's
series of every kind count), or ``max_series_per_host`` (one host whose processes churn
through pids), are dropped and counted.

>>> from ragwatch.agents.sim import FleetSimulator, SimConfig
>>> from ragwatch.streams.alerting.rules import load_rules
>>> pipe = GpuPipeline(load_rules())
>>> sim = FleetSimulator(SimConfig(hosts=1, gpus=1, interval_s=30, leak_start_s=0))
>>> fired = []
>>> for _, (ts, envs, _) in zip(range(2 * 120), sim.ticks()):  # two hours
...     fired += [t.alert for env in envs for t in pipe.process(env) if t.notify]
>>> fired[0].labels["process"], fired[0].labels["pid"], fired[0].status
('rag-worker', '4001', 'firing')
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ragwatch.catalog import POD_LABELS, PROCESS_POD_LABELS
from ragwatch.codec import gpu_wire
from ragwatch.detectors import make
from ragwatch.detectors.leak import GB, LeakDetector, LeakEstimate
from ragwatch.schema import GpuEnvelope, Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import ChartSeries, Domain
from ragwatch.streams.pipelines.budget import SeriesBudget

log = logging.getLogger(__name__)

SeriesKey = tuple[str, int, str, int]  # host, gpu index, mig ("" if none), pid (-1 = gpu)
# A host is swept by the pipeline's watermark only after 12 x stale_s (an hour by default):
# hosts live on different partitions, consumed at different paces, and a fast replay turns
# a second of lag into many minutes of event time.
SILENT_HOST_FACTOR = 12
TOP_K = 3  # GPUs per host listed by utilisation, memory and memory growth in the snapshot


def _top(gpus: list[dict[str, Any]], field: str, k: int) -> list[dict[str, Any]]:
    """The ``k`` GPUs with the largest ``field`` (None last), as {index, mig, value}."""
    ranked = sorted(gpus, key=lambda g: (g.get(field) is None, -(g.get(field) or 0.0), g["index"]))
    return [{"index": g["index"], "mig": g["mig"], "value": g.get(field)} for g in ranked[:k]]


def _worth_logging(dropped: int) -> bool:
    """Log a repeated drop the 1st, 10th and 100th time, then every 10,000th."""
    return dropped in (1, 10, 100) or dropped % 10_000 == 0


def _pod(d: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """The Kubernetes container a GPU (wire dict or series labels) is allocated to."""
    return d.get("namespace"), d.get("pod"), d.get("container")


def _pod_labels(d: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, str]:
    """The Kubernetes labels ``names`` of a wire dict, where set."""
    return {k: d[k] for k in names if d.get(k)}


def _leak() -> LeakDetector:
    det = make("leak")
    assert isinstance(det, LeakDetector)
    return det


# Signals that change with every sample; the others come from the leak detector's
# estimate and change only when it closes a bucket (every 2 min by default).
SAMPLE_SIGNALS = frozenset(
    {
        "fb_used_bytes",
        "fb_total_bytes",
        "tte_s",
        "tte_h",
        "gpu_mem_bytes",
        "rss_bytes",
        "fb_used_ratio",
        "gpu_util",
        "mem_copy_util",
        "temp_c",
        "power_w",
    }
)


@dataclass(slots=True)
class Series:
    """One tracked series: its labels, detector and latest raw values.

    ``signals`` is computed when read (rules, status, hints), not on every sample.
    """

    labels: dict[str, str]
    detector: LeakDetector
    last_ts: float = 0.0
    gpu: bool = True  # a GPU's series; False for one process on it
    value: float = 0.0  # the memory fed to the detector: fb_used, or the process's gpu_mem
    fb_used: int = 0  # of the GPU (a process's series too: time to exhaustion)
    fb_total: int = 0
    gpu_util: float | None = None
    mem_copy_util: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    rss: int | None = None
    estimate: LeakEstimate | None = None  # the detector's, as of the last evaluation
    attributed: float | None = 0.0  # a GPU's: its processes' recent GB/h (None: not known)
    watch: bool = True  # an alert of a rule that reads only the estimate may be active
    keys: dict[str, tuple[dict[str, str], str]] = field(default_factory=dict)  # rule -> alert

    @property
    def signals(self) -> dict[str, float | None]:
        """Every signal the rules of this series can read."""
        est = self.detector.estimate
        fb_used, total = self.fb_used, self.fb_total
        free = total - fb_used
        tte = est.time_to_exhaustion(free) if est else None
        if est and free <= 0:
            tte = 0.0  # full: nothing left, whatever the recent slope says
        elif est and tte is None:
            tte = math.inf  # not growing: never
        out: dict[str, float | None] = {
            "fb_used_bytes": float(fb_used),
            "fb_total_bytes": float(total),
            "mem_increase_bytes": est.increase_bytes if est else None,
            "mem_increase_gb": est.increase_bytes / GB if est else None,
            "mem_slope_bytes_per_s": est.slope_bytes_per_s if est else None,
            "gb_per_hour": est.gb_per_hour if est else None,
            "window_h": est.span_s / 3600 if est else None,
            "leak_score": self.detector.score_one({"value": self.value, "t": self.last_ts}),
            "mem_steadiness": est.steadiness if est else None,
            "recent_gb_per_hour": est.recent_gb_per_hour if est else None,
            "recent_steadiness": est.recent_steadiness if est else None,
            "tte_s": tte,
            "tte_h": None if tte is None else tte / 3600,
        }
        if self.gpu:
            recent, attributed = (est.recent_gb_per_hour if est else None), self.attributed
            out["attributed_gb_per_hour"] = attributed
            out["unattributed_gb_per_hour"] = (
                None if recent is None or attributed is None else recent - attributed
            )
            out["fb_used_ratio"] = fb_used / total if total else None
            out["gpu_util"] = self.gpu_util
            out["mem_copy_util"] = self.mem_copy_util
            out["temp_c"] = self.temp_c
            out["power_w"] = self.power_w
        else:
            out["gpu_mem_bytes"] = self.value
            out["rss_bytes"] = None if self.rss is None else float(self.rss)
        return out


@dataclass
class PipelineStats:
    envelopes: int = 0
    samples: int = 0
    dropped_samples: int = 0  # samples of series that did not fit under max_series
    dropped_host_cap: int = 0  # ... or under max_series_per_host (one host's pid churn)
    evicted_series: int = 0
    duplicates: int = 0  # samples not newer than their series' last one (a replay, a retry)


class GpuPipeline:
    """Tracks every GPU and process series and evaluates the rules on them.

    Cost per sample is a dict lookup, a detector update and a few attribute stores. Rules
    that read only the leak detector's output (``GpuMemoryLeak``) are evaluated when the
    detector closes a bucket, or while their alert is active; rules that read a per-sample
    signal (``fb_used_ratio``, ``gpu_util`` ...) on every sample. Both give the transitions
    of evaluating every rule on every sample: an inactive rule whose inputs did not change
    cannot start. A host's series are scanned for staleness only when its oldest one may be.
    """

    def __init__(
        self,
        rules: list[Rule],
        engine: AlertEngine | None = None,
        *,
        detector_factory: Callable[[], LeakDetector] = _leak,
        max_series: int = 100_000,
        max_series_per_host: int = 4096,
        budget: SeriesBudget | None = None,
        stale_s: float = 300.0,
        every_sample: bool = False,
    ) -> None:
        self.rules = {s: [r for r in rules if r.series == s] for s in ("gpu", "process")}
        # per series kind: (rules evaluated on every sample, rules that read only the
        # estimate); every_sample=True evaluates them all on every sample (the reference
        # the tests hold the fast path to)
        self._split = {
            kind: (
                [r for r in rs if every_sample or r.reads & SAMPLE_SIGNALS],
                [r for r in rs if not every_sample and not r.reads & SAMPLE_SIGNALS],
            )
            for kind, rs in self.rules.items()
        }
        self.engine = engine or AlertEngine()
        self._factory = detector_factory
        self.max_series = max_series
        self.max_series_per_host = max_series_per_host
        self.budget = budget or SeriesBudget(max_series)
        self.budget.watch(lambda: len(self.series))
        self.swept: set[str] = set()  # hosts whose last series went silent (see Pipelines.gone)
        self.stale_s = stale_s
        self.series: dict[SeriesKey, Series] = {}
        self._by_host: dict[str, set[SeriesKey]] = {}
        self._oldest: dict[str, float] = {}  # per host, <= the oldest last_ts of its series
        # Silent hosts are swept against min(watermark, sweep_mark): a worker sets it to the
        # slowest of its partitions, which a catch-up reads at different paces.
        self.sweep_mark = math.inf
        self._watermark = 0.0
        self._last_sweep = 0.0
        self.stats = PipelineStats()

    @property
    def watermark(self) -> float:
        """The newest event time seen (0 before any)."""
        return self._watermark

    def process(self, env: GpuEnvelope) -> list[Transition]:
        """Update every series of one host envelope; return the alert transitions."""
        return self.process_wire(gpu_wire(env))

    def process_wire(self, env: dict[str, Any]) -> list[Transition]:
        """:meth:`process` for a validated wire dict (``codec.decode_gpu_wire``)."""
        stats = self.stats
        stats.envelopes += 1
        out: list[Transition] = []
        host: str = env["host"]
        ts = float(env["ts"])
        series = self.series
        every_process = bool(self._split["process"][0])
        for gpu in env["gpus"]:
            stats.samples += 1
            mig = gpu.get("mig") or ""
            index = gpu["index"]
            fb_used, fb_total = gpu["fb_used"], gpu["fb_total"]
            procs = gpu.get("procs", ())
            g = series.get((host, index, mig, -1))
            if g is not None and gpu.get("pod") and _pod(gpu) != _pod(g.labels):
                out += self._reassigned(g, (host, index, mig, -1), ts)
                g = None
            if g is None:
                g = self._new((host, index, mig, -1), gpu, None)
            elif g.last_ts and ts <= g.last_ts:
                # Seen already: Kafka redelivers after a crash, producers retry. The GPU's
                # processes were in the same envelope, so they are duplicates too.
                stats.duplicates += 1 + len(procs)
                continue
            if g is not None:
                g.value = value = float(fb_used)
                g.detector.learn(ts, value)
                g.last_ts = ts
                g.fb_used, g.fb_total = fb_used, fb_total
                g.gpu_util = gpu.get("gpu_util")
                g.mem_copy_util = gpu.get("mem_copy_util")
                g.temp_c = gpu.get("temp_c")
                g.power_w = gpu.get("power_w")
                g.attributed = self._attributed(host, index, mig, procs)
                self._evaluate(g, "gpu", ts, out)
            for proc in procs:
                pkey = (host, index, mig, proc["pid"])
                p = series.get(pkey)
                if p is None:
                    p = self._new(pkey, gpu, proc)
                    if p is None:
                        continue
                p.value = value = float(proc["gpu_mem"])
                det = p.detector
                det.learn(ts, value)
                if ts > p.last_ts:
                    p.last_ts = ts
                p.fb_used = fb_used
                p.fb_total = fb_total
                p.rss = proc.get("rss")
                if every_process or p.watch or det.estimate is not p.estimate:
                    self._evaluate(p, "process", ts, out)
        oldest = self._oldest.get(host)
        if oldest is None or ts - oldest > self.stale_s:
            out += self._evict(host, ts, self.stale_s)
        if ts > self._watermark:
            self._watermark = ts
        if self._watermark - self._last_sweep >= self.stale_s:
            self._last_sweep = self._watermark
            now = min(self._watermark, self.sweep_mark)
            for h in list(self._by_host):
                out += self._evict(h, now, SILENT_HOST_FACTOR * self.stale_s)
        return out

    def process_batch(self, envs: list[dict[str, Any]]) -> list[Transition]:
        """:meth:`process_wire` for validated wire dicts, in order; the same transitions."""
        out: list[Transition] = []
        for env in envs:
            out += self.process_wire(env)
        return out

    def _attributed(self, host: str, index: int, mig: str, procs: Iterable[Any]) -> float | None:
        """What the GPU's processes explain of its growth: the sum of their own recent
        rates, as of their last estimates (0 when no process is seen). Unknown (None)
        while a visible process has no estimate yet (new, or warming up: a process that
        restarted and leaks again must not read as growth nobody explains)."""
        total = 0.0
        for proc in procs:
            p = self.series.get((host, index, mig, proc["pid"]))
            est = p.detector.estimate if p is not None else None
            if est is None or est.recent_gb_per_hour is None:
                return None
            total += est.recent_gb_per_hour
        return total

    def tracks(self, host: str) -> bool:
        return host in self._by_host

    def host_series(self, host: str) -> dict[SeriesKey, Series]:
        """Every series of ``host`` (for a snapshot)."""
        return {k: self.series[k] for k in self._by_host.get(host, ())}

    def adopt(self, host: str, series: dict[SeriesKey, Series]) -> int:
        """Take over a host's series from a snapshot, unless this pipeline already tracks
        the host (its own state is newer). Returns how many series it adopted."""
        if host in self._by_host or any(k[0] != host for k in series):
            return 0
        keys = sorted(series)[: self._room()]
        for k in keys:
            series[k].watch = True  # the engine may restore its alerts next
            series[k].keys.clear()  # alert labels come from the rules of this process
            self.series[k] = series[k]
        if keys:
            self._by_host[host] = set(keys)
        return len(keys)

    def forget(self, host: str) -> int:
        """Drop a host's series without resolving anything (another worker owns it now);
        returns how many were dropped."""
        keys = self._by_host.pop(host, set())
        for k in keys:
            self.series.pop(k, None)
        self._oldest.pop(host, None)
        return len(keys)

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "gpu"
    domain: ClassVar[Domain] = "host"

    def dump(self, key: str) -> dict[SeriesKey, Series]:
        return self.host_series(key)

    def status(self, key: str) -> dict[str, Any]:
        return self.host_snapshot(key)

    def charts(self, key: str) -> Iterable[ChartSeries]:
        for k, s in self.host_series(key).items():
            yield ChartSeries("gpu" if k[3] < 0 else "process", s.labels, s.last_ts, s)

    def host_snapshot(self, host: str) -> dict[str, Any]:
        """What ``ragwatch status`` shows about one host: GPUs, their processes, slopes."""
        gpus: dict[tuple[int, str], dict[str, Any]] = {}
        for key in sorted(self._by_host.get(host, ()), key=lambda k: (k[1], k[2], k[3])):
            s = self.series[key]
            signals = s.signals
            g = gpus.setdefault(
                (key[1], key[2]), {"index": key[1], "mig": key[2] or None, "procs": []}
            )
            view = {
                k: signals.get(k)
                for k in (
                    "fb_used_bytes",
                    "fb_total_bytes",
                    "gb_per_hour",
                    "mem_increase_gb",
                    "tte_h",
                )
            }
            if key[3] == -1:
                g.update(
                    view,
                    name=s.labels.get("gpu_name"),
                    uuid=s.labels.get("uuid"),
                    gpu_util=signals.get("gpu_util"),
                    ts=s.last_ts,
                    **{k: s.labels[k] for k in POD_LABELS if k in s.labels},
                )
            else:
                proc: dict[str, Any] = {
                    "pid": key[3],
                    "name": s.labels["process"],
                    "container": s.labels["container"],
                    "gpu_mem_bytes": signals.get("gpu_mem_bytes"),
                    "gb_per_hour": view["gb_per_hour"],
                }
                proc.update((k, s.labels[k]) for k in PROCESS_POD_LABELS if k in s.labels)
                g["procs"].append(proc)
        top = [g for g in gpus.values() if "ts" in g]
        return {
            "host": host,
            "gpus": list(gpus.values()),
            "top_gpus": {
                "util": _top(top, "gpu_util", TOP_K),
                "memory": _top(top, "fb_used_bytes", TOP_K),
                "growth": _top(top, "gb_per_hour", TOP_K),
            },
        }

    # ------------------------------------------------------------------ internals

    def _room(self) -> int:
        """How many more series fit: under ``max_series`` and the worker's budget."""
        return min(self.max_series - len(self.series), self.budget.room())

    def _new(
        self, key: SeriesKey, gpu: dict[str, Any], proc: dict[str, Any] | None
    ) -> Series | None:
        if self._room() <= 0:
            self.stats.dropped_samples += 1
            if _worth_logging(self.stats.dropped_samples):
                log.warning(
                    "series cap %d reached: dropped new series host=%s gpu=%d (dropped so far: %d)",
                    self.max_series,
                    key[0],
                    key[1],
                    self.stats.dropped_samples,
                )
            return None
        if len(self._by_host.get(key[0], ())) >= self.max_series_per_host:
            self.stats.dropped_host_cap += 1
            if _worth_logging(self.stats.dropped_host_cap):
                log.warning(
                    "host %s has %d series (max_series_per_host): dropped new series gpu=%d "
                    "(dropped so far: %d)",
                    key[0],
                    self.max_series_per_host,
                    key[1],
                    self.stats.dropped_host_cap,
                )
            return None
        labels = {"host": key[0], "gpu": str(key[1]), "uuid": gpu["uuid"], "mig": key[2]}
        if proc is None:
            labels["gpu_name"] = gpu["name"]
            labels.update(_pod_labels(gpu, POD_LABELS))
        else:
            labels.update(
                pid=str(proc["pid"]),
                process=proc["name"],
                container=proc.get("container") or "none",
            )
            labels.update(_pod_labels(proc, PROCESS_POD_LABELS))
        s = Series(labels=labels, detector=self._factory(), gpu=proc is None)
        self.series[key] = s
        self._by_host.setdefault(key[0], set()).add(key)
        return s

    def _drop(self, key: SeriesKey) -> Series:
        """Stop tracking one series (its host's set may be left empty: the caller tidies)."""
        s = self.series.pop(key)
        self._by_host[key[0]].discard(key)
        self.stats.evicted_series += 1
        return s

    def _reassigned(self, g: Series, key: SeriesKey, ts: float) -> list[Transition]:
        """A GPU now allocated to another pod: a new workload, so a new series (a fresh
        baseline), and the old one's alerts resolved as gone."""
        self._drop(key)
        note = f"the device was allocated to pod {g.labels.get('pod', '?')}, now to another"
        return self.engine.clear_fingerprints((fp for _, fp in g.keys.values()), ts, note)

    def _evaluate(self, s: Series, kind: str, ts: float, out: list[Transition]) -> None:
        every, on_estimate = self._split[kind]
        est = s.detector.estimate
        changed = est is not s.estimate
        s.estimate = est
        signals: dict[str, float | None] | None = None
        engine = self.engine
        for rule in every:
            signals = signals or s.signals
            self._evaluate_rule(s, rule, signals, ts, out)
        watched, watch = s.watch, False
        for rule in on_estimate:
            fp = self._key(s, rule)[1]
            if changed or watched or engine.is_active(fp):
                signals = signals or s.signals
                self._evaluate_rule(s, rule, signals, ts, out)
                # active, or inactive with its expr holding (a `resolve` condition ended it
                # while the expr still held): evaluated on the next sample too
                watch = watch or engine.is_active(fp) or rule.holds(signals)
        s.watch = watch

    def _key(self, s: Series, rule: Rule) -> tuple[dict[str, str], str]:
        key = s.keys.get(rule.name)
        if key is None:
            key = s.keys[rule.name] = self.engine.alert_key(rule, s.labels)
        return key

    def _evaluate_rule(
        self,
        s: Series,
        rule: Rule,
        signals: dict[str, float | None],
        ts: float,
        out: list[Transition],
    ) -> None:
        labels, fp = self._key(s, rule)
        t = self.engine.evaluate_key(rule, labels, fp, signals, ts)
        if t is not None:
            out.append(t)

    def _evict(self, host: str, now: float, stale_s: float) -> list[Transition]:
        out: list[Transition] = []
        keys = self._by_host.get(host, set())
        for key in [k for k in keys if now - self.series[k].last_ts > stale_s]:
            s = self._drop(key)
            match: dict[str, str] = {
                k: s.labels[k] for k in ("host", "gpu", "mig", "pid") if k in s.labels
            }
            out += self.engine.clear(match, now)
        if keys:
            self._oldest[host] = min(self.series[k].last_ts for k in keys)
        else:
            self._by_host.pop(host, None)
            self._oldest.pop(host, None)
            self.swept.add(host)
        return out
