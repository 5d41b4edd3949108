"""Per-envelope cost of the worker's hot path, without Kafka, next to its baselines.

Measures, in one process over the same pre-encoded simulated telemetry (host envelopes of
``--gpus`` GPUs with two processes each):

1. ``orjson.loads`` alone (the floor any JSON consumer pays);
2. ``codec.decode_as`` (parse + strict validation into frozen records: replay and tests);
3. ``codec.decode_gpu_wire`` (parse + the same validation, into msgspec structs: the worker);
4. ``decode_gpu_wire`` + ``GpuPipeline.process_batch`` in batches of ``--batch`` (leak
   detectors on every GPU and process series, the rules), the worker's GPU path.

Prints envelopes/s and GPU samples/s for each, the ratios to the baseline, and writes
``bench/results/pipeline.json``. Run: ``make bench`` or ``python bench/pipeline.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.codec import decode_as, decode_gpu_wire, encode
from ragwatch.schema import GpuEnvelope
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.gpu import GpuPipeline

RESULTS = Path(__file__).parent / "results"


def telemetry(hosts: int, gpus: int, ticks: int) -> list[bytes]:
    sim = FleetSimulator(SimConfig(hosts=hosts, gpus=gpus, interval_s=10.0))
    out = []
    for _, (_, envs, _) in zip(range(ticks), sim.ticks(), strict=False):
        out.extend(encode(e) for e in envs)
    return out


def rate(fn: Callable[[], None], n: int, repeat: int = 3) -> tuple[float, float]:
    """Best of ``repeat`` runs: (items/s, CPU seconds of that run)."""
    best, cpu = 0.0, 0.0
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if n / dt > best:
            best, cpu = n / dt, time.process_time() - c0
    return best, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=360, help="10 s ticks: 360 = one hour")
    ap.add_argument("--batch", type=int, default=256, help="envelopes per process_batch")
    args = ap.parse_args()
    data = telemetry(args.hosts, args.gpus, args.ticks)
    n = len(data)
    rules = load_rules()

    def baseline() -> None:
        for d in data:
            orjson.loads(d)

    def decode() -> None:
        for d in data:
            decode_as(GpuEnvelope, d)

    def wire() -> None:
        for d in data:
            decode_gpu_wire(d)

    def full() -> None:
        pipe = GpuPipeline(rules)
        for i in range(0, n, args.batch):
            pipe.process_batch([decode_gpu_wire(d) for d in data[i : i + args.batch]])

    rows: dict[str, dict[str, float]] = {}
    paths = (
        ("orjson.loads", baseline),
        ("decode_as", decode),
        ("decode_gpu_wire", wire),
        ("decode+pipeline", full),
    )
    for name, fn in paths:
        per_s, cpu = rate(fn, n)
        rows[name] = {
            "envelopes_per_s": round(per_s),
            "gpu_samples_per_s": round(per_s * args.gpus),
            "cpu_s": round(cpu, 3),
        }
    base = rows["orjson.loads"]["envelopes_per_s"]
    size = sum(map(len, data)) / n
    print(
        f"{n} host envelopes ({args.hosts} hosts x {args.gpus} GPUs x 2 procs, "
        f"{size / 1024:.1f} KiB each), Python {platform.python_version()}, {platform.machine()}"
    )
    print(f"{'path':<18} {'envelopes/s':>12} {'GPU samples/s':>14} {'vs orjson':>10}")
    for name, r in rows.items():
        print(
            f"{name:<18} {r['envelopes_per_s']:>12,} {r['gpu_samples_per_s']:>14,} "
            f"{r['envelopes_per_s'] / base:>9.2f}x"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pipeline.json").write_text(
        json.dumps(
            {
                "envelopes": n,
                "hosts": args.hosts,
                "gpus": args.gpus,
                "bytes_per_envelope": size,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
