"""``ragwatch replay``: recorded telemetry through the worker's pipelines, offline, in event
time, as fast as the CPU allows.

Replay reads JSONL files of envelopes (one encoded envelope per line, as ``ragwatch
record`` (:mod:`ragwatch.commands.record`) or ``ragwatch agent --source sim --once --json``
write them; ``.gz`` too) and CSV series (``timestamp,value``, NAB's shape), all in
event-time order (:mod:`ragwatch.commands.replay_input` reads them). Envelopes go through
:class:`~ragwatch.streams.pipelines.fleet.Pipelines` with the worker's rules, so they give the
worker's transitions (GPU envelopes decoded to structs and consecutive ones processed
together, as the worker does: :class:`~ragwatch.streams.pipelines.fleet.Run`); a CSV
series has no rule, so each file is scored by one detector (score, then learn: by default
``seasonal``, the worker's baseline) and its score crossing the threshold fires (up) or
resolves (down) an ``AnomalyScore`` alert.
A line that does not parse is counted with its file, line and reason; it never stops the
replay.

>>> lane = ScoreLane("level", "seasonal", threshold=0.5)
>>> scores = [lane.process(Point(0, 60.0 * t, 10.0 + t % 3)) for t in range(300)]
>>> [t.alert.status for t in lane.process(Point(0, 60.0 * 300, 90.0))]
['firing']
"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

from ragwatch.codec import to_dict
from ragwatch.commands.replay_input import (
    GpuWire,
    Point,
    Tally,
    Telemetry,
    Traces,
    input_files,
    input_mb,
    merged,
)
from ragwatch.detectors import Detector, make, score_then_learn
from ragwatch.errors import ConfigError
from ragwatch.progress import Progress
from ragwatch.request_wire import RequestsWire
from ragwatch.schema import Alert, AlertStatus, RequestsEnvelope, Transition
from ragwatch.streams.alerting.engine import fingerprint
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.fleet import Pipelines, Run
from ragwatch.streams.pipelines.traces import TraceAssembler

SCORE_RULE = "AnomalyScore"
BATCH_RUN = 512  # consecutive GPU (or request) envelopes processed together at most


class ScoreLane:
    """One CSV series: a detector, score then learn, and the threshold as its rule."""

    def __init__(self, series: str, detector: str, threshold: float) -> None:
        self.detector: Detector = make(detector)
        self.threshold = threshold
        self.labels = {
            "alertname": SCORE_RULE,
            "severity": "warning",
            "series": series,
            "detector": detector,
        }
        self.fingerprint = fingerprint(SCORE_RULE, self.labels)
        self.firing: Alert | None = None

    def process(self, p: Point) -> list[Transition]:
        score = score_then_learn(self.detector, {"value": p.value, "t": p.ts})
        if (score >= self.threshold) == (self.firing is not None):
            return []
        if self.firing is None:
            self.firing = self._alert("firing", p, score, p.ts, None)
            return [Transition(self.firing, "inactive")]
        resolved = self._alert("resolved", p, score, self.firing.starts_at, p.ts)
        self.firing = None
        return [Transition(resolved, "firing")]

    def _alert(
        self, status: AlertStatus, p: Point, score: float, start: float, end: float | None
    ) -> Alert:
        series = self.labels["series"]
        summary = f"{series}: score {score:.3f} vs threshold {self.threshold:g}, value {p.value:g}"
        return Alert(
            rule=SCORE_RULE,
            severity="warning",
            status=status,
            labels=dict(self.labels),
            annotations={"summary": summary, "score": f"{score:.6f}"},
            value=p.value,
            expected=None,
            starts_at=start,
            ends_at=end,
            fingerprint=self.fingerprint,
            at=p.ts,
        )


class Replay:
    """The worker's pipelines for envelopes, a :class:`ScoreLane` per CSV file."""

    def __init__(
        self, rules: list[Rule], files: Sequence[Path], *, detector: str, threshold: float
    ) -> None:
        self.pipes = Pipelines(rules)
        self.traces = TraceAssembler()
        csvs = {i: p for i, p in enumerate(files) if p.name.endswith(".csv")}
        names = Counter(p.name for p in csvs.values())  # the path only where names clash
        self.lanes = {
            i: ScoreLane(p.name if names[p.name] == 1 else str(p), detector, threshold)
            for i, p in csvs.items()
        }

    def process(self, item: Telemetry | Point) -> list[Transition]:
        """One item's transitions (a GPU envelope a batch of one: :meth:`run` batches)."""
        if isinstance(item, Point):
            return self.lanes[item.lane].process(item)
        if isinstance(item, Traces):  # assembled into request records, as the worker does
            return self._requests(self.traces.add(item.spans))
        out = self._requests(self._done(item.ts))
        if isinstance(item, GpuWire):
            return out + self.pipes.gpu_batch([item.env])
        if isinstance(item, RequestsWire):
            return out + self.pipes.request_batch([item])
        return out + self.pipes.process(item)

    def _done(self, ts: float) -> list[RequestsEnvelope]:
        """The traces done by event time ``ts``, as request envelopes."""
        return self.traces.advance(ts) if self.traces.stats.open else []

    def finish(self) -> list[Transition]:
        """The traces still open at the end of the input: they are done."""
        return self._requests(self.traces.advance(math.inf))

    def _requests(self, envelopes: Sequence[RequestsEnvelope]) -> list[Transition]:
        return self.pipes.request_batch(envelopes) if envelopes else []

    def run(self, items: Iterable[Telemetry | Point]) -> Iterator[Transition]:
        """Every transition of ``items``, then of the traces still open, in order: those of
        :meth:`process` one item at a time, consecutive GPU envelopes processed together,
        and consecutive request envelopes together."""
        run = Run(self.pipes, BATCH_RUN)
        for item in items:
            if not isinstance(item, GpuWire | RequestsEnvelope | RequestsWire):
                yield from run.flush()
                yield from self.process(item)
                continue
            done = self._done(item.ts)  # between the run so far and this envelope
            if done:
                yield from run.flush()
                yield from self._requests(done)
            yield from run.add(item.env if isinstance(item, GpuWire) else item)
        yield from run.flush()
        yield from self.finish()


