"""Recorded lines in event-time order, with bounded memory.

A recording made by ``ragwatch record`` is in Kafka's consumption order: each partition
in order, partitions interleaved at whatever pace the consumer read them (one can be
hours of event time ahead of another). Played in that order, hosts on the slow partition
look silent to the pipelines' sweeps. Replay therefore sorts every input by event time
(the envelopes' ``ts``; ties keep the order of the files, then of the lines, so each
sender's own order is kept), which is the order a worker reading every partition evenly
would see.

:func:`sort_items` is an external merge sort: lines are kept as their raw bytes, sorted
in runs of at most ``budget_bytes``, and runs beyond the first are spilled to temporary
files and merged back with a heap, so memory stays bounded whatever the recording's
size. An input that is already in order costs one pass and one run per budget.

>>> items = [Item(3.0, 0, 1, b"c"), Item(1.0, 0, 2, b"a"), Item(2.0, 1, 1, b"b")]
>>> [i.raw for i in sort_items(items, budget_bytes=100)]
[b'a', b'b', b'c']
>>> [i.raw for i in sort_items(items, budget_bytes=1)]     # spilled runs, same order
[b'a', b'b', b'c']
"""

from __future__ import annotations

import heapq
import struct
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

BUDGET_BYTES = 64 * 1024 * 1024  # raw bytes sorted in memory per run
_HEAD = struct.Struct("<dqqI")  # ts, file, line, length of the raw bytes
_OVERHEAD = 96  # bytes an Item costs beyond its raw line (for the budget)


@dataclass(frozen=True, slots=True, order=True)
class Item:
    """One line of one input: sorted by event time, then file, then line."""

    ts: float
    file: int
    line: int
    raw: bytes = field(compare=False)


def sort_items(
    items: Iterable[Item], *, budget_bytes: int = BUDGET_BYTES, tmpdir: str | None = None
) -> Iterator[Item]:
    """``items`` sorted (stable by file and line), holding at most ``budget_bytes`` of
    them in memory at a time; the rest waits in temporary files (removed when done)."""
    runs: list[IO[bytes]] = []
    run: list[Item] = []
    size = 0
    try:
        for item in items:
            run.append(item)
            size += len(item.raw) + _OVERHEAD
            if size >= budget_bytes:
                runs.append(_spill(sorted(run), tmpdir))
                run, size = [], 0
        run.sort()
        if not runs:
            yield from run
            return
        yield from heapq.merge(*(_read(f) for f in runs), iter(run))
    finally:
        for f in runs:
            f.close()


def _spill(run: list[Item], tmpdir: str | None) -> IO[bytes]:
    f = tempfile.TemporaryFile(dir=tmpdir)  # noqa: SIM115  # closed by sort_items
    for item in run:
        f.write(_HEAD.pack(item.ts, item.file, item.line, len(item.raw)))
        f.write(item.raw)
    f.seek(0)
    return f


def _read(f: IO[bytes]) -> Iterator[Item]:
    while head := f.read(_HEAD.size):
        ts, file, line, n = _HEAD.unpack(head)
        yield Item(ts, file, line, f.read(n))
