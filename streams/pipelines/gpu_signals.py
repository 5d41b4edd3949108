"""What a GPU or process series' signals are, and how they are read from its row.

A series of :class:`~ragwatch.streams.pipelines.gpu.GpuPipeline` is a row: raw
:data:`COLUMNS` (memory, utilisation, temperature ...) and a row of the pipeline's
:class:`~ragwatch.detectors.leak.LeakBank`. Its signals (:data:`GPU_SIGNALS`,
:data:`PROCESS_SIGNALS`) are computed from those when read, never stored, two ways that
give the same values (``tests/unit/test_gpu_columnar.py`` holds them together):

- :class:`SignalArrays`: one array per signal over many rows of one kind, each computed
  when first read (a rule's mask reads two or three of them);
- :func:`row_signals`: one row in plain floats (a few rows cost less so than as arrays).

:class:`RowSignals` reads the rows of mixed kinds that a reader takes together (the rows
of a wave's alerts, the hosts of a status or of charts) one way or the other by their
number; a :class:`SeriesView` is one of those rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ragwatch.advisor import gpu_words, process_words
from ragwatch.catalog import SCORED
from ragwatch.detectors.leak import GB
from ragwatch.schema import AnomalyFact
from ragwatch.streams.pipelines.gpu_peers import PEER_SIGNALS
from ragwatch.streams.pipelines.scoring import MAX_FACTS, score_names

if TYPE_CHECKING:
    from ragwatch.streams.pipelines.gpu import GpuPipeline

SeriesKey = tuple[str, int, str, int]  # host, gpu index, mig ("" if none), pid (-1 = gpu)
F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
SCALAR_ROWS = 4  # at most this many rows' signals are read in plain floats, not arrays

# The signals of each kind of series, in the order their dicts list them.
LEAK_SIGNALS = (
    "fb_used_bytes",
    "fb_total_bytes",
    "mem_increase_bytes",
    "mem_increase_gb",
    "mem_slope_bytes_per_s",
    "gb_per_hour",
    "window_h",
    "leak_score",
    "mem_steadiness",
    "recent_gb_per_hour",
    "recent_steadiness",
    "tte_s",
    "tte_h",
    "leak_gb_per_hour",
    "floor_gb_per_hour",
    "floor_steadiness",
    "above_known_gb",
)
GPU_SIGNALS = (
    *LEAK_SIGNALS,
    "attributed_gb_per_hour",
    "unattributed_gb_per_hour",
    "unattributed_growth_gb",
    "fb_used_ratio",
    "gpu_util",
    "mem_copy_util",
    "temp_c",
    "power_w",
    *PEER_SIGNALS,  # the GPU against its like GPUs, as last compared (.gpu_peers)
    *score_names(SCORED["gpu"]),  # the generic detector's scores (.scoring)
)
PEER_SET = frozenset(PEER_SIGNALS)
PROCESS_SIGNALS = (*LEAK_SIGNALS, "gpu_mem_bytes", "rss_bytes", *score_names(SCORED["process"]))
SCORE_SET = frozenset(score_names(SCORED["gpu"]) + score_names(SCORED["process"]))
GPU_SIGNAL_SET, PROCESS_SIGNAL_SET = frozenset(GPU_SIGNALS), frozenset(PROCESS_SIGNALS)
# the raw columns of a row (NaN where a value is not known), as a snapshot holds them
COLUMNS = (
    "value",
    "fb_used",
    "fb_total",
    "gpu_util",
    "mem_copy_util",
    "temp_c",
    "power_w",
    "rss",
    "attributed",
    # a GPU's memory that no listed process holds, and its low-water marks of this hour
    # and the hour before (GpuPipeline._residual; the hour's number in residual_block)
    "residual",
    "residual_lo",
    "residual_lo_before",
    "residual_block",
    # a GPU's last comparison with its like GPUs (.gpu_peers; NaN: not compared)
    *PEER_SIGNALS,
)


class SeriesView:
    """One series as readers outside the pipeline see it (hints, charts, status): its
    labels, last event time and signals. The signals of the rows read together are
    computed together, each when first read."""

    __slots__ = ("_at", "_rows", "labels", "last_ts")

    def __init__(self, labels: dict[str, str], last_ts: float, rows: RowSignals, at: int):
        self.labels, self.last_ts, self._rows, self._at = labels, last_ts, rows, at

    @property
    def signals(self) -> Mapping[str, float | None]:
        """Every signal the rules of this series can read (None: no value)."""
        return self._rows.row(self._at)

    def bands(self) -> Mapping[str, list[float | None]]:
        """Its scored signals' newest score, expected value and band (.scoring)."""
        return self._rows.bands(self._at)