@dataclass
class RuleCount:
    fired: int = 0
    resolved: int = 0
    first_firing: float | None = None
    firing: set[str] = field(default_factory=set)  # fingerprints firing now


class Summary:
    """Per rule: fired, resolved, still firing at the end, first firing time."""

    def __init__(self) -> None:
        self.rules: dict[str, RuleCount] = {}
        self.first_ts: float | None = None
        self.last_ts: float | None = None

    def see(self, ts: float) -> None:
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)

    def add(self, t: Transition) -> None:
        a = t.alert
        c = self.rules.setdefault(a.rule, RuleCount())
        if a.status == "firing":
            c.fired += 1
            c.firing.add(a.fingerprint)
            if c.first_firing is None:
                c.first_firing = _when(a)
        elif a.status == "resolved" and t.previous == "firing":
            c.resolved += 1
            c.firing.discard(a.fingerprint)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "fired": c.fired,
                "resolved": c.resolved,
                "firing_at_end": len(c.firing),
                "first_firing": c.first_firing,
            }
            for name, c in sorted(self.rules.items())
            if c.fired
        }


def replay(
    paths: Sequence[Path],
    rules: list[Rule],
    out: TextIO,
    *,
    as_json: bool = False,
    pending: bool = False,
    detector: str = "seasonal",
    threshold: float = 0.5,
    err: TextIO | None = None,
    progress: Progress | None = None,
) -> int:
    """Replay ``paths`` and print transitions and the summary; 0 if anything was replayed,
    2 if nothing could be read. How far it got goes to ``progress`` (by default a
    :class:`~ragwatch.progress.Progress` on ``err``: a bar on a terminal, else a line
    every 10 s)."""
    files = input_files(paths)
    if not files:
        raise ConfigError(
            f"replay: no *.jsonl, *.jsonl.gz or *.csv in {', '.join(map(str, paths))}"
        )
    try:
        runner = Replay(rules, files, detector=detector, threshold=threshold)
    except ValueError as exc:
        raise ConfigError(f"replay: {exc}") from None
    tally, summary = Tally(), Summary()
    started = time.perf_counter()
    err = err or sys.stderr
    progress = progress or Progress("replay", "MB", out=err)
    progress.phase("reading", total=input_mb(files))
    progress.note(lambda: f"event time {_iso(summary.last_ts)}" if summary.last_ts else "")
    try:
        for t in _transitions(runner, merged(files, tally, progress), summary, progress):
            summary.add(t)
            if pending or t.notify:
                out.write(_json_line(t) if as_json else _text(t))
    finally:
        progress.close(final_line=False)  # the summary below says it all
    elapsed = time.perf_counter() - started
    _report(tally, summary, elapsed, out, err, as_json)
    return 0 if tally.envelopes + tally.points else 2


