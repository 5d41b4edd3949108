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

This module holds the pipeline: its rows, a batch's waves, eviction. Beside it are what a
row's signals are and how they are read (:mod:`.gpu_signals`), a wave's samples as they
are gathered (:mod:`.gpu_wave`), a host's snapshot (:mod:`.gpu_snapshot`) and its status
and charts (:mod:`.gpu_status`); the rules are gated by
:mod:`ragwatch.streams.alerting.gating`, as the request pipeline's are.

A series not seen for ``stale_s`` of event time (the process exited, the GPU vanished)
is forgotten and its active alerts resolve. A host that goes silent altogether is swept
the same way once the pipeline's event-time high-water mark is ``12 * stale_s`` past its
last sample and past the mark when its last envelope arrived (the margin tolerates
partitions that are consumed at different paces; a host that sends is not silent,
whatever its stamps). Each envelope's stamp is judged first (:mod:`.gpu_clock`): one far
behind its host's own newest (a clock jump back), before 2000 or a day behind the
pipeline is refused whole and counted (``clock_jumps_back``, ``too_old``).
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
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ragwatch.catalog import SCORED
from ragwatch.codec import gpu_wire
from ragwatch.detectors.leak import GB, LeakBank, LeakEstimate
from ragwatch.gpu_wire import GpuMessage, GpuSampleWire, ProcessWire
from ragwatch.schema import GpuEnvelope, HostFacts, Transition
from ragwatch.streams.alerting import gating
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines import gpu_snapshot, gpu_status
from ragwatch.streams.pipelines.base import (
    BatchFailed,
    ChartSeries,
    Domain,
    Step,
    Steps,
    Tap,
    drive,
    transitions_of,
)
from ragwatch.streams.pipelines.budget import SeriesBudget
from ragwatch.streams.pipelines.facts import host_facts, leaking
from ragwatch.streams.pipelines.gpu_clock import HostClocks, Verdict
from ragwatch.streams.pipelines.gpu_peers import LikeGpus, reads_peers
from ragwatch.streams.pipelines.gpu_signals import (
    COLUMNS,
    F64,
    Rows,
    RowSignals,
    SeriesKey,
    SeriesView,
    SignalArrays,
    anomalous_of,
    row_signals,
    score_wave,
)
from ragwatch.streams.pipelines.gpu_wave import Layout, Wave, series_labels, shape_of
from ragwatch.streams.pipelines.rows import RowIndex
from ragwatch.streams.pipelines.scoring import ScoreBlock

log = logging.getLogger(__name__)

# A host is swept by the pipeline's watermark only after 12 x stale_s (an hour by default):
# hosts live on different partitions, consumed at different paces, and a fast replay turns
# a second of lag into many minutes of event time.
SILENT_HOST_FACTOR = 12
SWEPT = "host %s: silent for %.0f s of event time at ts=%.0f: swept, %d alert transition(s)"
RESIDUAL_BLOCK_S = 3600.0


def _worth_logging(dropped: int) -> bool:
    """Log a repeated drop the 1st, 10th and 100th time, then every 10,000th."""
    return dropped in (1, 10, 100) or dropped % 10_000 == 0


def _flat(keyed: Mapping[str, list[tuple[SeriesKey, int]]]) -> Rows:
    """The rows of hosts' keyed rows (:meth:`GpuPipeline.host_rows`), host by host."""
    return np.array([r for pairs in keyed.values() for _, r in pairs], dtype=np.intp)