class RowSignals:
    """The signals of some rows of mixed kinds: a few rows in plain floats
    (:func:`row_signals`), more as one array per signal and kind, each made
    when first read, so a reader of two signals of 10,000 rows computes two arrays."""

    def __init__(self, pipe: GpuPipeline, rows: Rows) -> None:
        self._pipe, self._rows = pipe, rows
        self._few: list[dict[str, float | None]] | None = None
        self._gpu: list[bool] = pipe.is_gpu[rows].tolist()
        self._pos: list[int] = []
        self._arrays: dict[bool, Mapping[str, F64]] = {}
        self._at: dict[bool, Rows] = {}
        self._columns: dict[tuple[bool, str], list[float | None]] = {}

    def row(self, at: int) -> Mapping[str, float | None]:
        if len(self._rows) <= SCALAR_ROWS:
            if self._few is None:
                self._few = [row_signals(self._pipe, int(r)) for r in self._rows]
            return self._few[at]
        if not self._arrays:
            self._split()
        return _RowView(self, at, self._gpu[at])

    def bands(self, at: int) -> Mapping[str, list[float | None]]:
        """Row ``at``'s scored signals: ``{signal: [score, yhat, lower, upper, ...]}``
        (:meth:`~.scoring.ScoreBlock.scored`), each read when asked."""
        row = int(self._rows[at])
        return self._pipe.scores[self._gpu[at]].bands(row)

    def column(self, name: str) -> list[float | None]:
        """One signal of every row (None: no value, or not a signal of the row's kind)."""
        if len(self._rows) <= SCALAR_ROWS:
            return [self.row(i).get(name) for i in range(len(self._rows))]
        if not self._arrays:
            self._split()
        merged = np.full(len(self._rows), np.nan)
        for flag, at in self._at.items():
            if len(at) and name in (GPU_SIGNAL_SET if flag else PROCESS_SIGNAL_SET):
                merged[at] = self._arrays[flag][name]
        return _nones(merged)

    def _split(self) -> None:
        gpu = np.array(self._gpu, dtype=bool)
        pos = np.empty(len(gpu), dtype=np.intp)
        for flag in (True, False):
            at = self._at[flag] = np.flatnonzero(gpu == flag)
            pos[at] = np.arange(len(at))
            self._arrays[flag] = SignalArrays(self._pipe, self._rows[at], flag)
        self._pos = pos.tolist()

    def value(self, gpu: bool, name: str, at: int) -> float | None:
        column = self._columns.get((gpu, name))
        if column is None:
            column = self._columns[gpu, name] = _nones(self._arrays[gpu][name])
        return column[self._pos[at]]


def _nones(values: F64) -> list[float | None]:
    """``values`` as floats, None for NaN (no value)."""
    return [None if math.isnan(v) else v for v in values.tolist()]


class _RowView(Mapping[str, "float | None"]):
    """One row's signals, read from its :class:`RowSignals` columns."""

    __slots__ = ("_at", "_gpu", "_rows")

    def __init__(self, rows: RowSignals, at: int, gpu: bool) -> None:
        self._rows, self._at, self._gpu = rows, at, gpu

    def __getitem__(self, name: str) -> float | None:
        if name not in (GPU_SIGNAL_SET if self._gpu else PROCESS_SIGNAL_SET):
            raise KeyError(name)
        return self._rows.value(self._gpu, name, self._at)

    def __iter__(self) -> Iterator[str]:
        return iter(GPU_SIGNALS if self._gpu else PROCESS_SIGNALS)

    def __len__(self) -> int:
        return len(GPU_SIGNALS if self._gpu else PROCESS_SIGNALS)


