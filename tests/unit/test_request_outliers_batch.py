"""The request-outlier detector's batch path, held to the per-point one: ``certified`` never
vouches for a point whose sequential score is not 0 (and follows its documented rule),
``learn_points`` leaves exactly the state ``learn_point`` leaves, and a stream fed through
both gives the same scores, labels, clusters, medians and pickles as one fed point by
point. On the simulator's healthy traffic it reports how many records are certified and
what each path costs (``python tests/unit/test_request_outliers_batch.py`` prints it).
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
from ragwatch.detectors.outlier_grid import SUB_OUT, Key
from ragwatch.detectors.request_outliers import REQUEST_FEATURES, SUB_SHRINK, RequestOutliers

Pt = tuple[float, float]
Scored = tuple[float, str | None]  # a point's score and, for an outlier, its label
EPS = [128.0, 1.0, 16.0, 0.37, 1000.0]
HUGE = [2.0**64, 2.0**64 - 2048.0, 2.0**63, 1.8e19, 2.0**53 + 2.0, 1e300]
KINDS = ["dense"] * 10 + ["dup"] * 2 + ["edge", "scatter", "huge", "neg"]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def side(eps: float) -> float:
    return eps / math.sqrt(2.0) * (1.0 - SUB_SHRINK)


def as_dict(p: Pt) -> dict[str, Any]:
    return {"context_tokens": p[0], "output_tokens": p[1], "t": 0.0}


def detector(eps: float, min_samples: int, window: int, warmup: int) -> RequestOutliers:
    return RequestOutliers(eps, min_samples, window, warmup, features=REQUEST_FEATURES)


# -- streams ---------------------------------------------------------------------------


@st.composite
def point(draw: st.DrawFn, eps: float, centres: list[Pt], seen: list[Pt]) -> Pt:
    """A point of one of the kinds that stress the batch path: in a dense cluster, on a
    (sub-)cell boundary (or one ulp off it), scattered, a duplicate, huge, or negative."""
    kind = draw(st.sampled_from(KINDS))
    if kind == "dense":
        cx, cy = draw(st.sampled_from(centres))
        dx, dy = draw(st.integers(-4, 4)), draw(st.integers(-4, 4))
        return (cx + dx * eps / 8, cy + dy * eps / 8)
    if kind == "edge":
        unit = draw(st.sampled_from([side(eps), eps]))
        x, y = (draw(st.integers(-3, 40)) * unit for _ in "xy")
        nudge = draw(st.sampled_from([0.0, math.inf, -math.inf]))
        return (math.nextafter(x, nudge) if nudge else x, y)
    if kind == "scatter":
        return (draw(st.floats(0, 60 * eps)), draw(st.floats(0, 60 * eps)))
    if kind == "dup" and seen:
        return draw(st.sampled_from(seen))
    if kind == "neg":
        return (draw(st.sampled_from([-0.0, -1e-300, -eps, -3.5 * eps])), 0.0)
    big = st.one_of(st.sampled_from(HUGE), st.integers(2**40, 2**64).map(float))
    return (draw(big), draw(st.one_of(big, st.floats(0, 100 * eps))))


@st.composite
def cases(draw: st.DrawFn) -> tuple[RequestOutliers, list[list[Pt]]]:
    """A fresh detector and a stream cut in runs: the window not yet full, exactly full or
    wrapping when the runs begin, runs longer than the window too."""
    eps = draw(st.sampled_from(EPS))
    window = draw(st.integers(1, 24))
    det = detector(eps, draw(st.integers(1, 5)), window, draw(st.integers(0, window)))
    centres = draw(
        st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=3)
    )
    scaled = [(x * eps, y * eps) for x, y in centres]
    seen: list[Pt] = []
    runs: list[list[Pt]] = []
    for size in draw(st.lists(st.integers(0, 2 * window + 2), min_size=1, max_size=6)):
        run = [draw(point(eps, scaled, seen)) for _ in range(size)]
        seen += run
        runs.append(run)
    return det, runs


# -- the two ways to feed a detector ---------------------------------------------------


def one_by_one(det: RequestOutliers, run: Sequence[Pt], label: bool = True) -> list[Scored]:
    """The request pipeline's loop: score, label an outlier, learn, a point at a time."""
    out: list[Scored] = []
    for p in run:
        key = det.cell(p)
        s = det.score_point(p, key)
        out.append((s, det.label_one(as_dict(p)) if label and s >= 0.5 else None))
        det.learn_point(p, key)
    return out


