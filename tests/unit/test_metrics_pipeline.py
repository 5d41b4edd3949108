"""Scraped engine metrics: counters become rates with Prometheus' reset handling, label sets
are summed, gauges kept, a throughput drop below the Holt-Winters forecast pages, and the
pipeline stays bounded."""

from __future__ import annotations

import math
import random

import pytest

from ragwatch.schema import MetricSample, MetricsEnvelope
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.metrics import MetricsPipeline
from ragwatch.streams.worker.snapshot import dump_host, load_host

T0 = 1_767_225_600.0
TARGET = "http://vllm:8000/metrics"


def scrape(
    ts: float, *samples: tuple[str, dict[str, str], float], host: str = "node-1"
) -> MetricsEnvelope:
    return MetricsEnvelope(
        host, TARGET, ts, tuple(MetricSample(n, lab, v) for n, lab, v in samples)
    )


def signals(pipe: MetricsPipeline, host: str = "node-1") -> dict[str, float | None]:
    (engine,) = pipe.engine_snapshot(host)
    return dict(engine["signals"])


def test_rates_over_the_window_summed_over_label_sets() -> None:
    pipe = MetricsPipeline([], window_s=60.0)
    for i in range(10):  # two models, 100 and 50 tokens/s; 2 and 1 requests/s; 15 s scrapes
        t = 15.0 * i
        pipe.process(
            scrape(
                T0 + t,
                ("ragwatch_generation_tokens_total", {"model": "a"}, 100.0 * t),
                ("ragwatch_generation_tokens_total", {"model": "b"}, 50.0 * t),
                ("ragwatch_requests_succeeded_total", {"model": "a"}, 2.0 * t),
                ("ragwatch_requests_succeeded_total", {"model": "b"}, 0.9 * t),
                ("ragwatch_requests_failed_total", {"model": "b"}, 0.1 * t),
                ("ragwatch_e2e_seconds_sum", {"model": "a"}, 1.6 * t),
                ("ragwatch_e2e_seconds_count", {"model": "a"}, 2.0 * t),
                ("ragwatch_requests_waiting", {"model": "a"}, 3.0),
                ("ragwatch_requests_waiting", {"model": "b"}, 4.0),
                ("ragwatch_kv_cache_usage_ratio", {"model": "a"}, 0.5),
                ("ragwatch_kv_cache_usage_ratio", {"model": "b"}, 0.7),
                ("some_unknown_metric_total", {}, 1e6 * t),  # not ours: ignored
            )
        )
    sig = signals(pipe)
    assert sig["generation_tokens_per_s"] == pytest.approx(150.0)
    assert sig["requests_per_s"] == pytest.approx(3.0)
    assert sig["tokens_per_request"] == pytest.approx(50.0)
    assert sig["errors_ratio"] == pytest.approx(0.1 / 3.0)
    assert sig["e2e_mean_s"] == pytest.approx(0.8)
    assert sig["requests_waiting"] == 7.0  # summed
    assert sig["kv_cache_usage_ratio"] == 0.7  # a ratio: the largest
    assert sig["ttft_mean_s"] is None and sig["preemptions_per_s"] is None
    assert sig["counter_resets"] == 0.0


def test_a_counter_reset_is_a_restart_from_zero_not_a_drop() -> None:
    pipe = MetricsPipeline([], window_s=120.0)
    values = [0.0, 1500.0, 3000.0, 4500.0, 600.0, 2100.0]  # 100/s; the server restarted
    for i, v in enumerate(values):
        pipe.process(scrape(T0 + 15.0 * i, ("ragwatch_generation_tokens_total", {}, v)))
        rate = signals(pipe)["generation_tokens_per_s"]
        if i:
            assert rate is not None and rate > 0  # never negative, never zero
    # 4500 + 2100 tokens in 75 s (the 15 s with the restart count what was seen after it)
    assert signals(pipe)["generation_tokens_per_s"] == pytest.approx(6600.0 / 75.0)
    assert signals(pipe)["counter_resets"] == 1.0
    assert pipe.stats.counter_resets == 1


