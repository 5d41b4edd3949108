"""Messages with a few fields broken, for property tests that hold a fast decoder to the
strict one: odd values, fields removed, unknown fields added, at chosen paths of a valid
message."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

Path = tuple[Any, ...]

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def dict_at(d: Any, path: Path) -> dict[str, Any] | None:
    """The object at ``path``, if the mutations so far left one there."""
    try:
        for p in path:
            d = d[p]
    except (KeyError, IndexError, TypeError):
        return None
    return d if isinstance(d, dict) else None


def mutate(
    draw: st.DrawFn,
    valid: dict[str, Any],
    fields: dict[Path, list[str]],
    values: st.SearchStrategy[Any],
    *,
    rounds: int,
    unknown: Sequence[str] = (),
) -> dict[str, Any]:
    """A copy of ``valid`` with 1 to ``rounds`` fields (of ``fields``, by path, or one of
    ``unknown``) replaced by one of ``values`` or removed."""
    d = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, rounds))):
        path = draw(st.sampled_from(list(fields)))
        obj = dict_at(d, path)
        if obj is None:
            continue
        field = draw(st.sampled_from([*fields[path], *unknown]))
        if draw(st.booleans()):
            obj.pop(field, None)
        else:
            obj[field] = draw(values)
    return d