def batched(det: RequestOutliers, run: Sequence[Pt], label: bool = True) -> list[Scored]:
    """The same through the batch path: each run of certified points learnt at once (they
    score 0), the others scored and learnt as before."""
    if not run:
        return []
    pts = np.array(run, dtype=np.float64)
    keys = det.cells(pts)
    sure = det.certified(pts).tolist()
    out: list[Scored] = []
    i = 0
    while i < len(run):
        j = i
        while j < len(run) and sure[j]:
            j += 1
        if j > i:
            det.learn_points(pts[i:j], keys[i:j])
            out += [(0.0, None)] * (j - i)
            i = j
            continue
        s = det.score_point(run[i], keys[i])
        out.append((s, det.label_one(as_dict(run[i])) if label and s >= 0.5 else None))
        det.learn_point(run[i], keys[i])
        i += 1
    return out


def state(det: RequestOutliers) -> tuple[object, ...]:
    """Everything a detector holds, cache included, in the order that can matter."""
    return (
        pickle.dumps(det),
        det._head,
        bytes(det._ring),
        [(k, bytes(v)) for k, v in det._cells.items()],
        list(det._core.items()),
        sorted(det._dirty),
        sorted(det._changed),
        det._learnt,
    )


def probe(det: RequestOutliers) -> tuple[object, ...]:
    """What a caller sees: the clusters and medians (which also refresh the cache)."""
    return (det.clusters(), det.medians())


# -- certified: sound, and the documented rule -----------------------------------------


def reference_certified(det: RequestOutliers, run: Sequence[Pt]) -> list[bool]:
    """``certified``'s rule by brute force: warming up, or at least ``min_samples`` of the
    run's earlier points and of the window points still there at its last turn share the
    point's sub-cell (indices below ``SUB_OUT``)."""
    s, window, n = side(det.eps), det.window, len(det)

    def sub(p: Pt) -> Key | None:
        k = tuple(math.floor(v / s) if abs(v / s) < 2**62 else 2**62 for v in p)
        return k if all(abs(i) < SUB_OUT for i in k) else None

    kept = det.points()[min(n, max(0, n + len(run) - 1 - window)) :]
    out = []
    for i, p in enumerate(run):
        k = sub(p)
        near = sum(sub(q) == k for q in kept) + sum(sub(q) == k for q in run[:i])
        warm = min(n + i, window) >= max(det.warmup, 1)
        out.append(not warm or (k is not None and i <= window and near >= det.min_samples))
    return out


@SETTINGS
@given(case=cases())
def test_certified_points_score_zero_at_their_turn(
    case: tuple[RequestOutliers, list[list[Pt]]],
) -> None:
    det, runs = case
    for run in runs:
        sure = det.certified(np.array(run, dtype=np.float64).reshape(-1, 2)).tolist()
        assert sure == reference_certified(det, run)
        fresh = pickle.loads(pickle.dumps(det))  # no cached sub-cells
        assert fresh.certified(np.array(run).reshape(-1, 2)).tolist() == sure
        for p, ok in zip(run, sure, strict=True):
            assert not ok or det.score_point(p) == 0.0, (p, det.points())
            det.learn_point(p)


def test_dense_traffic_is_mostly_certified() -> None:
    rng = np.random.default_rng(1)
    det = detector(128.0, 3, 2000, 50)
    det.learn_points(np.column_stack((rng.normal(3000, 200, 2000), rng.normal(250, 40, 2000))))
    run = np.column_stack((rng.normal(3000, 200, 70), rng.normal(250, 40, 70)))
    assert det.certified(run).mean() > 0.9
    odd = np.array([[12000.0, 20.0], [3000.0, 2.0**64]])
    assert det.certified(odd).tolist() == [False, False]


def test_huge_coordinates_are_never_certified_but_do_not_block_others() -> None:
    det = detector(128.0, 2, 10, 0)
    huge = [(2.0**64, 2.0**64)] * 5 + [(1.8e19, 7.0)] * 5
    det.learn_points(huge)
    run = [(2.0**64, 2.0**64), (1.8e19, 7.0), (5.0, 5.0), (6.0, 6.0), (7.0, 7.0)]
    assert det.certified(run).tolist() == [False, False, False, False, True]
    assert [s for s, _ in one_by_one(det, run)] == [0.0, 0.0, 1.0, 1.0, 0.0]