def test_the_window_forgets_old_points() -> None:
    pipe = MetricsPipeline([], window_s=60.0)
    for i in range(20):  # 10/s for 150 s, then 100/s
        t = 15.0 * i
        v = 10.0 * min(t, 150.0) + 100.0 * max(0.0, t - 150.0)
        pipe.process(scrape(T0 + t, ("ragwatch_generation_tokens_total", {}, v)))
    assert signals(pipe)["generation_tokens_per_s"] == pytest.approx(100.0)


def test_duplicates_are_dropped_and_stale_engines_forgotten() -> None:
    pipe = MetricsPipeline([], stale_s=600.0)
    pipe.process(scrape(T0, ("ragwatch_requests_waiting", {}, 1.0)))
    pipe.process(scrape(T0, ("ragwatch_requests_waiting", {}, 9.0)))  # a retry
    assert pipe.stats.duplicates == 1 and signals(pipe)["requests_waiting"] == 1.0
    pipe.process(scrape(T0 + 1300.0, ("ragwatch_requests_waiting", {}, 1.0), host="node-2"))
    assert [k[0] for k in pipe.series] == ["node-2"]
    assert pipe.stats.evicted_series == 1


def test_label_sets_and_engines_are_capped() -> None:
    pipe = MetricsPipeline([], max_label_sets=3, max_series=1)
    samples = tuple(("ragwatch_requests_waiting", {"model": str(i)}, 1.0) for i in range(5))
    pipe.process(scrape(T0, *samples))
    pipe.process(scrape(T0, ("ragwatch_requests_waiting", {}, 1.0), host="node-2"))
    assert signals(pipe)["requests_waiting"] == 3.0
    assert pipe.stats.dropped_label_sets == 2 and pipe.stats.dropped_series == 1


def test_a_throughput_drop_pages_and_a_snapshot_keeps_the_engine() -> None:
    pipes = Pipelines(load_rules())
    tokens, fired = 0.0, []
    for i in range(4 * 60 * 4):  # four hours of 15 s scrapes; -40 % from 3 h on
        t = 15.0 * i
        rate = 200.0 * (1 + 0.1 * math.sin(t / 3600.0)) * (0.6 if t >= 3 * 3600 else 1.0)
        tokens += rate * 15.0
        env = scrape(T0 + t, ("ragwatch_generation_tokens_total", {}, tokens))
        fired += [x.alert for x in pipes.process(env) if x.alert.status == "firing"]
        if t == 2 * 3600:
            restored = Pipelines(load_rules())
            assert load_host(restored, "node-1", dump_host(pipes, "node-1")) == 1
            assert restored.metrics.series.keys() == pipes.metrics.series.keys()
    (alert,) = fired
    assert alert.rule == "EngineThroughputDrop" and alert.labels["target"] == TARGET
    assert alert.starts_at - (T0 + 3 * 3600) <= 10 * 60
    assert "generated tokens/s" in alert.annotations["summary"]
    assert alert.annotations["hint"]


def test_a_counter_near_the_float_maximum_starts_over_instead_of_breaking_the_target() -> None:
    """Scrapes 0, 1.79e308, 0, 1.79e308 (all finite) made the reset offset inf: every later
    scrape of the target raised, also after a snapshot. Now such a value restarts the
    counter (counted), and the target's rate is back once the window holds normal data."""
    pipes = Pipelines(load_rules())
    tokens = 0.0
    for i in range(400):
        tokens += 1500.0  # 100 tokens/s, 15 s scrapes; minutes 25-26: the attack
        value = (0.0, 1.79e308, 0.0, 1.79e308)[i - 100] if 100 <= i < 104 else tokens
        pipes.process(scrape(T0 + 15.0 * i, ("ragwatch_generation_tokens_total", {}, value)))
        if i == 200:
            assert pipes.metrics.stats.implausible_counters == 2  # 1.79e308 after 0, twice
            restored = Pipelines(load_rules())
            assert load_host(restored, "node-1", dump_host(pipes, "node-1")) == 1
            pipes = restored
    sig = signals(pipes.metrics)
    assert sig["generation_tokens_per_s"] == pytest.approx(100.0)
    assert all(v is None or math.isfinite(v) for v in sig.values())


