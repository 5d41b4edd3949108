"""The leak bank (the only implementation of the leak detector) is held to its
specification, the plain-Python reference of ``tests/reference/leak.py``: on the same
samples, in batches of any shape, every row's estimate, leak rate and late count equal the
reference's within a float tolerance (running means and matrix medians round differently
from sums and ``statistics.median``), through gaps, late samples, steps, leaks, reloads,
sawtooths, loads and rows reused after a reset."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragwatch.detectors.leak import LeakBank, LeakDetector, LeakParams
from tests.reference.leak import LeakReference

T0 = 1_767_225_600.0
PARAMS = [
    {},
    {"window_s": 1800.0, "min_span_s": 300.0, "recent_s": 600.0, "floor_horizon_s": 3600.0},
    {"window_s": 3600.0, "bucket_s": 70.0, "min_points": 3, "min_span_s": 0.0},
]
REL = 1e-9  # relative: a value that is the same arithmetic in another order
ABS = 1e-3  # bytes (or bytes/s): far below any threshold the rules read


def close(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return x is y
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or math.isclose(x, y, rel_tol=REL, abs_tol=ABS)


def check(bank: LeakBank, refs: list[LeakReference]) -> None:
    """Every row of the bank against its reference object."""
    rates = bank.leak_rates(range(len(refs)))
    for row, ref in enumerate(refs):
        est, fit, floor = bank.estimate(row), ref.fit, ref.floor
        assert (est is None) == (fit is None), row
        assert int(bank.late[row]) == ref.late, row
        assert close(float(rates[row]), ref.leak_rate()), (row, rates[row], ref.leak_rate())
        if est is None or fit is None:
            continue
        assert est.points == len(ref.points)
        for got, want in [
            (est.slope_bytes_per_s, fit["slope"]),
            (est.span_s, fit["span"]),
            (est.level_bytes, fit["level"]),
            (est.steadiness, fit["steadiness"]),
            (est.rising, fit["rising"]),
            (est.recent_slope_bytes_per_s, _opt(fit["recent_slope"])),
            (est.recent_steadiness, _opt(fit["recent_steadiness"])),
            (est.floor_slope_bytes_per_s, _opt(floor["slope"]) if floor else None),
            (est.floor_steadiness, _opt(floor["steadiness"]) if floor else None),
        ]:
            assert close(got, want), (row, est, fit, floor)
        known = floor["known"] if floor else math.nan
        want_above = fit["level"] - known if math.isfinite(known) else None
        assert close(est.above_known_bytes, want_above), (row, est, known)


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else x


def stream(rng: random.Random, hours: float) -> list[tuple[float, float, float]]:
    """One series ``(t, bytes, load)``: irregular sampling with gaps and late samples, noise
    (none, NVML-like MiB, or 50 MB), a step, a leak or a sawtooth, a reload dip, a load
    that is sometimes unknown."""
    out, t = [], 0.0
    step_at, leak_at = rng.uniform(0, hours) * 3600, rng.uniform(0, hours) * 3600
    rate = rng.choice([0.0, 0.3, 1.2, 5.0]) * 1e9 / 3600
    freed = rng.choice([0.0, 0.6])  # of each 20 min's growth, at its end
    sd = rng.choice([0.0, 1e6, 5e7])
    while t < hours * 3600:
        into = max(0.0, t - leak_at)
        grown = rate * (into - freed * (into // 1200) * 1200)
        v = 30e9 + rng.gauss(0, sd) + (3e9 if t >= step_at else 0.0) + grown
        if rng.random() < 0.01:
            v = 4e9  # a reload
        u = math.nan if rng.random() < 0.1 else 100 * (0.5 + 0.5 * math.sin(t / 7200))
        late = rng.random() < 0.03
        out.append((T0 + (t - rng.uniform(0, 400) if late else t), v, u))
        t += rng.choice([10.0, 10.0, 30.0, 60.0]) * (50 if rng.random() < 0.005 else 1)
    return out


def feed(
    params: dict[str, float], streams: list[list[tuple[float, float, float]]], batch: int
) -> int:
    """The bank and the references over the same samples, compared after every batch; how
    many rows end with an estimate."""
    refs = [LeakReference(LeakParams(**params)) for _ in streams]
    bank = LeakBank(capacity=1, **params)
    bank.reserve(len(streams))  # it grows
    # interleave the rows as envelopes would, then cut the sequence into batches
    events = [(t, row, v, u) for row, s in enumerate(streams) for t, v, u in s]
    merged = sorted(enumerate(events), key=lambda e: (round(e[1][0] / 60), e[0]))
    seq = [e for _, e in merged]  # roughly in time, each row's own order kept
    for lo in range(0, len(seq), batch):
        part = seq[lo : lo + batch]
        for t, row, v, u in part:
            refs[row].learn(t, v, u)
        bank.learn(*zip(*[(r, t, v) for t, r, v, _ in part], strict=True), [u for *_, u in part])
        check(bank, refs)
    return sum(r.fit is not None for r in refs)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("batch", [1, 7, 500])
def test_the_bank_follows_the_reference(params: dict[str, float], batch: int) -> None:
    rng = random.Random(batch * 31 + len(params))
    assert feed(params, [stream(rng, hours=5.0) for _ in range(6)], batch) >= 4  # not vacuous


def test_the_bank_follows_the_reference_past_the_floor_window() -> None:
    """Fourteen hours: the floor's 12 h window slides, the known range forgets."""
    rng = random.Random(11)
    assert feed({}, [stream(rng, hours=14.0) for _ in range(3)], 200) == 3


