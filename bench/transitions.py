"""Same alerts: every transition of the quality scenarios and of the soak, recorded and compared.

Issue 17 (the GPU pipeline's series as arrays, updated a batch at a time) must not change
what alerts do. This tool plays the scenarios through
:class:`~ragwatch.streams.pipelines.fleet.Pipelines`, without Kafka, with the shipped rules,
and writes down every transition (``--write``), or plays them again and compares with what
was written (``--check``).

The runs (plan ``full``, the default):

- the fault scenarios of ``bench/quality.py`` (``leak``, ``throughput``, ``retrieval``,
  ``outliers``, ``oom``, ``all``): 4 hosts x 2 GPUs, 2 services x 2 instances, seed 0,
  10 s samples, quality's hours;
- its 7 healthy days (60 s samples) in quality's three shards: ``healthy/gpu`` (GPU
  telemetry and device events, no services) and one per service (``healthy/rag-api``,
  ``healthy/rag-search``: that service's requests only);
- ``soak``: the telemetry of ``bench/soak.py`` (scenario ``all``, 8 hosts x 4 GPUs, 4
  services, 10 s samples, 24 h, request faults healed after 5 h, seed 7), in the order of
  the soak's offline replay (``ragwatch replay`` sorts by ``ts``, ties in the agent's
  order). The soak starts 2 days before the wall clock, at midnight UTC; here it starts at
  the fixed midnight the scenarios use (2026-01-01), so a recording stays valid. The online
  part of the soak (Kafka, killed workers) is not deterministic and is not played: the
  soak itself checks that it delivers what its offline replay implies.

Plan ``ci`` is small (2 hosts, mostly 60 s samples, GPU telemetry alone but in ``all``): a
healthy day and the leak until the OOM kill (13 h) with a GPU a host; ``all`` for 2 h with
its request faults healed after 30 min and the leak (1.5 h of 10 s samples) with two.
``tests/unit/test_same_alerts.py`` plays it against ``tests/data/transitions/ci.json``.

Feeding. Consecutive GPU envelopes go to ``Pipelines.gpu_batch`` as decoded messages
(``codec.gpu_wire``), and consecutive request envelopes to ``Pipelines.request_batch``, in
runs of up to 256, a run flushed before any envelope of another kind (so the order of the
stream is kept); ``--one-at-a-time``, or code without those seams, feeds
``Pipelines.process`` one envelope at a time.

A transition is recorded as rule, status, previous, labels, ``starts_at``, ``ends_at``,
``at`` (the evaluation's event time) and resolution; annotations are not (hints may change
legitimately), and ``value`` is kept to 6 significant digits apart: a changed value is a
warning. ``--check`` fails (exit 1) when a scenario's transitions differ as a multiset of
those fields (stricter than issue 17's rule, status, labels, ``starts_at``: a batch must not
change ``previous``, ``ends_at``, ``at`` or why an alert resolved either), and says whether
only their order differs (information: ``gpu_batch`` hands
back a run's GPU transitions before its event transitions).

``--code DIR`` plays the ragwatch of another checkout (``git worktree add /tmp/before
2ca3ea7``: the commit before the change) instead of the installed one: the tool runs again
in a child whose ``ragwatch`` packages come from ``DIR`` (its ``pyproject.toml``'s
``package-dir``), with the same venv for the rest.

Run: ``python bench/transitions.py --code /tmp/before --write
bench/results/transitions-before.json`` (the record), then ``python bench/transitions.py
--check bench/results/transitions-before.json [--one-at-a-time] [--scenarios leak,all]``.
The full plan takes ~11 CPU-minutes, ~12 min on 2 cores (``--jobs``, default: every core):
the soak ~5 min, each healthy service shard ~7 min (requests dominate), the rest ~3 min.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import ragwatch
from ragwatch.agents.scenario import build
from ragwatch.agents.sim_requests import service_name
from ragwatch.codec import gpu_wire
from ragwatch.schema import Alert, Envelope, GpuEnvelope, RequestsEnvelope, Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines

FORMAT = 1
BATCH = 256  # GPU envelopes per gpu_batch call, at most
START_TS = 1_767_225_600.0  # 2026-01-01 00:00 UTC, the scenarios' default start
# as bench/quality.py (tests/unit/test_same_alerts.py holds them equal)
FAULT_HOURS = {
    "leak": 3.0,
    "throughput": 2.0,
    "retrieval": 2.0,
    "outliers": 2.0,
    "oom": 13.0,
    "all": 13.0,
}
HEALTHY_DAYS = 7.0
KEY_FIELDS = ("rule", "status", "previous", "labels", "starts_at", "ends_at", "at", "resolution")

Row = dict[str, Any]
Key = tuple[Any, ...]


@dataclass(frozen=True)
class Run:
    """One simulated run. ``only``: ``"gpu"`` keeps GPU telemetry and device events, a
    service name keeps that service's requests, None keeps everything. ``by_ts``: played
    sorted by ``ts`` (stable), as ``ragwatch replay`` plays a recording."""

    scenario: str
    hours: float
    hosts: int = 4
    gpus: int = 2
    services: int = 2
    interval_s: float = 10.0
    seed: int = 0
    only: str | None = None
    heal_after_s: float | None = None
    start_ts: float = START_TS
    by_ts: bool = False


def plan(name: str) -> dict[str, Run]:
    """The runs of plan ``full`` or ``ci``, by name, costliest first."""
    if name == "ci":  # GPU telemetry alone where requests are not the point (they cost)
        day = Run("healthy", 24.0, hosts=2, gpus=1, services=0, interval_s=60.0)
        two = replace(day, gpus=2)
        return {
            "healthy-day": day,
            "all": replace(two, scenario="all", hours=2.0, services=1, heal_after_s=1800.0),
            "leak": replace(two, scenario="leak", hours=1.5, interval_s=10.0),
            # the OOM kill ends the leak at ~12 h
            "leak-to-oom": replace(day, scenario="leak", hours=13.0),
        }
    if name != "full":
        raise ValueError(f"unknown plan {name!r}")
    hours = HEALTHY_DAYS * 24
    runs = {
        "soak": Run(
            "all", 24.0, hosts=8, gpus=4, services=4, seed=7, heal_after_s=5 * 3600.0, by_ts=True
        ),
        **{s: Run(s, h) for s, h in FAULT_HOURS.items()},
        "healthy/gpu": Run("healthy", hours, services=0, interval_s=60.0, only="gpu"),
    }
    for i in range(2):
        svc = service_name(i)
        runs[f"healthy/{svc}"] = Run("healthy", hours, interval_s=60.0, only=svc)
    return runs


def envelopes(run: Run) -> Iterator[Envelope]:
    """The run's telemetry, in the order it is played."""
    world = build(
        run.scenario,
        hosts=run.hosts,
        gpus=run.gpus,
        services=run.services,
        seed=run.seed,
        interval_s=run.interval_s,
        start_ts=run.start_ts,
        heal_after_s=run.heal_after_s,
    )
    kept = (
        e
        for e in world.envelopes(hours=run.hours)
        if not isinstance(e, Alert) and _keep(e, run.only)
    )
    if run.by_ts:
        yield from sorted(kept, key=lambda e: e.ts)
    else:
        yield from kept


