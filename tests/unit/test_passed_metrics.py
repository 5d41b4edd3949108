"""Issue 34, point 2: the metrics passed through on ragwatch.metrics are scored too (a
gauge's value, a counter's rate), up to a cap per target, kept across a snapshot, and
shown with the engine's own scores in status, /metrics and the advisor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragwatch.advisor import gather, rank
from ragwatch.schema import MetricSample, MetricsEnvelope
from ragwatch.streams.pipelines.metrics import MetricsPipeline
from ragwatch.streams.pipelines.passed import MAX_PASSED, selector

T0 = 1_767_571_200.0  # a Monday, 00:00 UTC
TARGET = "http://node-1:9400/metrics"
CLOCK = 'DCGM_FI_DEV_SM_CLOCK{gpu="0"}'


def scrape(ts: float, clock: float, hits: float, extra: int = 0) -> MetricsEnvelope:
    rng = np.random.default_rng(int(ts))
    samples = [
        MetricSample("ragwatch_generation_tokens_total", {}, 1000.0 * (ts - T0)),
        MetricSample("DCGM_FI_DEV_SM_CLOCK", {"gpu": "0"}, clock + float(rng.normal(0, 5))),
        MetricSample("app_cache_hits_total", {}, hits),
        MetricSample("app_latency_seconds_bucket", {"le": "0.5"}, hits),  # not scored
        *(MetricSample("app_many", {"i": str(i)}, 1.0) for i in range(extra)),
    ]
    return MetricsEnvelope("node-1", TARGET, ts, tuple(samples))


def fed(
    pipe: MetricsPipeline, minutes: int, start: int = 0, clock: float = 1980.0, every: int = 15
) -> None:
    """A scrape every ``every`` seconds (the cache hits grow 10/3 a second)."""
    for i in range(start * 60 // every, (start + minutes) * 60 // every):
        ts = T0 + every * i
        pipe.process(scrape(ts, clock, hits=50.0 / 15 * every * i))


def scores(pipe: MetricsPipeline) -> dict[str, list[float | None]]:
    (engine,) = pipe.engine_snapshot("node-1")
    got: dict[str, list[float | None]] = engine["scores"]
    return got


def test_gauges_and_counter_rates_are_scored_beside_the_engines_own_signals() -> None:
    pipe = MetricsPipeline([])
    fed(pipe, 600)
    got = scores(pipe)
    assert "generation_tokens_per_s" in got  # the engine's own
    assert {CLOCK, "app_cache_hits_total"} <= set(got)
    assert not [k for k in got if "bucket" in k]
    score, yhat, lower, upper, value = got["app_cache_hits_total"][:5]
    assert value is not None and math.isclose(value, 50.0 / 15.0, rel_tol=1e-5)  # a rate
    assert lower is not None and upper is not None and yhat is not None
    assert lower <= yhat <= upper and score is not None and score < 0.9
    assert got[CLOCK][4] is not None and abs(got[CLOCK][4] - 1980.0) < 30


def test_a_clock_that_halves_is_anomalous_and_the_advisor_names_it() -> None:
    pipe = MetricsPipeline([])
    fed(pipe, 3 * 1440, every=60)  # three quiet days
    assert (scores(pipe)[CLOCK][0] or 0.0) < 0.5
    fed(pipe, 30, start=3 * 1440, clock=990.0, every=60)  # a power cap halves the SM clock
    status = {"hosts": [{"host": "node-1", "gpus": [], "engines": pipe.engine_snapshot("node-1")}]}
    moves = rank(gather(status, host="node-1"), 0.9, 10)
    clock = [m for m in moves if m.signal == CLOCK]
    assert clock and clock[0].change is not None and clock[0].change < -0.4, moves


def test_at_most_the_cap_per_target_and_the_rest_counted() -> None:
    pipe = MetricsPipeline([])
    pipe.process(scrape(T0, 1980.0, 0.0, extra=2 * MAX_PASSED))
    assert len(pipe.series[("node-1", TARGET)].passed) == MAX_PASSED
    assert pipe.stats.passed_dropped == 2 * MAX_PASSED + 2 - MAX_PASSED  # (in worker status)


def test_a_snapshot_keeps_the_scores_and_a_broken_one_changes_nothing() -> None:
    a = MetricsPipeline([])
    fed(a, 300)
    b = MetricsPipeline([])
    assert b.adopt("node-1", a.dump("node-1")) == 1
    for pipe in (a, b):
        fed(pipe, 5, start=300)
    assert scores(a) == scores(b)
    broken = a.dump("node-1")
    broken["series"][0]["passed"][0]["labels"] = "gpu=0"
    c = MetricsPipeline([])
    with pytest.raises(ValueError):
        c.adopt("node-1", broken)
    assert not c.series and c.passed.block.slots == 0


def test_a_dropped_target_gives_its_rows_back() -> None:
    pipe = MetricsPipeline([], stale_s=600.0)
    fed(pipe, 10)
    rows = pipe.passed.block.slots
    assert rows == 2
    pipe.forget("node-1")
    assert pipe.passed.block.slots == 0


def test_selectors_quote_label_values_as_promql_does() -> None:
    assert selector(("up", ())) == "up"
    assert selector(("x", (("a", "1"), ("b", 'q"\\')))) == 'x{a="1",b="q\\"\\\\"}'
