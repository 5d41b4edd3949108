"""The NAB baseline (``bench/robust_default.py``: ragwatch's ``default`` detector until
issue 31) and its robust window, on deterministic synthetic series: the baseline issue 34
measures from must stay what was measured."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from ragwatch.detectors import score_then_learn
from tests.bench_modules import load

BASELINE = load("robust_default")
RobustWindow, robust_z = BASELINE.RobustWindow, BASELINE.robust_z

NAMES = ["default"]


def xs(values: list[float]) -> list[dict[str, Any]]:
    return [{"value": v, "t": 1_700_000_000.0 + 60.0 * i} for i, v in enumerate(values)]


def noise(n: int, seed: int = 0, level: float = 100.0, sigma: float = 2.0) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, sigma) for _ in range(n)]


def make(name: str, **params: Any) -> Any:
    assert name == "default"
    return BASELINE.DefaultDetector(**params)


def run(name: str, values: list[float], **params: Any) -> list[float]:
    det = make(name, **params)
    return [score_then_learn(det, x) for x in xs(values)]


def test_robust_window_matches_statistics() -> None:
    rng = random.Random(3)
    win = RobustWindow(25)
    for _ in range(400):
        win.add(float(rng.choice([rng.randint(0, 4), rng.gauss(0, 1)])))
        vals = list(win.values)
        med = statistics.median(vals)
        mad = statistics.median(abs(v - med) for v in vals)
        assert win.median == med
        assert len(vals) <= 25
        if mad > 0:
            assert win.scale == pytest.approx(1.4826 * mad)
        else:
            assert win.scale >= 0


@pytest.mark.parametrize("name", NAMES)
def test_spike_is_detected_and_noise_is_not(name: str) -> None:
    values = noise(1500)
    values[1200] = 160.0
    scores = run(name, values)
    assert scores[1200] > 0.7
    assert scores[1200] == max(scores)
    assert max(scores[600:1200]) < 0.5


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("level", [0.0, -3.5, 42e9])
def test_flat_series_scores_zero_everywhere(name: str, level: float) -> None:
    assert set(run(name, [level] * 3000)) == {0.0}


@pytest.mark.parametrize("name", NAMES)
def test_warm_up_scores_zero(name: str) -> None:
    values = noise(100)
    values[10] = 1e6
    scores = run(name, values, min_samples=30)
    assert set(scores[:30]) == {0.0}
    assert max(scores[30:]) > 0.0


def test_a_value_off_a_constant_window_is_infinitely_far() -> None:
    win = RobustWindow(100)
    for _ in range(100):
        win.add(5.0)
    assert robust_z(5.0, win) == 0.0 and robust_z(5.5, win) == math.inf


def test_default_detects_a_level_shift_once() -> None:
    values = noise(2000, seed=5)
    for i in range(1500, 2000):
        values[i] += 12.0  # a lasting shift of six sigma
    scores = run("default", values)
    before = max(scores[700:1500])
    assert max(scores[1500:1510]) > 1.5 * before
    # only its start is news: once the new level is known, it scores like noise again
    assert max(scores[1900:]) <= before


def test_default_detects_a_dip_inside_the_range_of_a_sine() -> None:
    values = [50 + 10 * math.sin(i / 20) + random.Random(i).gauss(0, 0.2) for i in range(1500)]
    values[1300] -= 8.0  # a sudden drop that stays inside [40, 60]
    scores = run("default", values)
    assert scores[1300] > 0.6
    assert max(scores[800:1300]) < scores[1300]


@pytest.mark.parametrize("name", NAMES)
def test_scores_stay_in_unit_interval_on_wild_input(name: str) -> None:
    rng = random.Random(9)
    values = [rng.choice([0.0, 1e13, -1e12, rng.gauss(0, 1), 5.0]) for _ in range(2000)]
    scores = run(name, values)
    assert all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("default", {"long_window": 5}),
        ("default", {"short": 0}),
        ("default", {"short": 900}),
        ("default", {"history": 0}),
        ("default", {"level_z": -1.0}),
        ("default", {"floor": math.nan}),
        ("default", {"min_samples": 1}),
    ],
)
def test_bad_parameters_raise_value_error(name: str, params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        make(name, **params)
