"""The leak bank is held to the object detector it vectorises (as ``codec._gpu_wire_ok`` is
held to the strict decoder): on the same samples, in batches of any shape, every row's
estimate, score and late count equal the object's, through gaps, late samples, steps,
leaks, reloads and rows reused after a reset."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.detectors.leak import LeakDetector, LeakEstimate
from ragwatch.detectors.leak_bank import LeakBank

T0 = 1_767_225_600.0
PARAMS = [
    {},
    {"window_s": 1800.0, "min_span_s": 300.0, "recent_s": 600.0},
    {"window_s": 3600.0, "bucket_s": 70.0, "min_points": 3, "min_span_s": 0.0},
]


def same(a: LeakEstimate | None, b: LeakEstimate | None) -> bool:
    if a is None or b is None:
        return a is b

    def close(x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return x is y
        return x == y or math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)

    return all(
        close(getattr(a, f), getattr(b, f))
        for f in (
            "slope_bytes_per_s",
            "increase_bytes",
            "span_s",
            "level_bytes",
            "points",
            "steadiness",
            "recent_slope_bytes_per_s",
            "recent_steadiness",
        )
    )


def stream(rng: random.Random, hours: float) -> list[tuple[float, float]]:
    """One series: irregular sampling with gaps and late samples, noise, a step, a leak, a
    reload dip."""
    out, t = [], 0.0
    step_at, leak_at = rng.uniform(0, hours) * 3600, rng.uniform(0, hours) * 3600
    rate = rng.choice([0.0, 0.3, 1.2, 5.0]) * 1e9 / 3600
    while t < hours * 3600:
        v = 30e9 + rng.gauss(0, rng.choice([1e6, 5e7]))
        v += 3e9 if t >= step_at else 0.0
        v += rate * max(0.0, t - leak_at)
        if rng.random() < 0.01:
            v = 4e9  # a reload
        late = rng.random() < 0.03
        out.append((T0 + (t - rng.uniform(0, 400) if late else t), v))
        t += rng.choice([10.0, 10.0, 30.0, 60.0]) * (50 if rng.random() < 0.005 else 1)
    return out


def check(bank: LeakBank, objs: list[LeakDetector]) -> None:
    for row, obj in enumerate(objs):
        assert same(bank.estimate(row), obj.estimate), (row, bank.estimate(row), obj.estimate)
        assert int(bank.late[row]) == obj.late, row
    want = [o.score_one({"value": 0.0, "t": 0.0}) for o in objs]
    assert np.allclose(bank.scores(range(len(objs))), want, rtol=1e-12, atol=0)


def feed(params: dict[str, float], streams: list[list[tuple[float, float]]], batch: int) -> int:
    """Both forms over the same samples, compared after every batch; how many rows end
    with an estimate."""
    objs = [LeakDetector(**params) for _ in streams]
    bank = LeakBank(capacity=1, **params)
    bank.reserve(len(streams))  # it grows
    # interleave the rows as envelopes would, then cut the sequence into batches
    events = [(t, row, v) for row, s in enumerate(streams) for t, v in s]
    merged = sorted(
        enumerate(events), key=lambda e: (round(e[1][0] / 60), e[0])
    )  # roughly in time, each row's own order kept
    seq = [e for _, e in merged]
    by_row: dict[int, list[int]] = {}
    for i, (_, row, _) in enumerate(seq):
        by_row.setdefault(row, []).append(i)
    for lo in range(0, len(seq), batch):
        part = seq[lo : lo + batch]
        for t, row, v in part:
            objs[row].learn(t, v)
        bank.learn([r for _, r, _ in part], [t for t, _, _ in part], [v for _, _, v in part])
        check(bank, objs)
    return sum(o.estimate is not None for o in objs)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("batch", [1, 7, 500])
def test_the_bank_gives_the_objects_estimates(params: dict[str, float], batch: int) -> None:
    rng = random.Random(batch * 31 + len(params))
    assert feed(params, [stream(rng, hours=5.0) for _ in range(6)], batch) >= 4  # not vacuous


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 5),
    batch=st.integers(1, 300),
    params=st.sampled_from(PARAMS),
)
def test_any_batching_of_any_streams_matches(
    seed: int, rows: int, batch: int, params: dict[str, float]
) -> None:
    rng = random.Random(seed)
    feed(params, [stream(rng, hours=rng.uniform(0.2, 4.0)) for _ in range(rows)], batch)


def test_a_reset_row_starts_afresh_and_others_keep_theirs() -> None:
    rng = random.Random(3)
    a, b = stream(rng, 3.0), stream(rng, 3.0)
    bank = LeakBank(capacity=2)
    for (ta, va), (tb, vb) in zip(a, b, strict=False):
        bank.learn([0, 1], [ta, tb], [va, vb])
    kept = bank.estimate(1)
    bank.reset([0])
    fresh = LeakDetector()
    for t, v in a[:200]:
        bank.learn([0], [t], [v])
        fresh.learn(t, v)
    assert same(bank.estimate(0), fresh.estimate) and same(bank.estimate(1), kept)
    assert bank.late[0] == fresh.late


@pytest.mark.parametrize(
    "bad",
    [{"window_s": math.inf}, {"recent_s": 0.0}, {"scale_bytes": -1.0}, {"min_points": 1},
     {"min_span_s": math.nan}, {"bucket_s": 1e9}],
)  # fmt: skip
def test_the_bank_refuses_the_parameters_the_detector_refuses(bad: dict[str, float]) -> None:
    for make in (LeakDetector, LeakBank):
        with pytest.raises(ValueError):
            make(**bad)
