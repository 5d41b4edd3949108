"""Replica outliers (:mod:`ragwatch.detectors.replicas`): the bank equals its specification
(``tests/reference/replicas.py``) on random streams of updates; a replica drifting to 3x
its peers' latency is flagged once the drift passes the thresholds for ``for_s`` and stays
flagged, its peers never; a group of two never flags; a tight healthy group never flags
in a week of minutes; members come, go, are unknown, forgotten and pruned."""

from __future__ import annotations

import math
import pickle
import random
import statistics
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.detectors.replicas import (
    ReplicaBank,
    ReplicaGroup,
    ReplicaParams,
    ReplicaScore,
    ReplicaScores,
    peer_stats,
)
from tests.reference.replicas import ReplicaReference

LATENCY = "retrieval_p99_ms"
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
SIGNALS = {
    "lat": ReplicaParams("high", for_s=120.0, gap_s=90.0),
    "speed": ReplicaParams("low", z_min=2.0, rel_min=0.2, rel_floor=0.0, for_s=0.0),
    "err": ReplicaParams("both", min_members=4, rel_floor=0.0, abs_floor=0.5, for_s=60.0),
}
DEFAULT = ReplicaParams(z_min=3.0, rel_min=0.3, rel_floor=0.05, for_s=180.0, gap_s=200.0)


def same(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == want or math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)


def check(scores: ReplicaScores, want: list[ReplicaScore]) -> None:
    assert len(scores) == len(want)
    for i, w in enumerate(want):
        g = scores.one(i)
        assert g.member == w.member
        for name in ("value", "peer_median", "ratio", "z"):
            assert same(getattr(g, name), getattr(w, name)), (name, g, w)
        assert (g.deviant, g.outlier, g.since) == (w.deviant, w.outlier, w.since), (g, w)


def random_run(rng: random.Random, steps: int) -> list[tuple[str, Any]]:
    """Updates of 2 groups x 4 signals (three with their own parameters) over up to 8
    members: subsets, unknown values, ties, outliers, zeros, late updates, gaps, forgets."""
    pool = [f"m{i}" for i in range(8)]
    levels = [0.0, 1.0, 100.0]
    ops: list[tuple[str, Any]] = []
    t = 0.0
    for _ in range(steps):
        r = rng.random()
        if r < 0.03:
            ops.append(("forget", rng.choice("ab")))
            continue
        if r < 0.06:
            ops.append(("forget_member", (rng.choice("ab"), rng.choice(pool),
                                          rng.choice([None, "lat", "x"]))))  # fmt: skip
            continue
        if r < 0.08:
            ops.append(("prune", t - rng.choice([0.0, 60.0, 300.0])))
            continue
        t += rng.choice([0.0, 30.0, 60.0, 60.0, 60.0, 250.0])
        when = t - 120.0 if rng.random() < 0.05 else t  # a late update now and then
        members = rng.sample(pool, rng.randint(0, 8))
        base = rng.choice(levels)
        values = []
        for _m in members:
            u = rng.random()
            if u < 0.1:
                values.append(math.nan)
            elif u < 0.25:
                values.append(base * rng.choice([0.0, 0.3, 3.0, 10.0]) + rng.choice([0.0, 2.0]))
            else:
                values.append(round(base + rng.gauss(0, 1 + 0.02 * base), rng.choice([0, 3])))
        update = (rng.choice("ab"), rng.choice(["lat", "speed", "err", "x"]), when)
        ops.append(("update", (*update, members, values)))
    return ops


def replay(ops: list[tuple[str, Any]], capacity: int = 2) -> None:
    bank = ReplicaBank(DEFAULT, SIGNALS, capacity=capacity)
    ref = ReplicaReference(DEFAULT, dict(SIGNALS))
    for op, arg in ops:
        if op == "update":
            check(bank.update(*arg), ref.update(*arg))
            assert bank.members(arg[0], arg[1]) == ref.members(arg[0], arg[1])
        elif op == "forget":
            bank.forget(arg)
            ref.forget(arg)
        elif op == "forget_member":
            bank.forget_member(*arg)
            ref.forget_member(*arg)
        else:
            bank.prune(arg)
            ref.prune(arg)
        held = sum(len(p.members) for p in ref.panels.values())
        assert bank.rows == held
    assert bank.late == ref.late