def _keep(env: Envelope, only: str | None) -> bool:
    if only is None:
        return True
    if isinstance(env, RequestsEnvelope):
        return env.service == only
    return only == "gpu"


def feed(
    pipes: Pipelines, stream: Iterable[Envelope], *, one_at_a_time: bool = False
) -> Iterator[Transition]:
    """Every transition of ``stream``: consecutive GPU envelopes in ``gpu_batch`` runs of
    up to :data:`BATCH`, consecutive request envelopes in ``request_batch`` runs (where
    the code has them and ``one_at_a_time`` is false), the rest one at a time."""
    gpu = None if one_at_a_time else getattr(pipes, "gpu_batch", None)
    requests = None if one_at_a_time else getattr(pipes, "request_batch", None)
    run: list[Any] = []
    kind = ""
    for env in stream:
        batched = (env.kind == "gpu" and gpu) or (env.kind == "requests" and requests)
        if run and (not batched or env.kind != kind or len(run) >= BATCH):
            yield from (gpu if kind == "gpu" else requests)(run)  # type: ignore[misc]
            run = []
        if not batched:
            yield from pipes.process(env)
            continue
        kind = env.kind
        run.append(gpu_wire(env) if isinstance(env, GpuEnvelope) else env)
    if run:
        yield from (gpu if kind == "gpu" else requests)(run)  # type: ignore[misc]


