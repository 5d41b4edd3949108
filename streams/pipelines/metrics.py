"""From ``ragwatch.metrics`` (scraped serving-engine metrics) to per-engine rates and alerts.

Plain Python (no Faust): the worker feeds decoded :class:`MetricsEnvelope` s (one scrape of
one target) into :meth:`MetricsPipeline.process`, and so can a test or a replay.

Series ``engine``: one per (host, target), labels ``host`` and ``target``. The agent has
already renamed vLLM, SGLang, llama.cpp, TGI, TEI and Triton metrics to engine-neutral
``ragwatch_*`` names
(:mod:`ragwatch.agents.prom_map`); counters arrive cumulative, as scraped. Each counter
series (one label set) becomes a rate over the last ``window_s`` of event time, with
Prometheus' reset handling: a value below the previous one means the counter restarted
from zero (the server restarted), so the increase is the new value, never a negative
rate or a drop to zero; resets are counted (``counter_resets``). A value that would mean
more than ``MAX_COUNTER_RATE`` (10^12) a second, or a reset to a negative value, is
garbage: the counter starts over from it (its window dropped), counted in
``MetricsStats.implausible_counters``, so no scraped number can make a rate huge or inf.
The rates and gauges of all label sets of a name are summed (ratios: the maximum), like
``sum by (instance)``:

- ``requests_per_s`` (``ragwatch_requests_total``, else succeeded + failed),
  ``errors_ratio``, ``generation_tokens_per_s``, ``prompt_tokens_per_s``,
  ``tokens_per_request`` (generation tokens / requests: the throughput ratio),
  ``preemptions_per_s``;
- mean latencies from histogram and summary ``_sum`` / ``_count`` rates: ``e2e_mean_s``,
  ``ttft_mean_s``, ``queue_mean_s``, ``tpot_mean_s``;
- gauges: ``requests_waiting``, ``requests_running``, ``kv_cache_usage_ratio``;
- a seasonal baseline (a row of the pipeline's
  :class:`~ragwatch.detectors.seasonal.SeasonalBank`, of the log of generation tokens/s, fed
  each 5-minute bucket's mean: a daily profile learnt from previous days, a level and trend,
  held while the rate deviates significantly, a new level accepted after a day) with
  ``tps_forecast``, ``tps_deviation``, ``tps_z`` (the deviation in standard deviations: the
  requests' sampling noise when the engine counts requests, plus the baseline's
  uncertainty), ``tps_score``, ``tps_held_s``, ``tps_relearned_at`` and
  ``tps_relearned_from``.

Signals are None until a counter has two points in the window. Metrics that are not in
:data:`COUNTERS` or :data:`GAUGES` are ignored here (they stay on the topic for other
consumers). A scrape not newer than the series' last one is a duplicate and dropped. A
series silent for ``stale_s`` is forgotten and its alerts resolve; at most
``max_label_sets`` label sets per engine and ``max_series`` engines are tracked (beyond:
dropped and counted).

>>> from ragwatch.schema import MetricSample, MetricsEnvelope
>>> pipe = MetricsPipeline([])
>>> def scrape(ts, tokens, requests):
...     return MetricsEnvelope("node-1", "http://vllm:8000/metrics", ts, (
...         MetricSample("ragwatch_generation_tokens_total", {}, tokens),
...         MetricSample("ragwatch_requests_succeeded_total", {}, requests)))
>>> for ts, tokens, requests in ((0.0, 0.0, 0.0), (15.0, 3000.0, 12.0), (30.0, 6000.0, 24.0),
...                              (45.0, 1500.0, 6.0)):   # the server restarted before 45
...     _ = pipe.process(scrape(1e9 + ts, tokens, requests))
>>> sig = pipe.engine_snapshot("node-1")[0]["signals"]
>>> sig["generation_tokens_per_s"], sig["tokens_per_request"], sig["counter_resets"]
(166.66666666666666, 250.0, 2.0)
"""

from __future__ import annotations

