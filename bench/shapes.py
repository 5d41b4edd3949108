"""Play the independent scenarios (issue 30) and print how ragwatch did on each.

Shapes register in ``bench/shape_*.py`` modules (``SHAPES``: a list of
:class:`shape_kit.Shape`, or a function returning one); this plays each through the worker's
pipelines with the shipped rules (:func:`shape_kit.play`) and prints a table: each fault's
pages, delay and resolution against its acceptance, the false pages by rule, and the
verdict. A module may also hold ``INFO_FREE_AFTER`` ({shape: ts}): info alerts after ``ts``
fail that shape too (the real trace: no RequestOutlierCluster after its first day).

Run: ``python bench/shapes.py [--only NAME ...] [--list] [--jobs N] [--json]``. Writes
``bench/results/shapes.json`` (not with ``--only``: a partial run would overwrite the
whole table).
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from shape_kit import MINUTE, Outcome, Shape, play

import ragwatch

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "shapes.json"


def discover() -> tuple[dict[str, Shape], dict[str, float]]:
    """Every registered shape by name, and the info-free times; a module that does not
    import yet (another helper's, being written) is left out with a note on stderr."""
    shapes: dict[str, Shape] = {}
    quiet: dict[str, float] = {}
    for path in sorted(BENCH.glob("shape_*.py")):
        if path.stem == "shape_kit":
            continue
        try:
            module = importlib.import_module(path.stem)
        except Exception as exc:  # report it and go on with the others
            print(f"skipped {path.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        found = getattr(module, "SHAPES", [])
        for s in found() if callable(found) else found:
            shapes[s.name] = s
        quiet.update(getattr(module, "INFO_FREE_AFTER", {}))
    return shapes, quiet


def summary(o: Outcome, info_free_after: float | None = None) -> dict[str, Any]:
    """One shape's outcome as plain data, with its verdict."""
    late_info = [f for f in o.info if info_free_after is not None and f.at >= info_free_after]
    failures = [f"{f.expect.kind}: {', '.join(f.failures)}" for f in o.faults if f.failures]
    if o.false_pages:
        failures.append(f"{len(o.false_pages)} false pages")
    if late_info:
        failures.append(f"{len(late_info)} info alerts after the first day")
    return {
        "shape": o.shape,
        "ok": not failures,
        "failures": failures,
        "faults": [_fault(f) for f in o.faults],
        "false_pages": len(o.false_pages),
        "false_pages_by_rule": dict(Counter(f.rule for f in o.false_pages)),
        "false_pages_near_a_fault": sum(f.near is not None for f in o.false_pages),
        "false_page_list": [_firing(f) for f in o.false_pages][:50],
        "info_by_rule": dict(Counter(f.rule for f in o.info)),
        "info_after_first_day": len(late_info) if info_free_after is not None else None,
        "series_days": o.series_days,
        "false_pages_per_series_day": round(o.false_pages_per_series_day, 4),
        "envelopes": o.envelopes,
        "wall_s": o.wall_s,
    }


def _fault(f: Any) -> dict[str, Any]:
    e = f.expect
    return {
        "kind": e.kind,
        "target": e.target,
        "rules": list(e.rules),
        "pages": f.pages,
        "pages_by_rule": f.pages_by_rule,
        "delay_min": None if f.delay_s is None else round(f.delay_s / MINUTE, 1),
        "max_delay_min": None if e.max_delay_s is None else round(e.max_delay_s / MINUTE, 1),
        "resolved_after_min": None
        if f.resolved_after_s is None
        else round(f.resolved_after_s / MINUTE, 1),
        "resolved_during": f.resolved_during,
        "failures": list(f.failures),
    }


def _firing(f: Any) -> dict[str, Any]:
    keep = ("service", "instance", "host", "gpu", "pid")
    labels = {k: v for k, v in f.labels.items() if k in keep}
    return {"rule": f.rule, "severity": f.severity, "labels": labels, "at": f.at, "near": f.near}


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'shape':<26}{'verdict':<8}{'faults (pages, delay min / max, resolved after min)':<58}"
    lines = [head + f"{'false pages (by rule)':<40}{'info':<30}{'series-d':>9}{'wall s':>8}"]
    for r in rows:
        faults = "; ".join(
            f"{f['kind']} {f['pages']}p {f['delay_min'] if f['delay_min'] is not None else '-'}"
            f"/{f['max_delay_min'] if f['max_delay_min'] is not None else '-'}"
            + (f" r{f['resolved_after_min']}" if f["resolved_after_min"] is not None else "")
            for f in r["faults"]
        )
        false = f"{r['false_pages']} {r['false_pages_by_rule'] or ''}"
        info = str(r["info_by_rule"] or "")
        lines.append(
            f"{r['shape']:<26}{'ok' if r['ok'] else 'FAIL':<8}{faults or '-':<58}{false:<40}"
            f"{info:<30}{r['series_days']:>9.1f}{r['wall_s']:>8.0f}"
        )
        lines += [f"{'':<26}  - {why}" for why in r["failures"]]
    return "\n".join(lines)


_REGISTRY: tuple[dict[str, Shape], dict[str, float]] = ({}, {})  # what forked workers play


def _play(name: str) -> dict[str, Any]:
    shapes, quiet = _REGISTRY
    try:
        return summary(play(shapes[name]), quiet.get(name))
    except Exception as exc:  # a broken shape (or ragwatch mid-change) fails alone
        why = f"error: {type(exc).__name__}: {exc}"
        return {"shape": name, "ok": False, "failures": [why], "faults": [], "false_pages": 0,
                "false_pages_by_rule": {}, "info_by_rule": {}, "series_days": 0.0,
                "wall_s": 0.0}  # fmt: skip


def run(
    shapes: dict[str, Shape], quiet: dict[str, float], jobs: int, names: list[str] | None = None
) -> list[dict[str, Any]]:
    """Play ``names`` (default: all) of ``shapes``, in ``jobs`` forked processes, each with
    its :func:`summary` (``quiet``: the info-free times)."""
    global _REGISTRY
    _REGISTRY = shapes, quiet
    names = list(shapes) if names is None else names
    if jobs <= 1:
        return [_done(_play(n)) for n in names]
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        longest_first = sorted(names, key=lambda n: -shapes[n].series_days)  # a rough cost
        futures = {pool.submit(_play, n): n for n in longest_first}
        rows = {futures[f]: _done(f.result()) for f in as_completed(futures)}
    return [rows[n] for n in names]


def _done(row: dict[str, Any]) -> dict[str, Any]:
    """A line on stderr as each shape ends (a full run takes minutes)."""
    print(f"  {row['shape']}: {'ok' if row['ok'] else row['failures']}", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--list", action="store_true", help="list the shapes and what they model")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    shapes, quiet = discover()
    if args.list:
        for s in shapes.values():
            print(f"{s.name:<26}{len(s.faults)} faults, {s.series_days:6.1f} series-days: {s.note}")
        return 0
    unknown = sorted(set(args.only or ()) - set(shapes))
    if unknown:
        ap.error(f"no such shape: {', '.join(unknown)} (known: {', '.join(shapes)})")
    names = args.only or list(shapes)
    start = time.perf_counter()
    rows = run(shapes, quiet, args.jobs, names)
    wall = time.perf_counter() - start
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    print(f"\n{wall:.0f} s wall on {args.jobs} processes", file=sys.stderr)
    if not args.only:
        _write(rows, wall)
    return 0


def _code() -> dict[str, str]:
    """Which ragwatch was played: its directory (a snapshot on PYTHONPATH, or the working
    tree) and the repository's commit."""
    head = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=BENCH, capture_output=True, text=True
    )
    return {"ragwatch": str(Path(ragwatch.__file__).resolve().parent), "git": head.stdout.strip()}


def _write(rows: list[dict[str, Any]], wall: float) -> None:
    days = sum(r["series_days"] for r in rows)
    false = sum(r["false_pages"] for r in rows)
    out = {
        "command": "python bench/shapes.py",
        "summary": {
            "shapes": len(rows),
            "ok": sum(r["ok"] for r in rows),
            "series_days": round(days, 1),
            "false_pages": false,
            "false_pages_per_series_day": round(false / days, 4) if days else None,
        },
        "shapes": rows,
        "code": _code(),
        "wall_s": round(wall, 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