def row(t: Transition) -> Row:
    """The recorded fields of one transition."""
    a = t.alert
    return {
        "rule": a.rule,
        "status": a.status,
        "previous": t.previous,
        "labels": dict(sorted(a.labels.items())),
        "starts_at": a.starts_at,
        "ends_at": a.ends_at,
        "at": a.at,
        "resolution": a.resolution,
        "value": _sig6(a.value),
    }


def _sig6(v: float) -> float | str:
    return float(f"{v:.6g}") if math.isfinite(v) else str(v)


def play(name: str, run: Run, *, one_at_a_time: bool = False) -> dict[str, Any]:
    """Plays ``run`` with the shipped rules; its transitions as rows, and what it took."""
    start = time.perf_counter()
    pipes = Pipelines(load_rules())
    counted = _Counted(envelopes(run))
    rows = [row(t) for t in feed(pipes, counted, one_at_a_time=one_at_a_time)]
    wall = round(time.perf_counter() - start, 2)
    return {"name": name, "run": asdict(run), "envelopes": counted.n, "wall_s": wall, "rows": rows}


class _Counted:
    def __init__(self, items: Iterable[Envelope]) -> None:
        self.items, self.n = items, 0

    def __iter__(self) -> Iterator[Envelope]:
        for item in self.items:
            self.n += 1
            yield item


def play_all(runs: dict[str, Run], *, one_at_a_time: bool, jobs: int) -> Iterator[dict[str, Any]]:
    """Every run's result, in order; ``jobs`` run at a time (forked processes)."""
    if jobs <= 1 or len(runs) == 1:
        for name, run in runs.items():
            yield play(name, run, one_at_a_time=one_at_a_time)
        return
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(jobs, len(runs)), mp_context=ctx) as pool:
        futures = [
            pool.submit(play, name, run, one_at_a_time=one_at_a_time) for name, run in runs.items()
        ]
        for f in futures:
            yield f.result()


# ---------------------------------------------------------------------- comparing


def key(r: Row) -> Key:
    """What must not change: every recorded field but ``value``."""
    return tuple(tuple(sorted(r[f].items())) if f == "labels" else r[f] for f in KEY_FIELDS)


@dataclass
class Diff:
    """How one scenario's transitions compare with the recorded ones."""

    want: int
    got: int
    missing: list[Row]  # recorded, not produced (multiset difference)
    extra: list[Row]  # produced, not recorded
    order_at: int | None  # first index at which the order differs (multisets equal)
    value_changes: list[tuple[Row, Row]]  # same key, another value (warnings)

    @property
    def same(self) -> bool:
        return not self.missing and not self.extra


def compare(want: Sequence[Row], got: Sequence[Row]) -> Diff:
    """``got`` against ``want``: the multiset difference of the keys, where the order first
    differs, and the changed values."""
    wk, gk = [key(r) for r in want], [key(r) for r in got]
    missing = _minus(want, wk, Counter(gk))
    extra = _minus(got, gk, Counter(wk))
    order_at = None
    if not missing and not extra:
        order_at = next((i for i, (a, b) in enumerate(zip(wk, gk, strict=True)) if a != b), None)
    if not missing and not extra and order_at is None:
        pairs: Iterable[tuple[Row, Row]] = zip(want, got, strict=True)
    else:  # pair the rows of each key in their order
        by_key: dict[Key, list[Row]] = {}
        for r, k in zip(got, gk, strict=True):
            by_key.setdefault(k, []).append(r)
        pairs = [(r, by_key[k].pop(0)) for r, k in zip(want, wk, strict=True) if by_key.get(k)]
    changes = [(a, b) for a, b in pairs if a["value"] != b["value"]]
    return Diff(len(want), len(got), missing, extra, order_at, changes)