import logging
import math
import sys
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ragwatch.catalog import SCORED
from ragwatch.detectors.counts import count_z
from ragwatch.detectors.seasonal import DAY, DAY_LIMIT, SeasonalBank, SeasonalParams
from ragwatch.schema import MetricSample, MetricsEnvelope, Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import ChartSeries, Domain, Tap
from ragwatch.streams.pipelines.budget import SeriesBudget
from ragwatch.streams.pipelines.passed import Passed, PassedScores
from ragwatch.streams.pipelines.scoring import ScoreBlock, score_names

log = logging.getLogger(__name__)

BASELINE_BUCKET_S = 300.0  # one observation of the tokens/s baseline per 5 minutes
MAX_BUCKET = int(sys.float_info.max / BASELINE_BUCKET_S / 2)  # far beyond any event time
# No engine counts 10^12 of anything a second: a counter growing faster is garbage (or an
# attack: 0, 1.79e308, 0, 1.79e308 made the reset offset inf for good) and starts over.
MAX_COUNTER_RATE = 1e12
MAX_TARGETS = 64  # scraped targets per host: beyond, a new target's scrapes are dropped
HOLD_BAND, HOLD_Z = 0.1, 3.0  # the baseline holds through a deviation this large and sure
# an engine's tokens/s baseline (and the parameters its snapshot must have)
TPS_PARAMS = SeasonalParams(step_s=BASELINE_BUCKET_S)

SERIES = "engine"
SNAPSHOT_FORMAT = "engine-series/1"  # a host's engines in a snapshot: plain data, no objects
INT64 = 2**63  # msgpack carries ints in [-2**63, 2**64): beyond, as digits
SeriesKey = tuple[str, str]  # host, target
LabelKey = tuple[str, tuple[tuple[str, str], ...]]  # metric name, sorted labels
COUNTERS = (
    "ragwatch_requests_total",
    "ragwatch_requests_succeeded_total",
    "ragwatch_requests_failed_total",
    "ragwatch_generation_tokens_total",
    "ragwatch_prompt_tokens_total",
    "ragwatch_preemptions_total",
    *(
        f"ragwatch_{m}_seconds_{p}"
        for m in ("e2e", "ttft", "queue", "tpot")
        for p in ("sum", "count")
    ),
)
GAUGES = ("ragwatch_requests_waiting", "ragwatch_requests_running", "ragwatch_kv_cache_usage_ratio")


