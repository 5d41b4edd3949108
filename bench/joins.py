"""Same hints, same chart points: what the fleet joins, recorded and compared across code.

``bench/transitions.py`` compares transitions and leaves annotations out; this tool
compares what issue 31's one-way data path moved: the hint of every alert that starts
firing, and every chart point the worker's recorder takes. It plays the fault scenarios
of ``bench/transitions.py``'s ``full`` plan (``leak``, ``throughput``, ``retrieval``,
``outliers``, ``oom``, ``all``) through :class:`~ragwatch.streams.pipelines.fleet.Pipelines`
in runs of 256 envelopes (:class:`~ragwatch.streams.pipelines.fleet.Run`), with a chart
recorder attached as the worker attaches it and taken every 1,000 envelopes.

Run: ``python bench/joins.py --code /tmp/before --write /tmp/joins-before.json`` (the code
before: ``git worktree add /tmp/before <commit>``), then ``python bench/joins.py --check
/tmp/joins-before.json``: exit 1 and the first differences if a hint or a point differs.
Code from before issue 31's step (``Pipelines.observer``) and after (``Pipelines.tap``)
are both played.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transitions as tr

from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines, Run

SCENARIOS = ("leak", "throughput", "retrieval", "outliers", "oom", "all")
TAKE_EVERY = 1000


def attach(pipes: Pipelines) -> SeriesRecorder:
    """A recorder attached as this checkout's worker attaches it."""
    if hasattr(pipes, "tap"):
        rec = SeriesRecorder(pipes.rules)
        pipes.tap(rec.observe)
        return rec
    rec = SeriesRecorder()  # (before: the recorder read the fleet)
    pipes.observer = lambda domain, moved: rec.observe(pipes, domain, moved)  # type: ignore[attr-defined]
    return rec


def play(name: str) -> dict[str, Any]:
    """The hints and chart points of one scenario."""
    pipes = Pipelines(load_rules())
    rec = attach(pipes)
    run = Run(pipes, 256)
    hints: list[list[Any]] = []
    points: dict[str, list[Any]] = {}

    def keep(ts: list[Any]) -> None:
        for t in ts:
            if t.alert.status == "firing" and t.previous != "firing":
                a = t.alert
                hints.append([a.rule, a.fingerprint, a.at, a.annotations.get("hint")])

    def take() -> None:
        for sid, (_, got) in rec.take().items():
            points.setdefault(sid, []).extend(got)

    for i, env in enumerate(tr.envelopes(tr.plan("full")[name])):
        if isinstance(env, tr.GpuEnvelope):
            keep(run.add(tr.gpu_wire(env)))
        elif isinstance(env, tr.RequestsEnvelope):
            keep(run.add(env))
        else:
            keep(run.flush())
            keep(pipes.process(env))
        if i % TAKE_EVERY == TAKE_EVERY - 1:
            keep(run.flush())
            take()
    keep(run.flush())
    take()
    return {"hints": hints, "points": points}


def compare(name: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The first differences of one scenario (none: the same)."""
    out = []
    if want["hints"] != got["hints"]:
        pairs = zip(want["hints"], got["hints"], strict=False)
        first = next(((w, g) for w, g in pairs if w != g), None)
        out.append(f"{name}: hints differ ({len(want['hints'])} vs {len(got['hints'])}): {first}")
    for sid in sorted(set(want["points"]) | set(got["points"])):
        w, g = want["points"].get(sid), got["points"].get(sid)
        if w != g:
            out.append(f"{name}: points of {sid} differ ({len(w or [])} vs {len(g or [])})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="PATH", help="record hints and points")
    mode.add_argument("--check", type=Path, metavar="PATH", help="compare with a recording")
    ap.add_argument("--code", type=Path, metavar="DIR", help="import ragwatch from DIR")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    if args.code is not None:
        rest = [a for a in sys.argv[1:] if a not in ("--code", str(args.code))]
        return subprocess.call(tr.code_command(args.code, Path(__file__), rest))
    names = args.scenarios.split(",")
    got = {}
    for n in names:
        got[n] = play(n)
        points = sum(map(len, got[n]["points"].values()))
        print(f"{n}: {len(got[n]['hints'])} hints, {points} points", flush=True)
    if args.write:
        args.write.write_text(json.dumps({"code": tr.code_version(), "scenarios": got}))
        return 0
    want = json.loads(args.check.read_text())["scenarios"]
    diffs = [d for n in names for d in compare(n, want[n], got[n])]
    print("\n".join(diffs[:20]) if diffs else "the same hints and chart points")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
