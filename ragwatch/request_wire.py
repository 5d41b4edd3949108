r"""Typed decoding of ``requests`` messages with msgspec: the worker's fast path.

One pass of msgspec's JSON decoder parses a message and checks every field's type and
range against structs that forbid unknown fields (:class:`RequestsWire`), in C; the records
are then built from the structs (a frozen dataclass each, what the pipeline reads). As for
GPU messages (:mod:`ragwatch.gpu_wire`) it takes only the plain form agents and the SDK
write (ASCII without escapes or DEL, so every label is printable), and for those it accepts
exactly what :meth:`~ragwatch.schema.RequestsEnvelope.from_dict` accepts and builds the
same envelope (property tests in ``tests/unit/test_fast_paths.py`` hold it to both).
Anything else (an unknown field, whose value msgspec would not look at as orjson does; an
integer beyond 64 bits; a label outside ASCII) goes the checked way,
:func:`ragwatch.codec.decode_as`, for the same result or the same reason.

>>> env = decode(b'{"v":1,"kind":"requests","service":"rag","instance":"a","ts":2.0,'
...              b'"records":[{"ts":1.5,"status":"ok","e2e_ms":640.0,'
...              b'"context_tokens":2750,"output_tokens":178}]}')
>>> env.service, env.records[0].e2e_ms, env.records[0].stages
('rag', 640.0, {})
>>> decode(b'{"v":1,"kind":"requests","service":"rag","instance":"a","ts":2.0,'
...        b'"records":[],"extra":1e400}') is None
True
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ragwatch.gpu_wire import MAX_INT64, _plain
from ragwatch.schema import MAX_LABEL_LEN, SCHEMA_VERSION, RequestRecord, RequestsEnvelope

assert SCHEMA_VERSION == 1  # Literal[1] below

# A JSON int in a float field becomes that float, as the strict decoder's float() makes it;
# msgspec refuses numbers beyond a double (1e400) where orjson would too.
Time = Annotated[float, Meta(ge=0.0)]
Count = Annotated[int, Meta(ge=0, le=MAX_INT64)]  # beyond int64 (valid): the checked way
Label = Annotated[str, Meta(max_length=MAX_LABEL_LEN)]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_LEN)]


class RecordWire(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One record as the wire has it (:class:`~ragwatch.schema.RequestRecord`'s fields)."""

    ts: Time
    status: Literal["ok", "error"]
    e2e_ms: Time
    context_tokens: Count
    output_tokens: Count
    stages: dict[str, Time] = {}
    queue_ms: Time | None = None
    ttft_ms: Time | None = None


class RequestsWire(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A ``requests`` message (:class:`~ragwatch.schema.RequestsEnvelope` with its header)."""

    v: Literal[1]
    kind: Literal["requests"]
    service: Name
    instance: Name
    ts: Time
    records: list[RecordWire]
    host: Label | None = None
    pid: Count | None = None
    started: Time | None = None


_DECODER = msgspec.json.Decoder(RequestsWire)


def decode_wire(data: bytes) -> RequestsWire | None:
    """The structs of a valid ``requests`` message (what the request pipeline reads: its
    records need not be built as :class:`~ragwatch.schema.RequestRecord` objects, which
    cost more than the parse); None if it is not one, or if this path cannot tell."""
    if not _plain(data):
        return None
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None


def decode(data: bytes) -> RequestsEnvelope | None:
    """The envelope of a valid ``requests`` message; None if it is not one, or if this path
    cannot tell (the checked path decides)."""
    w = decode_wire(data)
    return None if w is None else to_envelope(w)


def to_envelope(w: RequestsWire) -> RequestsEnvelope:
    """The envelope of a message's structs (what the checked path builds from its bytes)."""
    rec = RequestRecord
    records = tuple(
        [
            rec(
                r.ts,
                r.status,
                r.e2e_ms,
                r.context_tokens,
                r.output_tokens,
                r.stages,  # msgspec makes a new dict for each (a default one too)
                r.queue_ms,
                r.ttft_ms,
            )
            for r in w.records
        ]
    )
    return RequestsEnvelope(w.service, w.instance, w.ts, records, w.host or None, w.pid, w.started)
