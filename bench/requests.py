"""The request path's in-process numbers (issues 14 and 17), without Kafka.

Speed: ``--services`` x ``--instances`` instances, each sending a batch a second of every
request at 100 req/s (the simulator's healthy traffic, ~70 records a batch), fed to the
worker's pipelines; the first ``--warm`` seconds are not timed, then each path runs on the
same ``--seconds`` of envelopes, side by side in one run:

1. ``orjson.loads`` of the envelopes (the floor any JSON consumer pays);
2. ``decode_requests_wire`` alone (the worker's typed pass into structs, validation
   included);
3. decode + the pipelines in batches of 512 (``Pipelines.request_batch``, as the worker
   takes what Faust has at hand): the worker's request path.

Prints records per second of CPU and CPU per record, and the ratio to (1).

Memory: a second run, ``--memory-services`` services of ``--memory-instances`` instances
at ``--memory-qps`` requests/s each for ``--memory-hours`` hours of event time, traced by
tracemalloc: what the pipeline holds per instance series in all (its own state and its
share of the service's outlier window), its own state by part (the banks' arrays per row,
and a deep size of each row's per-row objects: tail window, open buckets), and a
service's outlier window. Targets (issue 17): >= 250,000
records/s per core; <= 32 KiB per request series. Writes ``bench/results/requests.json``.
Run: ``python bench/requests.py`` (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import tracemalloc
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
from ragwatch.codec import decode_requests_wire, encode
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.requests import RequestPipeline

RESULTS = Path(__file__).parent / "results"
TARGET_RECORDS = 250_000
TARGET_BYTES = 32 * 1024
BATCH = 512  # messages the worker handles together at most (streams/worker/batches.py)


def telemetry(services: int, instances: int, seconds: int, qps: float, batch_s: float) -> list:
    """The simulator's envelopes for ``seconds`` of event time (every request recorded)."""
    cfg = RequestSimConfig(
        services=services,
        instances=instances,
        batch_s=batch_s,
        base_qps=qps,
        sample_rate=1.0,
        deploy_at_s=None,
        reload_at_s=None,
    )
    ticks = int(seconds / batch_s)
    return [
        env
        for _, (_, envs) in zip(range(ticks), RequestSimulator(cfg).ticks(), strict=False)
        for env in envs
    ]


def cpu(fn: Any) -> float:
    gc.collect()
    c = time.process_time()
    fn()
    return time.process_time() - c


def timing(args: argparse.Namespace) -> dict[str, Any]:
    envs = telemetry(args.services, args.instances, args.warm + args.seconds, 100.0, 1.0)
    pipes = Pipelines(load_rules())
    cut = next(i for i, e in enumerate(envs) if e.ts >= envs[0].ts + args.warm)
    for e in envs[:cut]:
        pipes.request(e)
    raw = [encode(e) for e in envs[cut:]]
    n = sum(len(e.records) for e in envs[cut:])

    def worker() -> None:
        for i in range(0, len(raw), BATCH):
            pipes.request_batch([decode_requests_wire(d) for d in raw[i : i + BATCH]])

    rows = {
        "orjson.loads": cpu(lambda: [orjson.loads(d) for d in raw]),
        "decode_requests_wire": cpu(lambda: [decode_requests_wire(d) for d in raw]),
        "decode+pipelines": cpu(worker),
    }
    return {
        "records": n,
        "envelopes": len(raw),
        "cpu_s": {k: round(v, 3) for k, v in rows.items()},
        "records_per_s": {k: round(n / v) for k, v in rows.items()},
        "us_per_record": {k: round(v / n * 1e6, 2) for k, v in rows.items()},
    }


def deep_size(o: object, seen: set[int]) -> int:
    """Bytes of ``o`` and everything it holds that ``seen`` does not hold already."""
    if id(o) in seen:
        return 0
    seen.add(id(o))
    n = sys.getsizeof(o)
    if isinstance(o, dict):
        return n + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in o.items())
    if isinstance(o, (list, tuple, set, frozenset)) or type(o).__name__ == "deque":
        return n + sum(deep_size(x, seen) for x in o)  # type: ignore[attr-defined]
    if isinstance(o, (str, bytes, int, float, array, bool)) or o is None:
        return n
    if isinstance(o, np.ndarray):
        return n  # getsizeof counts an array's own buffer
    if hasattr(o, "__dict__"):
        return n + deep_size(vars(o), seen)
    slots = [a for c in type(o).__mro__ for a in getattr(c, "__slots__", ())]
    return n + sum(deep_size(getattr(o, a), seen) for a in slots if hasattr(o, a))