def test_certified_says_nothing_for_other_features() -> None:
    det = RequestOutliers(window=10, warmup=0)
    assert det.certified([(1.0, 2.0)]).tolist() == [False]  # features not picked yet
    det.learn_one({"value": 1.0, "t": 0.0})
    assert det.certified([(1.0, 1.0)]).tolist() == [False]
    assert det.certified(np.empty((0, 2))).tolist() == []
    with pytest.raises(ValueError, match=r"\(m, 2\)"):
        det.certified([1.0, 2.0, 3.0])


# -- learn_points: the state learn_point leaves ----------------------------------------


@SETTINGS
@given(case=cases(), keyed=st.booleans(), probes=st.lists(st.booleans(), min_size=6))
def test_learn_points_leaves_the_state_learn_point_leaves(
    case: tuple[RequestOutliers, list[list[Pt]]], keyed: bool, probes: list[bool]
) -> None:
    a, runs = case
    b = pickle.loads(pickle.dumps(a))
    for run, look in zip(runs, probes, strict=False):
        if look:  # a refreshed cache: the cells a run empties must leave it
            assert probe(a) == probe(b)
        pts = np.array(run, dtype=np.float64).reshape(-1, 2)
        a.learn_points(pts, a.cells(pts) if keyed else None)
        for p in run:
            b.learn_point(p)
        assert state(a) == state(b)
    assert probe(a) == probe(b)
    assert state(a) == state(b)


def test_learn_points_one_by_one_for_other_layouts() -> None:
    a, b = RequestOutliers(window=5, warmup=0), RequestOutliers(window=5, warmup=0)
    for det in (a, b):
        det.learn_one({"value": 1.0, "t": 0.0})
    a.learn_points([[2.0], [3.0], [1.5]])
    for v in (2.0, 3.0, 1.5):
        b.learn_point((v,))
    assert state(a) == state(b)
    with pytest.raises(ValueError, match="keys"):
        a.learn_points([[1.0]], [])
    with pytest.raises(ValueError, match=r"\(m, d\)"):
        a.learn_points([1.0, 2.0])
    a.learn_points([])
    assert state(a) == state(b)


# -- the whole stream ------------------------------------------------------------------


@SETTINGS
@given(case=cases(), probes=st.lists(st.booleans(), min_size=6))
def test_a_stream_through_the_batch_path_is_the_same_stream(
    case: tuple[RequestOutliers, list[list[Pt]]], probes: list[bool]
) -> None:
    a, runs = case
    b = pickle.loads(pickle.dumps(a))
    for run, look in zip(runs, probes, strict=False):
        assert batched(a, run) == one_by_one(b, run)
        if look:
            assert probe(a) == probe(b)
    assert probe(a) == probe(b)
    assert state(a) == state(b)
    assert pickle.dumps(a) == pickle.dumps(b)


def test_features_picked_by_a_first_point_take_the_batch_path() -> None:
    rng = np.random.default_rng(2)
    a, b = RequestOutliers(window=300, warmup=20), RequestOutliers(window=300, warmup=20)
    first = {"context_tokens": 3000, "output_tokens": 250, "t": 0.0}
    a.learn_one(first)
    b.learn_one(first)
    pts = np.column_stack((rng.normal(3000, 200, 900), rng.normal(250, 40, 900))).round()
    pts[::97] = (12000.0, 20.0)  # outliers, labelled alike
    runs = [[(float(x), float(y)) for x, y in pts[i : i + 70]] for i in range(0, 900, 70)]
    assert [batched(a, r) for r in runs] == [one_by_one(b, r) for r in runs]
    assert probe(a) == probe(b)
    assert state(a) == state(b)


# -- cells -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    eps=st.sampled_from(EPS),
    pts=st.lists(
        st.tuples(st.floats(-1e307, 1e307), st.floats(-1e6, 1e20)),
        max_size=20,
    ),
)
def test_cells_are_each_points_cell(eps: float, pts: list[Pt]) -> None:
    det = detector(eps, 3, 10, 0)
    assert det.cells(np.array(pts).reshape(-1, 2)) == [det.cell(p) for p in pts]
    small = [(x % 1e9, y % 1e9) for x, y in pts]  # the int64 fast path
    assert det.cells(np.array(small).reshape(-1, 2)) == [det.cell(p) for p in small]


