"""A wave of GPU envelopes: what :class:`~ragwatch.streams.pipelines.gpu.GpuPipeline`
gathers of a run of envelopes of distinct hosts before it learns them at once.

Per sample, the Python work is a few list appends (:class:`Wave`); a host whose envelopes
keep one shape (its GPUs, processes and pods stay put: :func:`shape_of`) has its rows in
envelope order kept (:class:`Layout`), so its next envelope appends them by column
without a key lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragwatch.catalog import POD_LABELS, PROCESS_POD_LABELS
from ragwatch.gpu_wire import GpuSampleWire, ProcessWire
from ragwatch.schema import Transition


class Wave:
    """The samples of one wave, gathered as Python lists and applied to the arrays at
    once (``GpuPipeline._flush``): GPU samples, and process samples pointing at
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

    def layout(self, lay: Layout, ts: float, gpus: list[GpuSampleWire]) -> None:
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
class Layout:
    """What a host's envelopes look like while its GPUs, processes and pods stay put:
    its rows in envelope order, so an envelope of the same shape skips the key lookups.
    A series of the host added or dropped drops it (``GpuPipeline.add_row``, ``_drop``)."""

    shape: tuple[Any, ...]  # per GPU: index, MIG, pod labels and the pids listed
    ts: float  # of the last envelope applied (every GPU row was last seen then)
    g_rows: list[int]
    p_rows: list[int]
    p_gpu: list[int]  # each process's GPU, as an index among the envelope's GPUs
    g_pos: list[int]  # each sample's position in the envelope
    p_pos: list[int]


def shape_of(gpus: list[GpuSampleWire]) -> tuple[Any, ...]:
    """What an envelope looks like: per GPU, its index, MIG, pod labels and the pids
    listed (:attr:`Layout.shape`)."""
    return tuple(
        (g.index, g.mig, g.namespace, g.pod, g.container, tuple([p.pid for p in g.procs]))
        for g in gpus
    )


def series_labels(
    key: tuple[str, int, str, int], gpu: GpuSampleWire, proc: ProcessWire | None
) -> dict[str, str]:
    """The labels of a new series ``key`` (host, GPU index, MIG instance, pid): a GPU's
    model and Kubernetes pod, or a process's pid, name, container and pod."""
    labels = {"host": key[0], "gpu": str(key[1]), "uuid": gpu.uuid, "mig": key[2]}
    if proc is None:
        labels["gpu_name"] = gpu.name
        labels.update(_pod_labels(gpu, POD_LABELS))
    else:
        labels.update(pid=str(proc.pid), process=proc.name, container=proc.container or "none")
        labels.update(_pod_labels(proc, PROCESS_POD_LABELS))
    return labels


def _pod_labels(sample: GpuSampleWire | ProcessWire, names: tuple[str, ...]) -> dict[str, str]:
    """The Kubernetes labels ``names`` of a sample, where set."""
    return {k: v for k in names if (v := getattr(sample, k))}