def memory(args: argparse.Namespace) -> dict[str, Any]:
    seconds = int(args.memory_hours * 3600)
    envs = telemetry(args.memory_services, args.memory_instances, seconds, args.memory_qps, 10.0)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        pipe = RequestPipeline([])
        for e in envs:
            pipe.process(e)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    rows = pipe.rows
    keys = list(pipe.series)
    r = np.array([pipe.series[k].row for k in keys], dtype=np.intp)
    n = len(keys)
    parts: Counter[str] = Counter()
    banks = {"traffic": rows.traffic, "latency": rows.latency, "counts": rows.counts}
    for name, bank in banks.items():  # a row's share of the bank's arrays (in use)
        parts[name] = bank.nbytes() * n // max(1, rows.capacity)
    parts["columns"] = (
        (sum(a.nbytes for a in rows.col.values()) + rows.signals.nbytes + rows.recent.nbytes)
        * n
        // max(1, rows.capacity)
    )
    for row in r.tolist():
        seen: set[int] = set()
        parts["tail"] += deep_size(rows.tails[row], seen)
        parts["buckets"] += deep_size(rows.buckets[row], seen)
        parts["senders"] += deep_size(rows.senders[row], seen)
    windows = [pipe.service_state(svc)[1].detector for svc in {k[0] for k in keys}]
    return {
        "series": n,
        "records": sum(len(e.records) for e in envs),
        "bytes_per_series": round(used / n),
        "own_bytes_per_series": round(sum(parts.values()) / n),
        "own_parts": {k: round(v / n) for k, v in parts.most_common(8)},
        "outlier_window_bytes": round(
            sum(deep_size(vars(d), set()) for d in windows) / len(windows)
        ),
        "capacity_rows": rows.capacity,
        "outlier_window_points": min(len(d) for d in windows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=4)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--warm", type=int, default=300)
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--memory-services", type=int, default=4)
    ap.add_argument("--memory-instances", type=int, default=2)
    ap.add_argument("--memory-qps", type=float, default=2.0)
    ap.add_argument("--memory-hours", type=float, default=6.0)
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    t = timing(args)
    print(
        f"{args.services} services x {args.instances} instances at 100 req/s, every request "
        f"recorded: {t['records']:,} records in {t['envelopes']:,} envelopes per path, "
        f"Python {platform.python_version()}"
    )
    base = t["cpu_s"]["orjson.loads"]
    print(f"{'path':<18} {'records/s/core':>15} {'us/record':>10} {'vs orjson':>10}")
    for name, c in t["cpu_s"].items():
        rate, us = t["records_per_s"][name], t["us_per_record"][name]
        print(f"{name:<18} {rate:>15,} {us:>10} {base / c:>9.2f}x")
    got = t["records_per_s"]["decode+pipelines"]
    verdict = "met" if got >= TARGET_RECORDS else "MISSED"
    print(f"target >= {TARGET_RECORDS:,} records/s/core: {verdict}")
    out: dict[str, Any] = {"args": vars(args), "python": platform.python_version(), "timing": t}
    if not args.no_memory:
        m = memory(args)
        ok = m["bytes_per_series"] <= TARGET_BYTES
        own = ", ".join(f"{k} {v / 1024:.1f}" for k, v in m["own_parts"].items())
        print(
            f"memory after {args.memory_hours:g} h at {args.memory_qps:g} req/s an instance "
            f"({m['series']} instances, {m['records']:,} records): "
            f"{m['bytes_per_series'] / 1024:.1f} KiB per series in all, "
            f"target <= {TARGET_BYTES // 1024} KiB {'met' if ok else 'MISSED'}; "
            f"own state {m['own_bytes_per_series'] / 1024:.1f} KiB ({own} KiB); "
            f"a service's outlier window {m['outlier_window_bytes'] / 1024:.1f} KiB "
            f"({m['outlier_window_points']:,} points)"
        )
        out["memory"] = m
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "requests.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