def _engine_day(demand: float, kv_fault: float, rng: random.Random) -> tuple[float, ...]:
    """One minute of a vLLM engine (requests/s, generated tokens/s, running, waiting, KV
    cache usage, queue wait s): its load follows demand (utilisation 0.6 at the usual peak,
    a queue's wait as rho / (1 - rho)); ``kv_fault`` fills its cache at the usual demand."""
    rps = 8.0 * demand * math.exp(rng.gauss(0, 0.1))
    rho = min(0.95, 0.6 * demand)
    wait = 0.05 * rho / (1 - rho) * math.exp(rng.gauss(0, 0.2)) + 3.0 * kv_fault
    usage = min(0.995, 0.1 + 0.7 * rho + rng.gauss(0, 0.02) + 0.6 * kv_fault)
    waiting = max(0.0, rps * wait + rng.gauss(0, 0.3))
    return rps, rps * 180.0, rps * 4.0 * (1 + rho), waiting, usage, wait


@pytest.mark.parametrize("tokens", [True, False], ids=["generating", "no-tokens"])
@pytest.mark.parametrize("fault", ["surge", "kv-cache"])
def test_an_engine_s_load_counts_unless_its_demand_explains_it(fault: str, tokens: bool) -> None:
    """Two days of an engine's daily rhythm, then the third morning: demand doubling for
    three hours moves its running and waiting requests, KV cache and queue wait far out of
    their bands, scored, but its generated tokens/s 100 % above their expectation explain
    them (or, for an engine that generates none, an embedder's, its requests/s): not
    counted. A KV cache filling at the usual demand (requests waiting, their wait up)
    counts."""
    pipe, rng, totals = MetricsPipeline(load_rules()), random.Random(3), [0.0] * 5
    start, most = T0 + 2 * 86400 + 8 * 3600, 0.0
    for i in range(int((start - T0) / 60) + 150):
        t = T0 + 60.0 * i
        demand = 0.55 + 0.45 * math.cos(2 * math.pi * ((t % 86400) / 3600 - 15) / 24)
        late = t >= start + 1800  # the fault at full size
        surge, kv = (2.0 if late and fault == "surge" else 1.0), float(late and fault != "surge")
        rps, tps, running, waiting, usage, wait = _engine_day(demand * surge, kv, rng)
        for k, v in enumerate((rps, tps, rps * 2500.0, rps * wait, rps)):
            totals[k] += v * 60.0
        counters = [("ragwatch_requests_succeeded_total", {}, totals[0])]
        if tokens:
            counters += [("ragwatch_generation_tokens_total", {}, totals[1]),
                         ("ragwatch_prompt_tokens_total", {}, totals[2])]  # fmt: skip
        counters += [("ragwatch_queue_seconds_sum", {}, totals[3]),
                     ("ragwatch_queue_seconds_count", {}, totals[4])]  # fmt: skip
        pipe.process(scrape(
            t, *counters,
            ("ragwatch_requests_running", {}, running), ("ragwatch_requests_waiting", {}, waiting),
            ("ragwatch_kv_cache_usage_ratio", {}, usage),
        ))  # fmt: skip
        if late:
            sig = signals(pipe)
            most = max(most, sig["anomalous_signals"] or 0.0)
    assert sig["kv_cache_usage_ratio_score"] == 1.0  # far out of its band either way
    assert (sig["generation_tokens_per_s"] is not None) == tokens
    if fault == "surge":
        if tokens:
            assert sig["tps_deviation"] is not None and sig["tps_deviation"] > 0.5
        assert most <= 1.0
    else:
        assert most >= 2.0
