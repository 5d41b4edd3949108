"""Contract checks every registered detector must pass (river's ``checks`` pattern).

One module, parametrised over every name in :data:`ragwatch.detectors.REGISTRY`, drives
each detector through its public protocol only (``make``, ``learn_one``, ``score_one``,
``clone``, pickle). A new detector gets these checks for free by registering itself.

The checks rely on the shared input convention: ``x = {"value": float, "t": epoch s}``.
"Missing features tolerated" becomes, for these univariate detectors, "a sample the
detector refuses (missing or non-finite value) raises and leaves no trace".
"""

from __future__ import annotations

import contextlib
import math
import pickle
import random
import statistics
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.detectors import REGISTRY, Detector, make, score_then_learn
from tests.timing import chunk_seconds

with contextlib.suppress(ValueError):
    make("")  # any call to make() loads the built-in detectors into REGISTRY
NAMES = sorted(REGISTRY)

T0 = 1_699_999_200.0  # a whole hour, so detector buckets line up with it
GB = 1e9

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)

pytestmark = pytest.mark.parametrize("name", NAMES)


def stream(seed: int = 0, hours: float = 6.0, step_s: float = 10.0) -> Iterator[dict[str, Any]]:
    """GPU memory of one process: flat and noisy, then a 1.2 GB/h leak, with a 30 min gap.

    Every detector should have something to flag in it (the leak), so score comparisons
    below are not comparisons of zeros.
    """
    rng = random.Random(seed)
    n = int(hours * 3600 / step_s)
    for i in range(n):
        t = i * step_s
        if 2.0 * 3600 <= t < 2.5 * 3600:
            continue  # the agent was down for half an hour
        leak = max(0.0, t - 3600.0) * 1.2 * GB / 3600
        yield {"value": 6 * GB + rng.gauss(0, 40e6) + leak, "t": T0 + t}


