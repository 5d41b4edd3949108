"""The only code in ragwatch that turns records into bytes and bytes into records.

JSON through orjson, UTF-8, one envelope per message.

>>> from ragwatch.schema import GpuEnvelope
>>> data = encode(GpuEnvelope(host="h1", ts=10.0, gpus=()))
>>> data
b'{"v":1,"kind":"gpu","host":"h1","ts":10.0,"gpus":[]}'
>>> decode(data) == GpuEnvelope(host="h1", ts=10.0, gpus=())
True
>>> decode(b'{"v":2,"kind":"gpu"}')
Traceback (most recent call last):
...
ragwatch.errors.SchemaError: v: unsupported schema version 2 (this build reads v=1)
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson

from ragwatch.errors import SchemaError
from ragwatch.schema import (
    KINDS,
    SCHEMA_VERSION,
    Alert,
    Envelope,
    EventEnvelope,
    GpuEnvelope,
    MetricsEnvelope,
    RequestsEnvelope,
)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_E = TypeVar("_E", GpuEnvelope, RequestsEnvelope, EventEnvelope, MetricsEnvelope, Alert)


def to_dict(record: Envelope) -> dict[str, Any]:
    """The JSON object of an envelope, with ``v`` and ``kind`` first."""
    head: dict[str, Any] = {"v": SCHEMA_VERSION, "kind": record.kind}
    if isinstance(record, EventEnvelope):
        # EventEnvelope refuses attrs that clash with these header fields.
        return {**head, "host": record.host, "ts": record.ts, "type": record.type, **record.attrs}
    body = {name: getattr(record, name) for name in record.__dataclass_fields__}
    return {**head, **body}


def encode(record: Envelope) -> bytes:
    """Serialise an envelope to its wire bytes."""
    return orjson.dumps(to_dict(record))


def loads(data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """Parse wire bytes into a JSON object, with size and syntax checks."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise SchemaError(f"message too large: {size} bytes > limit {max_bytes}")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"malformed JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise SchemaError(f"message: expected a JSON object, got {type(obj).__name__}")
    return obj


def from_dict(obj: dict[str, Any]) -> Envelope:
    """Validate a parsed JSON object and build its record (dispatching on ``kind``)."""
    kind = obj.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        v = obj.get("v")
        if v != SCHEMA_VERSION:
            raise SchemaError(f"v: unsupported schema version {v!r} (this build reads v=1)")
        raise SchemaError(f"kind: unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    return cls.from_dict(obj)


def decode(data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Envelope:
    """Parse and validate one message of any kind. Raises SchemaError with a reason."""
    return from_dict(loads(data, max_bytes=max_bytes))


def decode_as(cls: type[_E], data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES) -> _E:
    """Parse and validate one message that must be of ``cls``'s kind."""
    return cls.from_dict(loads(data, max_bytes=max_bytes))
