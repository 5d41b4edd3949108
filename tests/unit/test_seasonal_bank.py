"""The seasonal bank is held to the object baseline it vectorises, bit for bit: the same
calls on a row and on a :class:`SeasonalBaseline` give identical forecasts, hold results
and state (every slot of an exported object), through day changes, gaps of days, profile
refreshes, late observations, holds that relearn, overflowing values, resets, snapshots
and adoptions, comparing every row after every call."""

from __future__ import annotations

import math
import random
from array import array
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.detectors.seasonal import Relearned, SeasonalBaseline
from ragwatch.detectors.seasonal_bank import SeasonalBank

T0 = 1_767_225_600.0  # midnight UTC
PARAMS: list[dict[str, Any]] = [
    # hour-long "days" of 6 slots: profiles, refreshes and recycled days come quickly
    {"season_s": 3600.0, "slot_s": 600.0, "days": 3, "warmup": 2, "hold_max_s": 1200.0},
    {
        "season_s": 3600.0,
        "slot_s": 900.0,
        "days": 2,
        "damping": 1.0,
        "min_coverage": 0.5,
        "hold_max_s": 900.0,
        "unprofiled_hold_s": 600.0,
        "outlier_z": 2.0,
    },
    {
        "step_s": 300.0,
        "slot_s": 7200.0,
        "days": 3,
        "min_coverage": 0.5,
        "warmup": 3,
        "hold_max_s": 7200.0,
    },
    {},  # the defaults: 48 slots, 7 days, a day's hold
]
EXTREME = [1e300, -1e300, 1.7e308, -1.7e308, 1e154, 3e160]
KINDS = ("learn", "burst", "hold", "holdrun", "read", "reset", "snapshot", "adopt")


def same(a: Any, b: Any) -> bool:
    """Bit for bit (floats by their hex: -0.0 is not 0.0, NaN is NaN), arrays element-wise."""
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    if isinstance(a, array) and isinstance(b, array):
        return a.typecode == b.typecode and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, Relearned) and isinstance(b, Relearned):
        return all(same(getattr(a, f), getattr(b, f)) for f in ("at", "held_s", "before", "after"))
    return type(a) is type(b) and bool(a == b)


def assert_state(bank: SeasonalBank, row: int, obj: SeasonalBaseline) -> None:
    exported = bank.export(row)
    for slot in SeasonalBaseline.__slots__:
        mine, theirs = getattr(exported, slot), getattr(obj, slot)
        assert same(mine, theirs), (row, slot, mine, theirs)


def assert_reads(
    bank: SeasonalBank, rows: list[int], objs: list[SeasonalBaseline], t: list[float]
) -> None:
    mean, var, noise = bank.forecast(rows, t)
    held, prof = bank.held_s(rows, t), bank.profile_at(rows, t)
    ready, holding, has = bank.ready(rows), bank.holding(rows), bank.has_profile(rows)
    at, held_for, before, after = bank.relearned(rows)
    for i, (row, obj) in enumerate(zip(rows, objs, strict=True)):
        f = obj.forecast(t[i])
        got = (float(mean[i]), float(var[i]), float(noise[i]))
        want = (math.nan,) * 3 if f is None else (f.mean, f.var, f.noise)
        assert all(map(same, got, want)), (row, got, want)
        assert same(float(held[i]), obj.held_s(t[i])) and same(float(prof[i]), obj.profile_at(t[i]))
        assert (bool(ready[i]), bool(holding[i]), bool(has[i])) == (
            obj.ready,
            obj.holding,
            obj.has_profile,
        )
        rel = obj.relearned
        want_rel = (math.nan,) * 4 if rel is None else (rel.at, rel.held_s, rel.before, rel.after)
        got_rel = (float(at[i]), float(held_for[i]), float(before[i]), float(after[i]))
        assert all(map(same, got_rel, want_rel)), (row, got_rel, want_rel)
        assert int(bank.late[row]) == obj.late and int(bank.outliers[row]) == obj.outliers


