"""LatencyBank against LatencyBaseline, row by row, bit for bit: the baselines judged
against, the holds and re-learnt levels, the entries (every ``entry_values`` requests) and
the exported state, on random quantiles that stay, jump, vanish (None) and come back."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ragwatch.detectors.latency import LatencyBank
from tests.reference.evidence import LatencyBaseline, adopt_baseline, baseline_of

T0 = 1_767_225_600.0


def _state(b: LatencyBaseline) -> tuple[Any, ...]:
    model = b.model
    assert model is not None
    slots = [a for c in type(model).__mro__ for a in getattr(c, "__slots__", ())]
    values = [getattr(model, a) for a in slots]
    inner = tuple(list(v) if type(v).__name__ == "array" else v for v in values)
    return (b.seen_at_entry, b.relearned_at, b.relearned_before, inner)


def _same(a: float, b: float | None) -> bool:
    return (b is None and math.isnan(a)) or (b is not None and a == b)


steps = st.lists(
    st.tuples(
        st.sampled_from([30.0, 60.0, 600.0, 3600.0, 6 * 3600.0]),  # time on
        st.lists(
            st.one_of(st.none(), st.floats(0.0, 5e3), st.sampled_from([100.0, 130.0, 900.0])),
            min_size=3,
            max_size=3,
        ),
        st.integers(0, 250),  # new requests each row's window took
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps, hold_max_s=st.sampled_from([3600.0, 86400.0]))
def test_rows_judge_hold_and_learn_as_objects_do(
    steps: list[tuple[float, list[float | None], int]], hold_max_s: float
) -> None:
    bank = LatencyBank(2, min_entries=2, hold_max_s=hold_max_s)  # grows to 3 rows
    objects = [LatencyBaseline(min_entries=2, hold_max_s=hold_max_s) for _ in range(3)]
    rows = np.array([2, 0, 1])  # not in order: rows are plain indices
    bank.reserve(3)
    t, seen = T0, [0, 0, 0]
    for dt, values, more in steps:
        t += dt
        seen = [s + more for s in seen]
        v = np.array([math.nan if x is None else x for x in values])
        got = bank.update(rows, np.full(3, t), v, np.array(seen, dtype=np.int64))
        for i, obj in enumerate(objects):
            assert _same(got[i], obj.update(t, values[i], seen[i]))
            assert _same(bank.baseline(rows[i : i + 1], np.array([t]))[0], obj.baseline(t))
            assert bank.held_s(rows[i : i + 1], np.array([t]))[0] == obj.held_s(t)
    for i, obj in enumerate(objects):
        assert _state(baseline_of(bank, int(rows[i]))) == _state(obj)


def test_adopt_export_and_dump_load_round_trip() -> None:
    obj = LatencyBaseline(min_entries=2)
    for k in range(40):
        obj.update(T0 + 60 * k, 100.0 + (k % 3) if k < 30 else 400.0, 100 * k)
    bank = LatencyBank(1, min_entries=2)
    adopt_baseline(bank, 0, obj)
    assert _state(baseline_of(bank, 0)) == _state(obj)
    other = LatencyBank(4, min_entries=2)
    other.load(np.array([3]), bank.dump(np.array([0])))
    assert _state(baseline_of(other, 3)) == _state(obj)
    other.reset(np.array([3]))
    assert _state(baseline_of(other, 3)) == _state(LatencyBaseline(min_entries=2))


def test_a_dump_of_another_shape_is_refused_before_anything_changes() -> None:
    bank = LatencyBank(2, min_entries=2)
    bank.update(np.array([0, 1]), np.full(2, T0), np.array([100.0, 200.0]), np.zeros(2, np.int64))
    data = bank.dump(np.array([0, 1]))
    before = bank.dump(np.array([0, 1]))
    bad = {**data, "seen_at_entry": data["seen_at_entry"][:8]}
    try:
        bank.load(np.array([0, 1]), bad)
    except ValueError:
        pass
    else:
        raise AssertionError("a dump of another length was taken")
    assert bank.dump(np.array([0, 1])) == before


def test_a_baseline_past_the_float_range_is_inf_in_both_not_an_error() -> None:
    """Two days of a daily latency rhythm, then the largest finite latency for more than a
    day: accepted as the new level where the daily profile is low, it forecasts past the
    float range where the profile is higher. Both forms give inf there (no quantile is
    above it) instead of raising OverflowError on every close of the series, and agree."""
    biggest = float(np.finfo(np.float64).max)

    def latency(t: float) -> float:
        if t >= T0 + 3 * 86400 + 11 * 3600:
            return biggest
        return 1000.0 * math.exp(2 * math.sin(2 * math.pi * ((t - T0) % 86400) / 86400))

    obj, bank, row = LatencyBaseline(), LatencyBank(1), np.array([0])
    t, seen, infinite = T0, 0, 0
    for _ in range(6 * 1440):
        t, seen = t + 60.0, seen + 100
        v = latency(t)
        got = bank.update(row, np.array([t]), np.array([v]), np.array([seen]))
        assert _same(got[0], obj.update(t, v, seen))
        infinite += math.isinf(got[0])
    assert infinite > 0
    assert _state(baseline_of(bank, 0)) == _state(obj)
