"""``ragwatch replay`` and ``ragwatch record``: recorded telemetry through the worker's
pipelines, offline, in event time, as fast as the CPU allows.

Replay reads JSONL files of envelopes (one encoded envelope per line, as ``ragwatch
record`` or ``ragwatch agent --source sim --once --json`` write them; ``.gz`` too) and
CSV series (``timestamp,value``, NAB's shape). Envelopes go through
:class:`~ragwatch.streams.pipelines.fleet.Pipelines` with the worker's rules, so they give the
worker's transitions (GPU envelopes decoded to structs and consecutive ones processed
together, as the worker does: :class:`~ragwatch.streams.pipelines.fleet.Run`); a CSV
series has no rule, so each file is scored by one detector (score, then learn) and its
score crossing the threshold fires (up) or resolves (down) an ``AnomalyScore`` alert.
Every input is played in event-time order: the envelopes of all JSONL files are sorted
together by ``ts`` (a recording is in consumption order, one partition read ahead of
another; ties keep the files' order, then each file's), with an external merge sort so
memory stays bounded (:mod:`ragwatch.event_order`); CSV series are merged in by a heap,
each in its own order. A line that does not parse is counted with its file, line and
reason; it never stops the replay.

>>> parse_time("2014-04-01 00:05:00"), parse_time("1396310700")
(1396310700.0, 1396310700.0)
>>> lane = ScoreLane("level", "default", threshold=0.5)
>>> scores = [lane.process(Point(0, float(t), 10.0 + t % 3)) for t in range(300)]
>>> [t.alert.status for t in lane.process(Point(0, 300.0, 90.0))]
['firing']

``record`` consumes the ragwatch topics from the beginning of every partition (assigned,
not subscribed: no group join) and writes the valid envelopes as JSONL, in consumption
order: Kafka's order per key (host, service) is kept.
"""

from __future__ import annotations

import csv
import gzip
import heapq
import io
import logging
import math
import sys
import textwrap
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import msgspec
import orjson

from ragwatch.codec import (
    decode,
    decode_as,
    decode_gpu_wire,
    decode_requests_wire,
    encode,
    gpu_wire,
    to_dict,
)
from ragwatch.config import Settings
from ragwatch.detectors import Detector, make, score_then_learn
from ragwatch.errors import ConfigError, SchemaError
from ragwatch.event_order import Item, sort_items
from ragwatch.gpu_wire import GpuMessage
from ragwatch.otlp import decode_traces
from ragwatch.progress import Progress
from ragwatch.request_wire import RequestsWire
from ragwatch.schema import (
    Alert,
    AlertStatus,
    EventEnvelope,
    GpuEnvelope,
    MetricsEnvelope,
    RequestsEnvelope,
    Span,
    Transition,
)
from ragwatch.streams.alerting.engine import fingerprint
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.fleet import Pipelines, Run
from ragwatch.streams.pipelines.traces import TraceAssembler

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".jsonl.gz", ".csv")
SCORE_RULE = "AnomalyScore"
KEEP_BAD = 100  # bad lines kept for the report (all are counted)
BATCH_RUN = 512  # consecutive GPU (or request) envelopes processed together at most
GPU_LINE = b'{"v":1,"kind":"gpu",'  # how encode() starts a GPU envelope
REQUESTS_LINE = b'{"v":1,"kind":"requests",'  # ... and a requests one


@dataclass(frozen=True, slots=True)
class Traces:
    """One OTLP/JSON line (an ``ExportTraceServiceRequest``, as the Collector's file
    exporter writes them): its spans, at the event time of the newest span's end."""

    ts: float
    spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class GpuWire:
    """One GPU envelope as the worker decodes it (``codec.decode_gpu_wire``): its validated
    message, with its host and event time."""

    host: str
    ts: float
    env: GpuMessage

    @classmethod
    def of(cls, env: GpuMessage) -> GpuWire:
        return cls(env.host, float(env.ts), env)


Telemetry = GpuWire | RequestsEnvelope | RequestsWire | EventEnvelope | MetricsEnvelope | Traces
TOPIC_KINDS: dict[str, type[Any]] = {
    "gpu": GpuEnvelope,
    "requests": RequestsEnvelope,
    "events": EventEnvelope,
    "metrics": MetricsEnvelope,
}