def _minus(rows: Sequence[Row], keys: Sequence[Key], other: Counter[Key]) -> list[Row]:
    left = Counter(other)
    out = []
    for r, k in zip(rows, keys, strict=True):
        if left[k] > 0:
            left[k] -= 1
        else:
            out.append(r)
    return out


def report(name: str, diff: Diff, wall_s: float, *, show: int = 5) -> list[str]:
    """Lines that say how ``name`` compares."""
    verdict = "same" if diff.same else "DIFFERENT"
    lines = [f"{name}: {diff.got} transitions (recorded {diff.want}), {verdict}, {wall_s:.1f} s"]
    for label, rows in (("missing", diff.missing), ("extra", diff.extra)):
        if rows:
            lines.append(f"  {len(rows)} {label}:")
            lines += [f"    {_brief(r)}" for r in rows[:show]]
    if diff.order_at is not None:
        lines.append(f"  info: same multiset, order differs from index {diff.order_at}")
    if diff.value_changes:
        lines.append(f"  warning: {len(diff.value_changes)} values changed:")
        lines += [
            f"    {_brief(a)}: {a['value']} -> {b['value']}" for a, b in diff.value_changes[:show]
        ]
    return lines


def _brief(r: Row) -> str:
    labels = ",".join(f"{k}={v}" for k, v in r["labels"].items() if k not in _QUIET)
    ends = "" if r["ends_at"] is None else f" ends_at={r['ends_at']}"
    res = "" if r["resolution"] is None else f" ({r['resolution']})"
    return (
        f"{r['rule']} {r['previous']}->{r['status']}{res} {{{labels}}} "
        f"starts_at={r['starts_at']}{ends} at={r['at']}"
    )


_QUIET = {"alertname", "severity", "team", "uuid", "mig", "container", "gpu_name"}


# ---------------------------------------------------------------------- files

# Imports ragwatch from the checkout in argv[1] (its pyproject's package-dir), ahead of the
# editable install's finder, then runs argv[2] with the arguments after it.
_WITH_CODE = """
import runpy, sys, tomllib
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location
from pathlib import Path

root = Path(sys.argv[1]).resolve()
with open(root / "pyproject.toml", "rb") as f:
    dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
mapping = {name: root / d for name, d in dirs.items()}


class Finder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in mapping:
            d = mapping[fullname]
            init = d / "__init__.py"
            return spec_from_file_location(fullname, init, submodule_search_locations=[str(d)])
        parent = fullname.rpartition(".")[0]
        if parent in mapping:
            return PathFinder.find_spec(fullname, [str(mapping[parent])])
        return None


sys.meta_path.insert(0, Finder)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def with_code(root: Path, argv: Sequence[str]) -> int:
    """This tool's run with ``argv`` less ``--code``, importing ragwatch from ``root``."""
    rest, args = [], iter(argv)
    for a in args:
        if a == "--code":
            next(args, None)
        elif not a.startswith("--code="):
            rest.append(a)
    if not (root / "pyproject.toml").is_file():
        raise SystemExit(f"--code {root}: no pyproject.toml there")
    cmd = code_command(root, Path(__file__).resolve(), rest)
    return subprocess.run(cmd, check=False).returncode


def code_command(root: Path, script: Path, args: Sequence[str]) -> list[str]:
    """The command that runs ``script`` with ``args`` in this venv, its ``ragwatch``
    packages imported from the checkout ``root`` (``bench/house.py`` uses it too)."""
    return [sys.executable, "-c", _WITH_CODE, str(root), str(script), *args]


def code_version() -> dict[str, Any]:
    """Where the ragwatch that runs comes from: its checkout and commit."""
    root = Path(ragwatch.__file__).resolve().parents[1]

    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
        return proc.stdout.strip()

    commit = git("rev-parse", "HEAD")  # "" outside a git checkout
    dirty = bool(commit) and bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"root": str(root), "commit": commit, "dirty": dirty}


