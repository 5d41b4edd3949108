"""Recent points of the series people look at, for ``/api/v1/series/{id}`` and charts.

The worker keeps the current state of every series; this module picks, for the hosts and
services that changed, a new point per chart series at most every ``step_s`` of event
time, and the worker appends it to Redis (:meth:`RedisState.write_series`, a capped
list per series). Points are ``[ts, value, forecast, score]`` (forecast and score None
where the series has none):

========================================  ==============================================
series id                                 value, forecast, score
========================================  ==============================================
``service:SVC:INSTANCE:tokens_per_s``     output tokens/s, Holt-Winters forecast, score
``service:SVC:INSTANCE:tokens_per_req``   tokens/request, forecast, score
``service:SVC:INSTANCE:retriever_p99``    retriever P99 ms, its baseline, none
``service:SVC:INSTANCE:e2e_p95``          e2e P95 ms, its baseline, none
``gpu:HOST:GPU[:MIG]:fb_used``            framebuffer bytes, none, none
``process:HOST:GPU[:MIG]:PID:gpu_mem``    the process's GPU bytes, none, leak score
``engine:HOST:TARGET:tokens_per_s``       generated tokens/s, forecast, score
========================================  ==============================================

>>> from ragwatch.agents.scenario import build
>>> from ragwatch.streams.pipelines import Pipelines
>>> from ragwatch.streams.rules import load_rules
>>> pipes = Pipelines(load_rules())
>>> for env in build("leak", hosts=1, gpus=1, services=1, interval_s=60.0).envelopes(hours=1):
...     _ = pipes.process(env)
>>> rec = SeriesRecorder()
>>> points = rec.collect(pipes, {"gpu-node-01"}, {"rag-api"})
>>> for sid in sorted(points):
...     print(sid, points[sid][1][1:])
gpu:gpu-node-01:0:fb_used ...
process:gpu-node-01:0:2000:gpu_mem ...
process:gpu-node-01:0:4001:gpu_mem ...
service:rag-api:rag-api-0:e2e_p95 ...
>>> rec.collect(pipes, {"gpu-node-01"}, {"rag-api"})  # nothing new since
{}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ragwatch.streams.pipelines import Pipelines

Point = list[float | None]


class _HasSignals(Protocol):
    @property
    def signals(self) -> Mapping[str, float | None]: ...


# service signals charted: (series suffix, value, forecast or baseline, score, unit)
SERVICE_CHARTS = (
    ("tokens_per_s", "output_tokens_per_s", "tps_forecast", "tps_score", "tokens/s"),
    ("tokens_per_req", "tokens_per_request", "tpr_forecast", "tpr_score", "tokens"),
    ("retriever_p99", "retriever_p99_ms", "retriever_p99_baseline_ms", None, "ms"),
    ("e2e_p95", "e2e_p95_ms", "e2e_p95_baseline_ms", None, "ms"),
)


class SeriesRecorder:
    """Remembers what it already emitted, so each point is written once."""

    def __init__(self, step_s: float = 60.0, max_tracked: int = 200_000) -> None:
        self.step_s = step_s
        self.max_tracked = max_tracked
        self._last: dict[str, float] = {}  # series id -> ts of the last point emitted

    def collect(
        self, pipes: Pipelines, hosts: Iterable[str], services: Iterable[str]
    ) -> dict[str, tuple[dict[str, Any], Point]]:
        """series id -> (its index entry, the new point) for what changed."""
        out: dict[str, tuple[dict[str, Any], Point]] = {}
        for host in hosts:
            for key, s in pipes.gpus.host_series(host).items():
                _, gpu, mig, pid = key
                where = f"{host}:{gpu}" + (f":{mig}" if mig else "")
                if pid < 0:
                    sid = f"gpu:{where}:fb_used"
                    meta = {"kind": "gpu", "labels": s.labels, "signal": "fb_used_bytes"}
                    self._add(out, sid, meta, "bytes", s.last_ts, s, "fb_used_bytes")
                else:
                    sid = f"process:{where}:{pid}:gpu_mem"
                    meta = {"kind": "process", "labels": s.labels, "signal": "gpu_mem_bytes"}
                    self._add(
                        out, sid, meta, "bytes", s.last_ts, s, "gpu_mem_bytes",
                        score="leak_score",
                    )  # fmt: skip
            for (_, target), e in pipes.metrics.host_series(host).items():
                sid = f"engine:{host}:{target}:tokens_per_s"
                meta = {"kind": "engine", "labels": e.labels, "signal": "generation_tokens_per_s"}
                self._add(
                    out, sid, meta, "tokens/s", e.last_ts, e, "generation_tokens_per_s",
                    forecast="tps_forecast", score="tps_score",
                )  # fmt: skip
        for service in services:
            series, _ = pipes.requests.service_state(service)
            for (_, inst), svc in series.items():
                if svc.bucket_end is None:
                    continue
                for suffix, value, forecast, score, unit in SERVICE_CHARTS:
                    sid = f"service:{service}:{inst}:{suffix}"
                    meta = {"kind": "service", "labels": svc.labels, "signal": value}
                    self._add(
                        out, sid, meta, unit, svc.bucket_end, svc, value,
                        forecast=forecast, score=score,
                    )  # fmt: skip
        return out

    def _add(
        self,
        out: dict[str, tuple[dict[str, Any], Point]],
        sid: str,
        meta: dict[str, Any],
        unit: str,
        ts: float,
        series: _HasSignals,
        value: str,
        *,
        forecast: str | None = None,
        score: str | None = None,
    ) -> None:
        last = self._last.get(sid)
        if last is not None and ts - last < self.step_s:
            return  # before reading signals: a GPU series computes them when read
        if last is None and len(self._last) >= self.max_tracked:
            return
        signals = series.signals
        v = signals.get(value)
        if v is None:
            return
        self._last[sid] = ts
        point: Point = [
            ts,
            v,
            signals.get(forecast) if forecast else None,
            signals.get(score) if score else None,
        ]
        out[sid] = ({**meta, "unit": unit}, point)
