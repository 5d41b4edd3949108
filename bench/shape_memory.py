"""GPU memory as real serving hosts show it (issue 30, point 3): shapes of the framebuffer
memory of devices and their processes, written apart from ragwatch's simulators.

What they model, sampled as NVML does (every 10 s, exact bytes per process, the device's
total a little above the sum of its processes: driver and CUDA contexts):

- **a caching allocator** (PyTorch's): a process holds its weights plus the peak of its
  working set, rounded up to 256 MB segments (steps of 256 MB to 1 GB, as a burst needs
  one or several); the working set follows the load (a daily rhythm peaking mid-afternoon,
  weekends at 45 %), so memory climbs in steps through the morning ramp, plateaus, and is
  reset by the daily restart (a new pid: the device empty for a minute and a half, the
  weights loaded again);
- **vLLM-style preallocation**: 90 % of the device taken at start, then flat;
- **a model reload** in the same process: memory down to the CUDA context for a minute,
  then back;
- **batch jobs** as real ones run: +20 GB allocated within a minute and a half of the
  start (model weights, the input batch, the allocator's peak of the first iterations),
  held for the 30 min the job runs and freed at its exit, every 2 h, inside the serving
  process (a job that empties the cache when done) or as a short-lived process of its own;
- **leaks** through the allocator, in 20 MB small-pool segments: steady (the seed's
  1.2 GB/h, a slow 0.25 GB/h), and a GC sawtooth (+1 GB/h with 60 % of each 20 min's growth
  freed at its end: net +0.4 GB/h).

``SHAPES`` are played by ``bench/shapes.py``; :func:`fleet_gpus` is a healthy fleet of such
devices for the 14-day fleet shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from shape_kit import DAY, HOUR, MINUTE, MONDAY, Expect, Shape

from ragwatch.schema import GpuEnvelope, GpuSample, ProcessSample

MB, GB = 1e6, 1e9
MIB = 2**20
TOTAL = 81559 * MIB  # an H100 80GB HBM3 as NVML reports it
SEGMENT = 256 * MIB  # the allocator's large segments
SMALL = 20 * MIB  # its small-pool segments: what a leak of small tensors grows by
DRIVER = 512 * MIB  # the device's memory in use with no process (driver, reserved)
CONTEXT = 480 * MIB  # a process's CUDA context
ROOM = 0.995  # of the total, what processes can hold: the driver reserves the rest
INTERVAL = 10.0
LEAK_RULES = ("GpuMemoryLeak", "GpuMemoryLeakSlow")
GPU_LEAK_RULES = ("GpuMemoryLeakUnattributed", "GpuMemoryLeakUnattributedSlow")


def load(ts: np.ndarray, weekend: float = 0.45) -> np.ndarray:
    """Demand in [0, 1]: a trough at 04:00, the peak at 15:00 (UTC), weekends at ``weekend``."""
    hour = (ts % DAY) / HOUR
    daily = 0.2 + 0.8 * np.clip(np.sin(np.pi * (hour - 4.0) / 22.0), 0.0, 1.0) ** 1.5
    weekday = ((ts - MONDAY) // DAY) % 7
    return daily * np.where(weekday >= 5, weekend, 1.0)


@dataclass
class Proc:
    """One process's life on a device: its memory at each sample of ``ts``."""

    pid: int
    name: str
    start: float
    end: float
    mem: Callable[[np.ndarray], np.ndarray]
    container: str = "c0ffee"


