"""From ``ragwatch.gpu`` envelopes to per-GPU and per-process signals and alert transitions.

Plain Python (no Faust): the Faust agent in :mod:`ragwatch.streams.app` feeds decoded
envelopes into :meth:`GpuPipeline.process`, and so can a test or a replay.

Series:

- ``gpu``: one per (host, GPU index, MIG instance), a leak detector on ``fb_used``;
- ``process``: one per (host, GPU, MIG, pid), a leak detector on its GPU memory. A new
  pid is a new series, so a restart resets the detector.

A series not seen for ``stale_s`` of event time (the process exited, the GPU vanished)
is forgotten and its active alerts resolve. A host that goes silent altogether is swept
the same way once the pipeline's event-time high-water mark is ``12 * stale_s`` past its
last sample (the margin tolerates partitions that are consumed at different paces).
Samples of new series beyond ``max_series`` are dropped and counted.

>>> from ragwatch.agents.sim import FleetSimulator, SimConfig
>>> from ragwatch.streams.rules import load_rules
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragwatch.detectors import make
from ragwatch.detectors.leak import GB, LeakDetector
from ragwatch.schema import GpuEnvelope, GpuSample, ProcessSample
from ragwatch.streams.engine import AlertEngine, Transition
from ragwatch.streams.rules import Rule

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


def _leak() -> LeakDetector:
    det = make("leak")
    assert isinstance(det, LeakDetector)
    return det


@dataclass
class Series:
    """One tracked series: its labels, detector and latest raw values."""

    labels: dict[str, str]
    detector: LeakDetector
    last_ts: float = 0.0
    signals: dict[str, float | None] = field(default_factory=dict)


@dataclass
class PipelineStats:
    envelopes: int = 0
    samples: int = 0
    dropped_samples: int = 0  # samples of series that did not fit under max_series
    evicted_series: int = 0
    duplicates: int = 0  # samples not newer than their series' last one (a replay, a retry)


class GpuPipeline:
    """Tracks every GPU and process series and evaluates the rules on them."""

    def __init__(
        self,
        rules: list[Rule],
        engine: AlertEngine | None = None,
        *,
        detector_factory: Callable[[], LeakDetector] = _leak,
        max_series: int = 100_000,
        stale_s: float = 300.0,
    ) -> None:
        self.rules = {s: [r for r in rules if r.series == s] for s in ("gpu", "process")}
        self.engine = engine or AlertEngine()
        self._factory = detector_factory
        self.max_series = max_series
        self.stale_s = stale_s
        self.series: dict[SeriesKey, Series] = {}
        self._by_host: dict[str, set[SeriesKey]] = {}
        self._watermark = 0.0
        self._last_sweep = 0.0
        self.stats = PipelineStats()

    def process(self, env: GpuEnvelope) -> list[Transition]:
        """Update every series of one host envelope; return the alert transitions."""
        self.stats.envelopes += 1
        out: list[Transition] = []
        for gpu in env.gpus:
            self.stats.samples += 1
            gkey: SeriesKey = (env.host, gpu.index, gpu.mig or "", -1)
            g = self._series(gkey, env, gpu, None)
            if g is not None and g.last_ts and env.ts <= g.last_ts:
                # Seen already: Kafka redelivers after a crash, producers retry. The GPU's
                # processes were in the same envelope, so they are duplicates too.
                self.stats.duplicates += 1 + len(gpu.procs)
                continue
            if g is not None:
                self._update(g, float(gpu.fb_used), env.ts, gpu)
                g.signals.update(
                    fb_used_ratio=gpu.fb_used / gpu.fb_total if gpu.fb_total else None,
                    gpu_util=gpu.gpu_util,
                    mem_copy_util=gpu.mem_copy_util,
                    temp_c=gpu.temp_c,
                    power_w=gpu.power_w,
                )
                self._evaluate(g, "gpu", env.ts, out)
            for proc in gpu.procs:
                p = self._series((env.host, gpu.index, gpu.mig or "", proc.pid), env, gpu, proc)
                if p is None:
                    continue
                self._update(p, float(proc.gpu_mem), env.ts, gpu)
                p.signals.update(
                    gpu_mem_bytes=float(proc.gpu_mem),
                    rss_bytes=None if proc.rss is None else float(proc.rss),
                )
                self._evaluate(p, "process", env.ts, out)
        out += self._evict(env.host, env.ts, self.stale_s)
        if env.ts > self._watermark:
            self._watermark = env.ts
        if self._watermark - self._last_sweep >= self.stale_s:
            self._last_sweep = self._watermark
            for host in list(self._by_host):
                out += self._evict(host, self._watermark, SILENT_HOST_FACTOR * self.stale_s)
        return out

    def host_series(self, host: str) -> dict[SeriesKey, Series]:
        """Every series of ``host`` (for a snapshot)."""
        return {k: self.series[k] for k in self._by_host.get(host, ())}

    def adopt(self, host: str, series: dict[SeriesKey, Series]) -> int:
        """Take over a host's series from a snapshot, unless this pipeline already tracks
        the host (its own state is newer). Returns how many series it adopted."""
        if host in self._by_host or any(k[0] != host for k in series):
            return 0
        room = max(0, self.max_series - len(self.series))
        keys = sorted(series)[:room]
        self.series.update((k, series[k]) for k in keys)
        if keys:
            self._by_host[host] = set(keys)
        return len(keys)

    def host_snapshot(self, host: str) -> dict[str, Any]:
        """What ``ragwatch status`` shows about one host: GPUs, their processes, slopes."""
        gpus: dict[tuple[int, str], dict[str, Any]] = {}
        for key in sorted(self._by_host.get(host, ()), key=lambda k: (k[1], k[2], k[3])):
            s = self.series[key]
            g = gpus.setdefault(
                (key[1], key[2]), {"index": key[1], "mig": key[2] or None, "procs": []}
            )
            view = {
                k: s.signals.get(k)
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
                    gpu_util=s.signals.get("gpu_util"),
                    ts=s.last_ts,
                )
            else:
                g["procs"].append(
                    {
                        "pid": key[3],
                        "name": s.labels["process"],
                        "container": s.labels["container"],
                        "gpu_mem_bytes": s.signals.get("gpu_mem_bytes"),
                        "gb_per_hour": view["gb_per_hour"],
                    }
                )
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

    def _series(
        self, key: SeriesKey, env: GpuEnvelope, gpu: GpuSample, proc: ProcessSample | None
    ) -> Series | None:
        s = self.series.get(key)
        if s is not None:
            return s
        if len(self.series) >= self.max_series:
            self.stats.dropped_samples += 1
            if (
                self.stats.dropped_samples in (1, 10, 100)
                or self.stats.dropped_samples % 10_000 == 0
            ):
                log.warning(
                    "series cap %d reached: dropped new series host=%s gpu=%d (dropped so far: %d)",
                    self.max_series,
                    env.host,
                    gpu.index,
                    self.stats.dropped_samples,
                )
            return None
        labels = {"host": env.host, "gpu": str(gpu.index), "uuid": gpu.uuid, "mig": gpu.mig or ""}
        if proc is None:
            labels["gpu_name"] = gpu.name
        else:
            labels.update(pid=str(proc.pid), process=proc.name, container=proc.container or "none")
        s = Series(labels=labels, detector=self._factory())
        self.series[key] = s
        self._by_host.setdefault(env.host, set()).add(key)
        return s

    def _update(self, s: Series, value: float, ts: float, gpu: GpuSample) -> None:
        s.detector.learn_one({"value": value, "t": ts})
        s.last_ts = max(s.last_ts, ts)
        est = s.detector.estimate
        fb_used = gpu.fb_used
        free = gpu.fb_total - fb_used
        tte = est.time_to_exhaustion(free) if est else None
        if est and free <= 0:
            tte = 0.0  # full: nothing left, whatever the recent slope says
        elif est and tte is None:
            tte = math.inf  # not growing: never
        s.signals.update(
            fb_used_bytes=float(fb_used),
            fb_total_bytes=float(gpu.fb_total),
            mem_increase_bytes=est.increase_bytes if est else None,
            mem_increase_gb=est.increase_bytes / GB if est else None,
            mem_slope_bytes_per_s=est.slope_bytes_per_s if est else None,
            gb_per_hour=est.gb_per_hour if est else None,
            window_h=est.span_s / 3600 if est else None,
            leak_score=s.detector.score_one({"value": value, "t": ts}),
            mem_steadiness=est.steadiness if est else None,
            recent_gb_per_hour=est.recent_gb_per_hour if est else None,
            recent_steadiness=est.recent_steadiness if est else None,
            tte_s=tte,
            tte_h=None if tte is None else tte / 3600,
        )

    def _evaluate(self, s: Series, kind: str, ts: float, out: list[Transition]) -> None:
        for rule in self.rules[kind]:
            t = self.engine.evaluate(rule, s.labels, s.signals, ts)
            if t is not None:
                out.append(t)

    def _evict(self, host: str, now: float, stale_s: float) -> list[Transition]:
        out: list[Transition] = []
        keys = self._by_host.get(host, set())
        for key in [k for k in keys if now - self.series[k].last_ts > stale_s]:
            s = self.series.pop(key)
            keys.discard(key)
            self.stats.evicted_series += 1
            match: dict[str, str] = {
                k: s.labels[k] for k in ("host", "gpu", "mig", "pid") if k in s.labels
            }
            out += self.engine.clear(match, now)
        if not keys:
            self._by_host.pop(host, None)
        return out