def _pod(labels: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """The Kubernetes container a GPU series (its labels) is allocated to."""
    return labels.get("namespace"), labels.get("pod"), labels.get("container")


@dataclass
class PipelineStats:
    envelopes: int = 0
    samples: int = 0
    dropped_samples: int = 0  # samples of series that did not fit under max_series
    dropped_host_cap: int = 0  # ... or under max_series_per_host (one host's pid churn)
    evicted_series: int = 0
    duplicates: int = 0  # samples not newer than their series' last one (a replay, a retry)
    clock_jumps_back: int = 0  # samples refused: stamped far behind their host's newest
    too_old: int = 0  # samples refused: stamped before 2000, or a day behind the pipeline


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
        scoring: bool = True,
    ) -> None:
        """``leak``: the leak detector's parameters (:class:`~ragwatch.detectors.leak.
        LeakDetector`'s; its defaults if None); ``scoring``: every signal scored (.scoring)."""
        # the rules on a GPU against its like GPUs go with their comparison (.gpu_peers)
        self.peer_rules = [r for r in rules if r.series == "gpu" and reads_peers(r)]
        self.rules = {
            s: [r for r in rules if r.series == s and r not in self.peer_rules]
            for s in ("gpu", "process")
        }
        self.every_sample = every_sample
        self.engine = engine or AlertEngine()
        self.max_series = max_series
        self.max_series_per_host = max_series_per_host
        self.budget = budget or SeriesBudget(max_series)
        self.budget.watch(self.__len__)
        # hosts whose last series went silent, or refused as too old (see Pipelines.gone)
        self.swept: set[str] = set()
        self.stale_s = stale_s
        self.clocks = HostClocks(stale_s, newest=self._host_newest)  # judged: .gpu_clock
        self.index: RowIndex[SeriesKey] = RowIndex()
        self.bank = LeakBank(**(leak or {}))
        self._capacity = 0
        self.labels: list[dict[str, str] | None] = []  # per row, its series' (None: free)
        self._keys: list[dict[str, tuple[dict[str, str], str]] | None] = []
        self.where: list[str | None] = []  # chart series id prefixes, made when first charted
        # each row's signals scored by the generic detector, GPUs' and processes' (.scoring)
        self.scores = {
            g: ScoreBlock(SCORED[k], on=scoring) for g, k in ((True, "gpu"), (False, "process"))
        }
        self._grow(1024)
        self._oldest: dict[str, float] = {}  # per host, <= the oldest last_ts of its series
        self._layouts: dict[str, Layout] = {}  # per host, the shape of its last envelope
        # Silent hosts are swept against min(watermark, sweep_mark): a worker sets it to the
        # slowest of its partitions, which a catch-up reads at different paces.
        self.sweep_mark = math.inf
        self._watermark = 0.0
        self._last_sweep = 0.0
        self._wave = Wave()
        self.tap: Tap | None = None
        self._steps: list[Step] = []  # the waves of this batch done so far
        self.stats = PipelineStats()
        self.peers = LikeGpus(self)  # its GPUs against their like GPUs (.gpu_peers)

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
        for name in ("is_gpu", "watch", "peer_watch"):
            b = np.zeros(capacity, dtype=np.bool_)
            if old:
                b[:old] = getattr(self, name)
            setattr(self, name, b)
        self.labels.extend([None] * (capacity - old))
        self._keys.extend([None] * (capacity - old))
        self.where.extend([None] * (capacity - old))
        self._capacity = capacity
        self.bank.reserve(capacity)
        for block in self.scores.values():
            block.grow(capacity)

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
    peer_watch: npt.NDArray[np.bool_]  # ... of its rules against its like GPUs

    # ------------------------------------------------------------------ processing

    def process(self, env: GpuEnvelope) -> list[Transition]:
        """Update every series of one host envelope; return the alert transitions."""
        return self.process_batch([gpu_wire(env)])

    def process_wire(self, env: GpuMessage) -> list[Transition]:
        """:meth:`process` for a validated message (``codec.decode_gpu_wire``)."""
        return self.process_batch([env])

    def process_batch(self, envs: Iterable[GpuMessage]) -> list[Transition]:
        """Every envelope of a batch of validated messages, in order: the transitions of
        processing them one at a time, computed a wave of distinct hosts at once."""
        return transitions_of(drive(self.process_steps(envs)))

    def process_steps(self, envs: Iterable[GpuMessage]) -> Steps:
        """:meth:`process_batch`, wave by wave, each wave's step handed on as it is done
        (whoever drives it acts on it before the next wave: :func:`.base.drive`): the
        wave's hosts with the event time of their envelopes, its transitions, and the
        facts of the hosts whose alerts start firing in it (:meth:`facts`), for their
        hints. At most one step is pending at each hand-over."""
        wave, judge, take = self._wave, self.clocks.judge, Verdict.TAKE
        try:
            for env in envs:
                host = env.host
                ts = float(env.ts)
                verdict = judge(host, ts, self._watermark, self.sweep_mark)
                if verdict is not take:  # its stamp is refused (.gpu_clock)
                    self._refused(host, verdict, env.gpus)
                    continue
                if self.peers.due(ts):
                    self._flush()  # the minute is compared after the samples before it
                    yield from self._handed()
                    if compared := self.peers.take(ts):
                        self._emit([], compared)
                        yield from self._handed()
                if host in wave.hosts:
                    self._flush()
                self._gather(host, ts, env.gpus)
                wave.after.append((host, ts))
                yield from self._handed()
                if ts > self._watermark:
                    self._watermark = ts
                if self._watermark - self._last_sweep >= self.stale_s:
                    self._flush()
                    yield from self._handed()
                    self._last_sweep = self._watermark
                    self._emit([], self._sweep_silent())
                    yield from self._handed()
            self._flush()
            yield from self._handed()
            if compared := self.peers.compare_ready():  # the others' facts of minutes came
                self._emit([], compared)
                yield from self._handed()
        except GeneratorExit:  # whoever drove it failed: the rest of the batch is not done
            wave.clear()
            self._steps.clear()
            raise
        except Exception as exc:
            wave.clear()  # not the next batch's
            pending, self._steps = self._steps, []
            raise BatchFailed(pending) from exc

    def _refused(self, host: str, verdict: Verdict, gpus: list[GpuSampleWire]) -> None:
        """An envelope whose stamp is refused (:meth:`.gpu_clock.HostClocks.judge`): counted,
        sample by sample; it moves nothing on. A host refused as too old with no series
        is as good as swept (:meth:`.fleet.Pipelines.gone`: no status, no snapshot)."""
        stats = self.stats
        stats.envelopes += 1
        stats.samples += len(gpus)
        refused = len(gpus) + sum(len(g.procs) for g in gpus)
        if verdict is Verdict.JUMP_BACK:
            stats.clock_jumps_back += refused
        else:
            stats.too_old += refused
            if not self.tracks(host):
                self.swept.add(host)

    def _host_newest(self, host: str) -> float | None:
        """The event time of a host's newest series (None: it has none)."""
        owned = self.index.owned(host)
        if not owned:
            return None
        return float(self.index.last_seen[np.fromiter(owned, dtype=np.intp)].max())

    def _sweep_silent(self) -> list[Transition]:
        """Sweep the hosts silent for ``12 * stale_s`` (against the slowest partition's
        mark): no series of theirs seen, and no envelope of theirs arrived, since."""
        now = min(self._watermark, self.sweep_mark)
        silent_s = SILENT_HOST_FACTOR * self.stale_s
        swept: list[Transition] = []
        for h in self.index.owners():
            if not self.clocks.alive(host := str(h), now, silent_s):
                swept += (cleared := self._evict(host, now, silent_s))
                log.info(SWEPT, host, silent_s, now, len(cleared))
        self.clocks.swept(now, silent_s, self.tracks)
        return swept

    def _handed(self) -> Iterator[Step]:
        pending, self._steps = self._steps, []
        yield from pending

    def _emit(self, envs: list[tuple[str, float]], transitions: list[Transition]) -> None:
        """A wave is done: its step, with the facts its firing alerts' hints will read,
        and its points for the charts."""
        hosts = {t.alert.labels.get("host", "") for t in transitions if t.fires}
        facts = {h: self.facts(h) for h in sorted(hosts) if h}
        self._steps.append(Step(envs, transitions, facts))
        if self.tap is not None and envs:
            self.tap(self, envs)

    def _gather(self, host: str, ts: float, gpus: list[GpuSampleWire]) -> None:
        """One envelope's samples into the wave: by its host's layout when it has the
        same shape as the last one, else sample by sample."""
        stats, wave = self.stats, self._wave
        stats.envelopes += 1
        stats.samples += len(gpus)
        wave.hosts.add(host)
        shape = shape_of(gpus)
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
    ) -> Layout | None:
        """:meth:`_gather` sample by sample: new series, duplicates, a pod change, a pid
        listed twice (the wave is flushed first where a sample would meet one of its own
        series already in it). Returns the envelope's layout if it met only series it
        had, once each."""
        stats, wave, get, last_seen = self.stats, self._wave, self.index.get, self.index.last_seen
        plain = True  # nothing but known series, once each: a layout
        lay = Layout(shape, ts, [], [], [], [], [])
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
            if row is not None and gpu.pod and pod != _pod(self.labels[row] or {}):
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
            score_wave(self, r, ts)  # the generic detector on every scored signal (.scoring)
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
        """The rules on the wave's rows ``r`` (sampled at ``ts``), in sample order: only
        where one holds or an alert is active (:mod:`~ragwatch.streams.alerting.gating`;
        every rule of every row with ``every_sample``), the signals of all the rows picked
        computed together."""
        picked: list[gating.Pick] = []
        for kind, gpu in (("gpu", True), ("process", False)):
            at = np.flatnonzero(self.is_gpu[r] == gpu)
            rows = r[at]
            signals = self.signal_arrays(rows, gpu)
            rules = self.rules[kind]
            picked += gating.pick(rules, rows, signals, self.watch, at, every=self.every_sample)
        if not picked:
            return
        picked.sort(key=lambda p: p.at)
        dicts = self.signal_dicts(np.array([p.row for p in picked], dtype=np.intp))
        fired = gating.evaluate(self.engine, picked, dicts, self.row_keys, ts, self.watch)
        out += [tr for _, tr in fired]

    def row_keys(self, row: int, rules: Sequence[Rule]) -> dict[str, tuple[dict[str, str], str]]:
        """The alert labels and fingerprint of each of ``rules`` on ``row`` (cached)."""
        keys = self._keys[row]
        if keys is None:
            keys = self._keys[row] = {}
        labels = self.labels[row]
        assert labels is not None
        for rule in rules:
            if rule.name not in keys:
                keys[rule.name] = self.engine.alert_key(rule, labels)
        return keys

    # ------------------------------------------------------------------ signals

    def signal_arrays(self, rows: Rows, gpu: bool) -> Mapping[str, F64]:
        """The signals of ``rows`` (all GPUs, or all processes), one array each, computed
        when first read; NaN where a signal has no value (too little data)."""
        return SignalArrays(self, rows, gpu)

    def signal_dicts(self, rows: Rows) -> list[dict[str, float | None]]:
        """The signals of each of ``rows`` as the rules read them (None: no value)."""
        signals = RowSignals(self, rows)
        return [dict(signals.row(i)) for i in range(len(rows))]

    def row_signals(self, row: int) -> dict[str, float | None]:
        """:meth:`signal_dicts` of one row in plain floats (a few rows cost less so than
        as arrays; :func:`~.gpu_signals.row_signals`)."""
        return row_signals(self, row)

    def estimate(self, key: SeriesKey) -> LeakEstimate | None:
        """The leak detector's estimate of a series (None: not tracked, or warming up)."""
        row = self.index.get(key)
        return None if row is None else self.bank.estimate(row)

    # ------------------------------------------------------------------ series

    def _tight(self, gpus: list[GpuSampleWire]) -> bool:
        """Whether an envelope's new series might not all fit: then the wave before it is
        flushed first, so the series its hosts' sweeps free are free for it, as one
        envelope at a time."""
        return self.room() < len(gpus) + sum(len(g.procs) for g in gpus)

    def room(self) -> int:
        """How many more series fit: under ``max_series`` and the worker's budget."""
        return min(self.max_series - len(self.index), self.budget.room())

    def _new(
        self, key: SeriesKey, gpu: GpuSampleWire, proc: ProcessWire | None, ts: float
    ) -> int | None:
        if self.room() <= 0:
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
        return self.add_row(key, series_labels(key, gpu, proc), ts, gpu=proc is None)

    def add_row(self, key: SeriesKey, labels: dict[str, str], ts: float, *, gpu: bool) -> int:
        """A row for a new series (its detector and raw values afresh)."""
        row = self.index.add(key, at=ts)
        self._layouts.pop(key[0], None)
        if row >= self._capacity:
            self._grow(max(2 * self._capacity, row + 1))
        self.bank.reset([row])
        for block in self.scores.values():
            block.release([row])
        for name in COLUMNS:
            getattr(self, name)[row] = np.nan
        self.is_gpu[row] = gpu
        self.watch[row] = self.peer_watch[row] = False
        self.labels[row] = labels
        if gpu:
            self.peers.add(row, labels)
        self._keys[row] = self.where[row] = None
        return row

    def _drop(self, key: SeriesKey) -> tuple[dict[str, str], dict[str, Any]]:
        """Stop tracking one series; its labels and alert keys."""
        row = self.index.remove(key)
        self.peers.grouped.pop(row, None)
        self._layouts.pop(key[0], None)
        labels, keys = self.labels[row], self._keys[row]
        self.labels[row] = self._keys[row] = self.where[row] = None
        self.stats.evicted_series += 1
        return labels or {}, keys or {}

    def _reassigned(self, row: int, key: SeriesKey, ts: float) -> list[Transition]:
        """A GPU now allocated to another pod: a new workload, so a new series (a fresh
        baseline), and the old one's alerts resolved as gone."""
        rules = self.rules["gpu"] + self.peer_rules
        fps = [fp for _, fp in self.row_keys(row, rules).values()]
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

    def host_rows(self, host: str) -> list[tuple[SeriesKey, int]]:
        """The keys and rows of ``host``'s series, in key order (a GPU's before its
        processes')."""
        return sorted((self.index.key(r), r) for r in self.index.owned(host))

    def tracks(self, host: str) -> bool:
        return self.index.count(host) > 0

    def facts(self, host: str) -> HostFacts:
        """What ``host``'s GPUs say now, for hints (:meth:`facts_of`)."""
        return self.facts_of([host])[0]

    def facts_of(self, hosts: Iterable[str]) -> list[HostFacts]:
        """The facts of many hosts (:func:`.facts.host_facts`), their signals computed
        together: a hint's, and what the worker publishes of the hosts a wave moved into a
        new minute. Of their processes only the leaking ones are read one by one
        (:func:`.facts.leaking`: the rest say nothing in the facts, and a host has tens)."""
        keyed = {h: self.host_rows(h) for h in hosts}
        rows = _flat(keyed)
        procs = rows[~self.is_gpu[rows]]
        keep = set(rows[self.is_gpu[rows]].tolist())
        keep.update(procs[leaking(self.signal_arrays(procs, False))].tolist())
        last = self.index.last_seen
        newest = {h: float(last[[r for _, r in p]].max()) for h, p in keyed.items() if p}
        kept = {h: [(k, r) for k, r in p if r in keep] for h, p in keyed.items()}
        facts = [host_facts(h, series, newest.get(h)) for h, series in self._views(kept).items()]
        return [replace(f, anomalous=anomalous_of(self, keyed[f.host])) for f in facts]

    def host_series(self, host: str) -> dict[SeriesKey, SeriesView]:
        """Every series of ``host``, by key (their signals computed together when read)."""
        return self.views([host])[host]

    def views(self, hosts: Iterable[str]) -> dict[str, dict[SeriesKey, SeriesView]]:
        """:meth:`host_series` of many hosts, their signals computed together (one array
        per signal for all their rows: the status and charts of every changed host)."""
        return self._views({h: self.host_rows(h) for h in hosts})

    def _views(
        self, keyed: dict[str, list[tuple[SeriesKey, int]]]
    ) -> dict[str, dict[SeriesKey, SeriesView]]:
        rows = _flat(keyed)
        signals = RowSignals(self, rows)
        last, labels = self.index.last_seen[rows].tolist(), self.labels
        out: dict[str, dict[SeriesKey, SeriesView]] = {}
        i = 0
        for h, pairs in keyed.items():
            views = out[h] = {}
            for k, r in pairs:
                views[k] = SeriesView(labels[r] or {}, last[i], signals, i)
                i += 1
        return out

    def rows_of(
        self, hosts: Iterable[str]
    ) -> tuple[dict[str, list[tuple[SeriesKey, int]]], Rows, RowSignals]:
        """The rows of ``hosts`` in key order, host by host, and their signals (each
        computed for all of them when first read)."""
        keyed = {h: self.host_rows(h) for h in hosts}
        rows = _flat(keyed)
        return keyed, rows, RowSignals(self, rows)

    # -- the SignalPipeline seam (streams/pipelines/base.py) -----------------------------

    name: ClassVar[str] = "gpu"
    domain: ClassVar[Domain] = "host"

    def dump(self, key: str) -> dict[str, Any]:
        """A host's rows for a snapshot: keys, labels and typed arrays (raw little-endian
        bytes by column), nothing that unpickles into code (:func:`.gpu_snapshot.dump`)."""
        return gpu_snapshot.dump(self, key)

    def adopt(self, host: str, state: Any) -> int:
        """Take over a host's series from a snapshot (:meth:`dump`), unless this pipeline
        already tracks the host (its own state is newer). Returns how many series it
        adopted (:func:`.gpu_snapshot.adopt`)."""
        return gpu_snapshot.adopt(self, host, state)

    def forget(self, host: str) -> int:
        """Drop a host's series without resolving anything (another worker owns it now);
        returns how many were dropped."""
        keyed = self.host_rows(host)
        for k, _ in keyed:
            self.index.remove(k)
        for _, row in keyed:
            self.labels[row] = self._keys[row] = self.where[row] = None
        self._oldest.pop(host, None)
        self._layouts.pop(host, None)
        self.clocks.forget(host)
        return len(keyed)

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        """Each host's status entry (:func:`.gpu_status.status`)."""
        return gpu_status.status(self, keys)

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        """The hosts' series that charts may draw (:func:`.gpu_status.charts`)."""
        return gpu_status.charts(self, keys)

    def host_snapshot(self, host: str) -> dict[str, Any]:
        """What ``ragwatch status`` shows about one host: GPUs, their processes, slopes."""
        return self.status([host])[host]