class Run:
    """A bank and its reference objects, object ``i`` in bank row ``where[i]``, each
    series with its own clock and level."""

    def __init__(self, params: dict[str, Any], n: int, seed: int) -> None:
        self.proto = SeasonalBaseline(**params)
        self.bank = SeasonalBank(self.proto, capacity=1)
        self.bank.reserve(n)  # it grows
        self.objs = [self.proto.clone() for _ in range(n)]
        self.where = list(range(n))
        rng = random.Random(seed)
        self.extreme = rng.random() < 0.3
        offsets = [rng.choice([0.0, rng.uniform(0, 2 * self.proto.season_s)]) for _ in range(n)]
        self.clock = [T0 + o for o in offsets]
        self.base = [rng.uniform(-2, 6) for _ in range(n)]

    # values -------------------------------------------------------------------------
    def time(self, i: int, rng: random.Random) -> float:
        p = self.proto
        dt = rng.choice(
            [
                0.0,
                1.0,
                30.0,
                p.step_s,
                61.7,
                p.slot_s / 2,
                p.slot_s,
                p.season_s / 3,
                p.season_s,
                1.01 * p.season_s,
                3 * p.season_s + 17.0,
                -30.0,
                -p.season_s / 2,
            ]
        )
        t = self.clock[i] + dt
        self.clock[i] = max(self.clock[i], t)
        return t

    def z(self, i: int, t: float, rng: random.Random) -> float:
        if self.extreme and rng.random() < 0.15:
            return rng.choice(EXTREME)
        rhythm = 1.5 * math.sin(2 * math.pi * (t % self.proto.season_s) / self.proto.season_s)
        noise = rng.gauss(0, rng.choice([0.01, 0.3]))
        return self.base[i] + rhythm + noise + rng.choice([0, 0, 0, 3])  # some steps

    # calls ----------------------------------------------------------------------------
    def learn(self, ids: list[int], rng: random.Random, spacing: float | None = None) -> bool:
        """One learn call; False if the objects raised (and so did the bank)."""
        t = []
        for i in ids:
            if spacing is None:
                t.append(self.time(i, rng))
            else:
                self.clock[i] += spacing * rng.uniform(0.5, 1.5)
                t.append(self.clock[i])
        z = [self.z(i, ti, rng) for i, ti in zip(ids, t, strict=True)]
        var = [rng.choice([0.0, 1e-4, 0.01, 1.0, 1e300 if self.extreme else 0.1]) for _ in ids]
        steps = [rng.choice([1.0, 1.0, 0.5, 5.0, math.nan, math.inf, 1e300]) for _ in ids]
        args = zip(ids, t, z, var, steps, strict=True)
        raised = [self._call(self.objs[i].learn, *a) for i, *a in args]
        return self._bank_call(raised, self.bank.learn, self.rows(ids), t, z, var, steps)

    def hold(self, ids: list[int], rng: random.Random, run: bool = False) -> bool:
        t = []
        for i in ids:
            if run:
                self.clock[i] += max(self.proto.hold_max_s, 3600.0) * rng.uniform(0.2, 0.7)
                t.append(self.clock[i])
            else:
                t.append(self.time(i, rng))
        dev = [run or rng.random() < 0.7 for _ in ids]
        obs = [
            rng.choice([self.z(i, ti, rng), math.nan, math.inf])
            for i, ti in zip(ids, t, strict=True)
        ]
        out: list[bool] = []
        raised = []
        for k, i in enumerate(ids):
            observed = None if math.isnan(obs[k]) else obs[k]
            raised.append(self._call(self._hold_one, out, self.objs[i], t[k], dev[k], observed))
        got: list[Any] = []
        ok = self._bank_call(raised, self._hold_bank, got, self.rows(ids), t, dev, obs)
        if ok:
            assert got[0].tolist() == out, (got[0].tolist(), out)
        return ok

    @staticmethod
    def _hold_one(out: list[bool], obj: SeasonalBaseline, *args: Any) -> None:
        out.append(obj.hold(*args))

    def _hold_bank(self, got: list[Any], *args: Any) -> None:
        got.append(self.bank.hold(*args))

    @staticmethod
    def _call(f: Any, *args: Any) -> bool:
        try:
            f(*args)
        except (OverflowError, ValueError):  # statistics on values near the float range
            return True
        return False

    @staticmethod
    def _bank_call(raised: list[bool], f: Any, *args: Any) -> bool:
        if any(raised):
            with pytest.raises((OverflowError, ValueError)):
                f(*args)
            return False  # both are half-way through the call: nothing more to compare
        f(*args)
        return True

    def rows(self, ids: list[int]) -> list[int]:
        return [self.where[i] for i in ids]

    def reset(self, ids: list[int]) -> None:
        self.bank.reset(self.rows(ids))
        for i in ids:
            self.objs[i] = self.proto.clone()

    def snapshot(self, rng: random.Random) -> None:
        """Dump every row, load them into a new bank at other rows."""
        ids = list(range(len(self.objs)))
        data = self.bank.dump(self.rows(ids))
        bank = SeasonalBank(self.proto, capacity=1)
        bank.learn([0], [T0], [1.0], [0.1])  # a pool row in use: the layout differs
        new = rng.sample(range(1, 3 * len(ids) + 1), len(ids))
        bank.load(new, data)
        bank.reserve(max(new) + 1)
        self.bank, self.where = bank, new

    def adopt(self, ids: list[int]) -> None:
        """Rows take their objects' state (and the objects go on from the exports)."""
        for i in ids:
            self.bank.adopt(self.where[i], self.objs[i])
            self.objs[i] = self.bank.export(self.where[i])

    def check(self, rng: random.Random) -> None:
        for i, obj in enumerate(self.objs):
            assert_state(self.bank, self.where[i], obj)
        ids = list(range(len(self.objs)))
        t = [self.clock[i] + rng.choice([0.0, 30.0, 3600.0, -60.0]) for i in ids]
        assert_reads(self.bank, self.rows(ids), self.objs, t)

    # one operation ----------------------------------------------------------------------
    def op(self, kind: str, ids: list[int], seed: int) -> bool:
        """Apply one operation to the bank and the objects; False: stop (both raised)."""
        rng = random.Random(seed)
        ok = True
        if kind == "learn":
            ok = self.learn(ids, rng)
        elif kind == "burst":  # a day's worth, a slot or so apart: profiles get coverage
            for _ in range(rng.randint(3, self.proto.slots + 4)):
                spacing = self.proto.slot_s * rng.choice([0.3, 1.0])
                ok = ok and self.learn(ids, rng, spacing=spacing)
        elif kind == "hold":
            ok = self.hold(ids, rng)
        elif kind == "holdrun":  # long enough to be accepted as the new normal
            for _ in range(rng.randint(2, 6)):
                ok = ok and self.hold(ids, rng, run=True)
        elif kind == "read":
            pass
        elif kind == "reset":
            self.reset(ids)
        elif kind == "snapshot":
            self.snapshot(rng)
        else:
            self.adopt(ids)
        if ok:
            self.check(rng)
        return ok


