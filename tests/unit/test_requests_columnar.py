"""The columnar request pipeline gives the same in batches of any size as one envelope at a
time: every bucket close the same signals (==, every float identical), the same
transitions in the same order, the same statistics and the same bank rows. A wave closes
many rows' buckets together and a batch is split into waves, so this holds the wave
machinery to the plain order of events.

What the signals are is tested against brute-force references with a tolerance elsewhere
(``tests/unit/test_requests_serving.py``, ``test_count_bank.py``, ``test_latency_bank.py``,
``test_seasonal_bank.py``) and by behaviour (``test_requests_pipeline.py``). The object
pipeline the columnar one replaced (issue 17) is no longer kept as a twin (issue 31).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragwatch.agents.sim_requests import Fault, RequestSimConfig, RequestSimulator
from ragwatch.schema import RequestRecord, RequestsEnvelope, Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines import requests as columnar

RULES = load_rules()
T0 = 1_767_225_600.0


class Recorded(columnar.RequestPipeline):
    """The columnar pipeline, recording the signals of every close."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.closes: list[tuple[tuple[str, str], float, dict[str, float | None]]] = []

    def _round(self, k: int, closes: list[Any]) -> None:
        super()._round(k, closes)
        for c in closes:
            key = self.rows.index.key(c.row)
            self.closes.append((key, (c.b + 1) * self.bucket_s, self.rows.signal_dict(c.row)))


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_same_closes(got: list[Any], want: list[Any]) -> None:
    """The same closes, each with the same signals, exactly."""
    assert len(got) == len(want)
    key = lambda c: (c[1], c[0])  # noqa: E731  # a wave closes rows in another order
    for (gk, ge, gs), (wk, we, ws) in zip(sorted(got, key=key), sorted(want, key=key), strict=True):
        assert (gk, ge) == (wk, we) and set(gs) == set(ws)
        bad = {n: (gs[n], ws[n]) for n in ws if not _same(gs[n], ws[n])}
        assert not bad, f"{gk} at {ge}: {bad}"


def _tr(t: Transition) -> tuple[Any, ...]:
    a = t.alert
    return (a.rule, a.status, t.previous, tuple(sorted(a.labels.items())), a.starts_at,
            a.ends_at, a.value, a.resolution, tuple(sorted(a.annotations.items())))  # fmt: skip


def assert_same_rows(a: columnar.RequestPipeline, b: columnar.RequestPipeline) -> None:
    """Every series in the same state: its service's snapshot part, bit for bit."""
    assert set(a.series) == set(b.series)
    for service in {k[0] for k in a.series}:
        assert a.dump(service) == b.dump(service), service


def run_both(envs: list[RequestsEnvelope], batch: int = 1, **kw: Any) -> tuple[Any, Any]:
    """The pipeline fed one envelope at a time and in batches of ``batch``: the same."""
    pipe, one = Recorded(RULES, **kw), Recorded(RULES, **kw)
    got: list[Transition] = []
    want: list[Transition] = []
    for e in envs:
        want += one.process(e)
    for i in range(0, len(envs), batch):
        got += pipe.process_batch(envs[i : i + batch])
    assert_same_closes(pipe.closes, one.closes)
    assert [_tr(t) for t in got] == [_tr(t) for t in want]
    assert vars(pipe.stats) == vars(one.stats)
    assert_same_rows(pipe, one)
    return pipe, got


def simulated(hours: float, **kw: Any) -> list[RequestsEnvelope]:
    cfg = RequestSimConfig(**{"deploy_at_s": None, "reload_at_s": None, **kw})
    sim = RequestSimulator(cfg)
    ticks = int(hours * 3600 / cfg.batch_s)
    return [e for _, (_, envs) in zip(range(ticks), sim.ticks(), strict=False) for e in envs]


@pytest.mark.parametrize("scenario", ["healthy", "outliers", "all"])  # all: every fault
def test_the_simulators_scenarios_close_alike(scenario: str) -> None:
    envs = simulated(2.0, scenario=scenario, services=2, instances=2, base_qps=4.0,
                     sample_rate=1.0, batch_s=10.0, fault_start_s=1800.0)  # fmt: skip
    pipe, got = run_both(envs, batch=64)
    assert pipe.stats.buckets_closed > 400
    if scenario != "healthy":
        assert got  # the faults page


