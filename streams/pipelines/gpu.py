"""From ``ragwatch.gpu`` envelopes to per-GPU and per-process signals and alert transitions.

Plain Python and numpy (no Faust): the worker (:mod:`ragwatch.streams.worker.loop`) feeds
batches of decoded envelopes into :meth:`GpuPipeline.process_batch`, and so can a test or
a replay; :meth:`GpuPipeline.process` takes one.

Series:

- ``gpu``: one per (host, GPU index, MIG instance), a leak detector on ``fb_used``;
- ``process``: one per (host, GPU, MIG, pid), a leak detector on its GPU memory. A new
  pid is a new series, so a restart resets the detector.

The state is columnar (issue 17): a series is a row of arrays, its key's row kept by a
:class:`~ragwatch.streams.pipelines.rows.RowIndex`, its leak detector a row of a
:class:`~ragwatch.detectors.leak.LeakBank`, its raw values (memory, utilisation,
temperature ...) columns. A batch is split into *waves*, runs of envelopes of distinct
hosts: a wave's samples are learned with one set of array operations, its rules are
evaluated as masks over its rows, and only the rows where a rule holds or an alert is
active reach the alert engine. The transitions are those of one envelope at a time
(``tests/unit/test_gpu_columnar.py`` holds them to it).

A series not seen for ``stale_s`` of event time (the process exited, the GPU vanished)
is forgotten and its active alerts resolve. A host that goes silent altogether is swept
the same way once the pipeline's event-time high-water mark is ``12 * stale_s`` past its
last sample (the margin tolerates partitions that are consumed at different paces).
Samples of new series beyond ``max_series`` (in all; with a shared ``budget``, the worker's
series of every kind count), or ``max_series_per_host`` (one host whose processes churn
through pids), are dropped and counted.

>>> from ragwatch.agents.sim import FleetSimulator, SimConfig
>>> from ragwatch.codec import gpu_wire
>>> from ragwatch.streams.alerting.rules import load_rules
>>> pipe = GpuPipeline(load_rules())
>>> sim = FleetSimulator(SimConfig(hosts=1, gpus=1, interval_s=30, leak_start_s=0))
>>> fired = []
>>> for _, (ts, envs, _) in zip(range(2 * 120), sim.ticks()):  # two hours
...     batch = [gpu_wire(env) for env in envs]
...     fired += [t.alert for t in pipe.process_batch(batch) if t.notify]
>>> fired[0].labels["process"], fired[0].labels["pid"], fired[0].status
('rag-worker', '4001', 'firing')
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt

from ragwatch.catalog import POD_LABELS, PROCESS_POD_LABELS
from ragwatch.chart_ids import series_prefix
from ragwatch.codec import gpu_wire
from ragwatch.detectors.leak import GB, LeakBank, LeakEstimate
from ragwatch.gpu_wire import GpuMessage, GpuSampleWire, ProcessWire
from ragwatch.schema import GpuEnvelope, Transition
from ragwatch.streams.alerting import masks
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import BatchFailed, ChartSeries, Domain
from ragwatch.streams.pipelines.budget import SeriesBudget
from ragwatch.streams.pipelines.rows import RowIndex

log = logging.getLogger(__name__)

SeriesKey = tuple[str, int, str, int]  # host, gpu index, mig ("" if none), pid (-1 = gpu)
# called as a wave is done: its envelopes' (host, ts) and transitions -> those to keep
WaveDone = Callable[[list[tuple[str, float]], list[Transition]], list[Transition]]
F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
# A host is swept by the pipeline's watermark only after 12 x stale_s (an hour by default):
# hosts live on different partitions, consumed at different paces, and a fast replay turns
# a second of lag into many minutes of event time.
SILENT_HOST_FACTOR = 12
TOP_K = 3  # GPUs per host listed by utilisation, memory and memory growth in the snapshot
SNAPSHOT_FORMAT = "gpu-rows/1"  # a host's rows in a snapshot: typed arrays, no objects
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
)
PROCESS_SIGNALS = (*LEAK_SIGNALS, "gpu_mem_bytes", "rss_bytes")
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
)
RESIDUAL_BLOCK_S = 3600.0


def _top(gpus: list[dict[str, Any]], field: str, k: int) -> list[dict[str, Any]]:
    """The ``k`` GPUs with the largest ``field`` (None last), as {index, mig, value}."""
    ranked = sorted(gpus, key=lambda g: (g.get(field) is None, -(g.get(field) or 0.0), g["index"]))
    return [{"index": g["index"], "mig": g["mig"], "value": g.get(field)} for g in ranked[:k]]


def _worth_logging(dropped: int) -> bool:
    """Log a repeated drop the 1st, 10th and 100th time, then every 10,000th."""
    return dropped in (1, 10, 100) or dropped % 10_000 == 0


def _pod(labels: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """The Kubernetes container a GPU series (its labels) is allocated to."""
    return labels.get("namespace"), labels.get("pod"), labels.get("container")


def _pod_labels(sample: GpuSampleWire | ProcessWire, names: tuple[str, ...]) -> dict[str, str]:
    """The Kubernetes labels ``names`` of a sample, where set."""
    return {k: v for k in names if (v := getattr(sample, k))}


STATUS_SIGNALS = ("fb_used_bytes", "fb_total_bytes", "gb_per_hour", "mem_increase_gb", "tte_h")


class _StatusColumns(NamedTuple):
    """What a status shows of each row, one list per field over the rows of many hosts."""

    view: list[list[float | None]]  # STATUS_SIGNALS
    gpu_util: list[float | None]
    gpu_mem_bytes: list[float | None]
    last_ts: list[float]


class SeriesView:
    """One series as readers outside the pipeline see it (hints, charts, status): its
    labels, last event time and signals. The signals of the rows read together are
    computed together, each when first read."""

    __slots__ = ("_at", "_rows", "labels", "last_ts")

    def __init__(self, labels: dict[str, str], last_ts: float, rows: _RowSignals, at: int):
        self.labels, self.last_ts, self._rows, self._at = labels, last_ts, rows, at

    @property
    def signals(self) -> Mapping[str, float | None]:
        """Every signal the rules of this series can read (None: no value)."""
        return self._rows.row(self._at)


class _RowSignals:
    """The signals of some rows of mixed kinds: a few rows in plain floats
    (:meth:`GpuPipeline.row_signals`), more as one array per signal and kind, each made
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
                self._few = [self._pipe.row_signals(int(r)) for r in self._rows]
            return self._few[at]
        if not self._arrays:
            self._split()
        return _RowView(self, at, self._gpu[at])

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
            self._arrays[flag] = self._pipe.signal_arrays(self._rows[at], flag)
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
    """One row's signals, read from its :class:`_RowSignals` columns."""

    __slots__ = ("_at", "_gpu", "_rows")

    def __init__(self, rows: _RowSignals, at: int, gpu: bool) -> None:
        self._rows, self._at, self._gpu = rows, at, gpu

    def __getitem__(self, name: str) -> float | None:
        if name not in (GPU_SIGNAL_SET if self._gpu else PROCESS_SIGNAL_SET):
            raise KeyError(name)
        return self._rows.value(self._gpu, name, self._at)

    def __iter__(self) -> Iterator[str]:
        return iter(GPU_SIGNALS if self._gpu else PROCESS_SIGNALS)

    def __len__(self) -> int:
        return len(GPU_SIGNALS if self._gpu else PROCESS_SIGNALS)


