"""A seasonal bank's rows as plain data and back: the checks a snapshot's arrays pass
before any row changes (:func:`parse`), and the byte helpers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.seasonal.params import (
    FIELDS,
    NO_DAY,
    OUTLIER_RUN,
    PARAMS,
    VERSION,
    WEEK,
    WEEKLY,
    WEEKLY_SD,
)

if TYPE_CHECKING:
    from ragwatch.detectors.seasonal.bank import SeasonalBank


def parse(bank: SeasonalBank, k: int, data: dict[str, Any]) -> dict[str, Any]:
    """``data``'s arrays (a :meth:`SeasonalBank.dump` of ``k`` rows), checked against
    ``bank`` and each other (ValueError)."""
    version, theirs = data.get("version"), data.get("params")
    mine = bank.params.as_list()
    if version == 1 and bank.params.weekly_sd == WEEKLY_SD:
        mine = mine[: PARAMS.index("weekly_sd")]  # before the weekly table
    elif version != VERSION:
        mine = []
    if data.get("rows") != k or not _same(mine, theirs):
        raise ValueError("seasonal bank state of another version, size or parameters")
    parts = {name: _array(data, name, dt, k) for name, (dt, _) in FIELDS.items()}
    cells = WEEK * bank.blocks
    for name in WEEKLY if version == VERSION else ():
        parts[name] = _array(data, name, np.float64, k * cells).reshape(k, cells)
    parts["row_day"] = _array(data, "row_day", np.int64, k * bank.days)
    parts["row_day"] = parts["row_day"].reshape(k, bank.days)
    counts = parts["nrows"] = _array(data, "nrows", np.int64, k)
    if np.frombuffer(data["profiled"], dtype=np.uint8).max(initial=0) > 1:
        raise ValueError("seasonal bank state: profiled is not boolean")
    n_cells, profiled = int(counts.sum()), int(parts["profiled"].sum())
    for name in ("cell_w", "cell_zw"):
        parts[name] = _array(data, name, np.float64, n_cells * bank.slots)
        parts[name] = parts[name].reshape(n_cells, bank.slots)
    parts["profile"] = _array(data, "profile", np.float64, profiled * bank.slots)
    parts["profile"] = parts["profile"].reshape(profiled, bank.slots)
    _check_rows(bank, parts)
    return parts


def _check_rows(bank: SeasonalBank, parts: dict[str, Any]) -> None:
    counts, cur, day = parts["nrows"], parts["cur"], parts["day"]
    if ((counts < 0) | (counts > bank.days)).any():
        raise ValueError("seasonal bank state: a row holds too many days")
    if ((cur < 0) | (cur >= np.maximum(counts, 1))).any() or (
        (day == NO_DAY) != (counts == 0)
    ).any():
        raise ValueError("seasonal bank state: a row's day does not fit its cells")
    if (np.abs(parts["run"].astype(np.int64)) >= OUTLIER_RUN).any():
        raise ValueError("seasonal bank state: an outlier run does not fit")
    if "wk_n" in parts and not (np.isfinite(parts["wk_v"]).all() and (parts["wk_n"] >= 0).all()):
        raise ValueError("seasonal bank state: the weekly table does not fit")


def le(a: npt.NDArray[Any]) -> bytes:
    """An array's values as little-endian raw bytes."""
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def _array(data: dict[str, Any], name: str, dt: type[np.generic], size: int) -> Any:
    """``data[name]`` as ``size`` values of ``dt`` (ValueError if it is not that)."""
    raw = data.get(name)
    if not isinstance(raw, bytes):
        raise ValueError(f"seasonal bank state: {name} is not bytes")
    dtype = np.dtype(dt).newbyteorder("<")
    if len(raw) != size * dtype.itemsize:
        raise ValueError(f"seasonal bank state: {name} holds {len(raw)} bytes, not {size}")
    return np.frombuffer(raw, dtype=dtype).astype(np.dtype(dt))


def _same(mine: list[float], theirs: Any) -> bool:
    """Whether ``theirs`` is the parameter list ``mine`` (NaN: None, equal to NaN)."""
    if not mine or not isinstance(theirs, list) or len(theirs) != len(mine):
        return False
    return all(
        isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b)))
        for a, b in zip(mine, theirs, strict=True)
    )