def test_the_comparison_sees_leaks_and_floors() -> None:
    """Not vacuous: a steady leak, compared, has a leak rate from both horizons."""
    series = [(T0 + t, 30e9 + 1.2e9 * t / 3600, 50.0) for t in np.arange(0.0, 4 * 3600, 10.0)]
    ref = LeakReference()
    for t, v, u in series:
        ref.learn(t, v, u)
    assert ref.floor is not None and ref.floor["steadiness"] == 1.0
    assert ref.leak_rate() * 3600 / 1e9 == pytest.approx(1.2, rel=0.01)
    feed({}, [[(t, v, u) for t, v, u in series]], 100)


def test_a_leak_given_back_by_an_oom_kill_is_history_at_once() -> None:
    """A sawtooth leak (+1 GB/h, 60 % of each 20 min freed) for 4 h, then the OOM killer
    takes the process: memory falls below the whole horizon's floor. The floor's slope
    still rises (its blocks are the leak's), but no leak is left, in the bank and the
    reference alike (space-real seed 1 paged an unattributed leak 15 min after the kill)."""

    def v(t: float) -> float:
        if t >= 4 * 3600:
            return 0.6e9  # the context and the driver, the process gone
        return 30e9 + 1e9 / 3600 * (t - 0.6 * (t // 1200) * 1200)

    series = [(T0 + t, v(t), 50.0) for t in np.arange(0.0, 4.5 * 3600, 10.0)]
    bank = LeakBank(capacity=1)
    before = [(t, val, u) for t, val, u in series if t < T0 + 4 * 3600]
    bank.learn([0] * len(before), [t for t, *_ in before], [x for _, x, _ in before])
    assert bank.leak_rates([0])[0] * 3600 / 1e9 == pytest.approx(0.4, rel=0.2)  # it was a leak
    after = [(t, val, u) for t, val, u in series if t >= T0 + 4 * 3600]
    bank.learn([0] * len(after), [t for t, *_ in after], [x for _, x, _ in after])
    assert bank.fslope[0] > 0  # the floor's fit still holds the leak's blocks ...
    assert bank.leak_rates([0])[0] == 0.0  # ... but nothing is leaking now
    feed({}, [series], 60)  # and the reference agrees all along


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # found by CI: a level exactly 0.25 GB over the known range, by one rounding
    seed=311,
    rows=1,
    batch=1,
    params={"window_s": 1800.0, "min_span_s": 300.0, "recent_s": 600.0, "floor_horizon_s": 3600.0},
)
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
    for (ta, va, ua), (tb, vb, ub) in zip(a, b, strict=False):
        bank.learn([0, 1], [ta, tb], [va, vb], [ua, ub])
    kept = bank.estimate(1)
    bank.reset([0])
    fresh = LeakReference()
    for t, v, u in a[:200]:
        bank.learn([0], [t], [v], [u])
        fresh.learn(t, v, u)
    check(bank, [fresh])
    assert bank.estimate(1) == kept


@pytest.mark.parametrize(
    "bad",
    [{"window_s": math.inf}, {"recent_s": 0.0}, {"scale_bytes": -1.0}, {"min_points": 1},
     {"min_span_s": math.nan}, {"bucket_s": 1e9}, {"floor_group": 0}, {"noise_k": math.nan},
     {"floor_window_s": 3600.0}],
)  # fmt: skip
def test_the_bank_refuses_the_parameters_the_detector_refuses(bad: dict[str, float]) -> None:
    for make in (LeakDetector, LeakBank):
        with pytest.raises(ValueError):
            make(**bad)
