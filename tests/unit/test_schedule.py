"""The order ``make test`` hands test files to its workers (``tests/conftest.py``)."""

from __future__ import annotations

import json
import random

from tests.conftest import DURATIONS, schedule


def test_the_docstring_example() -> None:
    got = schedule({"a": 9.0, "b": 1.0, "c": 4.0, "w": 6.0, "v": 2.0}, {"w", "v"})
    assert got == ["a", "w", "c", "v", "b"]


def test_each_kind_runs_longest_first_and_neither_is_left_to_the_end() -> None:
    rng = random.Random(7)
    seconds = {f"f{i}": rng.choice([0.5, 3.0, 20.0, 120.0]) * rng.random() for i in range(80)}
    waiting = {f for f in seconds if rng.random() < 0.3}
    order = schedule(seconds, waiting)
    assert sorted(order) == sorted(seconds)
    for kind in (waiting, set(seconds) - waiting):
        mine = [seconds[f] for f in order if f in kind]
        assert mine == sorted(mine, reverse=True)
    totals = {w: sum(s for f, s in seconds.items() if (f in waiting) is w) for w in (False, True)}
    done = {False: 0.0, True: 0.0}
    for f in order:  # each file is of the kind that has done the smaller share of its time
        w = f in waiting
        assert done[w] / totals[w] <= done[not w] / totals[not w]
        done[w] += seconds[f]


def test_the_recorded_times_name_test_files() -> None:
    times = json.loads(DURATIONS.read_text())
    assert times and all(f.startswith("tests/") and f.endswith(".py") for f in times)
    assert all(s >= 0 for s in times.values())
    assert any("/integration/" in f for f in times) and any("/unit/" in f for f in times)
