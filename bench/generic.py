"""The generic detector's bank: microseconds per row-update and bytes per row.

One :class:`~ragwatch.detectors.generic.GenericBank` of ``--rows`` rows (10,000), each
call updating every row at once (event time advancing 60 s a call, noisy values with
a daily rhythm), repeated; the first ``--warm`` calls are not timed. Also times the
one-row view (score_one then learn_one, as NAB's tool drives it).

Run: ``python bench/generic.py [--rows N] [--calls N]``; writes ``bench/results/generic.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from ragwatch.detectors.generic import GenericBank, GenericDetector

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
T0 = 1_767_225_600.0


def bank_speed(rows: int, calls: int, warm: int) -> dict[str, float]:
    bank = GenericBank(capacity=rows)
    rng = np.random.default_rng(0)
    r = np.arange(rows)
    base = rng.uniform(1.0, 1e9, rows)
    times = []
    for i in range(warm + calls):
        t = T0 + 60.0 * i
        x = base * (1 + 0.1 * np.sin(2 * np.pi * t / 86400)) + rng.normal(0, 0.01, rows) * base
        start = time.perf_counter()
        bank.update(r, t, x)
        if i >= warm:
            times.append(time.perf_counter() - start)
    per_row = float(np.median(times)) / rows * 1e6
    return {
        "rows": rows,
        "calls_timed": calls,
        "us_per_row_update_median": round(per_row, 3),
        "us_per_row_update_best": round(min(times) / rows * 1e6, 3),
        "bytes_per_row": bank.nbytes() / bank.capacity,
    }


def view_speed(n: int) -> dict[str, float]:
    det = GenericDetector()
    rng = np.random.default_rng(1)
    xs = [{"value": float(v), "t": T0 + 60.0 * i} for i, v in enumerate(rng.normal(0, 1, n))]
    start = time.perf_counter()
    for x in xs:
        det.score_one(x)
        det.learn_one(x)
    return {
        "observations": n,
        "us_per_score_and_learn": round((time.perf_counter() - start) / n * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS / "generic.json")
    args = ap.parse_args(argv)
    result = {
        "bank": bank_speed(args.rows, args.calls, args.warm),
        "view": view_speed(5000),
        "command": "python bench/generic.py",
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "platform": platform.platform(),
        },
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