class SignalArrays(Mapping[str, F64]):
    """The signals of some rows of one kind, each computed when first read (a rule's
    mask reads two or three of them; a status or an alert all)."""

    def __init__(self, pipe: GpuPipeline, rows: Rows, gpu: bool) -> None:
        self._p, self._r, self._gpu = pipe, rows, gpu
        self._names = GPU_SIGNALS if gpu else PROCESS_SIGNALS
        self._done: dict[str, F64] = {}
        self.has = pipe.bank.has[rows]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, name: str) -> F64:
        v = self._done.get(name)
        if v is None:
            if name not in self._names:
                raise KeyError(name)
            if name in SCORE_SET:  # held by the scores' block, all read together
                self._done.update(self._p.scores[self._gpu].scores(self._r))
                return self._done[name]
            if name in PEER_SET:  # held as compared, not computed
                held: F64 = getattr(self._p, name)[self._r]
                self._done[name] = held
                return held
            with np.errstate(all="ignore"):
                v = self._done[name] = getattr(self, "_" + name)()
        return v

    def _est(self, a: F64) -> F64:
        return np.where(self.has, a[self._r], np.nan)

    def _fb_used_bytes(self) -> F64:
        return self._p.fb_used[self._r]

    def _fb_total_bytes(self) -> F64:
        return self._p.fb_total[self._r]

    def _mem_slope_bytes_per_s(self) -> F64:
        return self._est(self._p.bank.slope)

    def _mem_increase_bytes(self) -> F64:
        return self["mem_slope_bytes_per_s"] * self._est(self._p.bank.span)

    def _mem_increase_gb(self) -> F64:
        return self["mem_increase_bytes"] / GB

    def _gb_per_hour(self) -> F64:
        return self["mem_slope_bytes_per_s"] * 3600 / GB

    def _window_h(self) -> F64:
        return self._est(self._p.bank.span) / 3600

    def _leak_score(self) -> F64:
        return self._p.bank.scores(self._r)

    def _mem_steadiness(self) -> F64:
        return self._est(self._p.bank.steadiness)

    def _recent(self) -> F64:
        return self._est(self._p.bank.recent_slope)

    def _recent_gb_per_hour(self) -> F64:
        return self._recent() * 3600 / GB

    def _recent_steadiness(self) -> F64:
        return self._est(self._p.bank.recent_steadiness)

    def _leak(self) -> F64:
        v = self._done.get("_leak")
        if v is None:
            v = self._done["_leak"] = self._p.bank.leak_rates(self._r)
        return v

    def _tte_s(self) -> F64:
        # at the leak rate: a batch job's ramp or an allocator's morning is no time to OOM
        free = self["fb_total_bytes"] - self["fb_used_bytes"]
        rate = self._leak()
        tte = np.where(rate > 0, np.maximum(0.0, free) / rate, np.inf)
        tte = np.where(free <= 0, 0.0, tte)  # full: nothing left, whatever the slope says
        return np.where(self.has, tte, np.nan)

    def _leak_gb_per_hour(self) -> F64:
        return np.where(self.has, self._leak() * 3600 / GB, np.nan)

    def _floor_gb_per_hour(self) -> F64:
        b = self._p.bank
        return np.where(b.fhas[self._r], b.fslope[self._r] * 3600 / GB, np.nan)

    def _floor_steadiness(self) -> F64:
        return self._p.bank.fsteady[self._r]

    def _above_known_gb(self) -> F64:
        b = self._p.bank
        known = b.known[self._r]  # -inf: a young series, no range held and left yet
        return np.where(self.has & np.isfinite(known), (b.level[self._r] - known) / GB, np.nan)

    def _tte_h(self) -> F64:
        return self["tte_s"] / 3600

    def _attributed_gb_per_hour(self) -> F64:
        return self._p.attributed[self._r]

    def _unattributed_gb_per_hour(self) -> F64:
        return self["leak_gb_per_hour"] - self["attributed_gb_per_hour"]

    def _unattributed_growth_gb(self) -> F64:
        return self._p.residual_growth_gb(self._r)

    def _fb_used_ratio(self) -> F64:
        total = self["fb_total_bytes"]
        return np.where(total != 0, self["fb_used_bytes"] / total, np.nan)

    def _gpu_util(self) -> F64:
        return self._p.gpu_util[self._r]

    def _mem_copy_util(self) -> F64:
        return self._p.mem_copy_util[self._r]

    def _temp_c(self) -> F64:
        return self._p.temp_c[self._r]

    def _power_w(self) -> F64:
        return self._p.power_w[self._r]

    def _gpu_mem_bytes(self) -> F64:
        return self._p.value[self._r]

    def _rss_bytes(self) -> F64:
        return self._p.rss[self._r]


