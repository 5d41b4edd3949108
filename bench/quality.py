"""Detection quality on NAB: the ``default`` detector next to ``mad`` and the published scores.

Streams every file of the NAB subset in ``../shared/nab`` (data, labels and scorer from
numenta/NAB, see its README) through a fresh detector per file with NAB's own tool
(``tools/run_detector.py``: score first, then learn, ``x = {"value", "t"}``), once per
detector, in the same run: ``default`` and, as the baseline measured alongside, ``mad``.
Prints the three NAB profiles (standard, reward_low_FP_rate, reward_low_FN_rate) next to
the published full-corpus numbers (which come from a larger corpus: orientation only) and
writes ``bench/results/quality.json``.

Run: ``python bench/quality.py [--nab-dir DIR] [--jobs N]`` (about 10 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")
DETECTORS = {
    "default": "ragwatch.detectors.default:DefaultDetector",
    "mad": "ragwatch.detectors.mad:MADDetector",
}
# NAB scoreboard, full corpus (standard, low FP, low FN), from shared/nab/README.md
PUBLISHED = {
    "ARTime": (74.9, 65.1, 80.4),
    "Numenta HTM": (70.1, 63.1, 74.3),
    "contextOSE": (69.9, 67.0, 73.2),
    "windowed Gaussian": (39.6, 20.9, 47.4),
}

# Runs NAB's run_detector.main with the corpus pointed at --nab-dir (its default location is
# fixed relative to the tool itself). Worker processes fork, so they inherit the patch.
_RUNNER = """
import sys
from pathlib import Path
nab = Path(sys.argv[1])
sys.path.insert(0, str(nab / "tools"))
import nabscore, run_detector
nabscore.CORPORA["dev"] = (str(nab / "labels" / "combined_windows.json"), str(nab / "data"))
sys.exit(run_detector.main(sys.argv[2:]))
"""


def run_one(nab_dir: Path, name: str, spec: str, jobs: int) -> dict[str, object]:
    """One detector over the whole subset; returns run_detector's JSON summary."""
    cmd = [sys.executable, "-c", _RUNNER, str(nab_dir), spec, "--with-time"]
    cmd += ["--name", name, "--jobs", str(jobs)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: run_detector failed\n{proc.stdout}\n{proc.stderr}")
    summary: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["wall_s"] = round(time.perf_counter() - start, 2)
    return summary


def table(runs: dict[str, dict[str, object]]) -> str:
    lines = [f"{'detector':<36}" + "".join(f"{p:>20}" for p in PROFILES)]
    for name, summary in runs.items():
        scores = summary["dev"]
        assert isinstance(scores, dict)
        label = f"{name} (this run, subset)"
        lines.append(f"{label:<36}" + "".join(f"{scores[p]:>20.1f}" for p in PROFILES))
    for name, nums in PUBLISHED.items():
        label = f"{name} (published, full)"
        lines.append(f"{label:<36}" + "".join(f"{v:>20.1f}" for v in nums))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--nab-dir",
        type=Path,
        default=REPO.parent / "shared" / "nab",
        help="NAB subset with data/, labels/ and tools/ (default ../shared/nab)",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=RESULTS / "quality.json")
    args = ap.parse_args(argv)
    nab_dir = args.nab_dir.resolve()
    if not (nab_dir / "tools" / "run_detector.py").is_file():
        raise SystemExit(f"no NAB tools in {nab_dir} (use --nab-dir)")

    start = time.perf_counter()
    runs = {name: run_one(nab_dir, name, spec, args.jobs) for name, spec in DETECTORS.items()}
    total = time.perf_counter() - start
    print(
        f"NAB scores on {nab_dir} ({runs['default']['files']} files, "
        f"{runs['default']['rows']} rows)\n"
    )
    print(table(runs))
    for name, s in runs.items():
        print(f"{name}: {s['rows_per_cpu_s']} rows/CPU-s, {s['wall_s']} s wall")
    print(f"total {total:.1f} s")

    result = {
        "nab_dir": str(nab_dir),
        "corpus": "NAB subset (realAWSCloudwatch, artificialWithAnomaly, artificialNoAnomaly)",
        "detectors": {
            name: {
                "spec": s["detector"],
                "scores": s["dev"],
                "rows": s["rows"],
                "rows_per_cpu_s": s["rows_per_cpu_s"],
                "wall_s": s["wall_s"],
            }
            for name, s in runs.items()
        },
        "published_full_corpus": {
            k: dict(zip(PROFILES, v, strict=True)) for k, v in PUBLISHED.items()
        },
        "command": "python bench/quality.py",
        "total_wall_s": round(total, 2),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
