"""``nanmedian_rows`` against numpy's own ``nanmedian``: the same bits on every row."""

from __future__ import annotations

import doctest
import warnings

import numpy as np
import pytest

from ragwatch.detectors import medians
from ragwatch.detectors.medians import nanmedian_rows


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    bits_a, bits_b = a[~nan].view(np.uint64), b[~nan].view(np.uint64)
    return bool((nan == np.isnan(b)).all() and (bits_a == bits_b).all())


@pytest.mark.parametrize("seed", range(4))
def test_rows_of_values_nans_ties_infinities_and_signed_zeros_match_nanmedian(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(2000):
        n, m = int(rng.integers(1, 8)), int(rng.integers(1, 50))
        a = rng.normal(size=(n, m)) * 10.0 ** int(rng.integers(-5, 12))
        if rng.random() < 0.5:  # ties and zeros of both signs
            a = np.round(a, 1) if rng.random() < 0.5 else np.round(a / np.abs(a).max()) * -0.0
        a[rng.random((n, m)) < rng.random()] = np.nan
        if rng.random() < 0.2:
            a.flat[rng.integers(a.size)] = np.inf * rng.choice([-1.0, 1.0])
        if rng.random() < 0.1:
            a[0] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "All-NaN slice"
            want = np.nanmedian(a, axis=1)
        assert _same_bits(want, nanmedian_rows(a)), a


def test_a_row_of_nans_or_no_columns_is_nan_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(nanmedian_rows(np.full((2, 3), np.nan))).all()
        assert nanmedian_rows(np.empty((2, 0))).shape == (2,)
        assert np.isnan(nanmedian_rows(np.empty((2, 0)))).all()


def test_the_modules_example_runs() -> None:
    assert doctest.testmod(medians).failed == 0