def row_signals(pipe: GpuPipeline, row: int) -> dict[str, float | None]:
    """The signals of one row of ``pipe`` in plain floats; the same IEEE operations as
    :class:`SignalArrays`, so the same values."""
    b, nan = pipe.bank, math.nan
    used, total = float(pipe.fb_used[row]), float(pipe.fb_total[row])
    leak = float(b.leak_rates([row])[0])  # the bank's own arithmetic, on one row
    floor = float(b.fslope[row]) if b.fhas[row] else nan
    if b.has[row]:
        slope, span = float(b.slope[row]), float(b.span[row])
        recent, steady = float(b.recent_slope[row]), float(b.steadiness[row])
        recent_steady = float(b.recent_steadiness[row])
        free = total - used
        tte = 0.0 if free <= 0 else max(0.0, free) / leak if leak > 0 else math.inf
        known = float(b.known[row])
        above = (float(b.level[row]) - known) / GB if math.isfinite(known) else nan
    else:
        slope = span = recent = steady = recent_steady = tte = leak = above = nan
    increase = slope * span
    recent_gb = recent * 3600 / GB
    leak_gb = leak * 3600 / GB
    values: list[float] = [
        used, total, increase, increase / GB, slope, slope * 3600 / GB, span / 3600,
        float(b.scores([row])[0]), steady, recent_gb, recent_steady, tte, tte / 3600,
        leak_gb, floor * 3600 / GB, float(b.fsteady[row]), above,
    ]  # fmt: skip
    if pipe.is_gpu[row]:
        attributed = float(pipe.attributed[row])
        values += [
            attributed,
            leak_gb - attributed,
            float(pipe.residual_growth_gb(np.array([row]))[0]),
            used / total if total != 0 else nan,
            float(pipe.gpu_util[row]),
            float(pipe.mem_copy_util[row]),
            float(pipe.temp_c[row]),
            float(pipe.power_w[row]),
            *(float(getattr(pipe, name)[row]) for name in PEER_SIGNALS),
        ]
        names: tuple[str, ...] = GPU_SIGNALS
    else:
        values += [float(pipe.value[row]), float(pipe.rss[row])]
        names = PROCESS_SIGNALS
    values += pipe.scores[bool(pipe.is_gpu[row])].matrix(np.array([row], dtype=np.intp))[0].tolist()
    return {k: None if v != v else v for k, v in zip(names, values, strict=True)}


def score_wave(pipe: GpuPipeline, rows: Rows, ts: F64) -> None:
    """Score, then learn, the signals of a wave's ``rows`` (distinct, sampled at ``ts``)
    that the generic detector scores (:data:`~ragwatch.catalog.SCORED`), GPUs and
    processes each in their block (``pipe.scores``)."""
    gpu = pipe.is_gpu[rows]
    for flag in (True, False):
        block = pipe.scores[flag]
        at = np.flatnonzero(gpu == flag)
        at = at[block.due(rows[at], ts[at])]  # a series once a minute: only those gathered
        if len(at):
            arrays = SignalArrays(pipe, rows[at], flag)
            with np.errstate(all="ignore"):
                values = np.array([arrays[n] for n in block.names]).T  # column_stack, 4x faster
            block.learn_due(rows[at], ts[at], values)


def anomalous_of(pipe: GpuPipeline, pairs: list[tuple[SeriesKey, int]]) -> tuple[AnomalyFact, ...]:
    """The anomalous signals of a host's rows (``pairs``: key and row), GPUs' and
    processes' together, highest peak first (:meth:`~.scoring.ScoreBlock.anomalous`)."""
    out: list[AnomalyFact] = []
    for flag in (True, False):
        rows = [r for _, r in pairs if bool(pipe.is_gpu[r]) == flag]
        labels = [pipe.labels[r] or {} for r in rows]
        if flag:
            wheres = [gpu_words(lab.get("gpu"), lab.get("mig")) for lab in labels]
        else:
            wheres = [process_words(lab.get("pid"), lab.get("process")) for lab in labels]
        out += pipe.scores[flag].anomalous(rows, wheres)
    out.sort(key=lambda f: -f.score)
    return tuple(out[:MAX_FACTS])
