"""What ``ragwatch replay`` reads: the input files, their lines decoded, in event-time order.

Inputs are JSONL files of envelopes (one encoded envelope per line, as ``ragwatch record``
or ``ragwatch agent --source sim --once --json`` write them; ``.gz`` too), OTLP/JSON lines
(as the Collector's file exporter writes them) and CSV series (``timestamp,value``, NAB's
shape). The envelopes of all JSONL files are sorted together by ``ts`` (a recording is in
consumption order, one partition read ahead of another; ties keep the files' order, then
each file's), with an external merge sort so memory stays bounded
(:mod:`ragwatch.event_order`); CSV series are merged in by a heap, each in its own order.
A line that does not parse is counted with its file, line and reason (:class:`Tally`); it
never stops the replay.

>>> parse_time("2014-04-01 00:05:00"), parse_time("1396310700")
(1396310700.0, 1396310700.0)
"""

from __future__ import annotations

import csv
import gzip
import heapq
import io
import logging
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import orjson

from ragwatch.codec import decode, decode_gpu_wire, decode_requests_wire, gpu_wire
from ragwatch.errors import ConfigError, SchemaError
from ragwatch.event_order import Item, sort_items
from ragwatch.gpu_wire import GpuMessage
from ragwatch.otlp import decode_traces
from ragwatch.progress import Progress
from ragwatch.request_wire import RequestsWire
from ragwatch.schema import (
    Alert,
    EventEnvelope,
    GpuEnvelope,
    MetricsEnvelope,
    RequestsEnvelope,
    Span,
)

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".jsonl.gz", ".csv")
KEEP_BAD = 100  # bad lines kept for the report (all are counted)
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