def write(path: Path, header: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """The recording: a header, then per scenario its run and its rows, a row a line."""
    parts = [json.dumps(header)[:-1] + ', "scenarios": {']
    for i, r in enumerate(results):
        head = {k: r[k] for k in ("run", "envelopes", "wall_s")}
        rows = ",\n".join(json.dumps(x) for x in r["rows"])
        comma = "," if i < len(results) - 1 else ""
        parts.append(
            f'{json.dumps(r["name"])}: {json.dumps(head)[:-1]}, "transitions": [\n{rows}]}}{comma}'
        )
    parts.append("}}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise SystemExit(f"{path}: format {data.get('format')!r}, this tool reads {FORMAT}")
    return data


def recorded_runs(data: dict[str, Any]) -> dict[str, Run]:
    names = {f.name for f in fields(Run)}
    return {
        name: Run(**{k: v for k, v in s["run"].items() if k in names})
        for name, s in data["scenarios"].items()
    }


def _pick(runs: dict[str, Run], wanted: str | None) -> dict[str, Run]:
    if not wanted:
        return runs
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in runs]
    if unknown:
        raise SystemExit(f"unknown scenarios {', '.join(unknown)}; known: {', '.join(runs)}")
    return {n: runs[n] for n in names}


def _counts(rows: Sequence[Row]) -> str:
    c = Counter(r["status"] for r in rows)
    return ", ".join(f"{s} {c[s]}" for s in ("pending", "firing", "resolved") if c[s])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="PATH", help="record the transitions")
    mode.add_argument("--check", type=Path, metavar="PATH", help="compare with a recording")
    ap.add_argument("--plan", choices=("full", "ci"), default="full", help="with --write")
    ap.add_argument("--scenarios", help="a comma-separated subset (default: all)")
    ap.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="Pipelines.process, never gpu_batch or request_batch",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--code", type=Path, metavar="DIR", help="import ragwatch from DIR")
    args = ap.parse_args(argv)
    if args.code is not None:
        return with_code(args.code, sys.argv[1:] if argv is None else argv)

    version = code_version()
    feed_mode = "one_at_a_time" if args.one_at_a_time else "batches"
    print(
        f"ragwatch from {version['root']} at {version['commit'][:12]}"
        f"{' (dirty)' if version['dirty'] else ''}; feeding {feed_mode}",
        flush=True,
    )
    started = time.perf_counter()
    if args.write:
        runs = _pick(plan(args.plan), args.scenarios)
        results = []
        for r in play_all(runs, one_at_a_time=args.one_at_a_time, jobs=args.jobs):
            print(
                f"{r['name']}: {len(r['rows'])} transitions ({_counts(r['rows'])}), "
                f"{r['envelopes']} envelopes, {r['wall_s']:.1f} s",
                flush=True,
            )
            results.append(r)
        header = {"format": FORMAT, "plan": args.plan, "feed": feed_mode, "code": version}
        write(args.write, header, results)
        print(
            f"wrote {args.write} ({args.write.stat().st_size} bytes), "
            f"{time.perf_counter() - started:.1f} s"
        )
        return 0
    data = read(args.check)
    runs = _pick(recorded_runs(data), args.scenarios)
    print(
        f"against {args.check}: recorded from {data['code']['root']} at "
        f"{data['code']['commit'][:12]}, feeding {data['feed']}",
        flush=True,
    )
    failed = []
    for r in play_all(runs, one_at_a_time=args.one_at_a_time, jobs=args.jobs):
        diff = compare(data["scenarios"][r["name"]]["transitions"], r["rows"])
        print("\n".join(report(r["name"], diff, r["wall_s"])), flush=True)
        if not diff.same:
            failed.append(r["name"])
    took = f"{time.perf_counter() - started:.1f} s"
    if failed:
        print(f"FAIL: {', '.join(failed)} differ ({took})")
        return 1
    print(f"OK: {len(runs)} scenarios give the recorded transitions ({took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