@dataclass
class _Counter:
    """One counter label set: its raw last value and, in the window, points of its
    cumulative increase (resets and implausible values accounted for)."""

    last: float
    total: float = 0.0  # the increase seen so far (what Prometheus' increase() adds up)
    points: deque[tuple[float, float]] = field(default_factory=deque)  # (ts, total)

    def add(self, ts: float, value: float, window_s: float) -> str | None:
        """One scraped value; returns ``"reset"`` (it restarted from zero: the increase is
        the new value), ``"implausible"`` (it grew faster than ``MAX_COUNTER_RATE`` a
        second, or a reset to a negative value: the counter starts over from this value,
        its window dropped, so no rate of it is ever huge, negative or inf) or None.

        >>> c = _Counter(0.0)
        >>> [c.add(t, v, 60.0) for t, v in ((15, 100.0), (30, 1.79e308), (45, 0.0), (60, 50.0))]
        [None, 'implausible', 'reset', None]
        >>> c.rate()  # 0 then 50 tokens in the 15 s since the counter started over
        1.6666666666666667
        """
        reset = value < self.last
        increase = value if reset else value - self.last
        prev = self.points[-1][0] if self.points else None
        self.last = value
        if prev is not None and not 0 <= increase <= MAX_COUNTER_RATE * max(ts - prev, 1.0):
            self.total = 0.0
            self.points.clear()
            self.points.append((ts, 0.0))
            return "implausible"
        self.total += increase
        self.points.append((ts, self.total))
        while len(self.points) > 2 and ts - self.points[1][0] >= window_s:
            self.points.popleft()  # keep one point at or beyond the window's start
        return "reset" if reset else None

    def rate(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, v0), (t1, v1) = self.points[0], self.points[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else None


@dataclass
class EngineSeries:
    """One scraped target: its counters, gauges, baseline and latest signals."""

    labels: dict[str, str]
    row: int  # its tokens/s baseline's row in the pipeline's bank (log generation tokens/s)
    counters: dict[LabelKey, _Counter] = field(default_factory=dict)
    gauges: dict[LabelKey, float] = field(default_factory=dict)
    last_ts: float = 0.0
    resets: int = 0
    signals: dict[str, float | None] = field(default_factory=dict)
    bucket: int | None = None  # the open baseline bucket, and its sums: tokens/s, requests/s
    sums: tuple[float, float, int] = (0.0, 0.0, 0)
    relearned: tuple[float, float] | None = None  # when the baseline accepted a level, from
    passed: dict[LabelKey, Passed] = field(default_factory=dict)  # scored (.passed)


@dataclass
class MetricsStats:
    envelopes: int = 0
    samples: int = 0
    counter_resets: int = 0
    implausible_counters: int = 0  # values that restarted a counter (see _Counter.add)
    duplicates: int = 0  # scrapes not newer than their series' last
    dropped_label_sets: int = 0
    dropped_series: int = 0
    evicted_series: int = 0
    passed_dropped: int = 0  # passed-through label sets beyond a target's cap, not scored


class MetricsPipeline:
    """Tracks every scraped engine and evaluates the ``engine`` rules on it."""

    def __init__(
        self,
        rules: list[Rule],
        engine: AlertEngine | None = None,
        *,
        window_s: float = 300.0,
        stale_s: float = 600.0,
        max_series: int = 10_000,
        max_targets: int = MAX_TARGETS,
        budget: SeriesBudget | None = None,
        max_label_sets: int = 256,
        scoring: bool = True,
    ) -> None:
        if not (window_s > 0 and stale_s > 0):
            raise ValueError(f"need window_s > 0 and stale_s > 0: {window_s, stale_s}")
        self.rules = [r for r in rules if r.series == SERIES]
        self.engine = engine or AlertEngine()
        self.window_s, self.stale_s = window_s, stale_s
        self.max_series, self.max_label_sets = max_series, max_label_sets
        self.max_targets = max_targets
        self.budget = budget or SeriesBudget(max_series)
        self.budget.watch(lambda: len(self.series))
        self._by_host: dict[str, set[SeriesKey]] = {}  # host -> its tracked targets
        self.swept: set[str] = set()  # hosts whose last target went silent
        self.tap: Tap | None = None
        self.series: dict[SeriesKey, EngineSeries] = {}
        self.tps = SeasonalBank(TPS_PARAMS, 16)  # every engine's baseline, a row each
        self.scores = ScoreBlock(SCORED[SERIES], on=scoring)  # its signals scored (.scoring)
        self.passed = PassedScores(on=scoring)  # the metrics it passes through, scored
        self._free: list[int] = []  # rows of dropped engines, to reuse (reset)
        self._watermark = 0.0
        self.sweep_mark = math.inf  # see GpuPipeline.sweep_mark
        self._last_sweep = 0.0
        self.stats = MetricsStats()

    @property
    def watermark(self) -> float:
        """The newest event time seen (0 before any)."""
        return max(0.0, self._watermark)

    def process(self, env: MetricsEnvelope) -> list[Transition]:
        """One scrape: update the target's rates and gauges; return the alert transitions."""
        self.stats.envelopes += 1
        self.stats.samples += len(env.samples)
        s = self._series(env.host, env.target)
        out: list[Transition] = []
        if s is not None and env.ts <= s.last_ts:
            self.stats.duplicates += 1
        elif s is not None:
            s.last_ts = env.ts
            others = self._add(s, env)
            self.passed.take(s.passed, env.ts, others)
            self.stats.passed_dropped = self.passed.dropped
            s.signals = self._signals(s, env.ts)
            self._score(s, env.ts)
            for rule in self.rules:
                t = self.engine.evaluate(rule, s.labels, s.signals, env.ts)
                if t is not None:
                    out.append(t)
        self._watermark = max(self._watermark, env.ts)
        if self._watermark - self._last_sweep >= self.stale_s:
            self._last_sweep = self._watermark
            out += self._sweep()
        if self.tap is not None:
            self.tap(self, [(env.host, env.ts)])
        return out

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "engines"
    domain: ClassVar[Domain] = "host"

    def dump(self, key: str) -> dict[str, Any]:
        """A host's engines as plain data (a snapshot: see :func:`_dump_series`)."""
        engines = self.host_series(key)
        if not engines:  # most hosts scrape none
            return {"format": SNAPSHOT_FORMAT, "series": []}
        series = [
            {
                **_dump_series(self.tps.dump([s.row]), k[1], s),
                "scores": self.scores.dump(s.row),
                "passed": self.passed.dump(s.passed),
            }
            for k, s in engines.items()
        ]
        return {"format": SNAPSHOT_FORMAT, "series": series}

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        return {k: {"engines": self.engine_snapshot(k)} for k in keys}

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        for key in keys:
            for e in self.host_series(key).values():
                yield ChartSeries("engine", e.labels, e.last_ts, e)

    def engine_snapshot(self, host: str) -> list[dict[str, Any]]:
        """What ``ragwatch status`` shows about the engines scraped on one host."""
        return [
            {
                "target": k[1],
                "ts": s.last_ts,
                "signals": dict(s.signals),
                # signal: [score, yhat, lower, upper, ...]; a passed-through metric's
                # by its selector (.passed)
                "scores": {**self.scores.scored(s.row), **self.passed.scored(s.passed)},
            }
            for k, s in self.host_series(host).items()
        ]

    def tracks(self, host: str) -> bool:
        return host in self._by_host

    def host_series(self, host: str) -> dict[SeriesKey, EngineSeries]:
        return {k: self.series[k] for k in sorted(self._by_host.get(host, ()))}

    def forget(self, host: str) -> None:
        """Drop a host's engines without resolving anything (another worker owns it now)."""
        for k in self._by_host.pop(host, ()):
            s = self.series.pop(k)
            self._free.append(s.row)
            self.passed.release(s.passed)

    def adopt(self, host: str, state: Any) -> int:
        """Take over a host's engines from a snapshot (:meth:`dump`), unless this pipeline
        has any; ValueError, with nothing changed, if the state does not fit."""
        if host in self._by_host:
            return 0
        if isinstance(state, Mapping) and state.get("format") == SNAPSHOT_FORMAT:
            series = _load_series(host, state)  # every field checked, baselines included
        else:
            raise ValueError(f"engine state of host {host} in an unknown format")
        if any(k[0] != host for k in series):
            return 0
        keys = sorted(series)[: max(0, min(self.max_targets, self._room()))]
        scores = {d.get("target"): self.scores.check(d.get("scores")) for d in state["series"]}
        passed = {
            d.get("target"): self.passed.check(d.get("passed") or []) for d in state["series"]
        }
        for k in keys:
            s, tps = series[k]
            s.row = self._row()
            if tps is not None:
                self.tps.load([s.row], tps)
            self.scores.adopt(s.row, scores.get(k[1]))
            self.passed.adopt(s.passed, passed.get(k[1]) or [])
            self.series[k] = s
        if keys:
            self._by_host[host] = set(keys)
        return len(keys)

    # ------------------------------------------------------------------ internals

    def _series(self, host: str, target: str) -> EngineSeries | None:
        s = self.series.get((host, target))
        if s is None:
            if self._room() <= 0 or len(self._by_host.get(host, ())) >= self.max_targets:
                self.stats.dropped_series += 1
                return None
            labels = {"host": host, "target": target}
            s = self.series[(host, target)] = EngineSeries(labels, self._row())
            self._by_host.setdefault(host, set()).add((host, target))
        return s

    def _row(self) -> int:
        """A fresh baseline row for a new engine: a dropped engine's, else a new one."""
        if self._free:
            row = self._free.pop()
            self.tps.reset([row])
            self.scores.release([row])
            return row
        row = len(self.series) + len(self._free)  # rows in use or free are 0 .. n - 1
        self.tps.reserve(row + 1)
        self.scores.grow(row + 1)
        return row

    def _score(self, s: EngineSeries, ts: float) -> None:
        """Score, then learn, the engine's scored signals; their scores join its signals."""
        values = [s.signals.get(n) for n in self.scores.names]
        x = np.array([[_num_or_nan(v) for v in values]], dtype=np.float64)
        # the load a demand above its expectation explains does not count (.scoring)
        read = {n: np.array([_num_or_nan(s.signals.get(n))]) for n in self.scores.evidence_reads}
        evidence = self.scores.evidence(read, 1)
        got = self.scores.update(np.array([s.row], dtype=np.intp), np.array([ts]), x, evidence)
        s.signals.update(zip(score_names(self.scores.names), got[0].tolist(), strict=True))

    def _room(self) -> int:
        """How many more engines fit: under ``max_series`` and the worker's budget."""
        return min(self.max_series - len(self.series), self.budget.room())

    def _drop(self, key: SeriesKey) -> EngineSeries:
        s = self.series.pop(key)
        self._free.append(s.row)
        self.passed.release(s.passed)
        targets = self._by_host.get(key[0], set())
        targets.discard(key)
        if not targets:
            self._by_host.pop(key[0], None)
            self.swept.add(key[0])
        return s

    def _add(self, s: EngineSeries, env: MetricsEnvelope) -> list[MetricSample]:
        """Take the scrape's counters and gauges; returns the samples it passes through
        (:mod:`.passed`)."""
        others = []
        for sample in env.samples:
            name = sample.name
            if name not in COUNTERS and name not in GAUGES:
                others.append(sample)
                continue
            key = (name, tuple(sorted(sample.labels.items())))
            if name in GAUGES:
                if key in s.gauges or len(s.gauges) + len(s.counters) < self.max_label_sets:
                    s.gauges[key] = sample.value
                else:
                    self.stats.dropped_label_sets += 1
                continue
            c = s.counters.get(key)
            if c is None:
                if len(s.gauges) + len(s.counters) >= self.max_label_sets:
                    self.stats.dropped_label_sets += 1
                    continue
                c = s.counters[key] = _Counter(sample.value)
            seen = c.add(env.ts, sample.value, self.window_s)
            if seen == "reset":
                s.resets += 1
                self.stats.counter_resets += 1
            elif seen == "implausible":
                self.stats.implausible_counters += 1
        return others

    def _signals(self, s: EngineSeries, ts: float) -> dict[str, float | None]:
        rates: dict[str, float] = {}
        generated = 0.0  # the engine's tokens so far, resets accounted for (a counter)
        for (name, _), c in s.counters.items():
            r = c.rate()
            if r is not None:
                rates[name] = rates.get(name, 0.0) + r
            if name == "ragwatch_generation_tokens_total":
                generated += c.total
        gauges: dict[str, float] = {}
        for (name, _), v in s.gauges.items():
            combine = max if name.endswith("_ratio") else float.__add__
            gauges[name] = combine(gauges[name], v) if name in gauges else v

        def ratio(num: float | None, den: float | None) -> float | None:
            return None if num is None or not den else num / den

        failed = rates.get("ragwatch_requests_failed_total")
        requests = rates.get("ragwatch_requests_total")
        if requests is None and "ragwatch_requests_succeeded_total" in rates:
            requests = rates["ragwatch_requests_succeeded_total"] + (failed or 0.0)
        tokens = rates.get("ragwatch_generation_tokens_total")
        sig: dict[str, float | None] = {
            "requests_per_s": requests,
            "errors_ratio": ratio(failed, requests) if requests is not None else None,
            "generation_tokens_per_s": tokens,
            "generation_tokens_total": generated,
            "prompt_tokens_per_s": rates.get("ragwatch_prompt_tokens_total"),
            "tokens_per_request": ratio(tokens, requests),
            "preemptions_per_s": rates.get("ragwatch_preemptions_total"),
            "requests_waiting": gauges.get("ragwatch_requests_waiting"),
            "requests_running": gauges.get("ragwatch_requests_running"),
            "kv_cache_usage_ratio": gauges.get("ragwatch_kv_cache_usage_ratio"),
            "counter_resets": float(s.resets),
        }
        for m in ("e2e", "ttft", "queue", "tpot"):
            sig[f"{m}_mean_s"] = ratio(
                rates.get(f"ragwatch_{m}_seconds_sum"), rates.get(f"ragwatch_{m}_seconds_count")
            )
        self._baseline(s, ts, tokens, requests, sig)
        return sig

    def _baseline(
        self,
        s: EngineSeries,
        ts: float,
        tokens: float | None,
        requests: float | None,
        sig: dict[str, float | None],
    ) -> None:
        """Generation tokens/s against the seasonal baseline, then hold or learn it."""
        for k in ("forecast", "deviation", "z", "score"):
            sig[f"tps_{k}"] = None
        bank, row = self.tps, [s.row]
        # a scrape stamped beyond the baseline's calendar (|day| >= 2**62) is not learnt
        judged = tokens is not None and abs(ts / DAY) < DAY_LIMIT
        mean, var, noise = (float(a[0]) for a in bank.forecast(row, [ts])) if judged else NONE
        if not math.isnan(mean) and tokens is not None:
            forecast = math.exp(mean)
            d = tokens / forecast - 1
            rel_var = var + noise
            if requests:  # the requests' own noise: a compound Poisson count of tokens
                w = self.window_s
                z = count_z(tokens * w, forecast * w, 1.05 * tokens / requests, rel_var)
            else:
                z = math.log((tokens + 1e-9) / forecast) / math.sqrt(rel_var or 1e-12)
            sig["tps_forecast"], sig["tps_deviation"], sig["tps_z"] = forecast, d, z
            sig["tps_score"] = min(1.0, -d / 0.5) if d < 0 and z < -HOLD_Z else 0.0
            deviating = abs(d) > HOLD_BAND and (bool(bank.holding(row)[0]) or abs(z) > HOLD_Z)
            if bank.hold(row, [ts], [deviating], [math.log(tokens + 1e-9)])[0]:
                s.relearned = (ts, forecast)
        if tokens is not None:
            self._learn(s, ts, tokens, requests)
        sig["tps_held_s"] = float(bank.held_s(row, [ts])[0])
        sig["tps_relearned_at"] = s.relearned[0] if s.relearned else None
        sig["tps_relearned_from"] = s.relearned[1] if s.relearned else None

    def _learn(self, s: EngineSeries, ts: float, tokens: float, requests: float | None) -> None:
        """Each BASELINE_BUCKET_S bucket's mean tokens/s is one observation."""
        b = math.floor(ts / BASELINE_BUCKET_S)
        if s.bucket is not None and b != s.bucket:
            total, reqs, n = s.sums
            at = (s.bucket + 0.5) * BASELINE_BUCKET_S
            if n and abs(at / DAY) < DAY_LIMIT:  # beyond the calendar: not learnt
                mean, req_mean = total / n, reqs / n
                var = 1.05 / (req_mean * BASELINE_BUCKET_S) if req_mean > 0 else 0.0
                self.tps.learn([s.row], [at], [math.log(mean + 1e-9)], [var])
            s.sums = (0.0, 0.0, 0)
        s.bucket = b
        total, reqs, n = s.sums
        s.sums = (total + tokens, reqs + (requests or 0.0), n + 1)

    def _sweep(self) -> list[Transition]:
        out: list[Transition] = []
        now = min(self._watermark, self.sweep_mark)
        for key in [k for k, s in self.series.items() if now - s.last_ts > self.stale_s]:
            s = self._drop(key)
            self.stats.evicted_series += 1
            out += self.engine.clear(s.labels, now)
        return out


# -- snapshots: a host's engines as plain data --------------------------------------------


NONE = (math.nan, math.nan, math.nan)  # no forecast


def _int(v: int) -> int | str:
    """An int msgpack can carry, else its digits (a bucket of a ts near the float maximum)."""
    return v if -INT64 <= v < INT64 else str(v)


def _dump_series(tps: dict[str, Any], target: str, s: EngineSeries) -> dict[str, Any]:
    """One engine: str keys; numbers, strings, lists; its baseline (``tps``) as the
    seasonal bank's typed arrays (:meth:`SeasonalBank.dump` of its row)."""
    return {
        "target": target,
        "labels": dict(s.labels),
        "tps": tps,
        "counters": [
            [name, [list(p) for p in lab], c.last, c.total, [list(p) for p in c.points]]
            for (name, lab), c in s.counters.items()
        ],
        "gauges": [[name, [list(p) for p in lab], v] for (name, lab), v in s.gauges.items()],
        "last_ts": s.last_ts,
        "resets": s.resets,
        "signals": dict(s.signals),
        "bucket": None if s.bucket is None else _int(s.bucket),
        "sums": list(s.sums),
        "relearned": None if s.relearned is None else list(s.relearned),
    }


Loaded = tuple["EngineSeries", dict[str, Any] | None]  # an engine, its baseline's state


def _load_series(host: str, state: Mapping[str, Any]) -> dict[SeriesKey, Loaded]:
    """:func:`_dump_series`' engines back, every field checked (ValueError), each with its
    baseline's state (None: it learns again), checked to fit a row; the engines' rows are
    the adopting pipeline's to give."""
    series = state["series"]
    if not isinstance(series, list):
        raise ValueError("engine state: series is not a list")
    out: dict[SeriesKey, Loaded] = {}
    for d in series:
        target = _str(d["target"])
        out[(host, target)] = _engine(d, {"host": host, "target": target})
    return out


def _engine(d: Mapping[str, Any], labels: dict[str, str]) -> Loaded:
    """One engine's state; its labels must be the ones the pipeline gives its key (its
    alerts carry them, and a stale engine resolves the alerts they match)."""
    if d["labels"] != labels:
        raise ValueError("engine state: labels of another engine")
    tps = d["tps"]
    if tps is not None:  # ValueError if it is not a baseline of these parameters
        SeasonalBank(TPS_PARAMS, 1).load([0], tps)
    counters = {}
    for name, lab, last, total, points in d["counters"]:
        pts = deque((_num(t), _num(v)) for t, v in points)
        counters[(_str(name), _pairs(lab))] = _Counter(_num(last), _num(total), pts)
    gauges = {(_str(name), _pairs(lab)): _num(v) for name, lab, v in d["gauges"]}
    signals = d["signals"]
    if not isinstance(signals, dict):
        raise ValueError("engine state: signals are not a map")
    total, reqs, n = d["sums"]
    relearned = d["relearned"]
    engine = EngineSeries(
        labels=labels,
        row=-1,  # given by the adopting pipeline
        counters=counters,
        gauges=gauges,
        last_ts=_num(d["last_ts"]),
        resets=_count(d["resets"]),
        signals={_str(k): None if v is None else _num(v) for k, v in signals.items()},
        bucket=None if d["bucket"] is None else _bucket(d["bucket"]),
        sums=(_num(total), _num(reqs), _count(n)),
        relearned=None if relearned is None else (_num(relearned[0]), _num(relearned[1])),
    )
    return engine, tps


def _num_or_nan(v: float | None) -> float:
    return math.nan if v is None else v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"engine state: expected a string, got {type(v).__name__}")
    return v


def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"engine state: expected a number, got {type(v).__name__}")
    return v


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"engine state: expected a count, got {type(v).__name__} {_short(v)}")
    return v


def _short(v: Any) -> str:
    return repr(v) if isinstance(v, int | float) and not isinstance(v, bool) else ""


def _bucket(v: Any) -> int:
    """A baseline bucket: of an event time (a non-negative float), so its middle is one too."""
    b = _whole(v)
    if not 0 <= b <= MAX_BUCKET:
        raise ValueError("engine state: a bucket no event time has")
    return b


def _whole(v: Any) -> int:
    """An int, or the digits :func:`_int` wrote for one msgpack cannot carry."""
    if isinstance(v, str) and v.lstrip("-").isdigit() and len(v) < 400:
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"engine state: expected an integer, got {type(v).__name__}")
    return v


def _pairs(v: Any) -> tuple[tuple[str, str], ...]:
    """Sorted labels as the pipeline keys them (lists in a snapshot)."""
    if not isinstance(v, list | tuple):
        raise ValueError("engine state: labels are not a list of pairs")
    return tuple((_str(k), _str(x)) for k, x in v)
