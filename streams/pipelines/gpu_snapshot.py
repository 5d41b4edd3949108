"""A host's GPU and process series as plain data: what its snapshot holds, and back.

:func:`dump` writes one host's rows of :class:`~ragwatch.streams.pipelines.gpu.GpuPipeline`:
their keys and labels, and typed arrays (raw little-endian bytes by column: the event time
of each row, its kind, its raw :data:`~.gpu_signals.COLUMNS` and its leak detector's row),
nothing that unpickles into code. :func:`adopt` takes a host over from one, unless the
pipeline already tracks it (its own state is newer); the leak detectors' part is loaded
into a probe first, so one that does not fit raises before a row changes. The pipeline's
``dump`` and ``adopt`` (its :class:`~.base.SignalPipeline` seam) call these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ragwatch.detectors.leak import LeakBank
from ragwatch.streams.pipelines.gpu_signals import COLUMNS, SeriesKey

if TYPE_CHECKING:
    from ragwatch.streams.pipelines.gpu import GpuPipeline

FORMAT = "gpu-rows/1"  # a host's rows in a snapshot: typed arrays, no objects


def dump(pipe: GpuPipeline, host: str) -> dict[str, Any]:
    """``host``'s rows of ``pipe`` for a snapshot, in key order."""
    keyed = pipe.host_rows(host)
    r = np.array([row for _, row in keyed], dtype=np.intp)
    columns = {name: getattr(pipe, name)[r].astype("<f8").tobytes() for name in COLUMNS}
    return {
        "format": FORMAT,
        "keys": [k for k, _ in keyed],
        "labels": [pipe.labels[row] for _, row in keyed],
        "last_ts": pipe.index.last_seen[r].astype("<f8").tobytes(),
        "gpu": pipe.is_gpu[r].tobytes(),
        "columns": columns,
        "leak": pipe.bank.dump(r),
        # each row's generic detector state and newest scores (.scoring; None: not scored)
        "scores": _scores(pipe, [row for _, row in keyed]),
    }


def _scores(pipe: GpuPipeline, rows: list[int]) -> list[dict[str, Any] | None]:
    """Each row's :meth:`~.scoring.ScoreBlock.dump`, GPUs' and processes' each read
    together."""
    out: list[dict[str, Any] | None] = [None] * len(rows)
    for flag in (True, False):
        at = [i for i, row in enumerate(rows) if bool(pipe.is_gpu[row]) == flag]
        for i, dumped in zip(at, pipe.scores[flag].dump_many([rows[i] for i in at]), strict=True):
            out[i] = dumped
    return out


def adopt(pipe: GpuPipeline, host: str, state: Any) -> int:
    """Take over ``host``'s series from a :func:`dump` (as many as fit, in key order),
    unless ``pipe`` already tracks the host. Returns how many series it adopted;
    ValueError for a state of another format or shape."""
    if pipe.tracks(host):
        return 0
    if isinstance(state, dict) and state.get("format") == FORMAT:
        return _adopt_rows(pipe, host, state)
    raise ValueError(f"GPU state of host {host} in an unknown format")


def _adopt_rows(pipe: GpuPipeline, host: str, state: dict[str, Any]) -> int:
    keys = [tuple(k) for k in state["keys"]]
    if any(k[0] != host for k in keys):
        return 0
    n = len(keys)
    last = np.frombuffer(state["last_ts"], dtype="<f8")
    gpu = np.frombuffer(state["gpu"], dtype=np.bool_)
    columns = {  # a column the snapshot's writer did not have yet: not known
        c: np.frombuffer(state["columns"][c], dtype="<f8")
        if c in state["columns"]
        else np.full(n, np.nan)
        for c in COLUMNS
    }
    if len(last) != n or len(gpu) != n or any(len(v) != n for v in columns.values()):
        raise ValueError(f"GPU state of host {host}: arrays of another length")
    probe = LeakBank(1, **pipe.bank.params.as_dict())
    probe.load(np.arange(n), state["leak"])  # checks it fits before anything changes
    dumped = state.get("scores") or [None] * n  # (none before issue 34)
    if not isinstance(dumped, list) or len(dumped) != n:
        raise ValueError(f"GPU state of host {host}: scores of another length")
    scores = [pipe.scores[bool(g)].check(d) for g, d in zip(gpu, dumped, strict=True)]
    order = sorted(range(n), key=lambda i: keys[i])[: pipe.room()]
    rows = []
    for i in order:
        k = keys[i]
        key = (str(k[0]), int(k[1]), str(k[2]), int(k[3]))
        row = pipe.add_row(
            key, _checked_labels(key, state["labels"][i]), float(last[i]), gpu=bool(gpu[i])
        )
        for c in COLUMNS:
            getattr(pipe, c)[row] = columns[c][i]
        pipe.scores[bool(gpu[i])].adopt(row, scores[i])
        rows.append(row)
    if rows:
        picked = np.array(order, dtype=np.intp)
        pipe.bank.load(np.array(rows, dtype=np.intp), probe.dump(picked))
        pipe.watch[rows] = pipe.peer_watch[rows] = True  # the engine may restore its alerts
    return len(rows)


def _checked_labels(key: SeriesKey, labels: Any) -> dict[str, str]:
    """A snapshot's labels of the series ``key``: strings that name that series (its host,
    GPU, MIG instance and process) and no other, or ValueError. Its alerts carry them, and a
    stale series resolves the alerts they match."""
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ValueError(f"GPU series of host {key[0]}: labels are not a map of strings")
    host, index, mig, pid = key
    names = {"host": host, "gpu": str(index), "mig": mig, "pid": None if pid < 0 else str(pid)}
    if any(labels.get(k) != v for k, v in names.items()) or "service" in labels:
        raise ValueError(f"GPU series of host {host}: labels of another series")
    return dict(labels)
