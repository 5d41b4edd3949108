"""Like GPUs compared with one another (``streams/pipelines/gpu_peers.py``, the
``ReplicaGpu*`` rules): how often they page on healthy Kubernetes fleets, and how soon on
faults no other rule names.

Healthy shapes (a minute per sample, a week each unless said; every GPU held by a pod):

- ``weekly``: 12 hosts x 2 GPUs of one Deployment; a daily load with quiet weekends, each
  replica's share of it 0.7-1.3 (the balancer is not exact), a temperature offset per
  host of +-6 C (its place in the rack), a caching allocator's steps of memory;
- ``rollouts``: the same, with a rolling restart each day (each pod replaced in turn: its
  GPU idle 3 minutes, then a new pod of the same template warming its memory up);
- ``sticky``: session affinity sends one replica 0.45x the median load for a day, another
  1.8x;
- ``batch``: beside 8 serving GPUs, an indexing CronJob every 6 hours on 4 GPUs (pods of
  one run are one group; shards of unequal size end at different times, and a GPU whose
  pod ended is held by none);
- ``mixed-hosts``: two host generations in one group: the older runs 8 C warmer and
  draws 10 % less at the same load.

Faults, each on one GPU of ``weekly`` from day 2, 09:00: ``hung`` (utilisation and
power collapse, memory held: no XID), ``power-capped`` (power held at half, clocks with
it: utilisation up), ``hot`` (a fan: +20 C), ``starved`` (readiness failing: the balancer
sends it nothing, its pod stays).

A page is a ``ReplicaGpu*`` alert that fires; one on a faulted GPU after its fault began is
the fault's, every other is false. Printed: per shape the GPU-days, the false pages and
their rate per GPU-day; per fault each page and its delay. Every rule of the default set
runs (a false page of another GPU rule is printed too).

    python bench/gpu_peers.py [--days 7] [--shape NAME ...]
    python bench/gpu_peers.py --cost    # samples/s with the comparison on and off, same run
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ragwatch.schema import GpuEnvelope, GpuSample
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines

GB = 1 << 30
MODEL = "NVIDIA H100 80GB HBM3"
STEP_S = 60.0
T0 = 1_764_547_200.0  # a Monday, 00:00 UTC
SAFE = "bcdfghjklmnpqrstvwxz2456789"
FAULT_AT_S = 33 * 3600.0  # day 2, 09:00


def suffix(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(SAFE) for _ in range(n))


@dataclass
class Gpu:
    host: int
    index: int
    share: float
    pod: str | None
    template: str
    used: float = 40.0 * GB
    temp: float = 40.0
    warm_until: float = -math.inf  # a new pod's memory warming up until then
    idle_until: float = -math.inf  # its pod being replaced until then
    fault: str = ""


@dataclass
class Shape:
    name: str
    hosts: int = 12
    gpus: int = 2
    rack_c: float = 6.0
    rollouts: bool = False
    sticky: bool = False
    batch: bool = False
    mixed: bool = False
    fault: str = ""
    pods: bool = True  # False: no GPU is held by a pod (nothing is compared)
    gpus_list: list[Gpu] = field(default_factory=list)


def daily_load(ts: float) -> float:
    """The Deployment's load in percent of a GPU: a daily rhythm, weekends at half."""
    day = ((ts - T0) // 86_400) % 7
    hour = ((ts - T0) % 86_400) / 3600
    load = 50.0 + 32.0 * math.sin(2 * math.pi * (hour - 9.0) / 24)
    return load * (0.5 if day >= 5 else 1.0)


def envelopes(
    shape: Shape, days: float, seed: int = 11, step_s: float = STEP_S
) -> Iterator[GpuEnvelope]:
    rng = random.Random(seed)
    rack = {h: rng.uniform(-shape.rack_c, shape.rack_c) for h in range(shape.hosts)}
    gpus = [
        Gpu(
            h,
            g,
            rng.uniform(0.7, 1.3),
            f"vllm-7d9f8c6b5-{suffix(rng, 5)}" if shape.pods else None,
            "vllm",
        )
        for h in range(shape.hosts)
        for g in range(shape.gpus)
    ]
    if shape.fault:
        gpus[3].fault = shape.fault
    batch = [Gpu(shape.hosts + i // 2, i % 2, 1.0, None, "embed") for i in range(4)]
    if not shape.batch:
        batch = []
    shape.gpus_list = gpus
    steps = int(days * 86_400 / step_s)
    for i in range(steps):
        ts = T0 + i * step_s
        t = i * step_s
        _events(shape, gpus, batch, rng, t)
        load = daily_load(ts)
        by_host: dict[int, list[GpuSample]] = {}
        for gpu in gpus + batch:
            sample = _sample(shape, gpu, load, rack.get(gpu.host, 0.0), rng, t)
            by_host.setdefault(gpu.host, []).append(sample)
        for h, samples in sorted(by_host.items()):
            yield GpuEnvelope(f"node-{h:02d}", ts, tuple(samples))


def _events(shape: Shape, gpus: list[Gpu], batch: list[Gpu], rng: random.Random, t: float) -> None:
    day_s = t % 86_400
    if shape.rollouts and 2 * 3600 <= day_s < 2 * 3600 + len(gpus) * 300 and day_s % 300 == 0:
        gpu = gpus[int((day_s - 2 * 3600) // 300)]
        gpu.pod = f"vllm-5f6c9b8d4-{suffix(rng, 5)}"  # the new ReplicaSet's pod
        gpu.idle_until, gpu.warm_until = t + 180.0, t + 780.0
        gpu.used = 1.0 * GB
    if shape.sticky:
        gpus[5].share = 0.45 if 2 * 86_400 <= t < 3 * 86_400 else 1.0
        gpus[8].share = 1.8 if 2 * 86_400 <= t < 3 * 86_400 else 1.0
    if batch and t % (6 * 3600) == 0:
        run = f"embed-{int(t // 60) + 29_000_000}"
        for gpu in batch:
            gpu.pod = f"{run}-{suffix(rng, 5)}"
            gpu.idle_until = t + rng.uniform(0.6, 1.4) * 90 * 60  # the shard's end
    for gpu in batch:
        if gpu.pod is not None and t >= gpu.idle_until:
            gpu.pod = None  # the job's pod ended: the GPU is held by none


def _sample(
    shape: Shape, gpu: Gpu, load: float, rack: float, rng: random.Random, t: float
) -> GpuSample:
    if gpu.template == "embed":
        util = 97.0 + rng.gauss(0, 2) if gpu.pod is not None else 0.0
    elif t < gpu.idle_until:
        util = 0.0
    else:
        util = load * gpu.share + rng.gauss(0, 4)
    util = min(100.0, max(0.0, util))
    power = 70.0 + 5.6 * util + rng.gauss(0, 10)
    target = 30.0 + 0.4 * util + rack
    if shape.mixed and gpu.host % 2:
        target += 8.0
        power *= 0.9
    faulted = gpu.fault and t >= FAULT_AT_S
    if faulted and gpu.fault in ("hung", "starved"):
        util, power = 0.0, 70.0 + rng.gauss(0, 3)
        target = 30.0 + rack
    if faulted and gpu.fault == "power-capped":
        util, power = min(100.0, util * 1.6), min(power, 350.0 + rng.gauss(0, 5))
    if faulted and gpu.fault == "hot":
        target += 20.0
    gpu.temp += (target - gpu.temp) * 0.3 + rng.gauss(0, 0.5)
    if t < gpu.warm_until:
        gpu.used = min(40.0 * GB, gpu.used + 4.0 * GB)
    elif rng.random() < 0.01:  # the caching allocator takes a block more, or frees one
        gpu.used = min(70.0 * GB, max(30.0 * GB, gpu.used + rng.choice((2, -2)) * GB))
    busy = gpu.template != "embed" or gpu.pod is not None
    return GpuSample(
        gpu.index, f"GPU-{gpu.host}-{gpu.index}", MODEL, int(gpu.used if busy else 0.5 * GB),
        80 * GB, gpu_util=util, temp_c=gpu.temp, power_w=max(60.0, power),
        namespace="prod" if gpu.pod else None, pod=gpu.pod,
        container=("server" if gpu.template == "vllm" else "indexer") if gpu.pod else None,
    )  # fmt: skip


SHAPES: dict[str, Callable[[], Shape]] = {
    "weekly": lambda: Shape("weekly"),
    "rollouts": lambda: Shape("rollouts", rollouts=True),
    "sticky": lambda: Shape("sticky", sticky=True),
    "batch": lambda: Shape("batch", hosts=4, batch=True),
    "mixed-hosts": lambda: Shape("mixed-hosts", mixed=True),
}
FAULTS = ("hung", "power-capped", "hot", "starved")


def play(shape: Shape, days: float) -> tuple[list[tuple[str, str, str, float]], int, float]:
    """(rule, host, gpu, hours from T0 when it fired) of every GPU alert that fired, the
    GPU-samples played and the seconds it took."""
    pipes = Pipelines(load_rules())
    fired: list[tuple[str, str, str, float]] = []
    start = time.perf_counter()
    for tr in pipes.run(envelopes(shape, days)):
        a = tr.alert
        if tr.fires and a.labels.get("pid") is None and "host" in a.labels:
            fired.append((a.rule, a.labels["host"], a.labels.get("gpu", ""), (a.at - T0) / 3600))
    samples = pipes.gpus.stats.samples
    return fired, samples, time.perf_counter() - start


def cost(hosts: int, gpus: int, hours: float, rounds: int, step_s: float) -> None:
    """GPU samples per second through the pipelines, every GPU held by a pod of one
    Deployment, with the like-GPU comparison on (each minute) and off (the same
    envelopes; its minutes never taken), alternated in the same run; envelopes made
    beforehand, the best round of each."""
    envs = list(envelopes(Shape("cost", hosts=hosts, gpus=gpus), hours / 24, step_s=step_s))
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name in ("on", "off"):
            pipes = Pipelines(load_rules())
            if name == "off":
                pipes.gpus.peers.due = lambda ts: False  # type: ignore[method-assign]
            start = time.perf_counter()
            for _tr in pipes.run(envs):
                pass
            rate = pipes.gpus.stats.samples / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), rate)
    print(
        f"cost: {hosts} hosts x {gpus} GPUs in one group, {hours:g} h sampled every "
        f"{step_s:g} s, best of {rounds}: {best['on']:,.0f} samples/s compared, "
        f"{best['off']:,.0f} not: ratio {best['on'] / best['off']:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--shape", action="append", choices=[*SHAPES, *FAULTS])
    ap.add_argument("--cost", action="store_true", help="measure what comparing costs, only")
    args = ap.parse_args()
    if args.cost:
        cost(64, 8, 6.0, 3, 60.0)  # the worst case: a comparison a minute for each sample
        cost(64, 8, 1.5, 3, 15.0)  # the prom agent's scrape of dcgm-exporter (NVML: every 1 s)
        return
    names = args.shape or [*SHAPES, *FAULTS]
    total_days = total_false = 0.0
    print(f"{'shape':<14} {'GPU-days':>9} {'pages':>6} {'false':>6} {'per GPU-day':>12}  time")
    for name in names:
        shape = SHAPES[name]() if name in SHAPES else Shape(name, fault=name)
        fired, samples, took = play(shape, args.days)
        gpu_days = samples * STEP_S / 86_400
        faulted = {(f"node-{g.host:02d}", str(g.index)) for g in shape.gpus_list if g.fault}
        false = [f for f in fired if (f[1], f[2]) not in faulted or f[3] * 3600 < FAULT_AT_S]
        total_days += gpu_days if not shape.fault else 0.0
        total_false += len(false) if not shape.fault else 0
        rate = len(false) / gpu_days if gpu_days else math.nan
        print(
            f"{name:<14} {gpu_days:>9.0f} {len(fired):>6} {len(false):>6} {rate:>12.4f}"
            f"  {took:.0f} s"
        )
        for rule, host, gpu, h in fired:
            tag = "false" if (rule, host, gpu, h) in false else "fault"
            delay = f", {h - FAULT_AT_S / 3600:.1f} h after the fault" if tag == "fault" else ""
            print(f"    {tag}: {rule} {host} GPU {gpu} at {h:.1f} h{delay}")
    if total_days:
        print(
            f"healthy shapes: {total_false:.0f} false pages in {total_days:.0f} GPU-days = "
            f"{total_false / total_days:.4f} per GPU-day"
        )


if __name__ == "__main__":
    main()