@dataclass
class Device:
    """One GPU: its processes, the utilisation its load gives, NVML's noise."""

    host: str
    index: int
    procs: list[Proc]
    weekend: float = 0.45
    visible: bool = True  # False: GPU totals only (dcgm-exporter)
    extra: list[Proc] = field(default_factory=list)

    def samples(self, ts: np.ndarray, rng: np.random.Generator) -> list[GpuSample]:
        util = np.clip(100 * load(ts, self.weekend) * rng.lognormal(0, 0.15, len(ts)), 0, 100)
        alive = [(p, (ts >= p.start) & (ts < p.end)) for p in (*self.procs, *self.extra)]
        mem = {p.pid: _alive_mem(p, ts, a) for p, a in alive}
        used = DRIVER + rng.integers(0, 4, len(ts)) * 2 * MIB  # driver churn: a few MB
        for p, a in alive:
            # what does not fit is not given (CUDA's allocation fails; NVML never reads more
            # than the total): a batch job beside a full server gets what is free
            mem[p.pid] = np.minimum(mem[p.pid], np.maximum(0.0, ROOM * TOTAL - used - CONTEXT))
            used = used + np.where(a, mem[p.pid] + CONTEXT, 0.0)
        out = []
        for i in range(len(ts)):
            procs = tuple(
                ProcessSample(p.pid, p.name, int(mem[p.pid][i] + CONTEXT), container=p.container)
                for p, a in alive
                if a[i] and self.visible
            )
            out.append(
                GpuSample(self.index, f"GPU-{self.host}-{self.index}", "NVIDIA H100 80GB HBM3",
                          int(used[i]), TOTAL, gpu_util=float(round(util[i])), procs=procs)
            )  # fmt: skip
        return out


