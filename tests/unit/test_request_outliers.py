"""The request-outlier detector on synthetic request streams: quiet on a tight population,
loud on the incident's (12000 context, 20 output) requests, a new cluster once enough of
them arrive, exact against a brute-force DBSCAN, bounded, deterministic and fast.
"""

from __future__ import annotations

import math
import pickle
import random
import statistics
from collections.abc import Iterator
from typing import Any

import pytest

from ragwatch.detectors import make, score_then_learn
from ragwatch.detectors.request_outliers import Cluster, RequestOutliers
from tests.timing import chunk_seconds

T0 = 1_699_999_200.0
ODD = {"context_tokens": 12000, "output_tokens": 20}


def requests(n: int, seed: int = 0, t0: float = T0) -> Iterator[dict[str, Any]]:
    """A tight normal population: context ~ N(3000, 200), output ~ N(250, 40)."""
    rng = random.Random(seed)
    for i in range(n):
        yield {
            "context_tokens": round(rng.gauss(3000, 200)),
            "output_tokens": max(1, round(rng.gauss(250, 40))),
            "t": t0 + i,
        }


def trained(n: int = 2000, **params: Any) -> RequestOutliers:
    det = RequestOutliers(**params)
    for x in requests(n):
        det.learn_one(x)
    return det


def reference_score(
    window: list[tuple[float, ...]], q: tuple[float, ...], eps: float, m: int
) -> float:
    """The documented score by brute force over the whole window."""
    if sum(math.dist(p, q) <= eps for p in window) >= m:
        return 0.0
    cores = [p for p in window if sum(math.dist(p, o) <= eps for o in window) >= m + 1]
    if not cores:
        return 1.0
    d = min(math.dist(p, q) for p in cores)
    if d <= eps:
        return 0.4 * d / eps
    return 0.5 + 0.5 * (1 - math.exp(-(d - eps) / eps))


def test_registered_and_defaults() -> None:
    det = make("request_outliers")
    assert isinstance(det, RequestOutliers)
    assert (det.eps, det.min_samples, det.window, det.warmup) == (128.0, 3, 2000, 50)


def test_cold_start_scores_zero() -> None:
    det = RequestOutliers(warmup=50)
    xs = list(requests(49))
    for x in xs:
        assert score_then_learn(det, x) == 0.0
    assert det.score_one({**ODD, "t": T0}) == 0.0
    det.learn_one({**ODD, "t": T0})
    assert det.score_one({**ODD, "t": T0}) > 0.5  # 50 points now: warm


def test_tight_population_is_quiet_except_truly_isolated_points() -> None:
    det = RequestOutliers()
    flagged = []
    for x in requests(6000, seed=3):
        window = det.points()
        s = score_then_learn(det, x)
        assert 0.0 <= s <= 1.0
        if s >= 0.5:
            flagged.append((window, (float(x["context_tokens"]), float(x["output_tokens"]))))
    assert len(flagged) < 0.01 * 6000, len(flagged)
    for window, q in flagged:  # each flagged point really has no dense region within eps
        assert sum(math.dist(p, q) <= 128 for p in window) < 3
        cores = [p for p in window if sum(math.dist(p, o) <= 128 for o in window) >= 4]
        assert min(math.dist(p, q) for p in cores) > 128


def test_scores_match_brute_force_dbscan() -> None:
    rng = random.Random(5)
    det = RequestOutliers(window=300, warmup=20)
    for i in range(1500):
        if rng.random() < 0.05:  # sprinkle outliers, some near each other
            x = {
                "context_tokens": rng.choice([12000, 500, 9000]) + rng.randint(-150, 150),
                "output_tokens": rng.choice([20, 2000]) + rng.randint(-60, 60),
                "t": T0 + i,
            }
        else:
            x = next(requests(1, seed=i, t0=T0 + i))
        q = (float(x["context_tokens"]), float(x["output_tokens"]))
        window = det.points()
        got = score_then_learn(det, x)
        want = 0.0 if len(window) < 20 else reference_score(window, q, 128.0, 3)
        assert got == pytest.approx(want, abs=1e-12), (i, q)


@pytest.mark.parametrize(
    ("context", "output", "label"),
    [
        (12000, 20, "long context, short output"),
        (300, 2000, "short context, long output"),
        (12000, 2000, "long context, long output"),
        (300, 20, "short context, short output"),
        (3000, 2000, "typical context, long output"),
    ],
)
def test_injected_outliers_score_high_and_are_labelled(
    context: int, output: int, label: str
) -> None:
    det = trained()
    x = {"context_tokens": context, "output_tokens": output, "t": T0 + 1e4}
    assert det.score_one(x) >= 0.5
    assert det.label_one(x) == label


def test_normal_points_have_no_label() -> None:
    det = trained()
    x = {"context_tokens": 3000, "output_tokens": 250, "t": T0 + 1e4}
    assert det.score_one(x) == 0.0
    assert det.label_one(x) is None