def _transitions(
    runner: Replay, items: Iterable[Telemetry | Point], summary: Summary, progress: Progress
) -> Iterator[Transition]:
    return runner.run(_seen(items, summary, progress))


def _seen(
    items: Iterable[Telemetry | Point], summary: Summary, progress: Progress
) -> Iterator[Telemetry | Point]:
    for item in items:
        summary.see(item.ts)
        progress.advance()
        yield item


def _when(a: Alert) -> float:
    return a.at if a.at is not None else (a.ends_at if a.ends_at is not None else a.starts_at)


def _iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_line(t: Transition) -> str:
    obj = {**to_dict(t.alert), "previous": t.previous}
    return orjson.dumps(obj).decode() + "\n"


def _text(t: Transition) -> str:
    a = t.alert
    status = a.status.upper()
    if a.status == "resolved" and t.previous != "firing":
        status = "DROPPED"  # a pending alert whose condition cleared
    labels = " ".join(
        f"{k}={v}" for k, v in a.labels.items() if v and k not in ("alertname", "severity")
    )
    exp = "-" if a.expected is None else f"{a.expected:.4g}"
    head = f"{_iso(_when(a))} {status:<8} {a.severity:<8} {a.rule} {labels} "
    lines = [f"{head}value={a.value:.4g} expected={exp}"]
    if a.status != "resolved":
        lines += [
            textwrap.fill(
                f"{key}: {a.annotations[key]}",
                100,
                initial_indent="    ",
                subsequent_indent="      ",
            )
            for key in ("summary", "hint")
            if key in a.annotations
        ]
    return "\n".join(lines) + "\n"


def _report(
    tally: Tally, summary: Summary, elapsed: float, out: TextIO, err: TextIO, as_json: bool
) -> None:
    n = tally.envelopes + tally.points
    rate = n / elapsed if elapsed > 0 else 0.0
    for bad in tally.first_bad:
        err.write(f"ragwatch replay: bad line {bad}\n")
    if tally.bad > len(tally.first_bad):
        err.write(f"ragwatch replay: ... and {tally.bad - len(tally.first_bad)} more bad lines\n")
    if as_json:
        obj = {
            "kind": "summary",
            "files": tally.files,
            "envelopes": tally.envelopes,
            "points": tally.points,
            "bad_lines": tally.bad,
            "bad": [{"file": b.path, "line": b.line, "reason": b.reason} for b in tally.first_bad],
            "first_ts": summary.first_ts,
            "last_ts": summary.last_ts,
            "elapsed_s": round(elapsed, 3),
            "per_s": round(rate, 1),
            "rules": summary.as_dict(),
        }
        out.write(orjson.dumps(obj).decode() + "\n")
        return
    rows = summary.as_dict()
    if rows:
        width = max(len("RULE"), *map(len, rows))
        out.write(f"\n{'RULE':<{width}}  FIRED  RESOLVED  FIRING AT END  FIRST FIRING\n")
        for name, r in rows.items():
            out.write(
                f"{name:<{width}}  {r['fired']:>5}  {r['resolved']:>8}  "
                f"{r['firing_at_end']:>13}  {_iso(r['first_firing'])}\n"
            )
    else:
        out.write("\nno alert fired\n")
    out.write(
        f"replayed {tally.envelopes:,} envelopes and {tally.points:,} CSV points from "
        f"{tally.files} file(s) in {elapsed:.2f} s ({rate:,.0f}/s); event time "
        f"{_iso(summary.first_ts)} .. {_iso(summary.last_ts)}; {tally.bad} bad line(s)\n"
    )