def _alive_mem(p: Proc, ts: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """A process's memory where it runs (its model asked only for those times), else 0."""
    out = np.zeros(len(ts))
    if alive.any():
        out[alive] = p.mem(ts[alive])
    return out


def envelopes(
    devices: Sequence[Device], start: float, end: float, seed: int, interval: float = INTERVAL
) -> Iterator[GpuEnvelope]:
    """Every host's envelope every ``interval`` (NVML's 10 s by default), in event-time
    order, computed an hour at a time."""
    rng = np.random.default_rng(seed)
    hosts = sorted({d.host for d in devices})
    t = start
    while t < end:
        ts = np.arange(t, min(t + HOUR, end), interval)
        per = {h: [d.samples(ts, rng) for d in devices if d.host == h] for h in hosts}
        for i, at in enumerate(ts.tolist()):
            for h in hosts:
                yield GpuEnvelope(h, at, tuple(s[i] for s in per[h]))
        t += HOUR


# ---------------------------------------------------------------------- memory of a process


def allocator(
    weights: float, working: float, seed: int, weekend: float = 0.45
) -> Callable[[np.ndarray], np.ndarray]:
    """A caching allocator from its process's start: weights plus the peak of a working set
    that follows the load (lognormal bursts), rounded up to 256 MB segments."""

    def mem(ts: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(seed + int(ts[0] // HOUR))  # the same bursts for the same hour
        ws = working * load(ts, weekend) * rng.lognormal(0, 0.12, len(ts))
        return weights + np.ceil(ws / SEGMENT) * SEGMENT

    return _peak_since_start(mem)


def _peak_since_start(
    mem: Callable[[np.ndarray], np.ndarray],
) -> Callable[[np.ndarray], np.ndarray]:
    """``mem`` held at its running peak since the first time it was asked for (the
    allocator never gives segments back), across calls an hour at a time."""
    state: dict[str, float] = {"peak": 0.0}

    def held(ts: np.ndarray) -> np.ndarray:
        out = np.maximum.accumulate(np.maximum(mem(ts), state["peak"]))
        state["peak"] = float(out[-1])
        return out

    return held


def flat(level: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda ts: np.full(len(ts), level)


def loading(
    mem: Callable[[np.ndarray], np.ndarray], start: float, over_s: float = 60.0
) -> Callable[[np.ndarray], np.ndarray]:
    """``mem`` from a process start: the weights loaded over ``over_s``."""
    return lambda ts: mem(ts) * np.clip((ts - start) / over_s, 0.05, 1.0)


def with_reloads(
    mem: Callable[[np.ndarray], np.ndarray], hour: float, down_s: float = 60.0
) -> Callable[[np.ndarray], np.ndarray]:
    """A daily model reload at ``hour`` (UTC): down to nothing but the context for ``down_s``."""
    return lambda ts: np.where(((ts - hour * HOUR) % DAY) < down_s, 0.0, mem(ts))


def plus(
    mem: Callable[[np.ndarray], np.ndarray], extra: Callable[[np.ndarray], np.ndarray]
) -> Callable[[np.ndarray], np.ndarray]:
    return lambda ts: mem(ts) + extra(ts)


def steady_leak(start: float, gb_per_hour: float) -> Callable[[np.ndarray], np.ndarray]:
    """Leaked small tensors: 20 MB segments at ``gb_per_hour`` from ``start``."""
    return lambda ts: (
        np.floor(np.maximum(0.0, ts - start) * gb_per_hour * GB / HOUR / SMALL) * SMALL
    )


def sawtooth(
    start: float, gb_per_hour: float, period_s: float, freed: float
) -> Callable[[np.ndarray], np.ndarray]:
    """Grows ``gb_per_hour``; at the end of each ``period_s`` frees ``freed`` of that period's
    growth (a GC that collects most, not all)."""

    def mem(ts: np.ndarray) -> np.ndarray:
        dt = np.maximum(0.0, ts - start)
        per = gb_per_hour * GB * period_s / HOUR
        cycles, into = np.floor(dt / period_s), dt % period_s
        grown = cycles * per * (1 - freed) + per * into / period_s
        return np.floor(grown / (2 * MIB)) * 2 * MIB

    return mem


def batch(
    first: float, every_s: float, size: float, ramp_s: float = 90.0, hold_s: float = 30 * 60.0
) -> Callable[[np.ndarray], np.ndarray]:
    """A batch job's memory: ``size`` taken in 1 GB chunks over ``ramp_s`` from ``first``
    (weights, the input batch, the first iterations' peak), every ``every_s``, held
    ``hold_s`` (the job's run) and freed at its exit."""

    def mem(ts: np.ndarray) -> np.ndarray:
        into = np.where(ts >= first, (ts - first) % every_s, np.inf)
        chunks = np.floor(size / GB * np.clip(into / ramp_s, 0.0, 1.0)) * GB
        return np.where(into < ramp_s + hold_s, chunks, 0.0)

    return mem


# ---------------------------------------------------------------------- processes over days


def restarts(
    pid0: int, name: str, start: float, days: float, hour: float,
    make: Callable[[float, int], Callable[[np.ndarray], np.ndarray]], gap_s: float = 90.0,
) -> list[Proc]:  # fmt: skip
    """A serving process restarted every day at ``hour`` (a new pid each time): ``make(start,
    seed)`` its memory from its start."""
    procs, begin, pid, k = [], start, pid0, 0
    end = start + days * DAY
    while begin < end:
        nxt = (math.floor((begin - hour * HOUR) / DAY) + 1) * DAY + hour * HOUR
        procs.append(Proc(pid, name, begin, min(nxt, end), loading(make(begin, pid), begin)))
        begin, pid, k = nxt + gap_s, pid + 1, k + 1
    return procs


def hf_server(
    weights: float = 30 * GB, working: float = 8 * GB
) -> Callable[[float, int], Callable[[np.ndarray], np.ndarray]]:
    return lambda start, seed: allocator(weights, working, seed)


def vllm(total: float = TOTAL) -> Callable[[float, int], Callable[[np.ndarray], np.ndarray]]:
    return lambda start, seed: flat(0.9 * total - CONTEXT - DRIVER)


# ---------------------------------------------------------------------- the shapes

HOST = "mem-node-01"
PID = 4100


def _pair(
    subject: list[Proc], days: float, *, visible: bool = True, extra: list[Proc] | None = None
) -> list[Device]:
    """The subject on GPU 0, a healthy peer on GPU 1 (an allocator, restarted daily at 04:00)."""
    peer = restarts(5100, "rag-worker", MONDAY, days, 4.0, hf_server(24 * GB, 6 * GB))
    return [
        Device(HOST, 0, subject, visible=visible, extra=extra or []),
        Device(HOST, 1, peer, visible=visible),
    ]


def _shape(name: str, devices: list[Device], days: float, faults: tuple[Expect, ...],
           note: str, fault_days: float = 0.0, seed: int = 0) -> Shape:  # fmt: skip
    series = len(devices) + sum(1 for d in devices if d.visible)  # a GPU and its server
    return Shape(
        name,
        lambda: envelopes(devices, MONDAY, MONDAY + days * DAY, seed),
        faults,
        series_days=series * days - fault_days,
        note=note,
    )


def _leaky(
    extra: Callable[[np.ndarray], np.ndarray], days: float, weights: float = 38 * GB
) -> list[Proc]:
    """One serving process for ``days`` (no restart) with an allocator, plus ``extra``."""
    return [Proc(PID, "rag-worker", MONDAY, MONDAY + days * DAY,
                 loading(plus(allocator(weights, 4 * GB, 7), extra), MONDAY))]  # fmt: skip


def _target(gpu_only: bool = False) -> dict[str, str]:
    return {"host": HOST, "gpu": "0"} if gpu_only else {"host": HOST, "gpu": "0", "pid": str(PID)}


def sawtooth_leak() -> Shape:
    at = MONDAY + DAY + 10 * HOUR
    leak = Expect("leak", LEAK_RULES, _target(), at, None, max_delay_s=3 * HOUR)
    procs = _leaky(sawtooth(at, 1.0, 20 * MINUTE, 0.6), 2.0)
    return _shape("memory-sawtooth-leak", _pair(procs, 2.0), 2.0, (leak,),
                  "+1 GB/h, 60 % of each 20 min freed (net +0.4 GB/h) from day 2 10:00: one "
                  "page, firing while the net growth lasts", fault_days=2 * 14 / 24)  # fmt: skip


def batch_in_process() -> Shape:
    procs = _leaky(batch(MONDAY + 50 * MINUTE, 2 * HOUR, 20 * GB), 3.0, 34 * GB)
    return _shape("memory-batch-in-process", _pair(procs, 3.0), 3.0, (),
                  "a serving process that runs a 30 min, +20 GB batch every 2 h for 3 days: "
                  "a cycle that returns, no page")  # fmt: skip


def batch_process() -> Shape:
    jobs = [
        Proc(6000 + k, "embed-batch", at, at + 31.5 * MINUTE, batch(at, 2 * HOUR, 20 * GB))
        for k in range(36)
        for at in [MONDAY + 50 * MINUTE + k * 2 * HOUR]
    ]
    devices = _pair(_leaky(flat(0.0), 3.0, 34 * GB), 3.0, extra=jobs)
    return _shape(
        "memory-batch-process",
        devices,
        3.0,
        (),
        "a 30 min batch process of +20 GB every 2 h beside the server, 3 days: no page",
    )


def caching_allocator() -> Shape:
    procs = restarts(PID, "rag-worker", MONDAY, 5.0, 4.0, hf_server(30 * GB, 10 * GB))
    return _shape("memory-caching-allocator", _pair(procs, 5.0), 5.0, (),
                  "a caching allocator climbing 256 MB-1 GB steps with the morning load, "
                  "restarted daily at 04:00, Monday to Friday: no page")  # fmt: skip


def reloads() -> Shape:
    procs = [Proc(PID, "rag-worker", MONDAY, MONDAY + 4 * DAY,
                  with_reloads(loading(allocator(36 * GB, 6 * GB, 3), MONDAY), 3.0))]  # fmt: skip
    return _shape("memory-reloads", _pair(procs, 4.0), 4.0, (),
                  "a model reloaded daily at 03:00 in the same process (a minute at the "
                  "context only), 4 days: no page")  # fmt: skip


def slow_leak() -> Shape:
    at = MONDAY + DAY + 15 * HOUR
    leak = Expect("leak", LEAK_RULES, _target(), at, None, max_delay_s=3 * HOUR)
    procs = _leaky(steady_leak(at, 0.25), 2.0)
    return _shape("memory-slow-leak", _pair(procs, 2.0), 2.0, (leak,),
                  "0.25 GB/h from day 2 15:00 on an 80 GB GPU at ~43 GB (OOM in ~6 days): a "
                  "warning within 3 h", fault_days=2 * 9 / 24)  # fmt: skip


def seed_leak(gpu_only: bool = False) -> Shape:
    at = MONDAY + DAY + 1 * HOUR
    rules = GPU_LEAK_RULES if gpu_only else LEAK_RULES
    delay = 45 * MINUTE if gpu_only else 30 * MINUTE
    leak = Expect("leak", rules, _target(gpu_only), at, None, max_delay_s=delay)
    procs = _leaky(steady_leak(at, 1.2), 1.5)
    name = "memory-seed-leak-gpu-only" if gpu_only else "memory-seed-leak"
    return _shape(name, _pair(procs, 1.5, visible=not gpu_only), 1.5, (leak,),
                  "the seed's 1.2 GB/h from day 2 01:00 through the night"
                  + (" seen by dcgm-exporter (no processes)" if gpu_only else ""),
                  fault_days=(1 if gpu_only else 2) * 11 / 24)  # fmt: skip


def shapes() -> list[Shape]:
    return [
        sawtooth_leak(), batch_in_process(), batch_process(), caching_allocator(), reloads(),
        slow_leak(), seed_leak(), seed_leak(gpu_only=True),
    ]  # fmt: skip


SHAPES = shapes


# ---------------------------------------------------------------------- a healthy fleet


def fleet_gpus(
    hosts: int, gpus: int, start_ts: float, days: float, seed: int
) -> Iterator[GpuEnvelope]:
    """A healthy fleet: per GPU, a caching-allocator server restarted daily (60 %), a
    vLLM-style server (25 %) or an allocator server with a daily model reload (15 %); a
    batch process every few hours on one GPU in eight; weekly load (weekends at 45 %)."""
    rng = np.random.default_rng(seed)
    devices = []
    for h in range(hosts):
        for g in range(gpus):
            host, pid = f"gpu-node-{h:02d}", 10_000 * (h + 1) + 100 * g
            kind, hour = rng.random(), float(rng.uniform(1.0, 6.0))
            if kind < 0.6:
                weights, working = rng.uniform(14, 40) * GB, rng.uniform(3, 12) * GB
                procs = restarts(
                    pid, "rag-worker", start_ts, days, hour, hf_server(weights, working)
                )
            elif kind < 0.85:
                procs = restarts(pid, "vllm", start_ts, days, hour, vllm())
            else:
                mem = with_reloads(
                    loading(allocator(rng.uniform(20, 40) * GB, 6 * GB, pid), start_ts), hour
                )
                procs = [Proc(pid, "rag-worker", start_ts, start_ts + days * DAY, mem)]
            extra = []
            if rng.random() < 0.125 and kind < 0.6:
                every = float(rng.choice([2, 3, 4, 6])) * HOUR
                first = start_ts + float(rng.uniform(0, every))
                job = batch(first, every, 14 * GB)
                extra = [
                    Proc(pid + 50 + k, "embed-batch", at, at + 31.5 * MINUTE, job)
                    for k in range(int(days * DAY / every))
                    for at in [first + k * every]
                ]
            devices.append(Device(host, g, procs, extra=extra))
    return envelopes(devices, start_ts, start_ts + days * DAY, seed)