def test_similar_outliers_become_a_new_cluster() -> None:
    det = trained()
    before = det.clusters()
    assert len(before) == 1 and before[0].size > 1900
    rng = random.Random(9)
    scores = []
    for i in range(8):
        x = {
            "context_tokens": 12000 + rng.randint(-30, 30),
            "output_tokens": 20 + rng.randint(-5, 5),
            "t": T0 + 3000 + i,
        }
        scores.append(score_then_learn(det, x))
        det.learn_one(next(requests(1, seed=100 + i, t0=T0 + 3000 + i)))
    # The first min_samples are outliers; from then on they are a dense region of their own.
    assert all(s >= 0.5 for s in scores[:3]), scores
    assert all(s == 0.0 for s in scores[3:]), scores
    after = det.clusters()
    assert len(after) == 2
    new = after[1]
    assert isinstance(new, Cluster) and new.size == 8
    assert new.centroid == pytest.approx((12000, 20), abs=30)


def test_a_cluster_ages_out_of_the_window() -> None:
    det = RequestOutliers(window=500)
    for i in range(5):
        det.learn_one({**ODD, "t": T0 + i})
    for x in requests(495):
        det.learn_one(x)
    assert len(det.clusters()) == 2
    det.learn_one(next(requests(1, seed=1)))  # pushes the oldest outlier out: 4 remain
    assert len(det.clusters()) == 2
    for x in requests(10, seed=2):
        det.learn_one(x)
    assert len(det.clusters()) == 1
    assert det.score_one({**ODD, "t": T0}) > 0.5


def test_memory_is_bounded_by_the_window() -> None:
    det = RequestOutliers(window=2000)
    rng = random.Random(4)
    for i in range(100_000):
        if i % 50 == 0:  # wide drift and outliers: cells come and go
            x = {"context_tokens": rng.randint(0, 10**6), "output_tokens": rng.randint(0, 10**5)}
        else:
            x = {
                "context_tokens": 3000 + i // 10 + rng.randint(-300, 300),
                "output_tokens": 250 + rng.randint(-50, 50),
            }
        score_then_learn(det, {**x, "t": T0 + i})
        if i % 10_000 == 0:
            det.clusters()
    assert len(det) == len(det.points()) == 2000
    assert sum(len(c) for c in det._cells.values()) == 2 * 2000  # doubles
    assert len(det._cells) <= 2000
    assert len(det._dirty) <= 2000 and len(det._core) <= 2000
    assert sum(len(c) for c in det._core.values()) <= 2000  # a byte a point


def test_points_read_by_the_caller_score_and_learn_as_dicts_do() -> None:
    """score_point / learn_point (the request pipeline's path) are score_one / learn_one
    without reading a dict: same scores, same window, same clusters."""
    rng = random.Random(11)
    xs = [*requests(2500, seed=3), *({**ODD, "t": T0 + i} for i in range(12))]
    xs += [
        {"context_tokens": rng.randint(0, 20_000), "output_tokens": rng.randint(0, 3000),
         "t": T0}
        for _ in range(300)
    ]  # fmt: skip
    a, b = RequestOutliers(window=1000), RequestOutliers(window=1000)
    b.learn_one(xs[0])  # picks the features
    a.learn_one(xs[0])
    for x in xs[1:]:
        p = (float(x["context_tokens"]), float(x["output_tokens"]))
        assert b.score_point(p) == score_then_learn(a, x)
        b.learn_point(p)
        if rng.random() < 0.01:
            assert b.clusters() == a.clusters()
    assert pickle.dumps(a) == pickle.dumps(b)
    assert b.clusters() == a.clusters()


def test_deterministic_and_picklable() -> None:
    xs = [*requests(3000, seed=7), {**ODD, "t": T0}, *requests(500, seed=8)]
    a, b = RequestOutliers(), RequestOutliers()
    assert [score_then_learn(a, x) for x in xs] == [score_then_learn(b, x) for x in xs]
    assert pickle.dumps(a) == pickle.dumps(b)
    copy = pickle.loads(pickle.dumps(a))
    rest = [*requests(200, seed=9), {**ODD, "t": T0}]
    assert [score_then_learn(copy, x) for x in rest] == [score_then_learn(a, x) for x in rest]
    assert copy.clusters() == a.clusters()


def test_clone_is_fresh() -> None:
    det = trained(features=("context_tokens", "output_tokens"), eps=64.0)
    c = det.clone()
    assert len(c) == 0 and c.eps == 64.0 and c.features == ("context_tokens", "output_tokens")
    assert c.score_one({**ODD, "t": T0}) == 0.0
    assert RequestOutliers().clone().features is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "many", None])
def test_bad_values_raise_and_leave_no_trace(bad: object) -> None:
    det = trained(200)
    before = pickle.dumps(det)
    for x in (
        {"context_tokens": bad, "output_tokens": 10, "t": T0},
        {"context_tokens": 10, "output_tokens": 10, "t": bad},
    ):
        with pytest.raises(ValueError):
            det.learn_one(x)
        with pytest.raises(ValueError):
            det.score_one(x)
    assert pickle.dumps(det) == before


