"""The scenario space's second family: worlds drawn from shapes of real systems (issue 30).

``bench/space.py`` draws its first family from ragwatch's own simulators. This one draws
each world from the independent generators of the shape harness (``bench/shape_traffic.py``
and ``bench/shape_memory.py``, written apart from the simulators), so the space is not
only ours:

- **traffic** (:func:`shape_traffic.random_world`): one RAG service with two instances, 3 to
  9 days from any weekday, a daily rhythm of 2x to 20x, weekends at 25-100 % of weekdays,
  a quiet holiday in a third of the draws, per-minute bursts, a request mix (the real
  trace's, on its own arrivals or Poisson ones, chat-like or short answers), a retriever
  stall rate of 0-0.5 %, and zero to two request faults (decode, errors, queue, retrieval,
  tokens) of 20 minutes to 6 hours from the second day on; one world in four runs for
  14 days instead (two full weekly cycles);
- **GPUs** (:func:`gpu_world`): two hosts x two GPUs beside the service, each with a
  serving process as real ones behave (a caching allocator restarted daily, vLLM-style
  preallocation, or a daily model reload in the same process), a batch process every few
  hours beside one server in four (not beside vLLM, which holds 90 % of the GPU: a job
  there could not allocate), and in a third of the draws one memory fault on one
  GPU's server: the seed's steady leak (0.8-1.6 GB/h), a slow leak (0.2-0.4 GB/h) or a
  GC sawtooth (net 0.3-0.6 GB/h), from the second day on, to the end of the world.
  Samples every :data:`GPU_INTERVAL` (an agent's ``--interval 30``: the space's cost is
  in the GPU envelopes).

Healthy series-days: the two instances, the four GPUs and their serving processes, less
each fault's window (plus an hour).
"""

from __future__ import annotations

import math

import numpy as np
import shape_memory as mem
import shape_traffic as traffic
from shape_kit import DAY, HOUR, Expect, Shape

GPU_INTERVAL = 30.0
GPU_HOSTS = traffic.HOSTS4[:2]
GPUS_PER_HOST = 2
LONG_WORLD_P = 0.25  # share of worlds that run two full weeks
LEAK_P = 1 / 3


def real_world(seed: int) -> Shape:
    """The world of ``seed``: :func:`shape_traffic.random_world` plus :func:`gpu_world`."""
    rng = np.random.default_rng(seed ^ 0x6A3)
    base, t0, t1 = traffic.random_traffic(seed, 14 if rng.random() < LONG_WORLD_P else None)
    devices, leaks = gpu_world(rng, t0, t1)
    series = len(devices) * 2  # each GPU and its serving process
    faulty = sum(min(t1, (x.end_ts or t1) + HOUR) - x.start_ts for x in leaks)
    return Shape(
        f"real-{seed}",
        lambda: traffic.merged(base.make(), mem.envelopes(devices, t0, t1, seed, GPU_INTERVAL)),
        faults=base.faults + leaks,
        series_days=round(base.series_days + (series * (t1 - t0) - faulty) / DAY, 3),
        note=f"{base.note} GPUs: {len(devices)}, memory faults: {len(leaks)}.",
    )


def gpu_world(
    rng: np.random.Generator, t0: float, t1: float
) -> tuple[list[mem.Device], tuple[Expect, ...]]:
    """Two hosts x two GPUs of serving processes, batch jobs beside some, maybe one leak."""
    days = (t1 - t0) / DAY
    devices, leaks = [], []
    leaky = int(rng.integers(len(GPU_HOSTS) * GPUS_PER_HOST)) if rng.random() < LEAK_P else -1
    for n, (host, g) in enumerate((h, g) for h in GPU_HOSTS for g in range(GPUS_PER_HOST)):
        pid = 20_000 + 100 * n
        if n == leaky:
            procs, expect = _leaking(rng, host, g, pid, t0, t1)
            leaks.append(expect)
        else:
            procs = _server(rng, pid, t0, days)
        # drawn beside vLLM too (the next GPUs' draws stay as they were), but not run there:
        # it preallocates 90 %, no batch job fits beside it
        extra = [] if n == leaky else _batches(rng, pid, t0, t1)
        extra = [] if procs[0].name == "vllm" else extra
        devices.append(mem.Device(host, g, procs, extra=extra))
    return devices, tuple(leaks)


def _server(rng: np.random.Generator, pid: int, t0: float, days: float) -> list[mem.Proc]:
    kind, hour = rng.random(), float(rng.uniform(1.0, 6.0))
    if kind < 0.6:
        weights, working = rng.uniform(14, 40) * mem.GB, rng.uniform(3, 12) * mem.GB
        return mem.restarts(pid, "rag-worker", t0, days, hour, mem.hf_server(weights, working))
    if kind < 0.85:
        return mem.restarts(pid, "vllm", t0, days, hour, mem.vllm())
    base = mem.allocator(rng.uniform(20, 40) * mem.GB, 6 * mem.GB, pid)
    reloaded = mem.with_reloads(mem.loading(base, t0), hour)
    return [mem.Proc(pid, "rag-worker", t0, t0 + days * DAY, reloaded)]


def _leaking(
    rng: np.random.Generator, host: str, gpu: int, pid: int, t0: float, t1: float
) -> tuple[list[mem.Proc], Expect]:
    """One long-lived server (no restart: a restart ends a leak) leaking from day 2 on."""
    at = t0 + DAY + round(float(rng.uniform(0, max(HOUR, t1 - t0 - 2 * DAY))) / 60) * 60
    kind = str(rng.choice(["steady", "slow", "sawtooth"]))
    if kind == "steady":
        net = float(rng.uniform(0.8, 1.6))
        extra = mem.steady_leak(at, net)
    elif kind == "slow":
        net = float(rng.uniform(0.2, 0.4))
        extra = mem.steady_leak(at, net)
    else:  # +x GB/h, 60 % of each 20 min freed: net 0.4 x
        gross = float(rng.uniform(0.75, 1.5))
        net, extra = 0.4 * gross, mem.sawtooth(at, gross, 20 * 60.0, 0.6)
    weights = float(rng.uniform(20, 36)) * mem.GB
    server = mem.loading(mem.plus(mem.allocator(weights, 4 * mem.GB, pid), extra), t0)
    # the CUDA OOM killer takes the process when the device is full (weights, the
    # allocator's working set, the context and the driver leave the rest to the leak)
    room = 0.97 * mem.TOTAL - weights - 4 * mem.GB - mem.CONTEXT - mem.DRIVER
    oom = min(t1, at + room / (net * mem.GB) * HOUR)
    proc = mem.Proc(pid, "rag-worker", t0, oom, server)
    target = {"host": host, "gpu": str(gpu), "pid": str(pid)}
    end = None if oom >= t1 else oom
    return [proc], Expect(f"leak/{kind}", mem.LEAK_RULES, target, at, end)


def _batches(rng: np.random.Generator, pid: int, t0: float, t1: float) -> list[mem.Proc]:
    """Beside one healthy server in four, a batch process of 8-20 GB for 30 min every 2-6 hours."""
    if rng.random() >= 0.25:
        return []
    every = float(rng.choice([2, 3, 4, 6])) * HOUR
    first = t0 + float(rng.uniform(0, every))
    job = mem.batch(first, every, float(rng.uniform(8, 20)) * mem.GB)
    count = math.ceil((t1 - first) / every)
    return [
        mem.Proc(pid + 50 + k, "embed-batch", at, at + 31.5 * 60.0, job)
        for k in range(count)
        for at in [first + k * every]
    ]