class _Signals(Mapping[str, F64]):
    """The signals of some rows of one kind, each computed when first read (a rule's
    mask reads two or three of them; a status or an alert all)."""

    def __init__(self, pipe: GpuPipeline, rows: Rows, gpu: bool) -> None:
        self._p, self._r = pipe, rows
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


@dataclass
class PipelineStats:
    envelopes: int = 0
    samples: int = 0
    dropped_samples: int = 0  # samples of series that did not fit under max_series
    dropped_host_cap: int = 0  # ... or under max_series_per_host (one host's pid churn)
    evicted_series: int = 0
    duplicates: int = 0  # samples not newer than their series' last one (a replay, a retry)


class _Wave:
    """The samples of one wave, gathered as Python lists and applied to the arrays at
    once (:meth:`GpuPipeline._flush`): GPU samples, and process samples pointing at
    their GPU's (for its memory in use and total)."""

    __slots__ = (
        "after", "attr_of", "attr_rows", "g_copy", "g_pos", "g_power", "g_procs", "g_rows",
        "g_temp",
        "g_total", "g_ts", "g_used", "g_util", "hosts", "out", "p_gpu", "p_mem", "p_pos",
        "p_rows", "p_rss", "p_ts", "seq",
    )  # fmt: skip

    def __init__(self) -> None:
        self.hosts: set[str] = set()
        self.seq = 0  # the next sample's position in the wave (the order of evaluation)
        # per GPU sample (row -1: a GPU whose series did not fit; its processes' memory
        # in use and total are still its)
        self.g_rows: list[int] = []
        self.g_ts: list[float] = []
        self.g_used: list[int] = []
        self.g_total: list[int] = []
        self.g_util: list[float | None] = []
        self.g_copy: list[float | None] = []
        self.g_temp: list[float | None] = []
        self.g_power: list[float | None] = []
        self.g_procs: list[int] = []  # the memory its listed processes hold
        self.g_pos: list[int] = []
        # per process sample: its row, memory, RSS, and its GPU sample (index in g_*)
        self.p_rows: list[int] = []
        self.p_ts: list[float] = []
        self.p_mem: list[int] = []
        self.p_rss: list[int | None] = []
        self.p_gpu: list[int] = []
        self.p_pos: list[int] = []
        # per process listed under a GPU sample: its row before the wave (-1: new or
        # dropped), and which GPU sample it explains
        self.attr_rows: list[int] = []
        self.attr_of: list[int] = []
        self.after: list[tuple[str, float]] = []  # (host, ts) of each envelope: its sweep
        self.out: list[Transition] = []

    def clear(self) -> None:
        for name in self.__slots__:
            if name != "seq":
                getattr(self, name).clear()
        self.seq = 0

    def gpu(self, row: int, ts: float, gpu: GpuSampleWire) -> int:
        """One GPU sample; its index among the wave's GPU samples."""
        self.g_rows.append(row)
        self.g_ts.append(ts)
        self.g_used.append(gpu.fb_used)
        self.g_total.append(gpu.fb_total)
        self.g_util.append(gpu.gpu_util)
        self.g_copy.append(gpu.mem_copy_util)
        self.g_temp.append(gpu.temp_c)
        self.g_power.append(gpu.power_w)
        self.g_procs.append(sum(p.gpu_mem for p in gpu.procs))
        self.g_pos.append(self.seq)
        self.seq += 1
        return len(self.g_rows) - 1

    def process(self, row: int, ts: float, proc: ProcessWire, gpu_at: int) -> None:
        self.p_rows.append(row)
        self.p_ts.append(ts)
        self.p_mem.append(proc.gpu_mem)
        self.p_rss.append(proc.rss)
        self.p_gpu.append(gpu_at)
        self.p_pos.append(self.seq)
        self.seq += 1

    def layout(self, lay: _Layout, ts: float, gpus: list[GpuSampleWire]) -> None:
        """A whole envelope of a known layout: its rows from the layout, its values by
        column."""
        base, gbase = self.seq, len(self.g_rows)
        n_g, n_p = len(lay.g_rows), len(lay.p_rows)
        self.g_rows += lay.g_rows
        self.g_ts += [ts] * n_g
        self.g_used += [g.fb_used for g in gpus]
        self.g_total += [g.fb_total for g in gpus]
        self.g_util += [g.gpu_util for g in gpus]
        self.g_copy += [g.mem_copy_util for g in gpus]
        self.g_temp += [g.temp_c for g in gpus]
        self.g_power += [g.power_w for g in gpus]
        self.g_procs += [sum(p.gpu_mem for p in g.procs) for g in gpus]
        self.g_pos += [base + o for o in lay.g_pos]
        self.p_rows += lay.p_rows
        self.p_ts += [ts] * n_p
        procs = [p for g in gpus for p in g.procs]
        self.p_mem += [p.gpu_mem for p in procs]
        self.p_rss += [p.rss for p in procs]
        gpu_at = [gbase + j for j in lay.p_gpu]
        self.p_gpu += gpu_at
        self.p_pos += [base + o for o in lay.p_pos]
        self.attr_rows += lay.p_rows
        self.attr_of += gpu_at
        self.seq += n_g + n_p