# ---------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class BadLine:
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class Tally:
    """What the readers saw: inputs, bad lines (all counted, the first few kept)."""

    files: int = 0
    envelopes: int = 0
    points: int = 0
    bad: int = 0
    first_bad: list[BadLine] = field(default_factory=list)

    def reject(self, path: Path, line: int, reason: str) -> None:
        self.bad += 1
        if len(self.first_bad) < KEEP_BAD:
            self.first_bad.append(BadLine(str(path), line, reason))
        log.debug("bad line %s:%d: %s", path, line, reason)


@dataclass(frozen=True, slots=True)
class Point:
    """One value of a CSV series (``lane`` = the file's index)."""

    lane: int
    ts: float
    value: float


def input_files(paths: Sequence[Path]) -> list[Path]:
    """Files to replay: each FILE as given, each DIR's *.jsonl, *.jsonl.gz, *.csv sorted."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUFFIXES))
        elif p.exists():
            out.append(p)
        else:
            raise ConfigError(f"replay: {p}: no such file or directory")
    return out


def parse_time(text: str) -> float:
    """Epoch seconds from epoch seconds or ISO 8601 (naive = UTC); ValueError if neither."""
    text = text.strip()
    try:
        ts = float(text)
    except ValueError:
        dt = datetime.fromisoformat(text)
        ts = (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(ts):
        raise ValueError(f"not a finite time: {text!r}")
    return ts


def read_jsonl(path: Path, tally: Tally) -> Iterator[Telemetry]:
    """The valid envelopes of one JSONL file (gzip if it ends in .gz), in event-time order
    (:mod:`ragwatch.event_order`)."""
    return _decoded(sort_items(_lines(path, 0, tally)), [path], tally)


def _lines(path: Path, index: int, tally: Tally) -> Iterator[Item]:
    """Every line of one JSONL file that has an event time, unvalidated (validated once
    in order, by :func:`_decoded`); a line without one is rejected here."""
    n = 0
    try:
        with _open(path) as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                ts = _event_time(raw)
                if ts is None:
                    _reject(path, n, raw, tally)
                    continue
                yield Item(ts, index, n, raw)
    except (OSError, EOFError, zlib.error) as exc:
        tally.reject(path, n + 1, f"unreadable: {exc}")


class _Stamp(msgspec.Struct):
    """A line's ``ts``: the rest of the line is checked as JSON but not built."""

    ts: Any = None


_STAMP = msgspec.json.Decoder(_Stamp)


def _event_time(raw: bytes) -> float | None:
    """A line's event time (None: it has none), read without building the line (it is
    decoded once, in order, later); OTLP/JSON and what msgspec will not read are parsed."""
    if b'"resourceSpans"' not in raw:
        try:
            return _finite(_STAMP.decode(raw).ts)
        except msgspec.ValidationError:
            return None  # not an object
        except (msgspec.DecodeError, RecursionError):
            pass  # malformed, or deeper than msgspec goes: orjson decides
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, dict) and "resourceSpans" in obj:
        return _spans_end(obj)
    return _finite(obj.get("ts") if isinstance(obj, dict) else None)


def _finite(ts: Any) -> float | None:
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return None
    try:
        t = float(ts)
    except OverflowError:  # an int beyond any float (orjson refuses those)
        return None
    return t if math.isfinite(t) else None


def _spans_end(obj: dict[str, Any]) -> float | None:
    """The newest span end of an OTLP/JSON request, epoch seconds (None if it has none)."""
    ends = [
        sp.get("endTimeUnixNano")
        for rs in _dicts(obj.get("resourceSpans"))
        for ss in _dicts(rs.get("scopeSpans"))
        for sp in _dicts(ss.get("spans"))
    ]
    ns = [int(e) for e in ends if isinstance(e, str | int) and str(e).isdigit()]
    return max(ns) / 1e9 if ns else None


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _reject(path: Path, n: int, raw: bytes, tally: Tally) -> None:
    """Why a line is not telemetry (alerts have no ``ts`` and are outputs)."""
    try:
        env = decode(raw)
    except SchemaError as exc:
        tally.reject(path, n, exc.reason)
        return
    if isinstance(env, Alert):
        tally.reject(path, n, "kind 'alert' is an output, not telemetry")
    else:  # every telemetry kind has a valid ts: not reached
        tally.reject(path, n, "no event time")