kinds_weighted = st.sampled_from(
    ["learn"] * 4 + ["burst"] * 3 + ["hold"] * 2 + ["holdrun", "read", "reset", "snapshot", "adopt"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    params=st.sampled_from(PARAMS),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
    sequence=st.lists(
        st.tuples(
            kinds_weighted,
            st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True),
            st.integers(0, 2**32 - 1),
        ),
        min_size=8,
        max_size=40,
    ),
)
def test_every_row_stays_its_object_bit_for_bit(
    params: dict[str, Any], n: int, seed: int, sequence: list[tuple[str, list[int], int]]
) -> None:
    run = Run(params, n, seed)
    for kind, ids, op_seed in sequence:
        ids = [i for i in ids if i < n] or [0]
        if not run.op(kind, ids, op_seed):
            return


def test_a_long_run_reaches_every_branch() -> None:
    """Not vacuous: a scripted run of the property test sees profiles, refreshes of many
    days, recycled days, relearns, outliers, late observations and restarts."""
    seen = {"profile": 0, "relearned": 0, "outliers": 0, "late": 0, "recycled": 0}
    for params in PARAMS[:3]:
        run = Run(params, 4, seed=7)
        run.extreme = False
        rng = random.Random(11)
        for k in range(60):
            kind = ["burst", "learn", "hold", "holdrun", "burst", "snapshot", "adopt"][k % 7]
            assert run.op(kind, rng.sample(range(4), rng.randint(1, 4)), rng.getrandbits(32))
        objs = run.objs
        seen["profile"] += sum(o.has_profile for o in objs)
        seen["relearned"] += sum(o.relearned is not None for o in objs)
        seen["outliers"] += sum(o.outliers for o in objs)
        seen["late"] += sum(o.late for o in objs)
        seen["recycled"] += sum(len(o._row_day) == o.days for o in objs)
    assert all(seen.values()), seen


