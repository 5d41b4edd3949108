"""OTLP traces in: ``ExportTraceServiceRequest`` payloads, as the OpenTelemetry Collector's
Kafka exporter writes them (``otlp_proto``, its default, or ``otlp_json``) and as its file
exporter writes OTLP/JSON lines, decoded into :class:`~ragwatch.schema.Span` records.

Every failure is a :class:`~ragwatch.errors.SchemaError` with a reason (the message is
dead-lettered like any other bad input). Bounded: at most ``MAX_SPANS`` spans a message,
names and labels checked like every label (printable, at most 256 characters), attribute
strings cut to ``MAX_ATTR_LEN``, arrays and maps dropped (no stage or token attribute is
one), of a span's events only the earliest time of :data:`FIRST_CHUNK_EVENTS`, JSON
nesting bounded by the codec's size limit and orjson's depth limit.

``encoding`` is ``otlp_proto``, ``otlp_json`` or ``auto`` (a JSON object starts with
``{`` after optional white space; a protobuf ``ExportTraceServiceRequest`` starts with the
tag of its field 1, ``0x0a``).

>>> import orjson
>>> line = orjson.dumps({"resourceSpans": [{
...     "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "rag"}}]},
...     "scopeSpans": [{"spans": [{
...         "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
...         "name": "GET /ask", "startTimeUnixNano": "1767225600000000000",
...         "endTimeUnixNano": "1767225600812000000", "status": {"code": 2}}]}]}]})
>>> (span,) = decode_traces(line, "auto")
>>> span.service, span.parent_id, round(span.duration_ms), span.error
('rag', None, 812, True)
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import orjson

from ragwatch.codec import MAX_MESSAGE_BYTES
from ragwatch.errors import SchemaError
from ragwatch.schema import MAX_LABEL_LEN, AttrValue, Span, check_label

Encoding = Literal["otlp_proto", "otlp_json", "auto"]
ENCODINGS: tuple[str, ...] = ("otlp_proto", "otlp_json", "auto")
MAX_SPANS = 20_000  # per message: the Collector's batches are far smaller
MAX_ATTR_LEN = 1024
PROCESS_CREATED = "process.creation.time"  # semantic conventions (experimental): ISO 8601
STATUS_ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR
# span events that mark a streamed response's chunks: OpenInference's instrumentations add
# one at the first chunk, OpenLLMetry's one at each (older and newer names); the earliest
# is when the first token came, unless the span dropped events (an SDK keeps the newest
# 128 by default: a long answer's first chunks are gone)
FIRST_CHUNK_EVENTS = frozenset(
    {"First Token Stream Event", "llm.content.completion.chunk", "gen_ai.completion.chunk"}
)


def decode_traces(
    data: bytes, encoding: Encoding = "auto", *, max_bytes: int = MAX_MESSAGE_BYTES
) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``; SchemaError for anything else."""
    if len(data) > max_bytes:
        raise SchemaError(f"message: {len(data)} bytes, over the limit of {max_bytes}")
    if encoding == "auto":
        encoding = "otlp_json" if data.lstrip()[:1] == b"{" else "otlp_proto"
    if encoding == "otlp_json":
        return list(_bounded(_json_spans(data)))
    return list(_bounded(_proto_spans(data)))


def _bounded(spans: Iterable[Span]) -> Iterator[Span]:
    for n, span in enumerate(spans, 1):
        if n > MAX_SPANS:
            raise SchemaError(f"resourceSpans: more than {MAX_SPANS} spans in one message")
        yield span


# ---------------------------------------------------------------- OTLP/JSON


def _json_spans(data: bytes) -> Iterator[Span]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"message: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
        raise SchemaError("message: not an ExportTraceServiceRequest (no resourceSpans list)")
    for i, rs in enumerate(doc.get("resourceSpans", [])):
        where = f"resourceSpans[{i}]"
        rs = _obj(rs, where)
        resource = _json_attributes(_obj(rs.get("resource", {}), f"{where}.resource"), where)
        for j, ss in enumerate(_list(rs.get("scopeSpans", []), f"{where}.scopeSpans")):
            spans = _list(_obj(ss, f"{where}.scopeSpans[{j}]").get("spans", []), where)
            for k, sp in enumerate(spans):
                yield _json_span(_obj(sp, f"{where}.spans[{k}]"), resource, f"{where}.spans[{k}]")


