"""Rules evaluated only where they can change something (issue 17).

A pipeline that keeps its series in rows (the GPU pipeline's samples, the request
pipeline's bucket closes) evaluates its rules on many rows at once, and most rows of a
healthy fleet hold no alert and meet no condition. An inactive alert whose condition does
not hold cannot start, so only the rows where a rule holds (a mask over the rows,
:func:`~.masks.holds`) or an alert of the row may be active (the caller's ``watch``
flags) need the alert engine: the transitions are those of evaluating every rule on every
row, at a fraction of the cost. :func:`pick` chooses the rows, :func:`evaluate` hands them
to the engine in the caller's order and keeps ``watch``. Both pipelines call the two, so
the gating is written once.

>>> import numpy as np
>>> from ragwatch.streams.alerting.rules import parse_rule
>>> rule = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 90"})
>>> engine, watch = AlertEngine(), np.zeros(3, dtype=np.bool_)
>>> rows = np.arange(3)
>>> picked = pick([rule], rows, {"temp_c": np.array([60.0, 95.0, np.nan])}, watch)
>>> [p.row for p in picked]
[1]
>>> def keys(row, rules):
...     return {r.name: engine.alert_key(r, {"gpu": str(row)}) for r in rules}
>>> fired = evaluate(engine, picked, [{"temp_c": 95.0}], keys, [0.0, 10.0, 0.0], watch)
>>> [(at, t.alert.status) for at, t in fired], watch.tolist()
([(1, 'firing')], [False, True, False])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ragwatch.schema import Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.masks import holds
from ragwatch.streams.alerting.rules import Rule

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
Bools = npt.NDArray[np.bool_]
# a rule's name -> the labels and fingerprint of its alert on a row (AlertEngine.alert_key)
AlertKeys = Mapping[str, tuple[dict[str, str], str]]
KeysOf = Callable[[int, Sequence[Rule]], AlertKeys]


class Pick(NamedTuple):
    """A row whose rules go to the engine: its position in the caller's order (its
    sample, its close), its row, its rules and which of them hold (None: every rule is
    evaluated, as if it held)."""

    at: int
    row: int
    rules: Sequence[Rule]
    hold: Sequence[Any] | None  # per rule, a truth value


def pick(
    rules: Sequence[Rule],
    rows: Rows,
    signals: Mapping[str, F64],
    watch: Bools,
    at: Rows | None = None,
    *,
    every: bool = False,
) -> list[Pick]:
    """The rows of ``rows`` whose ``rules`` may change something: where one of them holds
    on ``signals`` (arrays over ``rows``), or where ``watch[row]`` is set (an alert of the
    row may be active), in the order of ``rows``. ``at``: the rows' positions in the
    caller's order (0, 1, ... if None). ``every``: every row, all its rules, unmasked
    (the GPU pipeline's reference mode, ``every_sample``; ``signals`` is not read)."""
    if not rules or not len(rows):
        return []
    pos = np.arange(len(rows)) if at is None else at
    if every:
        return [Pick(int(pos[j]), int(rows[j]), rules, None) for j in range(len(rows))]
    hold = [holds(rule, signals, len(rows)) for rule in rules]
    hit = np.logical_or.reduce([*hold, watch[rows]])
    return [
        Pick(int(pos[j]), int(rows[j]), rules, [h[j] for h in hold])
        for j in np.flatnonzero(hit).tolist()
    ]


def evaluate(
    engine: AlertEngine,
    picked: Iterable[Pick],
    signals: Iterable[Mapping[str, float | None]],
    keys: KeysOf,
    ts: Sequence[float] | F64,
    watch: Bools,
) -> list[tuple[int, Transition]]:
    """Each picked row's rules, in the order of ``picked``, to ``engine``: those that hold,
    and those whose alert is active (it may resolve), with the row's ``signals`` (one
    mapping per pick, read as its row comes: a generator computes them one at a time)
    at ``ts[at]``. Returns the transitions with their picks' positions, in order, and
    leaves ``watch[row]`` set where an alert of the row is active after."""
    out: list[tuple[int, Transition]] = []
    for p, sig in zip(picked, signals, strict=True):
        alert_keys, t = keys(p.row, p.rules), float(ts[p.at])
        active = False
        for n, rule in enumerate(p.rules):
            labels, fp = alert_keys[rule.name]
            if p.hold is None or p.hold[n] or engine.is_active(fp):
                tr = engine.evaluate_key(rule, labels, fp, sig, t)
                if tr is not None:
                    out.append((p.at, tr))
            active = active or engine.is_active(fp)
        watch[p.row] = active
    return out
