"""Property tests (hypothesis) that every registered detector must pass, whatever it is fed.

Parametrised over :data:`ragwatch.detectors.REGISTRY`, so a new detector is covered by
registering itself: with its defaults and, if it has an entry in ``EAGER``, with a short
warm-up too, so that hypothesis reaches the scoring code with short streams. Inputs follow
each detector's documented keys (``FEATURES``; ``{"value", "t"}`` unless listed).

The properties:

1. scores are floats in [0, 1], never NaN, for any finite values (huge, subnormal, signed
   zeros) at non-decreasing times with irregular spacing, repeats and gaps of days;
2. nothing raises on gaps and repeated time stamps (checked with 1), nor, for detectors
   that document how they treat time (``TIME``; a new detector joins by declaring it), on
   out-of-order time stamps; they are held to what they document: "blind" ones score the
   same values the same whatever the time stamps, "drops_late" ones learn nothing from a
   sample older than their open bucket;
3. NaN and inf are refused: ``learn_one`` raises ValueError or ignores the sample, and
   ``score_one`` raises ValueError or returns a score, as ``NON_FINITE`` records per
   detector; either way the state is untouched, so a twin that never saw the bad samples
   scores the rest of the stream identically;
4. a constant series (any constant, 0 and negatives included) scores 0 at every one of a
   few hundred points, and a detector given that many constant points is past its warm-up
   (a ramp afterwards is scored above 0);
5. two fresh instances fed the same stream give bit-identical scores (checked on the
   streams of 1 and 2, by ``scored``).

Hypothesis runs derandomised and without an example database, so CI sees the same examples.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.detectors import REGISTRY, Detector, make, score_then_learn

with contextlib.suppress(ValueError):
    make("")  # any call to make() loads the built-in detectors into REGISTRY
NAMES = sorted(REGISTRY)

DAY = 86400.0

# Input keys besides "t" where a detector does not take {"value": ...}.
FEATURES: dict[str, tuple[str, ...]] = {"request_outliers": ("context_tokens", "output_tokens")}

# Short warm-ups, so that short generated streams reach the scoring code.
EAGER: dict[str, dict[str, Any]] = {
    "leak": {"window_s": 600.0, "bucket_s": 60.0, "min_span_s": 120.0, "min_points": 3},
    "request_outliers": {"eps": 16.0, "min_samples": 2, "window": 20, "warmup": 3},
    "seasonal": {"step_s": 60.0, "season_s": 600.0, "slot_s": 60.0, "warmup": 2},
}

# How each detector documents its use of time stamps: "blind" (t must be finite but is not
# used), "drops_late" (samples older than the open event-time bucket are counted and dropped).
TIME: dict[str, Literal["blind", "drops_late"]] = {
    "leak": "drops_late",
    "request_outliers": "blind",
    "seasonal": "drops_late",
}

# What (learn_one, score_one) do with a non-finite value or time: "raises" ValueError, or
# "ignores" it (learn_one: returns without learning; score_one: returns a score in [0, 1]).
Handling = Literal["raises", "ignores"]
NON_FINITE: dict[str, tuple[Handling, Handling]] = {
    "leak": ("raises", "ignores"),  # score_one does not read x: the score of the trend so far
    "request_outliers": ("raises", "raises"),
    "seasonal": ("raises", "raises"),
}


def cases(names: Sequence[str]) -> list[Any]:
    """``(name, params)`` pytest params: each detector with its defaults and, if it has an
    entry in ``EAGER``, with a short warm-up."""
    return [pytest.param(n, {}, id=n) for n in names] + [
        pytest.param(n, EAGER[n], id=f"{n}-eager") for n in names if n in EAGER
    ]


CASES = cases(NAMES)

PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- strategies --------------------------------------------------------------------------

# near the largest double: sums of two of them overflow, some differences too
HUGE = [1.7976931348623157e308, 1e308, 8.98846567431158e307, 1e300]
HUGE += [-v for v in HUGE]
TINY = [5e-324, -5e-324, 2.2250738585072014e-308, 1e-300, -1e-300]
FINITE = st.one_of(
    st.floats(-1e3, 1e3),  # ordinary readings
    st.floats(0.0, 1e12),  # bytes, tokens, requests
    st.floats(allow_nan=False, allow_infinity=False),  # any double: huge, subnormal, -0.0
    st.sampled_from([0.0, -0.0, *TINY]),
    st.sampled_from(HUGE),
)
STEP = st.one_of(
    st.just(0.0),  # a repeated time stamp
    st.floats(0.0, 60.0),  # irregular sampling
    st.floats(60.0, 3600.0),  # missed samples
    st.floats(3600.0, 10 * DAY),  # agent down, host rebooted: hours to days
)
START = st.floats(0.0, 4e9)
BAD = [math.nan, math.inf, -math.inf]
STREAM_SIZE = (40, 200)  # points per generated stream (hypothesis averages about 80)

Point = tuple[float, ...]


def features(name: str) -> tuple[str, ...]:
    return FEATURES.get(name, ("value",))


def points(name: str, min_size: int, max_size: int) -> st.SearchStrategy[list[Point]]:
    point = st.tuples(*[FINITE] * len(features(name)))
    return st.lists(point, min_size=min_size, max_size=max_size)


def timeline(start: float, steps: Sequence[float]) -> list[float]:
    ts, t = [], start
    for dt in steps:
        t += dt
        ts.append(t)
    return ts


@st.composite
def rising_stream(draw: st.DrawFn, name: str) -> list[dict[str, float]]:
    """Finite points at non-decreasing times (repeats, irregular steps, gaps of days)."""
    pts = draw(points(name, *STREAM_SIZE))
    steps = draw(st.lists(STEP, min_size=len(pts), max_size=len(pts)))
    return [sample(name, p, t) for p, t in zip(pts, timeline(draw(START), steps), strict=True)]


def sample(name: str, point: Point, t: float) -> dict[str, float]:
    x = dict(zip(features(name), point, strict=True))
    x["t"] = t
    return x


def run(det: Detector, xs: Sequence[dict[str, float]]) -> list[float]:
    return [score_then_learn(det, x) for x in xs]


def scored(
    name: str, params: dict[str, Any], xs: Sequence[dict[str, float]]
) -> tuple[Detector, list[float]]:
    """A fresh detector fed ``xs`` and its scores, checked to be floats in [0, 1] and to be
    bit-identical to those of a second fresh instance (property 5)."""
    det = make(name, **params)
    scores = run(det, xs)
    assert_scores(scores)
    assert bits(run(make(name, **params), xs)) == bits(scores)
    return det, scores


def assert_scores(scores: Sequence[object]) -> None:
    for i, s in enumerate(scores):
        assert isinstance(s, float), (i, s)
        assert 0.0 <= s <= 1.0, (i, s)  # False for NaN


def bits(scores: Sequence[float]) -> list[str]:
    return [s.hex() for s in scores]


# -- the tables name registered detectors --------------------------------------------------


@pytest.mark.parametrize("table", [FEATURES, EAGER, TIME, NON_FINITE])
def test_tables_name_only_registered_detectors(table: dict[str, Any]) -> None:
    assert set(table) <= set(REGISTRY)


# -- 1. scores in [0, 1] ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), CASES)
@PROPERTY
@given(data=st.data())
def test_scores_are_floats_in_unit_interval(
    name: str, params: dict[str, Any], data: st.DataObject
) -> None:
    xs = data.draw(rising_stream(name))
    det, _ = scored(name, params, xs)
    probe = data.draw(points(name, 1, 5))  # after the stream, at its last time
    assert_scores([det.score_one(sample(name, p, xs[-1]["t"])) for p in probe])


# -- 2. time stamps in any order ----------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), cases([n for n in NAMES if n in TIME]))
@PROPERTY
@given(data=st.data())
def test_out_of_order_time_stamps_do_not_raise(
    name: str, params: dict[str, Any], data: st.DataObject
) -> None:
    pts = data.draw(points(name, *STREAM_SIZE))
    offsets = st.floats(-10 * DAY, 10 * DAY)
    ts = data.draw(st.lists(offsets, min_size=len(pts), max_size=len(pts)))
    start = data.draw(START)
    xs = [sample(name, p, start + dt) for p, dt in zip(pts, ts, strict=True)]
    scored(name, params, xs)


@pytest.mark.parametrize(("name", "params"), cases([n for n in NAMES if TIME.get(n) == "blind"]))
@PROPERTY
@given(data=st.data())
def test_time_blind_detectors_ignore_time_stamps(
    name: str, params: dict[str, Any], data: st.DataObject
) -> None:
    xs = data.draw(rising_stream(name))
    shuffled = data.draw(st.lists(st.floats(-1e10, 1e10), min_size=len(xs), max_size=len(xs)))
    ys = [{**x, "t": t} for x, t in zip(xs, shuffled, strict=True)]
    scores = run(make(name, **params), xs)
    assert bits(run(make(name, **params), ys)) == bits(scores)


@pytest.mark.parametrize(
    ("name", "params"), cases([n for n in NAMES if TIME.get(n) == "drops_late"])
)
@PROPERTY
@given(data=st.data())
def test_late_samples_change_nothing(
    name: str, params: dict[str, Any], data: st.DataObject
) -> None:
    xs = data.draw(rising_stream(name))
    late = data.draw(
        st.lists(
            st.tuples(st.integers(1, len(xs) - 1), points(name, 1, 1), st.floats(DAY, 30 * DAY)),
            min_size=1,
            max_size=10,
        )
    )
    # older than the first sample by a day or more: older than any open bucket
    inserts = {i: sample(name, p[0], xs[0]["t"] - age) for i, p, age in late}
    on_time, with_late = make(name, **params), make(name, **params)
    for i, x in enumerate(xs):
        if i in inserts:
            assert_scores([score_then_learn(with_late, inserts[i])])
        assert score_then_learn(with_late, x).hex() == score_then_learn(on_time, x).hex(), i


# -- 3. NaN and inf -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), CASES)
@PROPERTY
@given(data=st.data())
def test_non_finite_input_is_refused_without_a_trace(
    name: str, params: dict[str, Any], data: st.DataObject
) -> None:
    xs = data.draw(rising_stream(name))
    keys = [*features(name), "t"]
    bad = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(xs) - 1), st.sampled_from(keys), st.sampled_from(BAD)),
            min_size=1,
            max_size=10,
        )
    )
    learn_doc, score_doc = NON_FINITE.get(name, (None, None))
    clean, dirty = make(name, **params), make(name, **params)
    for i, x in enumerate(xs):
        for _, key, v in (b for b in bad if b[0] == i):
            poison = {**x, key: v}
            try:
                assert_scores([dirty.score_one(poison)])
                assert score_doc in (None, "ignores"), "documented to raise"
            except ValueError:
                assert score_doc in (None, "raises"), "documented to return a score"
            try:
                dirty.learn_one(poison)
                assert learn_doc in (None, "ignores"), "documented to raise"
            except ValueError:
                assert learn_doc in (None, "raises"), "documented to ignore"
        expected = score_then_learn(clean, x)
        assert score_then_learn(dirty, x).hex() == expected.hex(), i
        assert_scores([expected])


# -- 4. constant series -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), CASES)
@settings(PROPERTY, max_examples=30)
@given(data=st.data())
def test_constant_series_scores_zero(
    name: str, params: dict[str, Any], data: st.DataObject
) -> None:
    extreme = st.tuples(*[st.sampled_from(HUGE + TINY)] * len(features(name)))
    value = data.draw(st.one_of(points(name, 1, 1).map(lambda p: p[0]), extreme))
    # irregular spacing: a drawn pattern of steps, repeated, so that buckets of event time
    # hold varying numbers of samples; plus a few gaps of up to days
    n = data.draw(st.integers(300, 400))
    pattern = data.draw(st.lists(st.floats(0.0, 120.0), min_size=1, max_size=20))
    steps = list(itertools.islice(itertools.cycle(pattern), n))
    for i, gap in data.draw(st.lists(st.tuples(st.integers(0, n - 1), STEP), max_size=3)):
        steps[i] += gap
    xs = [sample(name, value, t) for t in timeline(data.draw(START), steps)]
    det = make(name, **params)
    scores = run(det, xs)
    assert set(scores) == {0.0}, (scores.index(max(scores)), max(scores))
    assert det.score_one(xs[-1]) == 0.0


@pytest.mark.parametrize("value", [0.0, -0.0, -5.0, 0.1, 42e9, -1e-300, 5e-324])
@pytest.mark.parametrize(("name", "params"), CASES)
def test_constant_series_is_past_warm_up(name: str, params: dict[str, Any], value: float) -> None:
    """The same length of constant input as above warms every detector up: a jump and a
    ramp that follow it are scored. So the zeros above are not warm-up zeros. (The jump,
    5 % of the value: a detector that models trends, ``seasonal``, learns a gentle ramp on
    a large value as its trend, and rightly so.)"""
    k = len(features(name))
    t0 = 1_699_999_200.0
    det = make(name, **params)
    flat = [sample(name, (value,) * k, t0 + 60.0 * i) for i in range(300)]
    assert set(run(det, flat)) == {0.0}
    jump = 0.05 * abs(value)
    ramp = [
        sample(name, (value + jump + 1e8 * i,) * k, t0 + 60.0 * (300 + i)) for i in range(1, 121)
    ]  # 6e9 units an hour: a leak of 6 GB/h, a jump for everything else
    scores = run(det, ramp)
    assert_scores(scores)
    assert max(scores) > 0.0
