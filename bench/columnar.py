"""The columnar GPU path's in-process targets (issue 17), without Kafka.

A synthetic fleet of ``--hosts`` hosts x ``--gpus`` GPUs x ``--procs`` processes (40
series per envelope by default; one leaking process per 64 hosts), 10 s samples, fed to
the worker's pipelines (``Pipelines.gpu_batch``: leak detectors, rules, hints) in batches
of ``--batch`` envelopes. First ``--warm-ticks`` ticks (2 h 3 min: every leak window
full), not timed; then, each on its own ``--ticks`` ticks, side by side in one run:

1. ``orjson.loads`` of the envelopes (the floor any JSON consumer pays);
2. ``decode_gpu_wire`` alone (parse and validate);
3. the pipelines alone, on envelopes decoded beforehand (with ``--charts``, twice more on
   fresh ticks: alone, then with the worker's chart recorder attached);
4. decode + pipelines: the worker's GPU path.

Prints series updates (GPU and process samples) per second of CPU, CPU per envelope, and
the ratio to (1). Then memory: the pipeline's traced allocations per series after the
same warm-up (tracemalloc, a second run). Targets: >= 1,000,000 series updates/s per
core with full windows; <= 4 KiB per series at >= 10,000 series. ``--profile`` prints
where (4) spends its time. Writes ``bench/results/columnar.json``.
Run: ``python bench/columnar.py`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import platform
import pstats
import random
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ragwatch.codec import decode_gpu_wire
from ragwatch.gpu_wire import from_mapping
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.gpu_signals import COLUMNS

RESULTS = Path(__file__).parent / "results"
T0 = 1_767_225_600.0
TARGET_UPDATES = 1_000_000
TARGET_BYTES = 4096


def fleet(hosts: int, gpus: int, procs: int, seed: int = 7) -> Callable[[int], list[dict]]:
    """The envelopes of tick ``t``, as the dicts their JSON holds (``from_mapping`` makes
    them what ``decode_gpu_wire`` returns)."""
    rng = random.Random(seed)
    noise = [rng.random() for _ in range(4096)]

    def tick(t: int) -> list[dict[str, Any]]:
        out = []
        for h in range(hosts):
            gs = []
            for g in range(gpus):
                ps = []
                for p in range(procs):
                    leak = 3.3e5 * 10 * t if (h % 64, g, p) == (0, 0, 0) else 0.0
                    mem = 2e9 + 1e6 * noise[(h * 31 + g * 7 + p + t) % 4096] + leak
                    ps.append(
                        {
                            "pid": 1000 + 10 * g + p,
                            "name": "rag-worker",
                            "gpu_mem": int(mem),
                            "rss": 3 * 10**9,
                            "container": "c0ffee",
                            "dead": False,
                            "namespace": None,
                            "pod": None,
                        }
                    )
                used = 2e10 + sum(p["gpu_mem"] for p in ps)
                gs.append(
                    {
                        "index": g,
                        "uuid": f"GPU-{h:04d}-{g}",
                        "name": "NVIDIA H100 80GB HBM3",
                        "fb_used": int(used),
                        "fb_total": 85_899_345_920,
                        "mig": None,
                        "fb_reserved": None,
                        "gpu_util": 50.0 + noise[(h + g + t) % 4096],
                        "mem_copy_util": 10.0,
                        "temp_c": 45.0,
                        "power_w": 300.0,
                        "procs": ps,
                    }
                )
            out.append(
                {"v": 1, "kind": "gpu", "host": f"gpu-{h:04d}", "ts": T0 + 10.0 * t, "gpus": gs}
            )
        return out

    return tick


def batches(envs: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(envs), n):
        yield envs[i : i + n]


def warm(pipes: Pipelines, tick: Callable[[int], list[dict]], ticks: int, batch: int) -> None:
    for t in range(ticks):
        for b in batches(tick(t), batch):
            pipes.gpu_batch([from_mapping(e) for e in b])


def cpu(fn: Callable[[], None]) -> float:
    gc.collect()
    c = time.process_time()
    fn()
    return time.process_time() - c


def timing(args: argparse.Namespace, tick: Callable[[int], list[dict]]) -> dict[str, Any]:
    pipes = Pipelines(load_rules(), max_series=1_000_000)
    warm(pipes, tick, args.warm_ticks, args.batch)
    bank = pipes.gpus.bank
    full = int(bank.count[: pipes.gpus.index.size].min())
    t1 = args.warm_ticks
    decoded = [from_mapping(e) for t in range(t1, t1 + args.ticks) for e in tick(t)]
    raw = [orjson.dumps(e) for t in range(t1 + args.ticks, t1 + 2 * args.ticks) for e in tick(t)]
    n = len(raw)
    per_env = args.gpus * (args.procs + 1)
    rows: dict[str, float] = {}
    rows["orjson.loads"] = cpu(lambda: [orjson.loads(d) for d in raw] and None)
    rows["decode_gpu_wire"] = cpu(lambda: [decode_gpu_wire(d) for d in raw] and None)
    rows["pipelines"] = cpu(
        lambda: [pipes.gpu_batch(b) for b in batches(decoded, args.batch)] and None
    )

    def worker_path() -> None:
        for b in batches(raw, args.batch):
            pipes.gpu_batch([decode_gpu_wire(d) for d in b])

    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    rows["decode+pipelines"] = cpu(worker_path)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    if args.charts:  # the worker's chart recorder, told after each wave (issue 29)
        rows.update(charts_cost(pipes, tick, t1 + 2 * args.ticks, args))
    return {
        "series": len(pipes.gpus),
        "points_per_window_min": full,
        "envelopes": n,
        "cpu_s": {k: round(v, 3) for k, v in rows.items()},
        "updates_per_s": {k: round(n * per_env / v) for k, v in rows.items()},
        "us_per_envelope": {k: round(v / n * 1e6, 1) for k, v in rows.items()},
    }


def charts_cost(
    pipes: Pipelines, tick: Callable[[int], list[dict]], t0: int, args: argparse.Namespace
) -> dict[str, float]:
    """The pipelines on two fresh runs of ``--ticks`` ticks each: without the chart
    recorder, then with it attached as the worker attaches it (a point a minute of event
    time per chart series, taken after each wave)."""
    plain = [from_mapping(e) for t in range(t0, t0 + args.ticks) for e in tick(t)]
    t1 = t0 + args.ticks
    charted = [from_mapping(e) for t in range(t1, t1 + args.ticks) for e in tick(t)]
    out = {"pipelines (again)": cpu(lambda: _feed(pipes, plain, args.batch))}
    rec = SeriesRecorder(pipes.rules)
    pipes.tap(rec.observe)
    out["pipelines+charts"] = cpu(lambda: _feed(pipes, charted, args.batch))
    pipes.tap(None)
    return out


def _feed(pipes: Pipelines, envs: list[Any], batch: int) -> None:
    for b in batches(envs, batch):
        pipes.gpu_batch(b)


def memory(args: argparse.Namespace, tick: Callable[[int], list[dict]]) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    pipes = Pipelines(load_rules(), max_series=1_000_000)
    for t in range(args.warm_ticks):
        envs = [from_mapping(e) for e in tick(t)]
        for b in batches(envs, args.batch):
            pipes.gpu_batch(b)
        del envs
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    g = pipes.gpus
    arrays = sum(a.nbytes for a in vars(g.bank).values() if hasattr(a, "nbytes")) + sum(
        getattr(g, c).nbytes for c in (*COLUMNS, "is_gpu", "watch")
    )
    return {
        "series": len(g),
        "bytes_per_series": round(used / len(g)),
        "array_bytes_per_series": round(arrays / len(g)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--warm-ticks", type=int, default=740)
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument(
        "--charts", action="store_true", help="also the pipelines with the chart recorder"
    )
    args = ap.parse_args()
    tick = fleet(args.hosts, args.gpus, args.procs)
    t = timing(args, tick)
    per = args.gpus * (args.procs + 1)
    print(
        f"{t['series']:,} series ({args.hosts} hosts x {args.gpus} GPUs x {args.procs} procs, "
        f"{per} per envelope), windows full (>= {t['points_per_window_min']} points), "
        f"batches of {args.batch}, {t['envelopes']:,} envelopes per path, "
        f"Python {platform.python_version()}"
    )
    base = t["cpu_s"]["orjson.loads"]
    print(f"{'path':<18} {'updates/s/core':>15} {'us/envelope':>12} {'vs orjson':>10}")
    for name, c in t["cpu_s"].items():
        print(
            f"{name:<18} {t['updates_per_s'][name]:>15,} {t['us_per_envelope'][name]:>12} "
            f"{base / c:>9.2f}x"
        )
    got = t["updates_per_s"]["decode+pipelines"]
    verdict = "met" if got >= TARGET_UPDATES else "MISSED"
    print(f"target >= {TARGET_UPDATES:,} updates/s/core: {verdict}")
    out: dict[str, Any] = {"args": vars(args), "python": platform.python_version(), "timing": t}
    if not args.no_memory:
        m = memory(args, tick)
        ok = m["bytes_per_series"] <= TARGET_BYTES
        print(
            f"memory: {m['bytes_per_series']:,} bytes per series at {m['series']:,} series "
            f"(arrays {m['array_bytes_per_series']:,}): target <= {TARGET_BYTES:,} "
            f"{'met' if ok else 'MISSED'}"
        )
        out["memory"] = m
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "columnar.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