@FUZZ
@given(st.integers(0, 2**32 - 1), st.integers(1, 120))
def test_bank_equals_reference(seed: int, steps: int) -> None:
    replay(random_run(random.Random(seed), steps))


def test_bank_equals_reference_fixed_seed() -> None:
    ops = random_run(random.Random(20240601), 1500)
    assert sum(op == "update" for op, _ in ops) > 1000
    replay(ops, capacity=1)


@pytest.mark.parametrize("k", [2, 3, 4, 5, 8, 31, 301])
def test_peer_stats_are_each_members_peers_median_and_mad(k: int) -> None:
    """Each member's peers' median and MAD (itself left out), as ``statistics.median``
    computes them on the peers, ties and repeated values included."""
    rng = np.random.default_rng(k)
    for x in (rng.lognormal(4.0, 0.3, k), rng.integers(0, 4, k).astype(float)):
        med, mad = peer_stats(x)
        for i in range(k):
            peers = [float(v) for j, v in enumerate(x) if j != i]
            centre = statistics.median(peers)
            assert med[i] == centre
            assert mad[i] == statistics.median([abs(v - centre) for v in peers])
    x = rng.lognormal(4.0, 0.3, 301)  # and the bank's reference agrees
    ref = ReplicaReference(ReplicaParams(rel_floor=0.0))
    want = ref.update("g", "s", 0.0, [str(i) for i in range(301)], x.tolist())
    assert [w.peer_median for w in want] == peer_stats(x)[0].tolist()


def drift_run(minutes: int, seed: int = 7) -> tuple[list[float], list[ReplicaScores]]:
    """Six replicas at 100 ms +- 2 %; rag-api-5 drifts linearly to 300 ms over 4 h from
    the end of hour one, then stays there."""
    rng = random.Random(seed)
    bank = ReplicaBank(signals={LATENCY: ReplicaParams("high")})
    pods = [f"rag-api-{i}" for i in range(6)]
    drift, out = [], []
    for minute in range(minutes):
        level = 100.0 + 200.0 * min(1.0, max(0.0, (minute - 60) / 240))
        drift.append(level)
        values = [rng.gauss(100.0, 2.0) for _ in pods[:5]] + [level * rng.gauss(1.0, 0.02)]
        out.append(bank.update("rag-api", LATENCY, 60.0 * minute, pods, values))
    return drift, out


def test_slow_drift_to_3x_is_flagged_and_stays_flagged() -> None:
    drift, runs = drift_run(8 * 60)
    flagged = [m for m, s in enumerate(runs) if s.outlier[5]]
    assert flagged, "the drifting replica was never flagged"
    first = flagged[0]
    # deviant needs 50 % above the peers' median (and z >= 4 on a 10 % floor: 40 %)
    crossed = next(m for m, level in enumerate(drift) if level >= 150.0)
    assert crossed + 30 <= first <= crossed + 30 + 10, (crossed, first)
    assert flagged == list(range(first, len(runs)))  # stays flagged while it lasts
    assert not any(s.outlier[:5].any() or s.deviant[:5].any() for s in runs)
    last = runs[-1].one(5)
    assert last.member == "rag-api-5" and last.since is not None
    assert 2.8 < last.ratio < 3.2 and 95 < last.peer_median < 105
    assert runs[-1].flagged() == ["rag-api-5"]


def test_direction_low_ignores_a_slow_replica_for_latency() -> None:
    """ "high" latency: a replica three times *faster* than its peers is not paged."""
    g = ReplicaGroup(ReplicaParams("high", for_s=0.0))
    s = g.update(0.0, {"a": 100.0, "b": 101.0, "c": 99.0, "d": 30.0})
    assert s.flagged() == [] and s.z[3] < -4
    g2 = ReplicaGroup(ReplicaParams("low", for_s=0.0))
    assert g2.update(0.0, {"a": 100.0, "b": 101.0, "c": 99.0, "d": 30.0}).flagged() == ["d"]