def test_missing_features_raise_a_clear_error() -> None:
    det = trained(200)
    with pytest.raises(ValueError, match=r"missing feature.*output_tokens"):
        det.learn_one({"context_tokens": 10, "t": T0})
    with pytest.raises(ValueError, match="context_tokens"):
        RequestOutliers().learn_one({"tokens": 10, "t": T0})
    with pytest.raises(ValueError, match=r"missing feature.*'t'"):
        det.learn_one({"context_tokens": 10, "output_tokens": 10})


def test_extra_keys_are_ignored() -> None:
    xs = list(requests(500))
    a, b = RequestOutliers(), RequestOutliers()
    noisy = [{**x, "host": "gpu-1", "value": 1.0} for x in xs]
    assert [score_then_learn(a, x) for x in xs] == [score_then_learn(b, x) for x in noisy]
    assert b.features == ("context_tokens", "output_tokens")


def test_generic_features() -> None:
    det = RequestOutliers(features=("a", "b", "c"), eps=1.0, warmup=10)
    rng = random.Random(1)
    for i in range(500):
        det.learn_one(
            {"a": rng.gauss(10, 0.3), "b": rng.gauss(5, 0.3), "c": rng.gauss(0, 0.3), "t": T0 + i}
        )
    assert det.score_one({"a": 10, "b": 5, "c": 0, "t": T0}) == 0.0
    x = {"a": 30, "b": 5, "c": 0, "t": T0}
    assert det.score_one(x) > 0.5
    assert det.label_one(x) == "high a, typical b, typical c"
    assert [c.size for c in det.clusters()][:1] == [pytest.approx(500, abs=30)]


def test_value_series_constant_scores_zero() -> None:
    det = make("request_outliers")
    scores = [score_then_learn(det, {"value": 42e9, "t": T0 + i}) for i in range(3000)]
    assert set(scores) == {0.0}
    assert det.score_one({"value": 43e9, "t": T0}) == 1.0  # 1e9 from the dense value


@pytest.mark.parametrize(
    ("eps", "min_samples", "window", "warmup"),
    [(0.0, 3, 10, 5), (math.nan, 3, 10, 5), (1.0, 0, 10, 5), (1.0, 3, 0, 0), (1.0, 3, 10, 11)],
)
def test_bad_parameters(eps: float, min_samples: int, window: int, warmup: int) -> None:
    with pytest.raises(ValueError):
        RequestOutliers(eps, min_samples, window, warmup)


def test_cost_per_request_does_not_grow() -> None:
    """Once the window is full a request costs the same after 30,000 as after 6,000 (no
    wall-clock floor, which a loaded machine would miss; speed is bench/pipeline.py's)."""
    det = RequestOutliers()
    rng = random.Random(3)
    xs = list(requests(30_000, seed=11))
    for i in range(0, len(xs), 100):  # 1 % outliers
        xs[i] = {
            "context_tokens": rng.randint(8000, 16000),
            "output_tokens": rng.randint(5, 40),
            "t": xs[i]["t"],
        }
    chunks = chunk_seconds(lambda x: score_then_learn(det, x), xs, 3_000)
    early, late = statistics.median(chunks[2:5]), statistics.median(chunks[-3:])
    assert late < 3 * early, [round(c * 1e3) for c in chunks]


def test_a_window_pickled_as_tuples_restores_the_same_detector() -> None:
    """Snapshots written before the window was doubles hold ``buf``, a list of tuples: they
    restore to the detector that learnt those points (same scores, clusters, pickle)."""
    det = trained(2500)
    state = det.__getstate__()
    old = {k: v for k, v in state.items() if k != "points"}
    old["buf"] = det.points()  # what __getstate__ wrote then
    restored = RequestOutliers.__new__(RequestOutliers)
    restored.__setstate__(old)
    assert restored.points() == det.points() and len(restored) == 2000
    assert pickle.dumps(restored) == pickle.dumps(det)
    rest = [*requests(300, seed=12), {**ODD, "t": T0}]
    assert [score_then_learn(restored, x) for x in rest] == [score_then_learn(det, x) for x in rest]
    assert restored.clusters() == det.clusters()


def test_a_full_window_is_kept_in_doubles() -> None:
    """A busy service's window of 2,000 requests: its points as doubles in a ring and in
    their cells, core points as a byte each (as tuples of floats it was ~400 KiB)."""
    import gc
    import tracemalloc

    rng = random.Random(2)
    xs = [
        {"context_tokens": round(rng.gauss(3000, 600)), "output_tokens": round(rng.gauss(250, 80)),
         "t": T0 + i}
        for i in range(4000)
    ]  # fmt: skip
    gc.collect()
    tracemalloc.start()
    try:
        det = RequestOutliers()
        for x in xs:
            score_then_learn(det, x)
        det.clusters()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(det) == 2000
    assert held < 160 * 1024, held