def _json_span(sp: Mapping[str, Any], resource: Mapping[str, AttrValue], where: str) -> Span:
    status = sp.get("status") or {}
    code = status.get("code", 0) if isinstance(status, dict) else 0
    return _span(
        trace_id=_json_id(sp.get("traceId"), 16, f"{where}.traceId"),
        span_id=_json_id(sp.get("spanId"), 8, f"{where}.spanId"),
        parent_id=_json_id(sp.get("parentSpanId"), 8, f"{where}.parentSpanId", optional=True),
        name=sp.get("name", ""),
        start_ns=_json_uint(sp.get("startTimeUnixNano"), f"{where}.startTimeUnixNano"),
        end_ns=_json_uint(sp.get("endTimeUnixNano"), f"{where}.endTimeUnixNano"),
        error=code in (STATUS_ERROR, "STATUS_CODE_ERROR"),
        attributes=_json_attributes(sp, where),
        resource=resource,
        where=where,
        first_chunk_ns=_first_chunk(
            (
                (e.get("name"), _json_uint(e.get("timeUnixNano", 0), f"{where}.events"))
                for e in _list(sp.get("events", []), f"{where}.events")
                if isinstance(e, dict) and e.get("name") in FIRST_CHUNK_EVENTS
            ),
            _json_uint(sp.get("droppedEventsCount", 0), f"{where}.droppedEventsCount"),
        ),
    )


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise SchemaError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise SchemaError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _json_id(v: Any, size: int, where: str, *, optional: bool = False) -> str | None:
    """Hex, as OTLP/JSON writes ids (base64, as a generic protobuf JSON encoder would, is
    read too); an empty parent id is a root span."""
    if v in (None, "") and optional:
        return None
    if not isinstance(v, str):
        raise SchemaError(f"{where}: expected a hex id, got {type(v).__name__}")
    if len(v) == 2 * size:
        try:
            bytes.fromhex(v)
        except ValueError:
            raise SchemaError(f"{where}: not hex") from None
        return v.lower()
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise SchemaError(f"{where}: expected {2 * size} hex digits") from None
    if len(raw) != size:
        raise SchemaError(f"{where}: expected {size} bytes, got {len(raw)}")
    return raw.hex()


def _json_uint(v: Any, where: str) -> int:
    """uint64 fields are decimal strings in OTLP/JSON (integers are read too)."""
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
        raise SchemaError(f"{where}: expected nanoseconds since the epoch")
    return v


def _json_attributes(owner: Mapping[str, Any], where: str) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for i, kv in enumerate(_list(owner.get("attributes", []), f"{where}.attributes")):
        kv = _obj(kv, f"{where}.attributes[{i}]")
        key, value = kv.get("key"), kv.get("value")
        if not isinstance(key, str) or not isinstance(value, dict):
            raise SchemaError(f"{where}.attributes[{i}]: expected a key and a value")
        v = _json_value(value, f"{where}.attributes[{i}]")
        if v is not None:
            out[key[:MAX_ATTR_LEN]] = v
    return out


def _json_value(value: Mapping[str, Any], where: str) -> AttrValue | None:
    if "stringValue" in value and isinstance(value["stringValue"], str):
        return value["stringValue"][:MAX_ATTR_LEN]
    if "boolValue" in value and isinstance(value["boolValue"], bool):
        return value["boolValue"]
    if "intValue" in value:  # int64: a decimal string in OTLP/JSON
        v = value["intValue"]
        try:
            return int(v) if not isinstance(v, bool) else None
        except (TypeError, ValueError):
            raise SchemaError(f"{where}: intValue is not an integer") from None
    if "doubleValue" in value and isinstance(value["doubleValue"], int | float):
        d = float(value["doubleValue"])
        return d if math.isfinite(d) else None
    return None  # arrays, maps, bytes, empty: not read by ragwatch


