"""A fixed sample of bench/space.py's scenario space, in ``make test``.

Four draws, picked for what they hold before their results were known: quiet nights of
one request a minute under an 11x daily rhythm with no fault; a 7.7-hour throughput drop
across a night and a short one at noon; a cluster of outlier requests overlapping a
throughput drop; a low-traffic instance with a short throughput drop beside a GPU leak.
``python bench/space.py`` runs 200 draws (``make bench``), a quarter of them played a second
time in a consumption order; here none is (1011 was: 28 s of CPU), since
``test_consumption_order.py`` plays GPU and request telemetry with leak, token and
retrieval alerts in two uneven consumption orders.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "space.py"
SEEDS = (1003, 1011, 1012, 1049)


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    spec = importlib.util.spec_from_file_location("bench_space", BENCH)
    assert spec is not None and spec.loader is not None
    space: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = space  # dataclasses look their module up
    try:
        spec.loader.exec_module(space)
        runs = space.run(SEEDS, jobs=2, consumption=False)
    finally:
        del sys.modules[spec.name]
    return {r["draw"]["seed"]: r for r in runs}


def test_no_false_pages_on_healthy_series(results: dict[int, dict[str, Any]]) -> None:
    assert {seed: r["false_pages"] for seed, r in results.items()} == {s: [] for s in SEEDS}
    quiet = results[1049]["draw"]
    assert not quiet["faults"] and quiet["trough_rpm"] < 1.5 and quiet["daily_ratio"] > 10


def test_one_fault_one_page_and_no_resolution_while_it_lasts(
    results: dict[int, dict[str, Any]],
) -> None:
    faults = [f for r in results.values() for f in r["faults"]]
    assert len(faults) == 6
    assert all(n <= 1 for f in faults for n in f["pages"].values()), faults
    assert [f["resolved_during"] for f in faults] == [[]] * 6


def test_faults_with_enough_traffic_are_found(results: dict[int, dict[str, Any]]) -> None:
    found = {(seed, f["kind"], f["start_s"]) for seed, r in results.items() for f in r["faults"]
             if f["delay_min"] is not None}  # fmt: skip
    kinds = {(seed, kind) for seed, kind, _ in found}
    assert {(1003, "throughput"), (1011, "outliers"), (1011, "throughput"), (1012, "leak")} <= kinds
    long_night = next(f for f in results[1003]["faults"] if f["duration_s"] > 7 * 3600)
    assert long_night["delay_min"] is not None and long_night["delay_min"] < 90
