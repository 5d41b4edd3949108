"""How the generic detector scores healthy signals (issue 34: "report the score distribution
of healthy signals").

Plays healthy shapes of the independent harness (``bench/shape_*.py``: no fault in them)
through the worker's pipelines, and every 10 minutes of event time reads the newest score
of every scored signal of every series (``streams/pipelines/scoring.py``), after the
first day (the detector's warm-up and first daily profile). Prints, per kind of series,
how many readings, the quantiles of the score, the share at or above 0.5 and 0.9, and
the share of readings with ``anomalous_signals >= 2`` (what the default rules need, for
15 minutes, to page).

Run: ``python bench/score_distribution.py [--only NAME ...]``; writes
``bench/results/score-distribution.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from shape_kit import DAY  # noqa: E402
from shapes import discover  # noqa: E402

from ragwatch.streams.alerting.rules import load_rules  # noqa: E402
from ragwatch.streams.pipelines.fleet import Pipelines  # noqa: E402
from ragwatch.streams.pipelines.scoring import ScoreBlock  # noqa: E402

HEALTHY = (
    "weekly-10d",
    "real-trace",
    "memory-caching-allocator",
    "memory-reloads",
    "memory-batch-process",
    "memory-batch-in-process",
)
EVERY_S = 600.0


def blocks(pipes: Pipelines) -> dict[str, ScoreBlock]:
    return {
        "gpu": pipes.gpus.scores[True],
        "process": pipes.gpus.scores[False],
        "service": pipes.requests.rows.scores,
        "engine": pipes.metrics.scores,
    }


def readings(block: ScoreBlock) -> tuple[np.ndarray, np.ndarray]:
    """The newest score of every scored signal, and anomalous_signals of every row."""
    rows = np.flatnonzero(block.slot >= 0)
    if not len(rows):
        return np.zeros(0), np.zeros(0)
    m = block.matrix(rows)
    scores = m[:, : block.k].ravel()
    return scores[~np.isnan(scores)], m[:, -1]


def play(shape: Any) -> dict[str, dict[str, list[np.ndarray]]]:
    pipes = Pipelines(load_rules())
    out: dict[str, dict[str, list[np.ndarray]]] = {}
    start = next_at = None
    for env in shape.make():
        pipes.process(env)
        ts = float(getattr(env, "ts", 0.0))
        start = ts if start is None else start
        if ts - start < DAY:
            continue
        if next_at is None or ts >= next_at:
            next_at = ts + EVERY_S
            for kind, block in blocks(pipes).items():
                s, n = readings(block)
                d = out.setdefault(kind, {"scores": [], "anomalous": []})
                d["scores"].append(s)
                d["anomalous"].append(n)
    return out


def summary(parts: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    s = np.concatenate(parts["scores"]) if parts["scores"] else np.zeros(0)
    n = np.concatenate(parts["anomalous"]) if parts["anomalous"] else np.zeros(0)
    if not len(s):
        return {"readings": 0}
    q = np.quantile(s, [0.5, 0.9, 0.99, 0.999])
    return {
        "readings": len(s),
        "p50": round(float(q[0]), 4),
        "p90": round(float(q[1]), 4),
        "p99": round(float(q[2]), 4),
        "p99.9": round(float(q[3]), 4),
        "share_ge_0.5": round(float((s >= 0.5).mean()), 5),
        "share_ge_0.9": round(float((s >= 0.9).mean()), 5),
        "series_readings": len(n),
        "share_two_or_more_anomalous": round(float((n >= 2).mean()), 5) if len(n) else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--only", nargs="+", default=list(HEALTHY))
    args = ap.parse_args()
    shapes, _ = discover()
    total: dict[str, dict[str, list[np.ndarray]]] = {}
    per_shape = {}
    t0 = time.perf_counter()
    for name in args.only:
        got = play(shapes[name])
        per_shape[name] = {kind: summary(parts) for kind, parts in got.items()}
        for kind, parts in got.items():
            t = total.setdefault(kind, {"scores": [], "anomalous": []})
            t["scores"] += parts["scores"]
            t["anomalous"] += parts["anomalous"]
        print(name, json.dumps(per_shape[name]), flush=True)
    result = {
        "shapes": args.only,
        "all": {kind: summary(parts) for kind, parts in total.items()},
        "per_shape": per_shape,
        "every_s": EVERY_S,
        "command": "python bench/score_distribution.py",
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": {"python": platform.python_version(), "arch": platform.machine()},
    }
    print(json.dumps(result["all"], indent=1))
    (BENCH / "results" / "score-distribution.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