def test_overflowing_values_restart_the_level_as_the_object_does() -> None:
    proto = SeasonalBaseline(season_s=3600.0, slot_s=600.0, warmup=2)
    bank, obj = SeasonalBank(proto, capacity=1), proto.clone()
    zs = [1.0, 1.1, *[1e300] * 6, 1.0, -1.7e308, 1.7e308, 2.0, *[1.0] * 6]
    for i, z in enumerate(zs):
        bank.learn([0], T0 + 60 * i, z, 0.0)
        obj.learn(T0 + 60 * i, z, 0.0)
        assert_state(bank, 0, obj)
        assert_reads(bank, [0], [obj], [T0 + 60 * i + 30])
    assert obj.outliers >= 4 and obj._n < len(zs)  # spikes, then restarts


@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([86400.0, 3600.0, 1800.0, 7.3]),
)
def test_numpy_mod_is_pythons(x: float, m: float) -> None:
    assert same(float(np.mod(np.float64(x), m)), x % m)


@pytest.mark.parametrize("jitter", [0.0, 7.0])
def test_many_rows_at_once_match_too(jitter: float) -> None:
    """Enough rows for the powers to be computed once per distinct step (on a time grid
    most rows share them), over three days with holds."""
    proto = SeasonalBaseline(season_s=7200.0, slot_s=600.0, hold_max_s=1800.0)
    n, rng = 90, random.Random(int(jitter))
    bank, objs = SeasonalBank(proto, capacity=n), [proto.clone() for _ in range(n)]
    rows = list(range(n))
    for i in range(300):
        t = [T0 + 60 * i * rng.choice([1, 1, 2]) + rng.uniform(0, jitter) for _ in rows]
        z = [1.0 + r % 5 + math.sin(ti / 1000) + rng.gauss(0, 0.1) for r, ti in enumerate(t)]
        if i % 50 < 40:
            bank.learn(rows, t, z, 0.01)
            for obj, ti, zi in zip(objs, t, z, strict=True):
                obj.learn(ti, zi, 0.01)
        else:
            dev = [r % 3 == 0 for r in rows]
            got = bank.hold(rows, t, dev, z).tolist()
            assert got == [o.hold(ti, d, zi) for o, ti, d, zi in zip(objs, t, dev, z, strict=True)]
        if i % 60 == 59:
            for row, obj in enumerate(objs):
                assert_state(bank, row, obj)
            assert_reads(bank, rows, objs, [ti + 60 for ti in t])
    assert sum(o.has_profile for o in objs) > n // 2 and any(o.outliers for o in objs)
    assert any(o.relearned is not None for o in objs)  # held rows accepted new levels


