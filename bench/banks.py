"""The leak bank against one detector per series (a one-row view each), side by side in one run.

For N series with full leak windows (``--series``, default 10,000; two hours of warm-up at
the sampling interval first), each "envelope batch" gives every series one sample; both
forms learn the same samples. Prints series updates per second of each and the ratio,
then the bank's memory per series (its arrays' bytes / N) next to a one-row detector's
(tracemalloc over N detectors with full windows), and writes ``bench/results/banks.json``.

Run: ``python bench/banks.py`` (``--series 2000 --seconds 3`` for a quick look).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from ragwatch.detectors.leak import LeakBank, LeakDetector

T0 = 1_767_225_600.0
OUT = Path(__file__).parent / "results" / "banks.json"


def values(rng: np.random.Generator, n: int, t: float) -> np.ndarray:
    """GPU memory of ``n`` series at ``t``: levels, noise, a tenth of them leaking."""
    base = 30e9 + (np.arange(n) % 7) * 1e9 + rng.normal(0, 5e7, n)
    return base + np.where(np.arange(n) % 10 == 0, 1.2e9 * (t - T0) / 3600, 0.0)


def run_bank(n: int, interval: float, warm: int, ticks: int) -> tuple[float, LeakBank]:
    rng, bank, rows = np.random.default_rng(1), LeakBank(capacity=n), np.arange(n)
    for k in range(warm):
        t = T0 + k * interval
        bank.learn(rows, np.full(n, t), values(rng, n, t))
    start = time.perf_counter()
    for k in range(warm, warm + ticks):
        t = T0 + k * interval
        bank.learn(rows, np.full(n, t), values(rng, n, t))
    return n * ticks / (time.perf_counter() - start), bank


def run_objects(n: int, interval: float, warm: int, ticks: int) -> tuple[float, list[LeakDetector]]:
    rng, dets = np.random.default_rng(1), [LeakDetector() for _ in range(n)]
    for k in range(warm):
        t = T0 + k * interval
        for d, v in zip(dets, values(rng, n, t).tolist(), strict=True):
            d.learn(t, v)
    start = time.perf_counter()
    for k in range(warm, warm + ticks):
        t = T0 + k * interval
        for d, v in zip(dets, values(rng, n, t).tolist(), strict=True):
            d.learn(t, v)
    return n * ticks / (time.perf_counter() - start), dets


def object_bytes(n: int, interval: float, warm: int) -> float:
    """Bytes per object detector with a full window (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _, dets = run_objects(n, interval, warm, 0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(dets) == n
    return (after - before) / n


def bank_bytes(bank: LeakBank, n: int) -> float:
    arrays = [v for v in vars(bank).values() if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in arrays) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--interval", type=float, default=10.0, help="sampling interval, s")
    ap.add_argument("--ticks", type=int, default=120, help="measured samples per series")
    args = ap.parse_args()
    n, interval = args.series, args.interval
    warm = int(2 * 3600 / interval) + 12  # full windows (2 h) and then some
    bank_rate, bank = run_bank(n, interval, warm, args.ticks)
    obj_rate, dets = run_objects(n, interval, warm, args.ticks)
    for row in (0, 1, n - 1):  # the same estimates, or the ratio means nothing
        a, b = bank.estimate(row), dets[row].estimate
        assert (
            a is not None
            and b is not None
            and abs(a.slope_bytes_per_s - b.slope_bytes_per_s)
            <= 1e-9 * max(1.0, abs(b.slope_bytes_per_s))
        ), row
    del dets
    obj_b = object_bytes(min(n, 2000), interval, warm)
    result: dict[str, Any] = {
        "series": n,
        "interval_s": interval,
        "ticks": args.ticks,
        "leak_bank_updates_per_s": round(bank_rate),
        "leak_objects_updates_per_s": round(obj_rate),
        "ratio": round(bank_rate / obj_rate, 2),
        "leak_bank_bytes_per_series": round(bank_bytes(bank, n)),
        "leak_object_bytes_per_series": round(obj_b),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    print(f"{'form':<10} {'updates/s':>12} {'bytes/series':>13}")
    print(f"{'bank':<10} {bank_rate:12,.0f} {result['leak_bank_bytes_per_series']:13,}")
    print(f"{'objects':<10} {obj_rate:12,.0f} {result['leak_object_bytes_per_series']:13,}")
    print(f"bank / objects: {result['ratio']}x  ({n} series, full windows, one core)")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
