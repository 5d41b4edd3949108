"""What ``ragwatch status`` and the charts read of the GPU and process series of hosts.

:func:`status` builds each host's status entry (its GPUs with their processes, and the
hosts' top GPUs by utilisation, memory and memory growth), :func:`charts` the series a
chart may draw. Both read the rows of many hosts together, so each signal is computed
once for all of them (:class:`~.gpu_signals.RowSignals`): the worker writes the status
and charts of every host that changed, every second. The pipeline's ``status`` and
``charts`` (its :class:`~.base.SignalPipeline` seam) call these.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ragwatch.catalog import POD_LABELS, PROCESS_POD_LABELS
from ragwatch.chart_ids import series_prefix
from ragwatch.streams.pipelines.base import ChartSeries
from ragwatch.streams.pipelines.gpu_signals import SeriesKey, SeriesView

if TYPE_CHECKING:
    from ragwatch.streams.pipelines.gpu import GpuPipeline

TOP_K = 3  # GPUs per host listed by utilisation, memory and memory growth in the snapshot
STATUS_SIGNALS = ("fb_used_bytes", "fb_total_bytes", "gb_per_hour", "mem_increase_gb", "tte_h")


class _StatusColumns(NamedTuple):
    """What a status shows of each row, one list per field over the rows of many hosts."""

    view: list[list[float | None]]  # STATUS_SIGNALS
    gpu_util: list[float | None]
    gpu_mem_bytes: list[float | None]
    last_ts: list[float]


def status(pipe: GpuPipeline, keys: Collection[str]) -> dict[str, dict[str, Any]]:
    """The status entry of each host of ``keys`` (one without series: no GPUs)."""
    keyed, rows, signals = pipe.rows_of(keys)
    columns = _StatusColumns(
        [signals.column(n) for n in STATUS_SIGNALS],
        signals.column("gpu_util"),
        signals.column("gpu_mem_bytes"),
        pipe.index.last_seen[rows].tolist(),
    )
    out, at = {}, 0
    for h, pairs in keyed.items():
        out[h] = _host_status(pipe, h, pairs, at, columns)
        at += len(pairs)
    return out


def charts(pipe: GpuPipeline, keys: Collection[str]) -> Iterator[ChartSeries]:
    """Every series of the hosts ``keys``, as charts draw them (read when iterated); each
    row's chart id prefix is made once and kept in ``pipe.where``."""
    _, at, signals = pipe.rows_of(keys)
    last, gpu, where = pipe.index.last_seen[at].tolist(), pipe.is_gpu[at].tolist(), pipe.where
    for i, r in enumerate(at.tolist()):
        labels, kind = pipe.labels[r] or {}, "gpu" if gpu[i] else "process"
        prefix = where[r]
        if prefix is None:
            prefix = where[r] = series_prefix(kind, labels)
        view = SeriesView(labels, last[i], signals, i)
        yield ChartSeries(kind, labels, last[i], view, prefix)


def _host_status(
    pipe: GpuPipeline,
    host: str,
    pairs: list[tuple[SeriesKey, int]],
    at: int,
    columns: _StatusColumns,
) -> dict[str, Any]:
    """One host's status from the columns of its rows (``pairs`` in key order, the
    first at ``at``): a GPU's row comes before its processes'."""
    gpus: dict[tuple[int, str], dict[str, Any]] = {}
    view = columns.view
    for i, (key, row) in enumerate(pairs, at):
        labels = pipe.labels[row] or {}
        g = gpus.get(key[1:3])
        if g is None:
            g = gpus[key[1:3]] = {"index": key[1], "mig": key[2] or None, "procs": []}
        if key[3] == -1:
            g.update(zip(STATUS_SIGNALS, [c[i] for c in view], strict=True))
            g["name"], g["uuid"] = labels.get("gpu_name"), labels.get("uuid")
            g["gpu_util"], g["ts"] = columns.gpu_util[i], columns.last_ts[i]
            g["scores"] = pipe.scores[True].scored(row)  # signal: [score, yhat, lower, upper]
            g.update((k, labels[k]) for k in POD_LABELS if k in labels)
            continue
        g["procs"].append(_process(key, labels, i, columns))
        g["procs"][-1]["scores"] = pipe.scores[False].scored(row)
    top = [g for g in gpus.values() if "ts" in g]
    return {
        "host": host,
        "gpus": list(gpus.values()),
        "top_gpus": {
            "util": _top(top, "gpu_util", TOP_K),
            "memory": _top(top, "fb_used_bytes", TOP_K),
            "growth": _top(top, "gb_per_hour", TOP_K),
        },
    }


def _process(
    key: SeriesKey, labels: Mapping[str, str], i: int, columns: _StatusColumns
) -> dict[str, Any]:
    """A process's entry under its GPU's, from its row (the ``i``-th of the columns)."""
    growth = columns.view[STATUS_SIGNALS.index("gb_per_hour")]
    proc: dict[str, Any] = {
        "pid": key[3],
        "name": labels["process"],
        "container": labels["container"],
        "gpu_mem_bytes": columns.gpu_mem_bytes[i],
        "gb_per_hour": growth[i],
    }
    proc.update((k, labels[k]) for k in PROCESS_POD_LABELS if k in labels)
    return proc


def _top(gpus: list[dict[str, Any]], field: str, k: int) -> list[dict[str, Any]]:
    """The ``k`` GPUs with the largest ``field`` (None last), as {index, mig, value}."""
    ranked = sorted(gpus, key=lambda g: (g.get(field) is None, -(g.get(field) or 0.0), g["index"]))
    return [{"index": g["index"], "mig": g["mig"], "value": g.get(field)} for g in ranked[:k]]
