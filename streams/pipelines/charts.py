"""Recent points of the series people look at, for ``/api/v1/series/{id}`` and charts.

The worker keeps the current state of every series; this module takes a point of each
chart series every ``step_s`` of **event time** (one a minute), as the state moves on: the
pipelines tell :meth:`SeriesRecorder.observe` which hosts and services moved on after each
wave of envelopes, and every second the worker appends what it took
(:meth:`SeriesRecorder.take`) to Redis (:meth:`RedisState.write_series`, a list of the
newest 1,440 points per series). So a replay at 720x, or as fast as the CPU allows, draws
the same charts as the same telemetry played in real time (sampling the state once a
second of wall time gave a point per 12 minutes of event time at 720x). The recorder
reads the signals of the pipeline whose series moved, never the fleet. Points are
``[ts, value, forecast, score]`` (forecast and score None where the series has none); a
chart of a signal the generic detector scores (``band``) has ``[ts, value, expected,
score, lower, upper]``: its expected value, score and band (:mod:`.scoring`), the small
multiples of an alert's page. The charts (:data:`CHARTS`):

========================================  ==============================================
series id                                 value, forecast, score
========================================  ==============================================
``service:SVC:INSTANCE:tokens_per_s``     output tokens/s, seasonal baseline, score
``service:SVC:INSTANCE:tokens_per_req``   tokens/request, forecast, score
``service:SVC:INSTANCE:decode_tps``       decode speed per request (median), its
                                          baseline, none
``service:SVC:INSTANCE:errors``           share of failed requests, the usual share,
                                          none (only when a rule charts it)
``service:SVC:INSTANCE:queue_p95``        queue wait P95 ms (newest requests), its
                                          baseline, none (only when a rule charts it)
``service:SVC:INSTANCE:ttft_net_p95``     TTFT less queue wait P95 ms, its baseline,
                                          none (only when a rule charts it)
``service:SVC:INSTANCE:retriever_p99``    retriever P99 ms, its baseline, none
``service:SVC:INSTANCE:e2e_p95``          e2e P95 ms, its baseline, none
``service:SVC:INSTANCE:STAGE_p95``        the retriever's, reranker's, LLM's P95 ms,
                                          expected, score, band
``service:SVC:INSTANCE:outliers``         outlier requests per bucket, none, none (only
                                          when a rule charts it)
``service:SVC:INSTANCE:SIGNAL``           a signal a service rule is about that no chart
                                          above holds, its ``expected`` signal, none
``gpu:HOST:GPU[:MIG]:fb_used``            framebuffer bytes, none, none
``gpu:HOST:GPU[:MIG]:gpu_util``           utilisation %, expected, score, band
``gpu:HOST:GPU[:MIG]:power_w``            power W, expected, score, band
``process:HOST:GPU[:MIG]:PID:gpu_mem``    the process's GPU bytes, none, leak score
``engine:HOST:TARGET:tokens_per_s``       generated tokens/s, forecast, score
========================================  ==============================================

Which chart shows a rule's alerts is read from the rule (:func:`charts_for`): the chart
of its series that holds its first ``expr`` signal or its ``expected`` signal, else the
chart that signal is derived from (``retriever_p99_ratio`` is the retriever P99 over its
baseline), else the memory of a GPU, a process or a device event's process, or the
generated tokens/s of an engine; a service rule about any other signal gets a chart of
that signal. Each series' index entry lists the rules it charts (``rules``), and
:func:`~ragwatch.chart_ids.alert_series` finds an alert's series in the index with it.

>>> from ragwatch.agents.scenario import build
>>> from ragwatch.streams.pipelines.fleet import Pipelines
>>> from ragwatch.streams.alerting.rules import load_rules
>>> pipes = Pipelines(load_rules())
>>> for env in build("leak", hosts=1, gpus=1, services=1, interval_s=60.0).envelopes(hours=1):
...     _ = pipes.process(env)
>>> rec = SeriesRecorder(pipes.rules)
>>> rec.observe(pipes.gpus, [("gpu-node-01", env.ts)])
>>> rec.observe(pipes.requests, [("rag-api", env.ts)])
>>> points = rec.take()
>>> len(points)  # the GPU's 3, its 2 processes', and 12 charts of each of the 2 instances
29
>>> print(*points["process:gpu-node-01:0:4001:gpu_mem"][0]["rules"])
GpuMemoryLeak GpuMemoryLeakSlow GpuOomKill GpuXidCritical
>>> for sid in sorted(points)[5:17]:  # an instance's: each default rule on its chart
...     print(sid, *points[sid][0]["rules"])
service:rag-api:rag-api-0:decode_tps DecodeSpeedDrop ReplicaDecodeOutlier
service:rag-api:rag-api-0:e2e_p95 E2eLatencyDeviation ReplicaLatencyOutlier ServiceAnomaly
service:rag-api:rag-api-0:errors ErrorRateHigh ReplicaErrorsOutlier
service:rag-api:rag-api-0:llm_p95
service:rag-api:rag-api-0:outliers RequestOutlierCluster
service:rag-api:rag-api-0:queue_p95 QueueWaitHigh
service:rag-api:rag-api-0:reranker_p95
service:rag-api:rag-api-0:retriever_p95
service:rag-api:rag-api-0:retriever_p99 RetrievalSlowdown ReplicaRetrievalOutlier
service:rag-api:rag-api-0:tokens_per_req TokensPerRequestDrop ReplicaTokensOutlier
service:rag-api:rag-api-0:tokens_per_s ThroughputDrop
service:rag-api:rag-api-0:ttft_net_p95 TtftDeviation
>>> rec.observe(pipes.gpus, [("gpu-node-01", env.ts)]); rec.take()  # nothing new since
{}

As the worker uses it: told by each pipeline after each of its waves (:meth:`.fleet.
Pipelines.tap`), taken once a second, a point a minute of event time whatever the batches:

>>> pipes = Pipelines(load_rules())
>>> rec = SeriesRecorder(pipes.rules)
>>> pipes.tap(rec.observe)
>>> for env in build("leak", hosts=1, gpus=1, services=1, interval_s=10.0).envelopes(hours=1):
...     _ = pipes.process(env)
>>> meta, points = rec.take()["process:gpu-node-01:0:4001:gpu_mem"]
>>> len(points), points[1][0] - points[0][0]
(60, 60.0)
>>> rec.take()
{}
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ragwatch.catalog import SCORE_SUMMARY
from ragwatch.chart_ids import series_prefix
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import ChartReader, ChartSeries

Point = list[float | None]
# kind -> the charts recorded for each series of that kind, with their index entry
# (less the series' labels)
Plan = dict[str, tuple[tuple["Chart", dict[str, Any]], ...]]


class _HasSignals(Protocol):
    @property
    def signals(self) -> Mapping[str, float | None]: ...


@runtime_checkable
class _HasBands(_HasSignals, Protocol):
    """A series the generic detector scores (a GPU's, a process', an instance's)."""

    def bands(self) -> Mapping[str, list[float | None]]: ...


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart of each series of a ``kind``: id ``kind:WHERE:suffix``."""

    kind: str  # gpu, process, service or engine
    suffix: str
    value: str  # the signal charted
    reference: str | None = None  # its forecast or baseline, drawn beside it
    score: str | None = None  # its anomaly score in [0, 1], charted below
    unit: str = ""
    about: tuple[str, ...] = ()  # signals derived from these (ratios, deviations, flags)
    main: bool = True  # recorded whatever the rules; else only for the rules that want it
    band: bool = False  # the generic detector's expected value, score and band (.scoring)

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(s for s in (self.value, self.reference, self.score) if s)


CHARTS = (
    Chart("gpu", "fb_used", "fb_used_bytes", unit="bytes"),
    Chart("gpu", "gpu_util", "gpu_util", unit="%", band=True),
    Chart("gpu", "power_w", "power_w", unit="W", band=True),
    Chart("process", "gpu_mem", "gpu_mem_bytes", score="leak_score", unit="bytes"),
    Chart("engine", "tokens_per_s", "generation_tokens_per_s", "tps_forecast", "tps_score",
          "tokens/s", ("tps_deviation",)),
    Chart("service", "tokens_per_s", "output_tokens_per_s", "tps_forecast", "tps_score",
          "tokens/s", ("tps_deviation", "tps_z")),
    Chart("service", "tokens_per_req", "tokens_per_request", "tpr_forecast", "tpr_score",
          "tokens", ("tpr_deviation", "tpr_z")),
    # what the service controls (docs/rules.md, "Demand is context"): the decode speed is
    # the seed's symptom, charted whatever the rules; the others when a rule reads them
    Chart("service", "decode_tps", "decode_tps", "decode_baseline_tps", unit="tokens/s",
          about=("decode_deviation", "decode_z")),
    Chart("service", "errors", "errors_ratio", "errors_baseline", unit="ratio", main=False,
          about=("errors_z", "window_errors")),
    Chart("service", "queue_p95", "queue_recent_p95_ms", "queue_p95_baseline_ms", unit="ms",
          main=False, about=("queue_p95_ratio", "queue_p95_excess_ms")),
    Chart("service", "ttft_net_p95", "ttft_net_p95_ms", "ttft_net_p95_baseline_ms",
          unit="ms", main=False, about=("ttft_net_p95_ratio", "ttft_net_p95_excess_ms")),
    Chart("service", "retriever_p99", "retriever_p99_ms", "retriever_p99_baseline_ms",
          unit="ms", about=("retriever_p99_ratio",)),
    Chart("service", "e2e_p95", "e2e_p95_ms", "e2e_p95_baseline_ms", unit="ms",
          about=("e2e_p95_ratio",)),
    *(Chart("service", f"{stage}_p95", f"{stage}_p95_ms", unit="ms", band=True)
      for stage in ("retriever", "reranker", "llm")),
    Chart("service", "outliers", "outliers", unit="requests", main=False,
          about=("recent_outliers", "outlier_ratio", "new_outlier_cluster",
                 "outlier_cluster_size")),
)  # fmt: skip
# the chart of a host's series that shows its alerts when no chart holds their signal
MAIN = {
    kind: next(c for c in CHARTS if (c.kind, c.suffix) == (kind, suffix))
    for kind, suffix in (("gpu", "fb_used"), ("process", "gpu_mem"), ("engine", "tokens_per_s"))
}
# the chart of a series that shows its generic anomaly alerts (which signals moved is the
# advisor's: ragwatch explain): its main chart; an instance's end-to-end P95
GENERIC = {**MAIN, "service": next(c for c in CHARTS if c.suffix == "e2e_p95")}
# device events are not charted: their alerts show the process's memory, then its GPU's
EVENT_CHARTS = (MAIN["process"], MAIN["gpu"])
UNITS = (("_ms", "ms"), ("_bytes", "bytes"), ("_per_s", "/s"), ("_ratio", "ratio"))


def _unit(signal: str) -> str:
    return next((unit for end, unit in UNITS if signal.endswith(end)), "")


def charts_for(rule: Rule) -> tuple[Chart, ...]:
    """The charts that show what ``rule`` is about, best first (none if its series is
    not charted)."""
    if rule.series == "event":
        return EVENT_CHARTS
    if rule.conditions[0].signal in SCORE_SUMMARY:  # the generic anomaly rules (the signals
        return (GENERIC[rule.series],) if rule.series in GENERIC else ()  # are the advisor's)
    own = [c for c in CHARTS if c.kind == rule.series]
    if not own:
        return ()
    signal = rule.conditions[0].signal
    expected = rule.expected if isinstance(rule.expected, str) else None
    found = (
        next((c for c in own if signal in c.signals), None)
        or next((c for c in own if expected in c.signals), None)
        or next((c for c in own if signal in c.about), None)
        # what it reports (a replica rule reads replica_*_deviant, reports the latency)
        or next((c for c in own if rule.value_signal in c.signals), None)
    )
    if found is not None:
        return (found,)
    if rule.series in MAIN:
        return (MAIN[rule.series],)
    return (Chart(rule.series, signal, signal, expected, unit=_unit(signal), main=False),)


def chart_plan(rules: Iterable[Rule]) -> Plan:
    """What to record: the main charts and those ``rules`` need, each with its index
    entry (``rules``: the rules it charts)."""
    charted = {(c.kind, c.suffix): (c, list[str]()) for c in CHARTS if c.main}
    for rule in rules:
        for c in charts_for(rule):
            charted.setdefault((c.kind, c.suffix), (c, []))[1].append(rule.name)
    plan: dict[str, list[tuple[Chart, dict[str, Any]]]] = {}
    for c, names in charted.values():
        meta: dict[str, Any] = {"kind": c.kind, "signal": c.value, "unit": c.unit, "rules": names}
        if c.band:  # its points: [ts, value, expected, score, lower, upper]
            meta["band"] = True
        plan.setdefault(c.kind, []).append((c, meta))
    return {kind: tuple(charts) for kind, charts in plan.items()}


class SeriesRecorder:
    """Remembers what it already emitted, so each point is written once: for at most
    ``max_tracked`` series (beyond, the least recently written is forgotten, and its next
    point may be written a second time); :meth:`forget` drops swept hosts' series.

    :meth:`observe` as the state of hosts and services moves on, :meth:`take` what was
    observed since the last take (many points per series between two writes, at most
    ``keep`` of each kept)."""

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        step_s: float = 60.0,
        max_tracked: int = 200_000,
        keep: int = 1440,
    ) -> None:
        """``rules``: all of them (which chart holds which alert: :func:`chart_plan`)."""
        self.plan: Plan = chart_plan(rules)
        self.step_s = step_s
        self.max_tracked = max_tracked
        self.keep = keep
        self._last: dict[str, float] = {}  # series id -> ts of the last point emitted
        # a series' id prefix -> the event time before which none of its charts is due
        # (the least of their last points + step_s): one look instead of one per chart
        self._quiet: dict[str, float] = {}
        # (pipeline, key) -> the event time before which none of its series is due, when
        # every chart of every series of it has a point (a series new to it gets its first
        # point up to step_s late): one look per envelope instead of one per series
        self._key_quiet: dict[tuple[str, str], float] = {}
        self._taken: dict[str, tuple[dict[str, Any], deque[Point]]] = {}  # observed, to take

    def observe(self, source: ChartReader, moved: Iterable[tuple[str, float]]) -> None:
        """The state of these keys of the pipeline ``source`` moved on to (key, event
        time): keep a point of each of their series that is due, for :meth:`take`. Told
        after each wave of envelopes, every point is taken at the first state at least
        ``step_s`` after the last one: the same points whatever the batches and the speed."""
        quiet, name = self._key_quiet, source.name
        due = {k for k, ts in moved if ts >= quiet.get((name, k), -math.inf)}
        if not due:
            return
        plan = self.plan
        out: dict[str, tuple[dict[str, Any], Point]] = {}
        ends: dict[str, list[float | None]] = {k: [] for k in due}
        owner = "service" if source.domain == "service" else "host"
        for c in source.charts(due):  # (read together: their signals cost less so)
            self._add(out, plan.get(c.kind, ()), c)
            where = c.where or series_prefix(c.kind, c.labels)
            ends.setdefault(c.labels.get(owner, ""), []).append(self._quiet.get(where))
        for k in due:
            quiet.pop((name, k), None)
            if ends[k] and None not in ends[k]:
                quiet[(name, k)] = min(e for e in ends[k] if e is not None)
                if len(quiet) > self.max_tracked:
                    del quiet[next(iter(quiet))]
        for sid, (meta, point) in out.items():
            if sid not in self._taken:
                self._taken[sid] = (meta, deque(maxlen=self.keep))
            self._taken[sid][1].append(point)

    def take(self) -> dict[str, tuple[dict[str, Any], list[Point]]]:
        """series id -> (its index entry, its points observed since the last take, oldest
        first)."""
        taken, self._taken = self._taken, {}
        return {sid: (meta, list(points)) for sid, (meta, points) in taken.items()}

    def _due(self, sid: str, ts: float) -> bool:
        last = self._last.get(sid)
        return last is None or ts - last >= self.step_s

    @property
    def tracked(self) -> int:
        """How many series ids it remembers (at most ``max_tracked``)."""
        return len(self._last)

    def forget(self, prefixes: tuple[str, ...]) -> list[str]:
        """Stop tracking the series whose ids start with one of ``prefixes``; their ids."""
        gone = [sid for sid in self._last if sid.startswith(prefixes)] if prefixes else []
        for sid in gone:
            del self._last[sid]
        for where in [w for w in self._quiet if w.startswith(prefixes)] if prefixes else []:
            del self._quiet[where]
        for sid in [s for s in self._taken if s.startswith(prefixes)] if prefixes else []:
            del self._taken[sid]
        self._key_quiet.clear()  # (cheap to learn again: one look at each key)
        return gone

    def _written(self, sid: str, ts: float) -> None:
        """Remember a point; beyond ``max_tracked`` series, forget the one written least
        recently (it was never refused a chart: a new series always gets one)."""
        self._last.pop(sid, None)
        self._last[sid] = ts  # the dict's order: least recently written first
        if len(self._last) > self.max_tracked:
            del self._last[next(iter(self._last))]

    def _add(
        self,
        out: dict[str, tuple[dict[str, Any], Point]],
        charts: tuple[tuple[Chart, dict[str, Any]], ...],
        series: ChartSeries,
    ) -> None:
        kind, labels, ts = series.kind, series.labels, series.ts
        where = series.where or series_prefix(kind, labels)
        if ts < self._quiet.get(where, -math.inf):
            return
        due = [(sid, c, meta) for c, meta in charts if self._due(sid := where + c.suffix, ts)]
        if due:  # (signals read only then: a GPU series computes them when read)
            self._emit(out, due, labels, ts, series.holder)
        self._quiet.pop(where, None)
        lasts = [self._last.get(where + c.suffix) for c, _ in charts]
        if lasts and None not in lasts:
            self._quiet[where] = min(x for x in lasts if x is not None) + self.step_s
            if len(self._quiet) > self.max_tracked:
                del self._quiet[next(iter(self._quiet))]

    def _emit(
        self,
        out: dict[str, tuple[dict[str, Any], Point]],
        due: list[tuple[str, Chart, dict[str, Any]]],
        labels: Mapping[str, str],
        ts: float,
        holder: _HasSignals,
    ) -> None:
        """The due points; a series taken already since the last :meth:`take` (its index
        entry is held) gets the plan's entry as it is, not a copy with its labels."""
        signals, bands = holder.signals, None
        for sid, chart, meta in due:
            v = signals.get(chart.value)
            if v is None:
                continue
            self._written(sid, ts)
            entry = meta if sid in self._taken else {**meta, "labels": dict(labels)}
            if chart.band:
                if bands is None:
                    bands = holder.bands() if isinstance(holder, _HasBands) else {}
                score, yhat, lower, upper = (bands.get(chart.value) or [None] * 4)[:4]
                out[sid] = (entry, [ts, v, yhat, score, lower, upper])
                continue
            ref = signals.get(chart.reference) if chart.reference else None
            score = signals.get(chart.score) if chart.score else None
            out[sid] = (entry, [ts, v, ref, score])