def fed(proto: SeasonalBaseline, days: float, seed: int, step: float = 600.0) -> SeasonalBaseline:
    """An object after ``days`` days of observations with a rhythm, a hold in between."""
    obj, rng = proto.clone(), random.Random(seed)
    for i in range(int(days * 86400 / step)):
        t = T0 + step * i
        obj.learn(t, 3.0 + math.sin(2 * math.pi * t / 86400) + rng.gauss(0, 0.05), 0.01)
        if i % 97 == 50:
            obj.hold(t, True)
        elif i % 97 == 60:
            obj.hold(t, False)
    return obj


def test_adopt_then_export_gives_the_object_back_and_both_go_on_alike() -> None:
    proto = SeasonalBaseline()
    bank = SeasonalBank(proto, capacity=2)
    objs = [fed(proto, 8.5, 1), fed(proto, 0.3, 2)]
    for row, obj in enumerate(objs):
        bank.adopt(row, obj)
        assert_state(bank, row, obj)
    for i in range(300):
        t = T0 + 8.5 * 86400 + 300 * i
        bank.learn([0, 1], t, [3.5, 2.0], [0.01, 0.1])
        for obj, z, v in zip(objs, [3.5, 2.0], [0.01, 0.1], strict=True):
            obj.learn(t, z, v)
    for row, obj in enumerate(objs):
        assert_state(bank, row, obj)
    assert objs[0].has_profile and bank.has_profile([0, 1]).tolist() == [True, objs[1].has_profile]


def test_dump_is_plain_data_and_load_restores_it_on_other_rows() -> None:
    proto = SeasonalBaseline()
    bank = SeasonalBank(proto, capacity=3)
    objs = [fed(proto, 3.2, 3), proto.clone(), fed(proto, 1.1, 4)]
    for row, obj in enumerate(objs):
        bank.adopt(row, obj)
    data = bank.dump([0, 1, 2])
    assert all(isinstance(k, str) for k in data)
    assert all(isinstance(v, bytes | int | float | str | list) for v in data.values())
    other = SeasonalBank(proto, capacity=1)
    other.adopt(0, fed(proto, 2.0, 5))
    other.load([5, 0, 2], data)
    for row, obj in zip([5, 0, 2], objs, strict=True):
        assert_state(other, row, obj)


def test_reset_gives_a_fresh_row_and_its_pool_rows_back() -> None:
    proto = SeasonalBaseline()
    bank = SeasonalBank(proto, capacity=2)
    kept = fed(proto, 4.0, 6)
    bank.adopt(0, fed(proto, 9.0, 7))
    bank.adopt(1, kept)
    pool, free = len(bank.cell_w), bank._nfree
    assert bank.nrows([0, 1]).tolist() == [7, 4]
    bank.reset([0])
    assert bank._nfree == free + 7 and bank.nrows([0]).tolist() == [0]
    assert_state(bank, 0, proto.clone())
    assert_state(bank, 1, kept)
    bank.adopt(0, fed(proto, 9.0, 8))  # the freed pool rows are used again
    assert len(bank.cell_w) == pool and bank._nfree == free


def test_reserve_grows_keeping_rows_and_new_rows_are_fresh() -> None:
    proto = SeasonalBaseline(season_s=3600.0, slot_s=600.0)
    bank = SeasonalBank(proto, capacity=1)
    obj = proto.clone()
    for i in range(200):
        bank.learn([0], T0 + 97 * i, 1.0 + (i % 7) / 10, 0.01)
        obj.learn(T0 + 97 * i, 1.0 + (i % 7) / 10, 0.01)
    bank.reserve(37)
    assert bank.capacity >= 37
    assert_state(bank, 0, obj)
    for row in (1, 36):
        assert_state(bank, row, proto.clone())
    bank.learn([40], T0, 1.0, 0.0)  # a write beyond the capacity grows it
    assert bank.capacity > 40 and bank.ready([40]).tolist() == [False]


def test_memory_is_a_pool_row_per_day_seen() -> None:
    proto = SeasonalBaseline()
    bank = SeasonalBank(proto, capacity=4)
    for day in range(9):
        bank.learn([0, 1, 2], T0 + 86400 * day + 3600, 1.0, 0.01)
        bank.learn([3], T0 + 3600, 1.0, 0.01)
    assert bank.nrows([0, 1, 2, 3]).tolist() == [7, 7, 7, 1]
    assert bank.nbytes() < 4 * 8 * 1024