def test_a_group_of_two_never_flags() -> None:
    g = ReplicaGroup(ReplicaParams(for_s=0.0))
    for minute in range(120):
        s = g.update(60.0 * minute, {"a": 100.0, "b": 1000.0 + minute})
        assert not s.outlier.any() and not s.deviant.any()
        assert s.peer_median.tolist() == [1000.0 + minute, 100.0]  # scored, never judged
    with pytest.raises(ValueError, match="min_members"):
        ReplicaParams(min_members=2)


def test_tight_healthy_group_never_flags_in_a_week() -> None:
    rng = np.random.default_rng(11)
    bank = ReplicaBank(signals={LATENCY: ReplicaParams("both", for_s=0.0)})
    pods = [f"rag-api-{i}" for i in range(6)]
    minutes = 7 * 24 * 60
    values = 100.0 * (1.0 + 0.03 * rng.standard_normal((minutes, len(pods))))
    flagged = deviant = 0
    worst = 0.0
    for minute in range(minutes):
        s = bank.update("rag-api", LATENCY, 60.0 * minute, pods, values[minute])
        flagged += int(s.outlier.sum())
        deviant += int(s.deviant.sum())
        worst = max(worst, float(np.abs(s.z).max()))
    rate = flagged / (minutes * len(pods))
    assert rate == 0.0 and deviant == 0
    assert worst < 4.0  # the 10 % floor: 3 % noise stays far below z_min
    assert bank.rows == len(pods)


def test_unknown_members_are_ignored() -> None:
    g = ReplicaGroup(ReplicaParams(for_s=0.0))
    s = g.update(0.0, {"a": 100.0, "b": math.nan, "c": 101.0, "d": 99.0, "e": 400.0})
    assert s.known == 4 and s.flagged() == ["e"]
    assert math.isnan(s.z[1]) and math.isnan(s.peer_median[1]) and not s.outlier[1]
    assert s.peer_median[4] == 100.0  # b is no peer
    # with a and c unknown only two remain known: nobody is judged
    s = g.update(60.0, {"a": math.nan, "b": math.inf, "c": math.nan, "d": 99.0, "e": 400.0})
    assert s.known == 2 and s.flagged() == []


def test_streak_survives_unjudged_updates_within_gap() -> None:
    g = ReplicaGroup(ReplicaParams("high", for_s=600.0, gap_s=300.0))
    healthy = {"a": 100.0, "b": 101.0, "c": 99.0}
    for minute in range(5):
        assert g.update(60.0 * minute, {**healthy, "d": 300.0}).flagged() == []
    g.update(300.0, {**healthy, "d": math.nan})  # unknown: neither extends nor ends
    g.update(360.0, {"a": 100.0, "d": 300.0})  # two known: not judged
    s = g.update(480.0, {**healthy, "d": 300.0})  # judged 240 s after its last: within gap_s
    assert s.since[3] == 0.0 and s.flagged() == []
    s = g.update(600.0, {**healthy, "d": 300.0})
    assert s.flagged() == ["d"] and s.since[3] == 0.0
    g.update(660.0, {**healthy, "d": 100.0})  # judged healthy: the streak ends
    s = g.update(720.0, {**healthy, "d": 300.0})
    assert s.since[3] == 720.0 and s.flagged() == []
    s = g.update(1200.0, {**healthy, "d": 300.0})  # last judged 480 s ago > gap_s
    assert s.since[3] == 1200.0 and s.flagged() == []


def test_members_come_and_go() -> None:
    bank = ReplicaBank(ReplicaParams(for_s=0.0), capacity=1)
    bank.update("svc", "tok", 0.0, ["a", "b", "c"], [10.0, 11.0, 10.5])
    s = bank.update("svc", "tok", 60.0, ["b", "c", "d", "e"], [11.0, 10.5, 10.0, 40.0])
    assert s.flagged() == ["e"]
    assert bank.members("svc", "tok") == ("a", "b", "c", "d", "e") and bank.rows == 5
    assert bank.capacity >= 5
    assert bank.last_value("svc", "tok", "a") == 10.0  # absent, not forgotten
    assert bank.prune(30.0) == 1  # "a" not known since t=0
    assert bank.members("svc", "tok") == ("b", "c", "d", "e")


