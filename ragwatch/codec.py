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

import math
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from ragwatch import gpu_wire as gpu_wire_types
from ragwatch import request_wire as request_wire_types
from ragwatch.catalog import POD_LABELS, PROCESS_POD_LABELS
from ragwatch.errors import SchemaError
from ragwatch.schema import (
    KINDS,
    MAX_UINT,
    SCHEMA_VERSION,
    Alert,
    Envelope,
    EventEnvelope,
    GpuEnvelope,
    MetricsEnvelope,
    RequestsEnvelope,
    is_label,
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


_NO_PROCS: list[Any] = []  # a GPU without "procs" (never mutated)


_label_ok = is_label  # the fast path's name for it


def _opt_count(v: Any) -> bool:
    return v is None or (type(v) is int and 0 <= v <= MAX_UINT)


def _opt_number(v: Any, low: float) -> bool:
    # NaN fails the comparison; bool is not int here (type(True) is bool); ints stay
    # within 64 bits (the strict decoder refuses those beyond float range).
    if type(v) is float:
        return low <= v < math.inf and v != -math.inf  # (a low of -inf let -inf through)
    return v is None or (type(v) is int and low <= v <= MAX_UINT)


def _labels_ok(d: dict[str, Any], names: tuple[str, ...]) -> bool:
    """Whether each of ``names`` is absent, None or a valid label value in ``d``."""
    for name in names:
        v = d.get(name)
        if v is not None and not (type(v) is str and _label_ok(v)):
            return False
    return True


def _gpu_wire_ok(d: dict[str, Any]) -> bool:
    """Cheap, conservative check of a ``gpu`` envelope dict: True only if
    :meth:`GpuEnvelope.from_dict` accepts it (a property test holds the two together);
    False sends the message through the strict decoder for its error."""
    ts = d.get("ts")
    gpus = d.get("gpus")
    host = d.get("host")
    if not (
        type(d.get("v")) is int
        and d["v"] == SCHEMA_VERSION
        and d.get("kind") == "gpu"
        and type(host) is str
        and host
        and _label_ok(host)
        and (
            (type(ts) is float and 0.0 <= ts < math.inf)
            or (type(ts) is int and 0 <= ts <= MAX_UINT)
        )
        and type(gpus) is list
    ):
        return False
    for g in gpus:
        if type(g) is not dict:
            return False
        used, total, index, uuid = (
            g.get("fb_used"),
            g.get("fb_total"),
            g.get("index"),
            g.get("uuid"),
        )
        mig, procs = g.get("mig"), g.get("procs", _NO_PROCS)
        if not (
            type(used) is int
            and type(total) is int
            and 0 <= used <= total <= MAX_UINT
            and type(index) is int
            and 0 <= index <= MAX_UINT
            and type(uuid) is str
            and uuid
            and _label_ok(uuid)
            and type(g.get("name")) is str
            and _label_ok(g["name"])
            and (mig is None or (type(mig) is str and _label_ok(mig)))
            and _opt_count(g.get("fb_reserved"))
            and _opt_number(g.get("gpu_util"), 0.0)
            and _opt_number(g.get("mem_copy_util"), 0.0)
            and _opt_number(g.get("power_w"), 0.0)
            and _opt_number(g.get("temp_c"), -math.inf)
            and (procs is _NO_PROCS or type(procs) is list)
            and (
                (g.get("pod") is None and g.get("namespace") is None and g.get("container") is None)
                or _labels_ok(g, POD_LABELS)
            )
        ):
            return False
        for p in procs:
            if type(p) is not dict:
                return False
            pid, mem, container = p.get("pid"), p.get("gpu_mem"), p.get("container")
            if not (
                type(pid) is int
                and 0 <= pid <= MAX_UINT
                and type(mem) is int
                and 0 <= mem <= MAX_UINT
                and type(p.get("name")) is str
                and _label_ok(p["name"])
                and _opt_count(p.get("rss"))
                and (container is None or (type(container) is str and _label_ok(container)))
                and type(p.get("dead", False)) is bool
                and (
                    (p.get("pod") is None and p.get("namespace") is None)
                    or _labels_ok(p, PROCESS_POD_LABELS)
                )
            ):
                return False
    return True


def decode_gpu_wire(
    data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> gpu_wire_types.GpuMessage:
    """Parse and validate one ``gpu`` message into the structs the GPU pipeline reads
    (:class:`~ragwatch.gpu_wire.GpuMessage`; building ~90 frozen records per host envelope
    cost more than the whole analysis). Accepts and rejects exactly what :func:`decode_as`
    does for :class:`GpuEnvelope`; raises SchemaError with the same reason. Bytes in the
    plain form agents write go through msgspec's typed decoding (:mod:`ragwatch.gpu_wire`);
    what it cannot vouch for goes through orjson and the checks here.

    >>> m = decode_gpu_wire(b'{"v":1,"kind":"gpu","host":"h1","ts":10.0,"gpus":[]}')
    >>> m.host, m.gpus
    ('h1', [])
    """
    if type(data) is bytes and len(data) <= max_bytes:
        typed = gpu_wire_types.decode(data)  # one typed pass, in C; None: not sure
        if typed is not None:
            return typed
    d = loads(data, max_bytes=max_bytes)
    if not _gpu_wire_ok(d):
        GpuEnvelope.from_dict(d)  # raises the precise error; if not, the dict is valid
    return gpu_wire_types.from_mapping(d)


def gpu_wire(env: GpuEnvelope) -> gpu_wire_types.GpuMessage:
    """The structs of a GpuEnvelope (what :func:`decode_gpu_wire` returns for its bytes)."""
    return decode_gpu_wire(encode(env))


def decode_requests_wire(
    data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> request_wire_types.RequestsWire | RequestsEnvelope:
    """Parse and validate one ``requests`` message for the request pipeline: msgspec's
    structs where the typed pass vouches for it (the worker's hot path: no record built),
    else the checked envelope. Accepts and rejects exactly what :func:`decode_as` does
    for :class:`RequestsEnvelope` (SchemaError with the same reason).

    >>> w = decode_requests_wire(b'{"v":1,"kind":"requests","service":"rag",'
    ...                          b'"instance":"a","ts":2.0,"records":[]}')
    >>> type(w).__name__, w.service
    ('RequestsWire', 'rag')
    """
    if type(data) is bytes and len(data) <= max_bytes:
        typed = request_wire_types.decode_wire(data)
        if typed is not None:
            return typed
    return RequestsEnvelope.from_dict(loads(data, max_bytes=max_bytes))


# kinds with a typed pass that builds their record (the GPU one: decode_gpu_wire)
_TYPED: dict[type[Any], Callable[[bytes], Any]] = {RequestsEnvelope: request_wire_types.decode}


def decode_as(cls: type[_E], data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES) -> _E:
    """Parse and validate one message that must be of ``cls``'s kind. ``requests`` bytes in
    the plain form the SDK writes go through msgspec's typed decoding first
    (:mod:`ragwatch.request_wire`, twice as fast); what it cannot vouch for goes the
    checked way, for the same envelope or the same SchemaError."""
    fast = _TYPED.get(cls)
    if fast is not None and type(data) is bytes and len(data) <= max_bytes:
        typed: _E | None = fast(data)
        if typed is not None:
            return typed
    return cls.from_dict(loads(data, max_bytes=max_bytes))
