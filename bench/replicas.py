"""How often would replica outliers (``detectors/replicas.py``) flag, and on what? Issue 33's
groundwork: the detector is not wired into the worker yet, and this measures what it
would say before any rule pages on it.

Every request shape of the independent scenario space (``bench/shape_*.py``) is played
through one :class:`~ragwatch.streams.pipelines.fleet.Pipelines` as the worker plays it;
after each wave, each service that moved has its instances compared on a few signals (their
newest close) by a :class:`~ragwatch.detectors.replicas.ReplicaBank`. A streak that becomes
an outlier is a *flag*; one on a fault's target during its window (until an hour after it
ends) belongs to the fault, every other one is false. Printed per shape and signal; the
rate is false flags per instance-signal-day of the shape's healthy series-days.

    python bench/replicas.py [--shape NAME ...] [--for-s 1800] [--z-min 4] [--rel-min 0.5]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from shape_kit import Shape, matches  # noqa: E402
from shapes import discover  # noqa: E402

from ragwatch.detectors.replicas import ReplicaBank, ReplicaParams  # noqa: E402
from ragwatch.streams.alerting.rules import load_rules  # noqa: E402
from ragwatch.streams.pipelines.fleet import Pipelines  # noqa: E402

# signal -> (direction, absolute floor in its units)
SIGNALS = {
    "retriever_p99_ms": ("high", 10.0),
    "e2e_p95_ms": ("high", 50.0),
    "decode_tps": ("low", 2.0),
    "tokens_per_request": ("both", 10.0),
    "errors_ratio": ("high", 0.02),
}


class Watch:
    """The bank fed from the pipelines' tap: each moved service's instances, per signal."""

    def __init__(self, pipes: Pipelines, params: dict[str, Any]) -> None:
        self.pipes = pipes
        self.bank = ReplicaBank(
            signals={
                name: ReplicaParams(direction, abs_floor=floor, **params)  # type: ignore[arg-type]
                for name, (direction, floor) in SIGNALS.items()
            }
        )
        self.last: dict[str, float] = {}
        self.flags: list[tuple[str, str, str, float]] = []  # service, instance, signal, at
        self.members: set[tuple[str, str]] = set()
        self.current: dict[tuple[str, str], set[str]] = {}  # flagged now, per group and signal
        self.first: dict[str, float] = {}  # service -> its first compared close

    def observe(self, source: Any, moved: Any) -> None:
        if source is not self.pipes.requests:
            return
        for service in {m[0] if isinstance(m, tuple) else m for m in moved}:
            self._compare(service)

    def _compare(self, service: str) -> None:
        views = [(k[1], v) for k, v in self.pipes.requests.series.items() if k[0] == service]
        ends = [v.bucket_end for _, v in views if v.bucket_end is not None]
        if not ends or max(ends) <= self.last.get(service, -math.inf):
            return
        t = self.last[service] = max(ends)
        self.first.setdefault(service, t)
        members = [i for i, _ in views]
        self.members.update((service, i) for i in members)
        signals = [v.signals for _, v in views]
        for name in SIGNALS:
            values = [_num(s.get(name)) for s in signals]
            scores = self.bank.update(service, name, t, members, values)
            now = set(scores.flagged())
            before = self.current.get((service, name), set())
            self.flags += [(service, m, name, t) for m in sorted(now - before)]
            self.current[(service, name)] = now


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan


def play(shape: Shape, params: dict[str, Any]) -> dict[str, Any]:
    pipes = Pipelines(load_rules())
    watch = Watch(pipes, params)
    pipes.tap(watch.observe)
    for _ in pipes.run(shape.make()):
        pass
    true, false = [], []
    for service, instance, signal, at in watch.flags:
        labels = {"service": service, "instance": instance}
        hit = any(
            matches(labels, f.target)
            and f.start_ts <= at <= (math.inf if f.end_ts is None else f.end_ts + 3600)
            for f in shape.faults
        )
        (true if hit else false).append((instance, signal, at))
    # instance-signal-days: each service's instances over the span it was compared
    days = len(SIGNALS) * sum(
        sum(1 for s, _ in watch.members if s == svc) * (watch.last[svc] - t0) / 86400
        for svc, t0 in watch.first.items()
    )
    return {
        "shape": shape.name,
        "members": len(watch.members),
        "flags": len(watch.flags),
        "on_faults": len(true),
        "false": len(false),
        "instance_signal_days": round(days, 1),
        "false_per_signal_day": round(len(false) / days, 5) if days else None,
        "false_by_signal": dict(Counter(s for _, s, _ in false)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--for-s", type=float, default=1800.0)
    ap.add_argument("--z-min", type=float, default=4.0)
    ap.add_argument("--rel-min", type=float, default=0.5)
    args = ap.parse_args(argv)
    params = {"for_s": args.for_s, "z_min": args.z_min, "rel_min": args.rel_min}
    shapes, _ = discover()
    names = args.shape or sorted(shapes)
    total_false = total_days = 0.0
    for name in names:
        row = play(shapes[name], params)
        if not row["members"]:
            continue
        total_false += row["false"]
        total_days += row["instance_signal_days"]
        print(row, flush=True)
    if total_days:
        print(f"false flags per instance-signal-day: {total_false / total_days:.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
