"""The generic detector's bank (the only implementation) against its specification, the
plain-Python reference of ``tests/reference/generic.py``: on the same observations, in
calls of several rows, every score, expected value and band equals the reference's within
a float tolerance (the same arithmetic in another order: sums of histogram counts), through
irregular gaps, late and non-finite observations, steps and spikes. Then the behaviour the
product relies on: a bank of N rows is N one-row views, scores stay in [0, 1], a constant
scores 0, snapshots round-trip, a row fits in 1 KiB, a daily rhythm is learnt and a shift
scores high, then becomes the new normal; a shape that recurs stops being news while a
new one is news; an onset is reported once in its quiet period."""

from __future__ import annotations

import json
import math
import pickle
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.detectors.generic import GenericBank, GenericDetector, GenericParams, surprise
from tests.reference.generic import GenericReference

T0 = 1_767_225_600.0  # a Thursday, midnight UTC
DAY = 86400.0
REL, ABS = 1e-6, 1e-9
SHORT = GenericParams(warmup=20, memory_s=6 * 3600.0, slots=24)  # a few hours say something
FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


def close(a: float, b: float, size: float = 0.0) -> bool:
    """Equal within REL of the larger or of ``size`` (a band edge: of the value and the
    band's width, whose float32 profile slots round differently in another order)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS + REL * size)


def size(yhat: float, lower: float, upper: float) -> float:
    return 0.0 if math.isnan(yhat) else abs(yhat) + upper - lower


def stream(rng: random.Random, n: int) -> list[tuple[float, float]]:
    """One series: 10 s .. 5 min steps with gaps, late and repeated times, noise of one
    of several shapes (none, gaussian, bursty), a step, spikes, NaN now and then."""
    t, out = T0 + rng.uniform(0, DAY), []
    step_s = rng.choice([10.0, 60.0, 300.0])
    sd = rng.choice([0.0, 1.0, 50.0])
    shift_at = rng.randrange(n)
    for i in range(n):
        v = 100.0 + 20 * math.sin(2 * math.pi * t / DAY) + rng.gauss(0, sd)
        v += 40.0 if i >= shift_at else 0.0
        v += rng.expovariate(0.01) if rng.random() < 0.03 else 0.0
        v = math.nan if rng.random() < 0.02 else v
        late = rng.random() < 0.03
        out.append((t - rng.uniform(0, 2 * step_s) if late else t, v))
        t += step_s * (rng.choice([0.5, 1.0, 1.0, 2.0]) if rng.random() > 0.01 else 100)
    return out


def feed(params: GenericParams, streams: list[list[tuple[float, float]]]) -> None:
    """Rows in turn (each call: every row with an observation left), bank vs references."""
    bank = GenericBank(params, capacity=1)  # it grows
    refs = [GenericReference(params) for _ in streams]
    for i in range(max(map(len, streams))):
        rows = [r for r, s in enumerate(streams) if i < len(s)]
        t = [streams[r][i][0] for r in rows]
        x = [streams[r][i][1] for r in rows]
        if i % 7 == 3:  # forecast is read-only and agrees too
            yhat, lower, upper = bank.forecast(rows, t)
            for j, r in enumerate(rows):
                fc = refs[r].forecast(t[j])
                m = size(*fc)
                assert all(
                    close(a, b, m) for a, b in zip((yhat[j], lower[j], upper[j]), fc, strict=True)
                ), (
                    r,
                    i,
                )
        got = bank.update(rows, t, x)
        for j, r in enumerate(rows):
            want = refs[r].update(t[j], x[j])
            pairs = zip(
                (got.score[j], got.yhat[j], got.lower[j], got.upper[j], got.onset[j], got.held[j]),
                (want.score, want.yhat, want.lower, want.upper, want.onset, want.held),
                strict=True,
            )
            m = size(want.yhat, want.lower, want.upper)
            assert all(close(a, b, m) for a, b in pairs), (r, i, got, want)
    assert bank.late == sum(ref.late for ref in refs)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4))
def test_the_bank_follows_the_reference(seed: int, rows: int) -> None:
    rng = random.Random(seed)
    feed(SHORT, [stream(rng, rng.randrange(1, 120)) for _ in range(rows)])


def test_the_bank_follows_the_reference_over_days() -> None:
    rng = random.Random(3)
    feed(GenericParams(), [stream(rng, 900) for _ in range(3)])


def series(seed: int, n: int = 600, step_s: float = 60.0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    t = [T0 + step_s * i for i in range(n)]
    return t, [10 + 3 * math.sin(i / 50) + rng.gauss(0, 1) + 30 * (i == n - 50) for i in range(n)]


def test_a_bank_of_n_rows_is_n_views() -> None:
    streams = [series(seed) for seed in range(5)]
    bank = GenericBank(SHORT, capacity=2)
    views = [GenericDetector(**SHORT.as_dict()) for _ in streams]
    for i in range(len(streams[0][0])):
        got = bank.update(range(5), [s[0][i] for s in streams], [s[1][i] for s in streams])
        for r, (view, (t, x)) in enumerate(zip(views, streams, strict=True)):
            full = view.predict_one({"t": t[i], "value": x[i]})
            want = view.score_one({"t": t[i], "value": x[i]})
            view.learn_one({"t": t[i], "value": x[i]})
            assert math.isclose(got.onset[r], want, rel_tol=1e-12, abs_tol=1e-12), (r, i)
            assert math.isclose(got.score[r], full.score[0], rel_tol=1e-12, abs_tol=1e-12)
    assert max(views[0].score_one({"t": T0 + 1e6, "value": 1e3}), 0) > 0.5


def test_the_histograms_tails_are_summed_alike_on_few_rows_and_many() -> None:
    """From ``surprise.MANY`` rows on, the counts at or above each edge are summed a bin at
    a time, below along each row: both from the top bin down in float64, as a plain loop."""
    rng = np.random.default_rng(7)
    for n in (3, surprise.MANY - 1, surprise.MANY, surprise.MANY + 40):
        h = rng.exponential(50.0, (n, 26)) * (rng.random((n, 26)) < 0.6)
        h = (h * 2.0 ** rng.integers(-45, 1, (n, 26))).astype(np.float32)  # decayed for long
        want = np.zeros((n, 27))
        for i in range(n):
            acc = 0.0
            for k in range(25, -1, -1):
                acc += float(h[i, k])
                want[i, k] = acc
        assert np.array_equal(surprise._above(h), want), n


def test_a_bank_of_many_rows_scores_as_banks_of_few() -> None:
    """A bank of 2 x 150 rows (its calls above ``surprise.MANY``) and two of 150 rows (below
    it): the same floats, scores and state, through a spike and the shapes around it."""
    half = 150
    assert half < surprise.MANY <= 2 * half
    streams = [series(seed, n=200) for seed in range(2 * half)]
    many, few = GenericBank(SHORT, capacity=2 * half), [GenericBank(SHORT) for _ in range(2)]
    top = 0.0
    for i in range(200):
        t = np.array([s[0][i] for s in streams])
        x = np.array([s[1][i] for s in streams])
        got = many.update(np.arange(2 * half), t, x)
        parts = [b.update(np.arange(half), t[j * half:][:half], x[j * half:][:half])
                 for j, b in enumerate(few)]  # fmt: skip
        for name, a in got._asdict().items():
            b = np.concatenate([getattr(p, name) for p in parts])
            assert np.array_equal(a, b, equal_nan=True), (i, name)
        top = max(top, float(got.score.max()))
    assert top > 0.5  # the spike, 50 observations before the end
    for name in ("hz", "hb", "hs", "hn", "level", "anchor", "peak", "proto"):
        whole = getattr(many, name)[: 2 * half]
        assert np.array_equal(whole, np.concatenate([getattr(b, name)[:half] for b in few]))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 4 * DAY), st.one_of(st.floats(-1e15, 1e15), st.just(math.nan))),
        min_size=1,
        max_size=200,
    )
)
def test_scores_stay_in_the_unit_interval(steps: list[tuple[float, float]]) -> None:
    bank, t = GenericBank(SHORT, capacity=1), T0
    for dt, v in steps:
        t += dt
        out = bank.update([0], [t], [v])
        assert 0.0 <= out.score[0] <= 1.0
        assert not (out.lower[0] > out.yhat[0] or out.yhat[0] > out.upper[0])


@pytest.mark.parametrize("value", [0.0, -3.5, 42e9, 1e-300])
def test_a_constant_scores_zero_and_its_band_is_the_value(value: float) -> None:
    bank = GenericBank(capacity=1)
    for i in range(3000):
        out = bank.update([0], [T0 + 17.0 * i], [value])
        assert out.score[0] == 0.0
    assert (out.yhat[0], out.lower[0], out.upper[0]) == (value, value, value)
    assert bank.update([0], [T0 + 1e6], [value + 1.0]).score[0] > 0.5  # and then it moves


def test_late_and_non_finite_observations_are_not_learnt() -> None:
    bank = GenericBank(SHORT, capacity=3)
    t, x = series(1, n=200)
    for i in range(200):
        bank.update([0, 1], [t[i], t[i]], [x[i], x[i]])
    before = bank.row_state(0)
    forecast = bank.forecast([0], [t[-1] + 60])
    for tt, v in [(t[-1], 999.0), (t[10], 1.0), (t[-1] + 60, math.nan), (t[-1] + 60, math.inf)]:
        out = bank.update([0], [tt], [v])
        assert out.score[0] == 0.0
    assert bank.late == 2
    assert bank.row_state(0) == before
    assert np.allclose(bank.forecast([0], [t[-1] + 60]), forecast)
    fresh = bank.update([2], [T0], [5.0])  # a fresh row has no forecast
    assert fresh.score[0] == 0.0 and math.isnan(fresh.yhat[0])


def test_pickle_and_row_state_round_trip() -> None:
    t, x = series(2)
    bank = GenericBank(capacity=2)
    for i in range(400):
        bank.update([0, 1], [t[i], t[i]], [x[i], -x[i]])
    copy = pickle.loads(pickle.dumps(bank))
    other = GenericBank(capacity=5)
    state = json.loads(json.dumps(bank.row_state(1)))  # plain data
    other.set_row_state(4, state)
    assert other.row_state(4) == bank.row_state(1)
    for i in range(400, 600):
        a = bank.update([0, 1], [t[i], t[i]], [x[i], -x[i]])
        b = copy.update([0, 1], [t[i], t[i]], [x[i], -x[i]])
        c = other.update([4], [t[i]], [-x[i]])
        assert np.array_equal(a.score, b.score) and a.score[1] == c.score[0]
    with pytest.raises(ValueError):
        GenericBank(GenericParams(slots=24)).set_row_state(0, state)
    bank.reset([0])
    assert math.isnan(bank.forecast([0], [t[-1]])[0][0])


def test_a_row_fits_in_a_kibibyte() -> None:
    bank = GenericBank(capacity=1000)
    assert bank.nbytes() / bank.capacity <= 1024
    bank.reserve(1500)
    assert bank.capacity >= 1500 and bank.nbytes() / bank.capacity <= 1024


def daily(days: float, step_s: float = 300.0, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    t = [T0 + step_s * i for i in range(int(days * DAY / step_s))]
    return t, [50 + 30 * math.sin(2 * math.pi * tt / DAY) + rng.gauss(0, 1) for tt in t]


def test_a_daily_rhythm_is_learnt_and_a_shift_scores_high_then_is_accepted() -> None:
    t, x = daily(4.0)
    det = GenericDetector()
    scores = []
    for tt, v in zip(t, x, strict=True):
        scores.append(det.score_one({"t": tt, "value": v}))
        det.learn_one({"t": tt, "value": v})
    day3 = scores[int(2 * DAY / 300) :]
    assert np.mean(day3) < 0.01 and np.quantile(day3, 0.99) < 0.1
    end = t[-1] + 300
    yhat, lower, upper = det.forecast_one(end)
    assert abs(yhat - (50 + 30 * math.sin(2 * math.pi * end / DAY))) < 3 and lower < yhat < upper
    shifted = [
        det.score_one({"t": end + 300 * i, "value": 70 + 30 * math.sin(2 * math.pi * i / 288)})
        for i in range(1)
    ]
    assert shifted[0] > 0.3
    after = []
    for i in range(288):
        x_i = {"t": end + 300 * i, "value": 70 + 30 * math.sin(2 * math.pi * (end + 300 * i) / DAY)}
        after.append(det.score_one(x_i))
        det.learn_one(x_i)
    assert max(after[:6]) > 0.3  # the first half hour pages ...
    assert max(after[-100:]) < 0.1  # ... and within the day it is the new normal


def steady(days: float, step_s: float, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    t = [T0 + step_s * i for i in range(int(days * DAY / step_s))]
    return t, [50 + rng.gauss(0, 1) for _ in t]


def onsets(params: GenericParams, t: list[float], x: list[float]) -> list[float]:
    bank = GenericBank(params, capacity=1)
    return [float(bank.update([0], [tt], [v]).onset[0]) for tt, v in zip(t, x, strict=True)]


def test_a_recurring_shape_stops_being_news_and_a_new_one_is_news() -> None:
    t, x = steady(6.5, 300.0)
    noon = [i for i, tt in enumerate(t) if tt % DAY == DAY / 2]
    for i in noon:
        x[i] += 15.0  # a spike at noon every day
    burst = [i for i, tt in enumerate(t) if 0 <= tt - (T0 + 6 * DAY + 3600) < 1800]
    for i in burst:
        x[i] += 6.0 * (-1) ** i  # then half an hour of oscillation, never seen before
    with_shape = onsets(GenericParams(quiet_s=0.0), t, x)
    residual_only = onsets(GenericParams(quiet_s=0.0, shape_weight=1e-9), t, x)
    first, *_, fourth, fifth, sixth = noon
    assert with_shape[first] > residual_only[first]  # the first spike's shape is news ...
    for i in (fourth, fifth, sixth):  # ... by the fourth day it is not (the residual's is low)
        assert with_shape[i] <= residual_only[i] + 0.02 and with_shape[i] < 0.3
    assert max(with_shape[i] for i in burst) > 0.35  # the new shape is news
    assert max(residual_only[i] for i in burst) < 0.3  # where the residual alone is not


def test_an_onset_is_reported_once_in_its_quiet_period() -> None:
    t, x = steady(1.0, 60.0)
    x[600] += 30.0
    x[630] = x[600]  # the same spike half an hour later
    quiet, control = GenericBank(capacity=1), GenericBank(GenericParams(quiet_s=0.0), capacity=1)
    got = {}
    for i, (tt, v) in enumerate(zip(t, x, strict=True)):
        a, b = quiet.update([0], [tt], [v]), control.update([0], [tt], [v])
        got[i] = (a.onset[0], b.onset[0], a.score[0], b.score[0])
    assert got[600][0] == got[600][1] > 0.3  # news
    assert got[630][0] == 0.0 < got[630][1]  # not news again, though its own onset is not 0
    assert got[630][2] == got[630][3] >= got[630][1]  # the score keeps it


def test_parameters_are_checked() -> None:
    bad_ones = [{"slots": 0}, {"level_s": -1.0}, {"held_p": 1.0}, {"warmup": 1.5}]
    bad_ones += [{"shape_k": 0}, {"shape_lr": 0.0}, {"shape_r": -1.0}, {"quiet_s": -1.0}]
    for bad in bad_ones:
        with pytest.raises(ValueError):
            GenericParams(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        GenericDetector().learn_one({"t": T0, "value": math.nan})