def _decoded(items: Iterator[Item], paths: Sequence[Path], tally: Tally) -> Iterator[Telemetry]:
    for item in items:
        try:
            if item.raw.lstrip().startswith(b'{"resourceSpans"'):  # OTLP/JSON
                spans = tuple(decode_traces(item.raw, "otlp_json"))
                tally.envelopes += 1
                yield Traces(item.ts, spans)
                continue
            env = _decode(item.raw)
        except SchemaError as exc:
            tally.reject(paths[item.file], item.line, exc.reason)
            continue
        if isinstance(env, Alert):
            tally.reject(paths[item.file], item.line, "kind 'alert' is an output, not telemetry")
            continue
        tally.envelopes += 1
        yield env


def _decode(raw: bytes) -> Telemetry | Alert:
    """One line's envelope; a GPU one as its decoded message: straight from the bytes where the
    line starts as ``encode`` writes it (as the worker decodes it), else through its record
    (as :meth:`Pipelines.gpu` does)."""
    if raw.startswith(GPU_LINE):
        return GpuWire.of(decode_gpu_wire(raw))
    if raw.startswith(REQUESTS_LINE):
        return decode_requests_wire(raw)  # the typed pass into structs, as the worker
    env = decode(raw)
    return GpuWire.of(gpu_wire(env)) if isinstance(env, GpuEnvelope) else env


def read_csv(path: Path, lane: int, tally: Tally) -> Iterator[Point]:
    """The points of one ``timestamp,value`` CSV file (header optional), streamed."""
    line = 0
    try:
        with open(path, newline="", encoding="utf-8") as f:
            cols = (0, 1)
            for line, row in enumerate(csv.reader(f), 1):
                if not "".join(row).strip():
                    continue
                if line == 1 and _is_header(row):
                    named = _columns(row)
                    if named is None:
                        tally.reject(path, 1, f"header {row!r}: expected timestamp,value")
                        return
                    cols = named
                    continue
                point = _point(row, cols, lane)
                if isinstance(point, str):
                    tally.reject(path, line, point)
                    continue
                tally.points += 1
                yield point
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        tally.reject(path, line + 1, f"unreadable: {exc}")


def _point(row: list[str], cols: tuple[int, int], lane: int) -> Point | str:
    """The point of one CSV row, or why there is none."""
    if len(row) <= max(cols):
        return f"expected timestamp,value: got {len(row)} column(s)"
    try:
        ts = parse_time(row[cols[0]])
    except ValueError:
        return f"timestamp: not epoch seconds or ISO 8601: {row[cols[0]]!r}"
    try:
        value = float(row[cols[1]])
    except ValueError:
        return f"value: not a number: {row[cols[1]]!r}"
    if not math.isfinite(value):
        return f"value: not finite: {row[cols[1]]!r}"
    return Point(lane, ts, value)


def _is_header(row: list[str]) -> bool:
    try:
        parse_time(row[0])
    except ValueError:
        return True
    return False


def _columns(header: list[str]) -> tuple[int, int] | None:
    names = [h.strip().lower() for h in header]
    if "timestamp" not in names or "value" not in names:
        return None
    return names.index("timestamp"), names.index("value")


