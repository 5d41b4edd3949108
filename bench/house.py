"""The house (issue 31) against the code before it, side by side in one run: speed and memory.

Issue 31 moved every detector into one implementation (the banks), moved detector state out
of ``streams/``, split the large modules and changed how the pipelines hand on what a batch
produced. None of it may cost speed or memory. This runs the worker's two hot paths'
benchmarks, each checkout's own copy on its own code, alternating within one run (so a
neighbour's load falls on both alike), ``--rounds`` times:

- ``bench/columnar.py``: the GPU path (decode + pipelines; series updates per second of
  CPU) and the GPU pipeline's memory per series;
- ``bench/requests.py``: the request path (records per second of CPU) and the request
  pipeline's memory per instance series.

``--before DIR`` is a checkout of the code before (``git worktree add /tmp/before
1a542c0``); its packages are imported from there (``bench/transitions.py``'s
``code_command``, as its ``--code`` does), the venv is this one. Prints each figure's
median per side and the ratio after / before (speed: higher is better; memory: lower is
better), and writes ``bench/results/house.json``.

Run: ``python bench/house.py --before /tmp/before`` (about 15 minutes on 2 cores;
``--rounds 1 --quick`` for a look).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

from transitions import code_command  # a sibling script: bench/ is on the path when run

HERE = Path(__file__).resolve().parents[1]
OUT = HERE / "bench" / "results" / "house.json"

# (bench, its arguments, quick arguments, [(figure, path in its results json, better)])
BENCHES: tuple[tuple[str, list[str], list[str], list[tuple[str, tuple[str, ...], str]]], ...] = (
    (
        "columnar",
        ["--hosts", "256", "--ticks", "60"],
        ["--hosts", "64", "--warm-ticks", "200", "--ticks", "20"],
        [
            ("gpu series updates/s", ("timing", "updates_per_s", "decode+pipelines"), "higher"),
            ("gpu pipelines alone", ("timing", "updates_per_s", "pipelines"), "higher"),
            ("gpu bytes/series", ("memory", "bytes_per_series"), "lower"),
        ],
    ),
    (
        "requests",
        [],
        ["--warm", "60", "--seconds", "30", "--memory-hours", "1"],
        [
            ("request records/s", ("timing", "records_per_s", "decode+pipelines"), "higher"),
            ("request bytes/series", ("memory", "bytes_per_series"), "lower"),
        ],
    ),
)


def run_bench(root: Path, name: str, args: list[str]) -> dict[str, Any]:
    """``root``'s ``bench/<name>.py`` on ``root``'s code; its results json (the file the
    checkout keeps is put back as it was: these runs are not its record)."""
    script = root / "bench" / f"{name}.py"
    results = root / "bench" / "results" / f"{name}.json"
    kept = results.read_bytes() if results.exists() else None
    try:
        subprocess.run(
            code_command(root, script, args), check=True, cwd=root, stdout=subprocess.DEVNULL
        )
        out: dict[str, Any] = json.loads(results.read_text())
    finally:
        if kept is not None:
            results.write_bytes(kept)
    return out


def pick(data: dict[str, Any], path: tuple[str, ...]) -> float:
    v: Any = data
    for k in path:
        v = v[k]
    return float(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code before")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smaller fleets, for a look")
    args = ap.parse_args()
    sides = {"before": args.before.resolve(), "after": HERE}
    got: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
    for r in range(args.rounds):
        for name, full, quick, figures in BENCHES:
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                data = run_bench(sides[side], name, quick if args.quick else full)
                for figure, path, _ in figures:
                    got[side].setdefault(figure, []).append(pick(data, path))
                print(f"round {r + 1} {name:<9} {side:<6} done", flush=True)
    rows = []
    print(f"\n{'figure':<24} {'before':>12} {'after':>12} {'after/before':>13}")
    for _, _, _, figures in BENCHES:
        for figure, _, better in figures:
            b, a = (statistics.median(got[s][figure]) for s in ("before", "after"))
            ratio = a / b
            ok = ratio >= 0.95 if better == "higher" else ratio <= 1.05
            runs = {"before": got["before"][figure], "after": got["after"][figure]}
            row = {"figure": figure, "before": b, "after": a, "ratio": ratio}
            rows.append({**row, "better": better, "no_worse": ok, "runs": runs})
            print(f"{figure:<24} {b:>12,.0f} {a:>12,.0f} {ratio:>13.3f}  ({better} is better)")
    meta = {"before": str(sides["before"]), "rounds": args.rounds, "quick": args.quick}
    body = {**meta, "python": platform.python_version(), "figures": rows}
    OUT.write_text(json.dumps(body, indent=2) + "\n")


if __name__ == "__main__":
    main()
