"""The Holt-Winters detector on synthetic tokens/request series: quiet on healthy days with
a daily cycle, quick on the incident's 36 % drop, and well-behaved at warm-up, gaps and
its edges.

The healthy series is 500 tokens/request with a +-20 % daily sine and 3 % noise per
sample, one sample a minute (five per 5-minute bucket), four days. Everything goes
through the public surface: ``learn_one``/``score_one``, ``deviation``, ``report``,
``last_deviation``, ``forecast_for`` and ``late``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from ragwatch.detectors import make, score_then_learn
from ragwatch.detectors.holt_winters import Deviation, HoltWinters

T0 = 1_699_999_200.0  # a whole hour
DAY = 86400.0
HOUR = 3600.0
BUCKET = 300.0
DROP = (3 * DAY + 14 * HOUR, 3 * DAY + 14.5 * HOUR)  # day 4, 14:00-14:30


def healthy(t: float) -> float:
    return 500.0 * (1 + 0.2 * math.sin(2 * math.pi * t / DAY))


def series(
    days: float = 4.0,
    seed: int = 3,
    change: tuple[float, float] | None = None,
    factor: float = 1.0,
    gaps: tuple[tuple[float, float], ...] = (),
) -> Iterator[dict[str, Any]]:
    """One sample a minute; ``factor`` multiplies the values inside ``change``."""
    rng = random.Random(seed)
    for i in range(int(days * DAY / 60)):
        t = i * 60.0
        noise = 1 + rng.gauss(0, 0.03)
        if any(a <= t < b for a, b in gaps):
            continue
        v = healthy(t) * noise
        if change and change[0] <= t < change[1]:
            v *= factor
        yield {"value": v, "t": T0 + t}


def scores(det: HoltWinters, xs: Iterator[dict[str, Any]]) -> list[tuple[float, float]]:
    """(seconds since T0, score) for each sample, scored before it is learned."""
    return [(x["t"] - T0, score_then_learn(det, x)) for x in xs]


def between(scored: list[tuple[float, float]], a: float, b: float) -> list[float]:
    return [s for t, s in scored if a <= t < b]


@pytest.mark.parametrize("warmup_seasons", [0.0, 1.0])
def test_no_false_alarm_on_healthy_days(warmup_seasons: float) -> None:
    scored = scores(HoltWinters(warmup_seasons=warmup_seasons), series())
    first_day = between(scored, 0, DAY)
    if warmup_seasons:
        assert set(first_day) == {0.0}  # silent while the daily profile is learned
    assert max(first_day) < 0.5
    assert max(between(scored, DAY, 4 * DAY)) < 0.5  # three healthy days after warm-up
    assert max(between(scored, DAY, 4 * DAY)) > 0.0  # noise is seen, just not alarming


def test_throughput_drop_scores_within_two_buckets_and_while_it_lasts() -> None:
    det = HoltWinters(direction="down")
    scored = scores(det, series(change=DROP, factor=0.64))
    assert max(between(scored, DAY, DROP[0])) < 0.5
    first = next(t for t, s in scored if t >= DROP[0] and s >= 0.5)
    assert first - DROP[0] < 2 * BUCKET
    during = between(scored, DROP[0], DROP[1])
    assert min(during) >= 0.5, "robust updates keep a sustained drop visible"
    assert max(between(scored, DROP[1] + HOUR, 4 * DAY)) < 0.5  # and it recovers


def test_a_drop_that_lasts_hours_keeps_scoring_until_it_ends() -> None:
    """The baseline is held while the series deviates: four hours of -36 % score all along,
    nothing is learned from them, and the score is gone once the series is back."""
    long_drop = (DROP[0], DROP[0] + 4 * HOUR)
    det = HoltWinters(direction="down")
    scored = scores(det, series(change=long_drop, factor=0.64))
    assert min(between(scored, long_drop[0] + 2 * BUCKET, long_drop[1])) >= 0.5
    assert det.held >= 4 * HOUR / BUCKET - 2
    assert max(between(scored, long_drop[1] + 2 * BUCKET, 4 * DAY)) < 0.5
    assert not det.holding


def test_a_deviation_longer_than_hold_max_becomes_the_new_normal() -> None:
    step = (2 * DAY, 4 * DAY)  # a new model: tokens/request -36 % for good
    det = HoltWinters(direction="down", hold_max_s=2 * HOUR)
    scored = scores(det, series(change=step, factor=0.64))
    assert min(between(scored, step[0] + 2 * BUCKET, step[0] + 2 * HOUR)) >= 0.5
    assert max(between(scored, step[0] + 3 * HOUR, 4 * DAY)) < 0.5  # adopted after 2 h
    plain = scores(HoltWinters(direction="down", hold=math.inf), series(change=step, factor=0.64))
    assert max(between(plain, step[0] + HOUR, step[0] + 2 * HOUR)) < 0.5  # learned sooner


def test_report_explains_the_drop() -> None:
    det = HoltWinters(direction="down")
    t_open = BUCKET  # the report is about the bucket still open: the drop's second
    for x in series(days=(DROP[0] + t_open + 60) / DAY, change=DROP, factor=0.64):
        det.learn_one(x)
    rep = det.report()
    assert rep is not None
    assert rep.forecast == pytest.approx(healthy(DROP[0] + t_open), rel=0.05)
    assert rep.relative == pytest.approx(-0.36, abs=0.06)
    assert rep.actual == pytest.approx(rep.forecast * (1 + rep.relative))
    assert det.last_deviation == rep.relative


def test_an_increase_does_not_score_when_watching_drops() -> None:
    down = scores(HoltWinters(direction="down"), series(change=DROP, factor=1.36))
    up = scores(HoltWinters(direction="up"), series(change=DROP, factor=1.36))
    assert set(between(down, DROP[0], DROP[1])) == {0.0}
    assert max(between(down, DROP[1], 4 * DAY)) < 0.5  # nor does the return to normal
    assert max(between(up, DROP[0], DROP[0] + 2 * BUCKET)) >= 0.5


@pytest.mark.parametrize(
    "gap",
    [
        (0.3 * DAY, 0.3 * DAY + 4 * HOUR),  # inside the first season
        (1.5 * DAY, 1.5 * DAY + 3 * HOUR),
        (2 * DAY + 5 * HOUR, 2 * DAY + 10 * HOUR),
    ],
)
def test_gaps_of_hours_do_not_alarm_when_data_resumes_normal(gap: tuple[float, float]) -> None:
    scored = scores(HoltWinters(), series(gaps=(gap,)))
    assert max(between(scored, gap[1], gap[1] + 2 * HOUR)) < 0.5
    assert max(s for _, s in scored) < 0.5


def test_a_gap_longer_than_max_gap_restarts_level_but_keeps_the_daily_profile() -> None:
    gap = (2 * DAY, 2 * DAY + 8 * HOUR)
    det = HoltWinters(max_gap_s=6 * HOUR)
    scored = scores(det, series(gaps=(gap,)))
    assert set(between(scored, gap[1], gap[1] + 12 * BUCKET)) == {0.0}  # warm-up again
    assert max(between(scored, gap[1], 4 * DAY)) < 0.5
    t = 3 * DAY + 6 * HOUR  # the profile still knows the shape of the day
    assert det.forecast_for(T0 + 4 * DAY + 6 * HOUR) == pytest.approx(healthy(t), rel=0.05)


def test_constant_series_always_scores_zero() -> None:
    for value in (0.0, 42.0, 6e9):
        det = HoltWinters(season_s=HOUR * 2)
        xs = [{"value": value, "t": T0 + 30.0 * i} for i in range(4 * 240)]  # 4 seasons
        assert {score_then_learn(det, x) for x in xs} == {0.0}
        assert det.forecast_for(T0 + 30.0 * len(xs)) == value
        assert det.last_deviation == 0.0


def test_warm_up_returns_zero() -> None:
    det = HoltWinters(warmup_buckets=12)
    wild = [{"value": 500.0 * (1 + (i % 7)), "t": T0 + 60.0 * i} for i in range(12 * 5)]
    for x in wild:  # twelve buckets, values jumping by up to 7x
        assert det.score_one(x) == 0.0
        assert det.deviation(x) is None
        det.learn_one(x)
    assert det.report() is None
    # the thirteenth bucket is the first one scored
    assert det.score_one({"value": 50_000.0, "t": T0 + 12 * BUCKET}) == 1.0


def test_forecast_for() -> None:
    det = HoltWinters()
    assert det.forecast_for(T0) is None  # nothing learned
    xs = list(series(days=2))
    for x in xs:
        det.learn_one(x)
    now = xs[-1]["t"]
    nxt = now + BUCKET
    assert det.forecast_for(nxt) == pytest.approx(healthy(nxt - T0), rel=0.03)
    assert det.forecast_for(now - 2 * BUCKET) is None  # a closed bucket
    assert det.forecast_for(now + 7 * HOUR) is None  # past max_gap_s: the model would restart
    x = {"value": 123.0, "t": nxt}
    dev = det.deviation(x)
    assert isinstance(dev, Deviation)
    assert dev.forecast == det.forecast_for(nxt)
    assert dev.relative == pytest.approx((123.0 - dev.forecast) / dev.forecast)
    assert det.score_one(x) == min(1.0, abs(dev.relative) / 0.5)


def test_score_is_relative_deviation_over_scale_and_floor_protects_zero() -> None:
    det = HoltWinters(season_s=HOUR, warmup_buckets=2, floor=10.0)
    for i in range(4 * 60):
        det.learn_one({"value": 100.0, "t": T0 + 60.0 * i})
    t = T0 + 4 * HOUR
    assert det.score_one({"value": 75.0, "t": t}) == pytest.approx(0.5)  # 25 % below
    assert det.score_one({"value": 112.5, "t": t}) == pytest.approx(0.25)
    zero = HoltWinters(season_s=HOUR, warmup_buckets=2, floor=10.0)
    for i in range(4 * 60):
        zero.learn_one({"value": 0.0, "t": T0 + 60.0 * i})
    assert zero.score_one({"value": 2.0, "t": t}) == pytest.approx(0.4)  # 2 / floor / 0.5


def test_late_samples_are_counted_and_not_scored() -> None:
    det = HoltWinters(season_s=HOUR, warmup_buckets=1)
    for i in range(30):
        det.learn_one({"value": 100.0, "t": T0 + 60.0 * i})
    old = {"value": 1e6, "t": T0}
    assert det.score_one(old) == 0.0
    det.learn_one(old)
    assert det.late == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_raises(bad: float) -> None:
    det = HoltWinters()
    with pytest.raises(ValueError):
        det.learn_one({"value": bad, "t": T0})
    with pytest.raises(ValueError):
        det.score_one({"value": 1.0, "t": bad})


@pytest.mark.parametrize(
    "params",
    [
        {"bucket_s": 0.0},
        {"bucket_s": math.nan},
        {"season_s": 1000.0},  # not a multiple of 300
        {"season_s": 300.0},  # a single bucket
        {"season_s": math.inf},
        {"alpha": 0.0},
        {"alpha": 1.5},
        {"beta": -0.1},
        {"gamma": 2.0},
        {"scale": 0.0},
        {"floor": -1.0},
        {"direction": "sideways"},
        {"warmup_buckets": 0},
        {"warmup_buckets": 1.5},
        {"warmup_seasons": -1.0},
        {"max_gap_s": 60.0},
        {"clip": 0.0},
        {"clip": math.nan},
        {"hold": 0.0},
        {"hold_max_s": -1.0},
        {"hold_max_s": math.inf},
    ],
)
def test_invalid_params_raise(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HoltWinters(**params)


def test_registered_and_clone_keeps_params() -> None:
    det = make("holt_winters", season_s=HOUR, direction="down", scale=0.25)
    assert isinstance(det, HoltWinters)
    for x in series(days=0.1):
        det.learn_one(x)
    fresh = det.clone()
    assert isinstance(fresh, HoltWinters)
    assert (fresh.season_s, fresh.direction, fresh.scale) == (HOUR, "down", 0.25)
    assert fresh.report() is None


def test_values_near_the_float_range_do_not_poison_the_model() -> None:
    """+-1e308 overflows level and trend; the model starts over instead of staying NaN."""
    det = HoltWinters()
    xs = [1e308, -1e308] * 30 + [100.0] * 2000
    for i, v in enumerate(xs):
        det.learn_one({"value": v, "t": T0 + 60.0 * i})
    t = T0 + 60.0 * len(xs)
    assert det.forecast_for(t) == pytest.approx(100.0)
    assert det.score_one({"value": 1e6, "t": t}) == 1.0