def test_forget_and_forget_member() -> None:
    bank = ReplicaBank(ReplicaParams(for_s=0.0))
    for sig in ("lat", "err"):
        bank.update("svc", sig, 0.0, ["a", "b", "c", "d"], [1.0, 1.0, 1.0, 9.0])
        bank.update("gpu", sig, 0.0, ["g0", "g1", "g2"], [1.0, 1.0, 1.0])
    assert bank.rows == 14
    assert bank.forget_member("svc", "d", "lat") == 1
    assert bank.members("svc", "lat") == ("a", "b", "c")
    assert bank.members("svc", "err") == ("a", "b", "c", "d")
    assert bank.forget_member("svc", "d") == 1 and bank.forget_member("svc", "zz") == 0
    assert bank.forget("svc") == 6 and bank.rows == 6
    assert bank.members("svc", "lat") == () and bank.forget("svc") == 0
    assert math.isnan(bank.last_value("svc", "lat", "a"))
    # a forgotten group starts afresh: no streak, no late check against its old time
    s = bank.update("svc", "lat", -60.0, ["a", "b", "c", "d"], [1.0, 1.0, 1.0, 9.0])
    assert bank.late == 0 and s.since[3] == -60.0
    g = ReplicaGroup()
    g.update(0.0, {"a": 1.0, "b": 2.0})
    assert g.forget_member("a") and not g.forget_member("a") and g.members == ("b",)


def test_late_update_changes_nothing() -> None:
    bank = ReplicaBank(ReplicaParams(for_s=0.0))
    bank.update("s", "x", 120.0, ["a", "b", "c"], [1.0, 1.0, 1.0])
    s = bank.update("s", "x", 60.0, ["a", "b", "c", "d"], [1.0, 1.0, 1.0, 50.0])
    assert bank.late == 1 and s.deviant[3] and not s.outlier.any()
    assert np.isnan(s.since).all() and bank.members("s", "x") == ("a", "b", "c")


def test_pickle_round_trip_gives_same_scores() -> None:
    bank = ReplicaBank(ReplicaParams(for_s=120.0))
    for minute in range(5):
        bank.update("s", "x", 60.0 * minute, ["a", "b", "c", "d"], [1.0, 1.1, 0.9, 5.0])
    copy = pickle.loads(pickle.dumps(bank))
    a = bank.update("s", "x", 300.0, ["a", "b", "c", "d"], [1.0, 1.1, 0.9, 5.0])
    b = copy.update("s", "x", 300.0, ["a", "b", "c", "d"], [1.0, 1.1, 0.9, 5.0])
    assert [a.one(i) for i in range(4)] == [b.one(i) for i in range(4)]
    assert a.flagged() == ["d"] and a.since[3] == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [{"direction": "up"}, {"z_min": 0.0}, {"rel_min": -1.0}, {"for_s": math.inf},
     {"abs_floor": math.nan}],
)  # fmt: skip
def test_bad_parameters_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ReplicaParams(**kwargs)


def test_bad_updates_are_refused() -> None:
    bank = ReplicaBank()
    with pytest.raises(ValueError, match="distinct"):
        bank.update("s", "x", 0.0, ["a", "a", "b"], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="distinct"):
        bank.update("s", "x", 0.0, ["a", "b"], [1.0])
    with pytest.raises(ValueError, match="finite"):
        bank.update("s", "x", math.nan, ["a"], [1.0])
    assert bank.rows == 0


def test_peer_medians_of_values_near_the_largest_float_stay_finite() -> None:
    """Found by the pipelines' fuzz test (issue 34's stop): two instances at 1.79e308 ms
    made the peer median (a + b) / 2 overflow to inf."""
    med, mad = peer_stats(np.array([1.79e308, 1.79e308, 1.0]))
    assert np.isfinite(med).all() and np.isfinite(mad).all()
    assert med.tolist() == [8.95e307 + 0.5, 8.95e307 + 0.5, 1.79e308]