BAD_LEARN = [
    (math.nan, 1.0, 0.0),
    (math.inf, 1.0, 0.0),
    (T0, math.nan, 0.0),
    (T0, -math.inf, 0.0),
    (T0, 1.0, -1e-9),
    (T0, 1.0, math.nan),
    (1e300, 1.0, 0.0),  # beyond a day number's range
]


@pytest.mark.parametrize(("t", "z", "var"), BAD_LEARN)
def test_bad_observations_raise_before_anything_changes(t: float, z: float, var: float) -> None:
    proto = SeasonalBaseline(season_s=3600.0, slot_s=600.0)
    bank = SeasonalBank(proto, capacity=2)
    bank.learn([0, 1], [T0, T0], [1.0, 2.0], 0.01)
    before = bank.dump([0, 1])
    with pytest.raises(ValueError):
        bank.learn([0, 1], [T0 + 60, t], [1.0, z], [0.01, var])
    if not (math.isfinite(t) and abs(t) < 1e200):
        with pytest.raises(ValueError):
            bank.hold([0, 1], [T0 + 60, t], True, 1.0)
    if abs(t) < 1e200:  # the object refuses them too
        with pytest.raises((ValueError, OverflowError)):
            proto.clone().learn(t, z, var)
    assert bank.dump([0, 1]) == before


def test_bad_rows_are_refused() -> None:
    bank = SeasonalBank(SeasonalBaseline(), capacity=2)
    with pytest.raises(ValueError):
        bank.learn([1, 1], T0, 1.0, 0.0)
    with pytest.raises(ValueError):
        bank.hold([-1], T0, True)
    with pytest.raises(ValueError):
        bank.forecast([2], T0)


def _corrupt(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    return {**data, key: value}


def test_load_refuses_what_does_not_fit_and_changes_nothing() -> None:
    proto = SeasonalBaseline()
    bank = SeasonalBank(proto, capacity=2)
    bank.adopt(0, fed(proto, 2.5, 9))
    data = bank.dump([0])
    nrows = np.frombuffer(data["nrows"], dtype="<i8")
    bad = [
        _corrupt(data, "version", 2),
        _corrupt(data, "params", [*data["params"][:-2], 9.0, data["params"][-1]]),
        _corrupt(data, "rows", 2),
        _corrupt(data, "level", data["level"][:-1]),
        _corrupt(data, "cell_w", data["cell_w"] + b"\0" * 8),
        _corrupt(data, "nrows", (nrows + 8).astype("<i8").tobytes()),
        _corrupt(data, "profiled", b"\x02"),
        _corrupt(data, "cur", np.array([5], dtype="<i4").tobytes()),
        _corrupt(data, "run", "x"),
        {k: v for k, v in data.items() if k != "held_q"},
    ]
    other = SeasonalBank(SeasonalBaseline(days=3), capacity=1)
    target = SeasonalBank(proto, capacity=2)
    target.adopt(1, fed(proto, 1.5, 10))
    before = target.dump([0, 1])
    for d in bad:
        with pytest.raises(ValueError):
            target.load([1], d)
    with pytest.raises(ValueError):
        other.load([0], data)
    with pytest.raises(ValueError):
        target.load([0, 1], data)  # a dump of one row onto two
    assert target.dump([0, 1]) == before


def test_adopt_refuses_other_parameters_and_river_state() -> None:
    bank = SeasonalBank(SeasonalBaseline(), capacity=1)
    with pytest.raises(ValueError):
        bank.adopt(0, SeasonalBaseline(days=3))
    used = SeasonalBaseline()
    used.learn_one({"value": 5.0, "t": T0})
    with pytest.raises(ValueError):
        bank.adopt(0, used)
    assert_state(bank, 0, SeasonalBaseline())