def test_cells_of_a_non_finite_point_raise_as_cell_does() -> None:
    det = detector(128.0, 3, 10, 0)
    with pytest.raises(ValueError):
        det.cells([(math.nan, 1.0)])
    with pytest.raises(OverflowError):
        det.cells([(math.inf, 1.0)])


# -- the simulator's traffic -----------------------------------------------------------


def sim_runs(ticks: int) -> list[tuple[str, list[Pt]]]:
    """Each envelope's ok records (as points) with its service, as bench/requests.py sends
    them: 2 services x 2 instances, a batch a second of every request at 100 req/s."""
    cfg = RequestSimConfig(
        services=2,
        instances=2,
        batch_s=1.0,
        base_qps=100.0,
        sample_rate=1.0,
        deploy_at_s=None,
        reload_at_s=None,
    )
    envs = [
        e
        for _, (_, es) in zip(range(ticks), RequestSimulator(cfg).ticks(), strict=False)
        for e in es
    ]
    return [
        (
            e.service,
            [
                (float(r.context_tokens), float(r.output_tokens))
                for r in e.records
                if r.status == "ok"
            ],
        )
        for e in envs
    ]


def replay(
    runs: list[tuple[str, list[Pt]]],
    feed: Callable[[RequestOutliers, Sequence[Pt], bool], list[Scored]],
) -> tuple[dict[str, RequestOutliers], list[Scored], float]:
    """A detector per service fed every envelope's points (scored and learnt, outliers
    not labelled: labels cost both paths the same); the CPU seconds it took."""
    dets: dict[str, RequestOutliers] = {}
    scored: list[Scored] = []
    start = time.process_time()
    for service, run in runs:
        det = dets.get(service)
        if det is None and run:
            det = dets[service] = RequestOutliers()
            det.learn_one(as_dict(run[0]))  # the pipeline's first point picks the features
            run = run[1:]
        if det is not None:
            scored += feed(det, run, False)
    return dets, scored, time.process_time() - start


def certified_share(runs: list[tuple[str, list[Pt]]]) -> float:
    """The share of points certified once their service's window is full."""
    dets: dict[str, RequestOutliers] = {}
    sure = total = 0
    for service, run in runs:
        det = dets.setdefault(service, RequestOutliers(features=REQUEST_FEATURES))
        if len(det) == det.window:
            sure += int(det.certified(np.array(run)).sum())
            total += len(run)
        batched(det, run)
    return sure / total


def simulator_report(ticks: int, repeats: int = 1) -> dict[str, float]:
    """The share certified, and CPU microseconds a record each way (the best of
    ``repeats`` rounds, the two ways taking turns), checking they score alike."""
    runs = sim_runs(ticks)
    n = sum(len(r) for _, r in runs) - len({s for s, _ in runs})
    best = {"one_by_one": math.inf, "batched": math.inf}
    for _ in range(repeats):
        seq, seq_scores, seq_s = replay(runs, one_by_one)
        bat, bat_scores, bat_s = replay(runs, batched)
        assert bat_scores == seq_scores
        assert all(state(bat[s]) == state(seq[s]) for s in seq)
        best = {
            "one_by_one": min(best["one_by_one"], seq_s),
            "batched": min(best["batched"], bat_s),
        }
    return {
        "envelopes": len(runs),
        "records": n,
        "outliers": sum(s >= 0.5 for s, _ in seq_scores),
        "certified_share": certified_share(runs),
        **{f"us_per_record_{k}": v / n * 1e6 for k, v in best.items()},
    }


def test_simulator_traffic_is_mostly_certified_and_scores_the_same() -> None:
    report = simulator_report(ticks=500)  # 2,000 envelopes, ~140,000 records
    print(report)  # timings are reported, not asserted
    assert report["envelopes"] == 2000
    assert report["certified_share"] > 0.9


if __name__ == "__main__":
    for k, v in simulator_report(ticks=1500, repeats=3).items():
        print(f"{k:>26}: {v:.4g}")