# ---------------------------------------------------------------- OTLP/protobuf


def _proto_spans(data: bytes) -> Iterator[Span]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise SchemaError(
            f"message: not an OTLP protobuf ExportTraceServiceRequest: {exc}"
        ) from None
    for i, rs in enumerate(req.resource_spans):
        resource = _proto_attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for k, sp in enumerate(ss.spans):
                where = f"resourceSpans[{i}].spans[{k}]"
                yield _span(
                    trace_id=_proto_id(sp.trace_id, 16, f"{where}.traceId"),
                    span_id=_proto_id(sp.span_id, 8, f"{where}.spanId"),
                    parent_id=sp.parent_span_id.hex() if sp.parent_span_id else None,
                    name=sp.name,
                    start_ns=sp.start_time_unix_nano,
                    end_ns=sp.end_time_unix_nano,
                    error=sp.status.code == STATUS_ERROR,
                    attributes=_proto_attributes(sp.attributes),
                    resource=resource,
                    where=where,
                    first_chunk_ns=_first_chunk(
                        ((e.name, e.time_unix_nano) for e in sp.events), sp.dropped_events_count
                    ),
                )


def _proto_id(raw: bytes, size: int, where: str) -> str:
    if len(raw) != size:
        raise SchemaError(f"{where}: expected {size} bytes, got {len(raw)}")
    return raw.hex()


def _proto_attributes(attrs: Iterable[Any]) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for kv in attrs:
        kind = kv.value.WhichOneof("value")
        v: AttrValue | None
        if kind == "string_value":
            v = kv.value.string_value[:MAX_ATTR_LEN]
        elif kind == "bool_value":
            v = kv.value.bool_value
        elif kind == "int_value":
            v = kv.value.int_value
        elif kind == "double_value":
            d = kv.value.double_value
            v = d if math.isfinite(d) else None
        else:
            v = None  # arrays, maps, bytes
        if v is not None:
            out[kv.key[:MAX_ATTR_LEN]] = v
    return out


# ---------------------------------------------------------------- both


def _first_chunk(events: Iterable[tuple[Any, int]], dropped: int) -> int | None:
    """The earliest time (ns) of the events that mark a streamed chunk (0: no time); None
    if there is none, or the span ``dropped`` events (the first chunk's may be one)."""
    times = [t for name, t in events if name in FIRST_CHUNK_EVENTS and t > 0]
    return min(times) if times and not dropped else None


def _span(
    *,
    trace_id: str | None,
    span_id: str | None,
    parent_id: str | None,
    name: Any,
    start_ns: int,
    end_ns: int,
    error: bool,
    attributes: dict[str, AttrValue],
    resource: Mapping[str, AttrValue],
    where: str,
    first_chunk_ns: int | None = None,
) -> Span:
    assert trace_id is not None and span_id is not None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        raise SchemaError(f"{where}: an all-zero trace or span id is invalid")
    if not isinstance(name, str):
        raise SchemaError(f"{where}.name: expected a string")
    if end_ns < start_ns or start_ns == 0:
        raise SchemaError(f"{where}: ends before it starts, or has no start time")
    service = _resource_label(resource, ("service.name",), where) or "unknown_service"
    instance = _resource_label(
        resource, ("service.instance.id", "k8s.pod.name", "host.name"), where
    )
    created = resource.get(PROCESS_CREATED)
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id,
        name=check_label(name[:MAX_LABEL_LEN], f"{where}.name"),
        start_ns=start_ns,
        end_ns=end_ns,
        error=error,
        attributes=attributes,
        service=service,
        instance=instance or service,
        host=_resource_label(resource, ("host.name",), where),
        first_chunk_ns=first_chunk_ns,
        process_created=created if isinstance(created, str) else None,
    )


def _resource_label(
    resource: Mapping[str, AttrValue], keys: tuple[str, ...], where: str
) -> str | None:
    for key in keys:
        v = resource.get(key)
        if isinstance(v, str) and v:
            return check_label(v, f"{where}: resource attribute {key}")
    return None
