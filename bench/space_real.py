"""The scenario space's worlds from real systems (``bench/space_worlds.py``), played and summed.

Each draw is a world of :func:`space_worlds.real_world` (a RAG service's two instances on
the shape harness's traffic model, the real trace's request mixes among them, weekly
rhythms and holidays, two hosts x two GPUs of allocators, reloads, batch jobs, maybe a
leak, zero to three faults), played through the worker's pipelines with the shipped rules
(:func:`shape_kit.play`) and scored as the shapes are: a firing of a fault's rules on its
target belongs to it; every other firing at warning or above is a false page.

Run: ``python bench/space_real.py [--draws 40] [--seed0 0] [--jobs N]``; writes
``bench/results/space-real.json`` (every draw and the distribution: false pages by rule
per healthy series-day, pages per rule per fault, delays p50/p90 by fault kind).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes
import space_worlds
from shape_kit import play

RESULTS = Path(__file__).resolve().parent / "results"


def run_draw(seed: int) -> dict[str, Any]:
    cpu = time.process_time()
    row = shapes.summary(play(space_worlds.real_world(seed)))
    return {"seed": seed, **row, "cpu_s": round(time.process_time() - cpu, 1)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    faults = [f for r in rows for f in r["faults"]]
    days = sum(r["series_days"] for r in rows)
    false = Counter(
        rule for r in rows for rule, n in r["false_pages_by_rule"].items() for _ in range(n)
    )
    per_rule = Counter(n for f in faults for n in f["pages_by_rule"].values() if n)
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({f["kind"] for f in faults}):
        fs = [f for f in faults if f["kind"] == kind]
        delays = sorted(f["delay_min"] for f in fs if f["delay_min"] is not None)
        by_kind[kind] = {
            "faults": len(fs),
            "detected": len(delays),
            "delay_min_p50": _pct(delays, 0.5),
            "delay_min_p90": _pct(delays, 0.9),
            "more_than_one_page_per_rule": sum(
                any(n > 1 for n in f["pages_by_rule"].values()) for f in fs
            ),
        }
    one = [all(n <= 1 for n in f["pages_by_rule"].values()) for f in faults]
    return {
        "draws": len(rows),
        "healthy_series_days": round(days, 1),
        "false_pages": sum(false.values()),
        "false_pages_per_healthy_series_day": round(sum(false.values()) / max(days, 1e-9), 5),
        "false_pages_by_rule": dict(false),
        "info_alerts_by_rule": dict(
            Counter(rule for r in rows for rule, n in r["info_by_rule"].items() for _ in range(n))
        ),
        "faults": len(faults),
        "faults_with_at_most_one_page_per_rule": round(sum(one) / max(1, len(faults)), 4),
        "pages_per_rule_histogram": dict(sorted(per_rule.items())),
        "detected": round(sum(f["delay_min"] is not None for f in faults) / max(1, len(faults)), 4),
        "by_kind": by_kind,
        "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
    }


def _pct(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=RESULTS / "space-real.json")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    seeds = range(args.seed0, args.seed0 + args.draws)
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = []
        for row in pool.map(run_draw, seeds):
            rows.append(row)
            print(f"{row['shape']}: {row['series_days']:.0f} series-days, false "
                  f"{row['false_pages_by_rule']}, faults "
                  f"{[(f['kind'], f['pages_by_rule'], f['delay_min']) for f in row['faults']]}",
                  flush=True)  # fmt: skip
            _write(args, rows, start)  # what is done so far, if the run is cut short
    print(json.dumps(_write(args, rows, start), indent=1))
    print(f"wrote {args.out}")
    return 0


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], start: float) -> dict[str, Any]:
    s = summarize(rows)
    out = {
        "command": f"python bench/space_real.py --draws {args.draws} --seed0 {args.seed0}",
        "summary": s,
        "draws": rows,
        "wall_s": round(time.perf_counter() - start, 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return s


if __name__ == "__main__":
    sys.exit(main())