def run(det: Detector, xs: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[float]:
    return [score_then_learn(det, x) for x in xs]


def state(det: Detector) -> bytes:
    return pickle.dumps(det)


def test_is_a_detector(name: str) -> None:
    det = make(name)
    assert isinstance(det, Detector)
    assert isinstance(det.clone(), Detector)


def test_scores_before_learning_are_zero(name: str) -> None:
    det = make(name)
    for x in [{"value": 0.0, "t": T0}, {"value": 80 * GB, "t": T0 + 1}, *stream(hours=0.1)]:
        assert det.score_one(x) == 0.0


def test_the_check_stream_is_not_trivial(name: str) -> None:
    scores = run(make(name), stream())
    assert max(scores) > 0.1, "the leak in the check stream should be flagged"


def test_score_one_does_not_mutate(name: str) -> None:
    det = make(name)
    xs = list(stream())
    run(det, xs[:1200])
    for x in xs[1200:1500]:
        before = state(det)
        first = det.score_one(x)
        assert det.score_one(x) == first
        assert state(det) == before
        det.learn_one(x)


def test_new_features_are_tolerated(name: str) -> None:
    plain, extra = make(name), make(name)
    xs = list(stream(hours=4))
    noisy = [{**x, "host": "gpu-node-01", "pid": 4001, "rss": 3.0 * GB} for x in xs]
    assert run(plain, xs) == run(extra, noisy)


@pytest.mark.parametrize(
    "bad",
    [
        {"value": math.nan, "t": T0 + 7200},
        {"value": math.inf, "t": T0 + 7200},
        {"value": -math.inf, "t": T0 + 7200},
        {"value": 1.0, "t": math.nan},
        {"value": 1.0, "t": math.inf},
    ],
    ids=["nan", "inf", "-inf", "t-nan", "t-inf"],
)
def test_non_finite_input_raises_value_error_and_leaves_no_trace(
    name: str, bad: dict[str, float]
) -> None:
    det = make(name)
    run(det, stream(hours=2))
    before = state(det)
    with pytest.raises(ValueError):
        det.learn_one(bad)
    assert state(det) == before


@pytest.mark.parametrize("missing", ["value", "t"])
def test_missing_input_raises_and_leaves_no_trace(name: str, missing: str) -> None:
    det = make(name)
    run(det, stream(hours=2))
    before = state(det)
    with pytest.raises((KeyError, ValueError)):
        det.learn_one({k: v for k, v in {"value": 1.0, "t": T0 + 7200}.items() if k != missing})
    assert state(det) == before


def test_pickle_round_trip_keeps_scoring_the_same(name: str) -> None:
    det = make(name)
    xs = list(stream())
    run(det, xs[: len(xs) // 2])
    copy = pickle.loads(pickle.dumps(det))
    rest = xs[len(xs) // 2 :]
    assert run(copy, rest) == run(det, rest)


def test_clone_is_fresh_and_independent(name: str) -> None:
    trained = make(name)
    xs = list(stream())
    run(trained, xs[:1500])
    snapshot = state(trained)

    clone = trained.clone()
    assert clone is not trained
    assert all(clone.score_one(x) == 0.0 for x in xs[:10])  # nothing learned
    assert run(clone, xs) == run(make(name), xs)  # same parameters as a fresh one
    assert state(trained) == snapshot  # training the clone left the original alone

    run(trained, xs[1500:])
    assert run(trained.clone(), xs) == run(clone.clone(), xs)


def test_same_input_gives_same_scores(name: str) -> None:
    a, b = make(name), make(name)
    xs = list(stream(seed=7))
    assert run(a, xs) == run(b, xs)
    assert state(a) == state(b)


def test_constant_input_scores_zero(name: str) -> None:
    det = make(name)
    xs = [{"value": 42 * GB, "t": T0 + i * 10.0} for i in range(6 * 360)]
    assert set(run(det, xs)) == {0.0}


# what a detector holds fills within two days with these (the seasonal baseline keeps a
# row of cells per day seen, ``days`` of them: 7 by default)
FILLS_IN_TWO_DAYS: dict[str, dict[str, Any]] = {"seasonal": {"days": 2}}
# a detector whose state is fixed arrays whatever the cadence (its memories are event-time
# spans) is fed every 10 s: its one-row view costs ~0.2 ms a sample (numpy on one row)
STEP_S: dict[str, int] = {"generic": 10}


def test_memory_is_bounded_over_a_long_stream(name: str) -> None:
    """Three simulated days at 1 s: the pickled state stops growing once its windows are
    full (the first day; the second for a baseline that holds two days)."""
    det = make(name, **FILLS_IN_TWO_DAYS.get(name, {}))
    rng = random.Random(1)
    sizes = []
    step = STEP_S.get(name, 1)
    for i in range(0, 3 * 86400, step):
        det.learn_one({"value": 40 * GB + rng.gauss(0, 40e6), "t": T0 + i})
        if i % 3600 == 0:
            sizes.append(len(state(det)))
    full, later = max(sizes[24:48]), max(sizes[48:])
    assert later <= full * 1.1 + 512, sizes


@FUZZ
@given(
    steps=st.lists(
        st.tuples(
            st.one_of(
                st.floats(0.0, 120.0),  # regular sampling, duplicates included
                st.floats(600.0, 3 * 86400.0),  # agent down, host rebooted
            ),
            st.floats(-1e12, 1e13),
        ),
        min_size=1,
        max_size=300,
    )
)
def test_scores_stay_in_unit_interval(name: str, steps: list[tuple[float, float]]) -> None:
    det = make(name)
    t = T0
    for dt, value in steps:
        t += dt
        score = score_then_learn(det, {"value": value, "t": t})
        assert 0.0 <= score <= 1.0
    assert 0.0 <= det.score_one({"value": steps[-1][1], "t": t}) <= 1.0


def test_cost_per_sample_does_not_grow(name: str) -> None:
    """A sample costs the same after 50,000 as after 5,000: catches an accidental O(n) per
    sample (O(n^2) in all) without a wall-clock floor, which a loaded machine would miss.
    Speed itself is the benchmarks' business (bench/pipeline.py)."""
    det = make(name)
    rng = random.Random(2)
    n = 50_000 // STEP_S.get(name, 1)  # (a view of fixed arrays, ~0.3 ms a sample: 5,000)
    xs = [{"value": 40 * GB + rng.gauss(0, 40e6), "t": T0 + i} for i in range(n)]
    chunks = chunk_seconds(det.learn_one, xs, n // 10)
    early, late = statistics.median(chunks[1:4]), statistics.median(chunks[-3:])
    assert late < 3 * early, f"{name}: {[round(c * 1e3) for c in chunks]} ms per {n // 10:,}"
