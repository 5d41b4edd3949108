"""The series index of the banks against a plain dict model (hypothesis, stateful): every
key has one row, no two keys share one, freed rows are reused before the arrays grow, a
host's rows and the stale rows are exactly the model's."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ragwatch.streams.pipelines.rows import RowIndex

Key = tuple[str, int]
KEYS = st.tuples(st.sampled_from(["h1", "h2", "h3"]), st.integers(0, 6))


class Model(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index: RowIndex[Key] = RowIndex(capacity=2)
        self.seen: dict[Key, float] = {}
        self.peak = 0

    @rule(key=KEYS, at=st.floats(0, 1e6))
    def add(self, key: Key, at: float) -> None:
        if key in self.seen:
            with pytest.raises(KeyError):
                self.index.add(key, at=at)
            return
        row = self.index.add(key, at=at)
        self.seen[key] = at
        self.peak = max(self.peak, len(self.seen))
        assert self.index.key(row) == key and self.index.get(key) == row

    @precondition(lambda self: bool(self.seen))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.seen)))
        row = self.index.remove(key)
        del self.seen[key]
        with pytest.raises(KeyError):
            self.index.key(row)

    @precondition(lambda self: bool(self.seen))
    @rule(data=st.data(), at=st.floats(0, 1e6))
    def see(self, data: st.DataObject, at: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.seen)))
        self.index.seen([self.index.get(key)], [at])
        self.seen[key] = max(self.seen[key], at)

    @rule(now=st.floats(0, 2e6), older=st.floats(0, 1e6))
    def stale(self, now: float, older: float) -> None:
        got = {self.index.key(int(r)) for r in self.index.stale(now=now, older_than_s=older)}
        assert got == {k for k, at in self.seen.items() if at < now - older}

    @invariant()
    def one_row_per_key(self) -> None:
        rows = {self.index.get(k) for k in self.seen}
        assert len(rows) == len(self.seen) == len(self.index)
        assert self.index.size == self.peak  # freed rows reused before new ones
        for host in ("h1", "h2", "h3"):
            assert self.index.owned(host) == {self.index.get(k) for k in self.seen if k[0] == host}
        assert set(self.index.owners()) == {k[0] for k in self.seen}


TestRowIndex = Model.TestCase
TestRowIndex.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