def _open(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def merged(
    files: Sequence[Path], tally: Tally, progress: Progress | None = None
) -> Iterator[Telemetry | Point]:
    """Every file's items in event-time order: the envelopes of all JSONL files sorted
    together (a recording is in consumption order; ties keep the files' order, then each
    file's), CSV series merged in, each in its own order. ``progress`` is told how much
    of the JSONL files was read (the sort reads them all before the first item), then
    how many lines there are to replay."""
    tally.files = len(files)
    csvs: list[Iterable[Telemetry | Point]] = [
        read_csv(p, i, tally) for i, p in enumerate(files) if p.name.endswith(".csv")
    ]
    jsonl = [(i, p) for i, p in enumerate(files) if not p.name.endswith(".csv")]
    lines: Iterator[Item] = (item for i, p in jsonl for item in _lines(p, i, tally))
    if progress is not None:
        lines = _reading(lines, progress, counted=not csvs)
    envelopes = _decoded(sort_items(lines), files, tally)
    if not csvs:
        return iter(envelopes)
    return heapq.merge(envelopes, *csvs, key=lambda item: item.ts)


def _reading(lines: Iterator[Item], progress: Progress, *, counted: bool) -> Iterator[Item]:
    """``lines``, telling ``progress`` the MB read; once all are read, the next phase
    (replaying them: their number is the total, unless CSV series add points)."""
    n = 0
    for item in lines:
        n += 1
        progress.advance(len(item.raw) / 1e6)
        yield item
    progress.phase("replaying", unit="envelopes", total=n if counted else None)


def input_mb(files: Sequence[Path]) -> float | None:
    """The JSONL input's size in MB, None when a file is compressed (its size read is
    not known ahead)."""
    jsonl = [p for p in files if not p.name.endswith(".csv")]
    if any(p.name.endswith(".gz") for p in jsonl):
        return None
    return sum(p.stat().st_size for p in jsonl) / 1e6


# ---------------------------------------------------------------- replaying


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
    detector: str = "default",
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


# ---------------------------------------------------------------- recording


@dataclass
class RecordStats:
    written: int = 0
    invalid: int = 0
    consumed: int = 0


def record(
    settings: Settings,
    out_path: Path,
    *,
    topics: Sequence[str] = tuple(TOPIC_KINDS),
    duration_s: float | None = None,
    max_messages: int | None = None,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
) -> RecordStats:
    """Copy the valid envelopes of ``topics`` (from the beginning) to a JSONL file until
    ``max_messages`` envelopes are written, ``duration_s`` (wall clock) has passed, or
    ``stop`` is set. Kafka's order is kept per partition. How many were written goes to
    ``progress`` (by default on stderr: a bar on a terminal, else a line every 10 s)."""
    from confluent_kafka import KafkaException

    from ragwatch.kafka_admin import check_kafka

    unknown = sorted(set(topics) - set(TOPIC_KINDS))
    if unknown or not topics:
        raise ConfigError(f"record: --topics takes {','.join(TOPIC_KINDS)}; got {unknown}")
    limit = math.inf if max_messages is None else max_messages
    stop = stop or threading.Event()
    check_kafka(settings, "record")  # one line, before any file exists
    try:  # Kafka first: a missing topic leaves no empty file either
        consumer = _assigned_consumer(settings, topics)
    except KafkaException as exc:
        raise ConfigError(f"record: Kafka at {settings.kafka_bootstrap}: {exc}") from None
    deadline = math.inf if duration_s is None else time.monotonic() + duration_s
    try:
        try:
            f = _create(out_path)
        except OSError as exc:
            raise ConfigError(f"record: cannot write {out_path}: {exc.strerror}") from None
        with f:
            kinds = {settings.topic(name): TOPIC_KINDS[name] for name in topics}
            stats = RecordStats()
            progress = progress or Progress("record", "envelopes", total=max_messages)
            progress.note(lambda: _record_note(stats, deadline))
            while stats.written < limit and time.monotonic() < deadline and not stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    _record_one(msg, kinds, f, stats)
                    if stats.written >= limit:
                        break
                progress.update(stats.written)
    finally:
        if progress is not None:
            progress.close(final_line=False)  # the command's last line says it all
        consumer.close()
    return stats


def _record_note(stats: RecordStats, deadline: float) -> str:
    left = deadline - time.monotonic()
    ends = f"; {left:,.0f} s of --duration left" if math.isfinite(deadline) else ""
    return f"{stats.consumed:,} messages read, {stats.invalid:,} invalid{ends}"


def _assigned_consumer(settings: Settings, topics: Sequence[str]) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    conf = {
        **settings.kafka_config(),
        "group.id": f"ragwatch-record-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
    }
    consumer = Consumer(conf)
    assignment = []
    for name in topics:
        topic = settings.topic(name)
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            consumer.close()
            raise ConfigError(f"record: topic {topic} does not exist")
        assignment += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
    consumer.assign(assignment)
    return consumer


def _record_one(
    msg: Any, kinds: dict[str, type[Any]], f: io.BufferedIOBase, stats: RecordStats
) -> None:
    if msg.error() is not None:
        log.warning("record: %s", msg.error())
        return
    stats.consumed += 1
    try:
        env = decode_as(kinds[msg.topic()], msg.value() or b"")
    except SchemaError as exc:
        stats.invalid += 1
        log.warning(
            "record: skipped %s[%d] offset=%d: %s",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc.reason,
        )
        return
    f.write(encode(env) + b"\n")
    stats.written += 1


def _create(path: Path) -> io.BufferedIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "wb")
    return open(path, "wb")