def test_a_day_of_daily_rhythm_with_quiet_nights_and_a_fault_that_lasts() -> None:
    """Profiles are learnt (a day passes), a quiet night makes windows long, baselines
    hold through hours of a fault and accept it as the new level after ``hold_max_s``.
    With the weekly profile off: in its first week the profile takes a weekday it has
    not seen as uncertain, and this fault, which develops over hours from 20:00 on a
    Thursday, is then taken as Friday's level instead of held (docs/detection.md, known
    limits)."""
    faults = (Fault("throughput", 20 * 3600.0, None, 0, 0, 1.0),)
    envs = simulated(30.0, services=1, instances=1, base_qps=1.0, sample_rate=1.0,
                     batch_s=60.0, daily_ratio=20.0, burst_sigma=0.3, faults=faults)  # fmt: skip
    pipe, _ = run_both(envs, batch=256, hold_max_s=4 * 3600.0, weekly_sd=0.0)
    rows = np.array([v.row for v in pipe.series.values()], dtype=np.intp)
    assert pipe.rows.traffic.has_profile(pipe.rows.both(rows)).all()
    relearned = [pipe.rows.col[f"{f}_relearned_at"][rows] for f in ("rps", "tpr")]
    assert np.isfinite(relearned).any()


def _stream(rng: random.Random, n: int) -> Iterator[RequestsEnvelope]:
    """Odd traffic: several services and instances, senders (pids) and their restarts
    (``started``: warm-ups, crash loops, an older process's envelopes), gaps, duplicates,
    late and too-old records, errors, missing stages, bursts, outlier clusters."""
    t = T0 + rng.random() * 60
    keys = [(f"s{rng.randrange(3)}", f"i{rng.randrange(3)}") for _ in range(5)]
    for _ in range(n):
        t += rng.choice([0.5, 5.0, 30.0, 61.0, 700.0, 4000.0]) * rng.random()
        service, instance = rng.choice(keys)
        recs = []
        for _ in range(rng.choice([0, 1, 3, 20, 80])):
            ts = max(0.0, t - rng.choice([0.0, 5.0, 50.0, 120.0, 5000.0]) * rng.random())
            odd = rng.random() < 0.05
            ctx = rng.randrange(20_000) if odd else abs(int(rng.gauss(3000, 150)))
            recs.append(
                RequestRecord(
                    ts=ts,
                    status="error" if rng.random() < 0.05 else "ok",
                    e2e_ms=rng.lognormvariate(6, 0.5 if not odd else 2),
                    context_tokens=ctx,
                    output_tokens=rng.randrange(5000) if odd else int(rng.gauss(250, 30)) % 10**5,
                    stages={"retriever": rng.expovariate(0.01), "llm": rng.expovariate(0.002)}
                    if rng.random() < 0.8 else {"other": 1.0},
                    queue_ms=rng.choice([None, 3.0]),
                    ttft_ms=rng.choice([None, rng.expovariate(0.01)]),
                )
            )  # fmt: skip
        recs.sort(key=lambda r: r.ts)
        sent = t if rng.random() < 0.95 else t - 100.0  # a retry: a duplicate
        started = rng.choice([None, T0 - 100.0, T0 + 2000.0, T0 + 2600.0, t - 300.0])
        pid = rng.choice([None, 1, 2, rng.randrange(3, 100)])
        yield RequestsEnvelope(service, instance, sent, tuple(recs), pid=pid, started=started)


# not batches of 1: ``process(e)`` is ``process_batch([e])``, the reference itself
@settings(max_examples=9, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.sampled_from([3, 17, 256]))
def test_odd_streams_close_alike_in_any_batches(seed: int, batch: int) -> None:
    envs = list(_stream(random.Random(seed), 150))
    run_both(envs, batch=batch, rate_target=30.0, rate_min=5.0, min_baseline=2,
             stale_s=2000.0, reservoir=40, tail_requests=30)  # fmt: skip