@dataclass(slots=True)
class _Layout:
    """What a host's envelopes look like while its GPUs, processes and pods stay put:
    its rows in envelope order, so an envelope of the same shape skips the key lookups.
    A series of the host added or dropped drops it (``GpuPipeline._add``, ``_drop``)."""

    shape: tuple[Any, ...]  # per GPU: index, MIG, pod labels and the pids listed
    ts: float  # of the last envelope applied (every GPU row was last seen then)
    g_rows: list[int]
    p_rows: list[int]
    p_gpu: list[int]  # each process's GPU, as an index among the envelope's GPUs
    g_pos: list[int]  # each sample's position in the envelope
    p_pos: list[int]


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


def _shape(gpus: list[GpuSampleWire]) -> tuple[Any, ...]:
    return tuple(
        (g.index, g.mig, g.namespace, g.pod, g.container, tuple([p.pid for p in g.procs]))
        for g in gpus
    )


class GpuPipeline:
    """Tracks every GPU and process series and evaluates the rules on them.

    Per sample, the Python work is a dict lookup and a few list appends; the detectors,
    the signals and the rule conditions are array operations per wave. A rule reaches
    the alert engine for a row only where its condition holds or its alert is active (an
    inactive rule whose condition does not hold cannot start): the transitions of
    evaluating every rule on every sample, which ``every_sample=True`` does (the
    reference the tests hold the masks to).
    """

    def __init__(
        self,
        rules: list[Rule],
        engine: AlertEngine | None = None,
        *,
        leak: Mapping[str, Any] | None = None,
        max_series: int = 100_000,
        max_series_per_host: int = 4096,
        budget: SeriesBudget | None = None,
        stale_s: float = 300.0,
        every_sample: bool = False,
    ) -> None:
        """``leak``: the leak detector's parameters (:class:`~ragwatch.detectors.leak.
        LeakDetector`'s; its defaults if None)."""
        self.rules = {s: [r for r in rules if r.series == s] for s in ("gpu", "process")}
        self.every_sample = every_sample
        self.engine = engine or AlertEngine()
        self.max_series = max_series
        self.max_series_per_host = max_series_per_host
        self.budget = budget or SeriesBudget(max_series)
        self.budget.watch(self.__len__)
        self.swept: set[str] = set()  # hosts whose last series went silent (see Pipelines.gone)
        self.stale_s = stale_s
        self.index: RowIndex[SeriesKey] = RowIndex()
        self.bank = LeakBank(**(leak or {}))
        self._capacity = 0
        self._labels: list[dict[str, str] | None] = []
        self._keys: list[dict[str, tuple[dict[str, str], str]] | None] = []
        self._where: list[str | None] = []  # chart series id prefixes, made when first charted
        self._grow(1024)
        self._oldest: dict[str, float] = {}  # per host, <= the oldest last_ts of its series
        self._layouts: dict[str, _Layout] = {}  # per host, the shape of its last envelope
        # Silent hosts are swept against min(watermark, sweep_mark): a worker sets it to the
        # slowest of its partitions, which a catch-up reads at different paces.
        self.sweep_mark = math.inf
        self._watermark = 0.0
        self._last_sweep = 0.0
        self._wave = _Wave()
        self._then: WaveDone | None = None
        self._done: list[Transition] = []  # the transitions of this batch's waves so far
        self.stats = PipelineStats()

    def __len__(self) -> int:
        """The series tracked."""
        return len(self.index)

    @property
    def watermark(self) -> float:
        """The newest event time seen (0 before any)."""
        return self._watermark

    # ------------------------------------------------------------------ columns

    def _grow(self, capacity: int) -> None:
        old = self._capacity
        for name in COLUMNS:
            a = np.full(capacity, np.nan)
            if old:
                a[:old] = getattr(self, name)
            setattr(self, name, a)
        for name in ("is_gpu", "watch"):
            b = np.zeros(capacity, dtype=np.bool_)
            if old:
                b[:old] = getattr(self, name)
            setattr(self, name, b)
        self._labels.extend([None] * (capacity - old))
        self._keys.extend([None] * (capacity - old))
        self._where.extend([None] * (capacity - old))
        self._capacity = capacity
        self.bank.reserve(capacity)

    value: F64
    fb_used: F64
    fb_total: F64
    gpu_util: F64
    mem_copy_util: F64
    temp_c: F64
    power_w: F64
    rss: F64
    attributed: F64  # a GPU's: its processes' recent GB/h (NaN: not known)
    residual: F64  # a GPU's: the memory no listed process holds (bytes)
    residual_lo: F64  # ... its low-water mark this hour
    residual_lo_before: F64  # ... and the hour before (NaN: not a sample then)
    residual_block: F64  # the hour (ts // 3600) of its last sample
    is_gpu: npt.NDArray[np.bool_]
    watch: npt.NDArray[np.bool_]  # an alert of the row may be active: evaluate its rules

    # ------------------------------------------------------------------ processing

    def process(self, env: GpuEnvelope) -> list[Transition]:
        """Update every series of one host envelope; return the alert transitions."""
        return self.process_batch([gpu_wire(env)])

    def process_wire(self, env: GpuMessage) -> list[Transition]:
        """:meth:`process` for a validated message (``codec.decode_gpu_wire``)."""
        return self.process_batch([env])

    def process_batch(
        self, envs: Iterable[GpuMessage], then: WaveDone | None = None
    ) -> list[Transition]:
        """Every envelope of a batch of validated messages, in order: the transitions of
        processing them one at a time, computed a wave of distinct hosts at once.

        ``then`` is called as each wave is done, with the (host, ts) of its envelopes and
        its transitions, and returns the transitions to keep: what reads a host's GPU
        state for a transition (the worker's hints) reads it as of the host's envelope.
        """
        wave, done = self._wave, self._done
        self._then = then
        try:
            for env in envs:
                host = env.host
                if host in wave.hosts:
                    self._flush()
                ts = float(env.ts)
                self._gather(host, ts, env.gpus)
                wave.after.append((host, ts))
                if ts > self._watermark:
                    self._watermark = ts
                if self._watermark - self._last_sweep >= self.stale_s:
                    self._flush()
                    self._last_sweep = self._watermark
                    now = min(self._watermark, self.sweep_mark)
                    swept: list[Transition] = []
                    for h in self.index.owners():
                        swept += self._evict(str(h), now, SILENT_HOST_FACTOR * self.stale_s)
                    self._emit([], swept)
            self._flush()
            return list(done)
        except Exception as exc:
            wave.clear()  # not the next batch's
            raise BatchFailed(list(done)) from exc
        finally:
            self._then = None
            done.clear()

    def _emit(self, envs: list[tuple[str, float]], transitions: list[Transition]) -> None:
        if self._then is not None:
            transitions = self._then(envs, transitions)
        self._done += transitions

    def _gather(self, host: str, ts: float, gpus: list[GpuSampleWire]) -> None:
        """One envelope's samples into the wave: by its host's layout when it has the
        same shape as the last one, else sample by sample."""
        stats, wave = self.stats, self._wave
        stats.envelopes += 1
        stats.samples += len(gpus)
        wave.hosts.add(host)
        shape = _shape(gpus)
        lay = self._layouts.get(host)
        if lay is not None and lay.shape == shape:
            if ts <= lay.ts:  # every GPU of it seen already, so its processes too
                stats.duplicates += len(lay.g_rows) + len(lay.p_rows)
                return
            self.index.last_seen[lay.g_rows] = ts
            lay.ts = ts
            wave.layout(lay, ts, gpus)
            return
        self._layouts.pop(host, None)
        if wave.after and self._tight(gpus):  # (an envelope of a known layout adds none)
            self._flush()
            wave.hosts.add(host)
        lay = self._gather_samples(host, ts, gpus, shape)
        if lay is not None and lay.g_rows:  # (a host of no GPUs has nothing to look up)
            self._layouts[host] = lay

    def _gather_samples(
        self, host: str, ts: float, gpus: list[GpuSampleWire], shape: tuple[Any, ...]
    ) -> _Layout | None:
        """:meth:`_gather` sample by sample: new series, duplicates, a pod change, a pid
        listed twice (the wave is flushed first where a sample would meet one of its own
        series already in it). Returns the envelope's layout if it met only series it
        had, once each."""
        stats, wave, get, last_seen = self.stats, self._wave, self.index.get, self.index.last_seen
        plain = True  # nothing but known series, once each: a layout
        lay = _Layout(shape, ts, [], [], [], [], [])
        base = wave.seq
        in_wave: set[int] = set()  # this envelope's process rows
        for gi, gpu in enumerate(gpus):
            mig = gpu.mig or ""
            index = gpu.index
            procs = gpu.procs
            key = (host, index, mig, -1)
            row = get(key)
            if row is not None and ts <= last_seen[row]:
                # Seen already: Kafka redelivers after a crash, producers retry (an old
                # envelope's pod is no change of pod). The GPU's processes were in the same
                # envelope, so they are duplicates too.
                stats.duplicates += 1 + len(procs)
                plain = False
                continue
            pod = (gpu.namespace or None, gpu.pod or None, gpu.container or None)  # as labelled
            if row is not None and gpu.pod and pod != _pod(self._labels[row] or {}):
                if row in wave.g_rows:
                    self._flush()
                    wave.hosts.add(host)
                    base = wave.seq
                wave.out += self._reassigned(row, key, ts)
                row = None
            if row is None:
                plain = False
                row = self._new(key, gpu, None, ts)
            else:
                last_seen[row] = ts
            rows = [get((host, index, mig, p.pid)) for p in procs]
            g = wave.gpu(-1 if row is None else row, ts, gpu)
            lay.g_rows.append(-1 if row is None else row)
            lay.g_pos.append(wave.seq - 1 - base)
            if row is not None:
                wave.attr_rows.extend(-1 if r is None else r for r in rows)
                wave.attr_of.extend([g] * len(rows))
            for proc, prow in zip(procs, rows, strict=True):
                if prow is None:
                    plain = False
                    pkey = (host, index, mig, proc.pid)
                    prow = get(pkey)  # listed twice in this envelope: new the first time
                    if prow is None:
                        prow = self._new(pkey, gpu, proc, ts)
                        if prow is None:
                            continue
                if prow in in_wave:  # listed twice: the second sample comes after the first
                    plain = False
                    self._flush()
                    wave.hosts.add(host)
                    in_wave.clear()
                    g = wave.gpu(-1, ts, gpu)  # its memory in use and total, for the rest
                in_wave.add(prow)
                wave.process(prow, ts, proc, g)
                lay.p_rows.append(prow)
                lay.p_gpu.append(gi)
                lay.p_pos.append(wave.seq - 1 - base)
        return lay if plain and -1 not in lay.g_rows else None

    def _flush(self) -> None:
        """Learn the wave's samples, evaluate its rows, then sweep its hosts."""
        wave = self._wave
        if wave.g_rows or wave.p_rows:
            g = np.array(wave.g_rows, dtype=np.intp)
            used = np.array(wave.g_used, dtype=np.float64)
            total = np.array(wave.g_total, dtype=np.float64)
            keep = g >= 0
            gk = g[keep]
            self.fb_used[gk], self.fb_total[gk] = used[keep], total[keep]
            self.gpu_util[gk] = np.array(wave.g_util, dtype=np.float64)[keep]
            self.mem_copy_util[gk] = np.array(wave.g_copy, dtype=np.float64)[keep]
            self.temp_c[gk] = np.array(wave.g_temp, dtype=np.float64)[keep]
            self.power_w[gk] = np.array(wave.g_power, dtype=np.float64)[keep]
            p = np.array(wave.p_rows, dtype=np.intp)
            pg = np.array(wave.p_gpu, dtype=np.intp)
            self.fb_used[p], self.fb_total[p] = used[pg], total[pg]
            self.rss[p] = np.array(wave.p_rss, dtype=np.float64)
            r = np.concatenate([gk, p])
            ts = np.concatenate(
                [np.array(wave.g_ts, dtype=np.float64)[keep], np.array(wave.p_ts, dtype=np.float64)]
            )
            values = np.concatenate([used[keep], np.array(wave.p_mem, dtype=np.float64)])
            self.value[r] = values
            util = np.array(wave.g_util, dtype=np.float64)  # a process's load is its GPU's
            load = np.concatenate([util[keep], util[pg]])
            self.bank.learn_distinct(r, ts, values, load)  # a wave holds a series once
            # what the processes explain as of this same sample (before they learn it, a
            # GPU's bucket close compared its new rate with their previous bucket's)
            self.attributed[gk] = self._attributed(len(g))[keep]
            procs = np.array(wave.g_procs, dtype=np.float64)
            self._residual(gk, np.array(wave.g_ts, dtype=np.float64)[keep], (used - procs)[keep])
            self.index.seen(r, ts)
            order = np.argsort(
                np.concatenate(
                    [np.array(wave.g_pos, dtype=np.intp)[keep], np.array(wave.p_pos, dtype=np.intp)]
                ),
                kind="stable",
            )
            self._evaluate(r[order], ts[order], wave.out)
        for host, ts_ in wave.after:
            oldest = self._oldest.get(host)
            if oldest is None or ts_ - oldest > self.stale_s:
                wave.out += self._evict(host, ts_, self.stale_s)
        if wave.after or wave.out:
            self._emit(list(wave.after), list(wave.out))
        wave.clear()

    def _attributed(self, n: int) -> F64:
        """What each of the wave's ``n`` GPU samples' processes explain of its growth: the
        sum of their own growth rates (recent or floor, the larger), as of their last
        estimates (0 when no process is seen). Unknown (NaN) while a listed process has no
        whole fast horizon of its own yet (new, or warming up: a process that restarted and
        leaks again must not read as growth nobody explains, nor a batch job that just took
        20 GB: its start is a step in the GPU's last 30 minutes that its own short, flat
        series does not show as growth)."""
        wave, bank = self._wave, self.bank
        total = np.zeros(n)
        if wave.attr_rows:
            pr = np.array(wave.attr_rows, dtype=np.intp)
            known = pr >= 0
            at = np.where(known, pr, 0)
            # the most a process's growth could explain: its recent or its floor's rate (the
            # GPU's leak rate is one of its own two, read on the same memory plus others')
            grows = np.fmax(np.fmax(bank.recent_slope[at], bank.fslope[at]), 0.0)
            whole = known & bank.has[at] & bank.whole_recent(at)
            rate = np.where(whole, grows * 3600 / GB, np.nan)
            np.add.at(total, np.array(wave.attr_of, dtype=np.intp), rate)  # in order
        return total

    def _residual(self, r: Rows, ts: F64, residual: F64) -> None:
        """The GPUs' memory that no listed process holds (driver, contexts, processes the
        agent cannot see), and its low-water marks of the hour of ``ts`` and of the hour
        before: the memory nobody explains grew when it is above both (a GPU's robust slope
        is not the sum of its processes' where an allocator grows by steps: the morning of
        a caching allocator read as 0.46 GB/h that no process explained, bench/space_real.py
        seed 7, while the memory nobody held stayed within 6 MB)."""
        block = np.floor(ts / RESIDUAL_BLOCK_S)
        now = self.residual_block[r]
        turned = block != now  # (NaN: the first sample)
        lo = self.residual_lo[r]
        before = np.where(block == now + 1, lo, np.nan)  # the hour before, if it was one
        self.residual_lo_before[r] = np.where(turned, before, self.residual_lo_before[r])
        self.residual_lo[r] = np.where(turned, residual, np.fmin(lo, residual))
        self.residual_block[r] = block
        self.residual[r] = residual

    def residual_growth_gb(self, r: Rows) -> F64:
        """``unattributed_growth_gb`` of GPU rows ``r``: the memory no listed process holds,
        now less its low-water mark of this hour and the hour before (:meth:`_residual`)."""
        low = np.fmin(self.residual_lo[r], self.residual_lo_before[r])
        return (self.residual[r] - low) / GB

    def _evaluate(self, r: Rows, ts: F64, out: list[Transition]) -> None:
        """The rules on the wave's rows ``r`` (sampled at ``ts``), in sample order."""
        picked: list[tuple[int, int, list[Rule], list[npt.NDArray[np.bool_]] | None]] = []
        for kind, gpu in (("gpu", True), ("process", False)):
            rules = self.rules[kind]
            at = np.flatnonzero(self.is_gpu[r] == gpu)
            if not rules or not len(at):
                continue
            if self.every_sample:
                picked += [(int(i), int(r[i]), rules, None) for i in at]
                continue
            rows = r[at]
            signals = self.signal_arrays(rows, gpu)
            holds = [masks.holds(rule, signals, len(rows)) for rule in rules]
            hit = np.logical_or.reduce([*holds, self.watch[rows]])
            for j in np.flatnonzero(hit).tolist():
                picked.append((int(at[j]), int(rows[j]), rules, [h[j] for h in holds]))
        if not picked:
            return
        picked.sort(key=lambda p: p[0])
        dicts = self.signal_dicts(np.array([p[1] for p in picked], dtype=np.intp))
        engine = self.engine
        for (i, row, rules, hold), sig in zip(picked, dicts, strict=True):
            keys = self._row_keys(row, rules)
            t = float(ts[i])
            active = False
            for n, rule in enumerate(rules):
                labels, fp = keys[rule.name]
                if hold is None or hold[n] or engine.is_active(fp):
                    tr = engine.evaluate_key(rule, labels, fp, sig, t)
                    if tr is not None:
                        out.append(tr)
                active = active or engine.is_active(fp)
            self.watch[row] = active

    def _row_keys(self, row: int, rules: list[Rule]) -> dict[str, tuple[dict[str, str], str]]:
        """The alert labels and fingerprint of each of ``rules`` on ``row`` (cached)."""
        keys = self._keys[row]
        if keys is None:
            keys = self._keys[row] = {}
        labels = self._labels[row]
        assert labels is not None
        for rule in rules:
            if rule.name not in keys:
                keys[rule.name] = self.engine.alert_key(rule, labels)
        return keys

    # ------------------------------------------------------------------ signals

    def signal_arrays(self, rows: Rows, gpu: bool) -> Mapping[str, F64]:
        """The signals of ``rows`` (all GPUs, or all processes), one array each, computed
        when first read; NaN where a signal has no value (too little data)."""
        return _Signals(self, rows, gpu)

    def signal_dicts(self, rows: Rows) -> list[dict[str, float | None]]:
        """The signals of each of ``rows`` as the rules read them (None: no value)."""
        signals = _RowSignals(self, rows)
        return [dict(signals.row(i)) for i in range(len(rows))]

    def row_signals(self, row: int) -> dict[str, float | None]:
        """:meth:`signal_dicts` of one row in plain floats (a few rows cost less so than
        as arrays); the same IEEE operations as :class:`_Signals`, so the same values
        (``tests/unit/test_gpu_columnar.py`` holds the two together)."""
        b, nan = self.bank, math.nan
        used, total = float(self.fb_used[row]), float(self.fb_total[row])
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
        if self.is_gpu[row]:
            attributed = float(self.attributed[row])
            values += [
                attributed,
                leak_gb - attributed,
                float(self.residual_growth_gb(np.array([row]))[0]),
                used / total if total != 0 else nan,
                float(self.gpu_util[row]),
                float(self.mem_copy_util[row]),
                float(self.temp_c[row]),
                float(self.power_w[row]),
            ]
            names: tuple[str, ...] = GPU_SIGNALS
        else:
            values += [float(self.value[row]), float(self.rss[row])]
            names = PROCESS_SIGNALS
        return {k: None if v != v else v for k, v in zip(names, values, strict=True)}

    def estimate(self, key: SeriesKey) -> LeakEstimate | None:
        """The leak detector's estimate of a series (None: not tracked, or warming up)."""
        row = self.index.get(key)
        return None if row is None else self.bank.estimate(row)

    # ------------------------------------------------------------------ series

    def _tight(self, gpus: list[GpuSampleWire]) -> bool:
        """Whether an envelope's new series might not all fit: then the wave before it is
        flushed first, so the series its hosts' sweeps free are free for it, as one
        envelope at a time."""
        return self._room() < len(gpus) + sum(len(g.procs) for g in gpus)

    def _room(self) -> int:
        """How many more series fit: under ``max_series`` and the worker's budget."""
        return min(self.max_series - len(self.index), self.budget.room())

    def _new(
        self, key: SeriesKey, gpu: GpuSampleWire, proc: ProcessWire | None, ts: float
    ) -> int | None:
        if self._room() <= 0:
            self.stats.dropped_samples += 1
            if _worth_logging(self.stats.dropped_samples):
                log.warning(
                    "series cap %d reached: dropped new series host=%s gpu=%d (dropped so far: %d)",
                    self.max_series,
                    key[0],
                    key[1],
                    self.stats.dropped_samples,
                )
            return None
        if self.index.count(key[0]) >= self.max_series_per_host:
            self.stats.dropped_host_cap += 1
            if _worth_logging(self.stats.dropped_host_cap):
                log.warning(
                    "host %s has %d series (max_series_per_host): dropped new series gpu=%d "
                    "(dropped so far: %d)",
                    key[0],
                    self.max_series_per_host,
                    key[1],
                    self.stats.dropped_host_cap,
                )
            return None
        labels = {"host": key[0], "gpu": str(key[1]), "uuid": gpu.uuid, "mig": key[2]}
        if proc is None:
            labels["gpu_name"] = gpu.name
            labels.update(_pod_labels(gpu, POD_LABELS))
        else:
            labels.update(
                pid=str(proc.pid),
                process=proc.name,
                container=proc.container or "none",
            )
            labels.update(_pod_labels(proc, PROCESS_POD_LABELS))
        return self._add(key, labels, ts, gpu=proc is None)

    def _add(self, key: SeriesKey, labels: dict[str, str], ts: float, *, gpu: bool) -> int:
        """A row for a new series (its detector and raw values afresh)."""
        row = self.index.add(key, at=ts)
        self._layouts.pop(key[0], None)
        if row >= self._capacity:
            self._grow(max(2 * self._capacity, row + 1))
        self.bank.reset([row])
        for name in COLUMNS:
            getattr(self, name)[row] = np.nan
        self.is_gpu[row] = gpu
        self.watch[row] = False
        self._labels[row] = labels
        self._keys[row] = self._where[row] = None
        return row

    def _drop(self, key: SeriesKey) -> tuple[dict[str, str], dict[str, Any]]:
        """Stop tracking one series; its labels and alert keys."""
        row = self.index.remove(key)
        self._layouts.pop(key[0], None)
        labels, keys = self._labels[row], self._keys[row]
        self._labels[row] = self._keys[row] = self._where[row] = None
        self.stats.evicted_series += 1
        return labels or {}, keys or {}

    def _reassigned(self, row: int, key: SeriesKey, ts: float) -> list[Transition]:
        """A GPU now allocated to another pod: a new workload, so a new series (a fresh
        baseline), and the old one's alerts resolved as gone."""
        fps = [fp for _, fp in self._row_keys(row, self.rules["gpu"]).values()]
        labels, _ = self._drop(key)
        note = f"the device was allocated to pod {labels.get('pod', '?')}, now to another"
        return self.engine.clear_fingerprints(fps, ts, note)

    def _evict(self, host: str, now: float, stale_s: float) -> list[Transition]:
        out: list[Transition] = []
        owned = np.fromiter(self.index.owned(host), dtype=np.intp)
        stale = owned[now - self.index.last_seen[owned] > stale_s]
        for row in stale.tolist():
            labels, _ = self._drop(self.index.key(row))
            match: dict[str, str] = {
                k: labels[k] for k in ("host", "gpu", "mig", "pid") if k in labels
            }
            out += self.engine.clear(match, now)
        if len(stale) < len(owned):
            left = np.setdiff1d(owned, stale, assume_unique=True)
            self._oldest[host] = float(self.index.last_seen[left].min())
        else:
            self._oldest.pop(host, None)
            self.swept.add(host)
        return out

    def _host_rows(self, host: str) -> list[tuple[SeriesKey, int]]:
        return sorted((self.index.key(r), r) for r in self.index.owned(host))

    def tracks(self, host: str) -> bool:
        return self.index.count(host) > 0

    def host_series(self, host: str) -> dict[SeriesKey, SeriesView]:
        """Every series of ``host``, by key (their signals computed together when read)."""
        return self.views([host])[host]

    def views(self, hosts: Iterable[str]) -> dict[str, dict[SeriesKey, SeriesView]]:
        """:meth:`host_series` of many hosts, their signals computed together (one array
        per signal for all their rows: the status and charts of every changed host)."""
        keyed, rows, signals = self._read(hosts)
        last, labels = self.index.last_seen[rows].tolist(), self._labels
        out: dict[str, dict[SeriesKey, SeriesView]] = {}
        i = 0
        for h, pairs in keyed.items():
            views = out[h] = {}
            for k, r in pairs:
                views[k] = SeriesView(labels[r] or {}, last[i], signals, i)
                i += 1
        return out

    def _read(
        self, hosts: Iterable[str]
    ) -> tuple[dict[str, list[tuple[SeriesKey, int]]], Rows, _RowSignals]:
        """The rows of ``hosts`` in key order, host by host, and their signals (each
        computed for all of them when first read)."""
        keyed = {h: self._host_rows(h) for h in hosts}
        rows = np.array([r for pairs in keyed.values() for _, r in pairs], dtype=np.intp)
        return keyed, rows, _RowSignals(self, rows)

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "gpu"
    domain: ClassVar[Domain] = "host"

    def dump(self, key: str) -> dict[str, Any]:
        """A host's rows for a snapshot: keys, labels and typed arrays (raw little-endian
        bytes by column), nothing that unpickles into code."""
        keyed = self._host_rows(key)
        r = np.array([row for _, row in keyed], dtype=np.intp)
        columns = {name: getattr(self, name)[r].astype("<f8").tobytes() for name in COLUMNS}
        return {
            "format": SNAPSHOT_FORMAT,
            "keys": [k for k, _ in keyed],
            "labels": [self._labels[row] for _, row in keyed],
            "last_ts": self.index.last_seen[r].astype("<f8").tobytes(),
            "gpu": self.is_gpu[r].tobytes(),
            "columns": columns,
            "leak": self.bank.dump(r),
        }

    def adopt(self, host: str, state: Any) -> int:
        """Take over a host's series from a snapshot (:meth:`dump`), unless this pipeline
        already tracks the host (its own state is newer). Returns how many series it
        adopted."""
        if self.tracks(host):
            return 0
        if isinstance(state, dict) and state.get("format") == SNAPSHOT_FORMAT:
            return self._adopt_rows(host, state)
        raise ValueError(f"GPU state of host {host} in an unknown format")

    def _adopt_rows(self, host: str, state: dict[str, Any]) -> int:
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
        probe = LeakBank(1, **self.bank.params.as_dict())
        probe.load(np.arange(n), state["leak"])  # checks it fits before anything changes
        order = sorted(range(n), key=lambda i: keys[i])[: self._room()]
        rows = []
        for i in order:
            k = keys[i]
            key = (str(k[0]), int(k[1]), str(k[2]), int(k[3]))
            row = self._add(
                key, _checked_labels(key, state["labels"][i]), float(last[i]), gpu=bool(gpu[i])
            )
            for c in COLUMNS:
                getattr(self, c)[row] = columns[c][i]
            rows.append(row)
        if rows:
            picked = np.array(order, dtype=np.intp)
            self.bank.load(np.array(rows, dtype=np.intp), probe.dump(picked))
            self.watch[rows] = True  # the engine may restore its alerts next
        return len(rows)

    def forget(self, host: str) -> int:
        """Drop a host's series without resolving anything (another worker owns it now);
        returns how many were dropped."""
        keyed = self._host_rows(host)
        for k, _ in keyed:
            self.index.remove(k)
        for _, row in keyed:
            self._labels[row] = self._keys[row] = self._where[row] = None
        self._oldest.pop(host, None)
        self._layouts.pop(host, None)
        return len(keyed)

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        keyed, rows, signals = self._read(keys)
        columns = _StatusColumns(
            [signals.column(n) for n in STATUS_SIGNALS],
            signals.column("gpu_util"),
            signals.column("gpu_mem_bytes"),
            self.index.last_seen[rows].tolist(),
        )
        out, at = {}, 0
        for h, pairs in keyed.items():
            out[h] = self._host_status(h, pairs, at, columns)
            at += len(pairs)
        return out

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        _, at, signals = self._read(keys)
        last, gpu, where = self.index.last_seen[at].tolist(), self.is_gpu[at].tolist(), self._where
        for i, r in enumerate(at.tolist()):
            labels, kind = self._labels[r] or {}, "gpu" if gpu[i] else "process"
            prefix = where[r]
            if prefix is None:
                prefix = where[r] = series_prefix(kind, labels)
            view = SeriesView(labels, last[i], signals, i)
            yield ChartSeries(kind, labels, last[i], view, prefix)

    def host_snapshot(self, host: str) -> dict[str, Any]:
        """What ``ragwatch status`` shows about one host: GPUs, their processes, slopes."""
        return self.status([host])[host]

    def _host_status(
        self, host: str, pairs: list[tuple[SeriesKey, int]], at: int, columns: _StatusColumns
    ) -> dict[str, Any]:
        """One host's status from the columns of its rows (``pairs`` in key order, the
        first at ``at``): a GPU's row comes before its processes'."""
        gpus: dict[tuple[int, str], dict[str, Any]] = {}
        view, growth = columns.view, columns.view[STATUS_SIGNALS.index("gb_per_hour")]
        for i, (key, row) in enumerate(pairs, at):
            labels = self._labels[row] or {}
            g = gpus.get(key[1:3])
            if g is None:
                g = gpus[key[1:3]] = {"index": key[1], "mig": key[2] or None, "procs": []}
            if key[3] == -1:
                g.update(zip(STATUS_SIGNALS, [c[i] for c in view], strict=True))
                g["name"], g["uuid"] = labels.get("gpu_name"), labels.get("uuid")
                g["gpu_util"], g["ts"] = columns.gpu_util[i], columns.last_ts[i]
                g.update((k, labels[k]) for k in POD_LABELS if k in labels)
                continue
            proc: dict[str, Any] = {
                "pid": key[3],
                "name": labels["process"],
                "container": labels["container"],
                "gpu_mem_bytes": columns.gpu_mem_bytes[i],
                "gb_per_hour": growth[i],
            }
            proc.update((k, labels[k]) for k in PROCESS_POD_LABELS if k in labels)
            g["procs"].append(proc)
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
