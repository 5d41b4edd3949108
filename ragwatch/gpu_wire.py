r"""Typed decoding of ``gpu`` messages with msgspec: the worker's fast path.

One pass of msgspec's JSON decoder parses a message and checks every field's type and
range against typed dicts (:class:`GpuWireDict`), in C; ``fb_used <= fb_total`` is checked
after. It takes only messages in the plain form agents write (:func:`_plain`: ASCII, so
every string is printable; no escapes; every key one the typed dicts name: the colons in the
bytes are counted), and for those it accepts exactly what :meth:`~ragwatch.schema.GpuEnvelope.
from_dict` accepts and returns what ``orjson.loads`` returns (property tests in
``tests/unit/test_fast_paths.py`` hold it to both). Everything else (a field no schema
knows, whose value msgspec would skip unchecked; a label outside ASCII; a number deeper
than msgspec recurses) goes the checked way, :func:`ragwatch.codec.decode_gpu_wire`, for
the same result or the same reason.

>>> d = decode(b'{"v":1,"kind":"gpu","host":"h1","ts":10.0,"gpus":[]}')
>>> d
{'v': 1, 'kind': 'gpu', 'host': 'h1', 'ts': 10.0, 'gpus': []}
>>> decode(b'{"v":1,"kind":"gpu","host":"h1","ts":10.0,"gpus":[],"extra":1e400}') is None
True
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict

import msgspec
from msgspec import Meta

from ragwatch.schema import MAX_LABEL_LEN, MAX_UINT, SCHEMA_VERSION

assert MAX_UINT > 2**63 - 1

# msgspec bounds ints to int64: counts in [2**63, MAX_UINT] (valid, never seen: 8 EiB)
# go the checked way
MAX_INT64 = 2**63 - 1
U64 = Annotated[int, Meta(ge=0, le=MAX_INT64)]
I64 = Annotated[int, Meta(ge=-(2**63), le=MAX_INT64)]
Label = Annotated[str, Meta(max_length=MAX_LABEL_LEN)]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_LEN)]
# numbers: a JSON float stays a float and an int an int, as orjson gives them
NonNegative = Annotated[float, Meta(ge=0.0)] | U64
Number = float | I64

assert SCHEMA_VERSION == 1  # Literal[1] below


class ProcessWire(TypedDict):
    pid: U64
    name: Label
    gpu_mem: U64
    rss: NotRequired[U64 | None]
    container: NotRequired[Label | None]
    dead: NotRequired[bool]
    namespace: NotRequired[Label | None]
    pod: NotRequired[Label | None]


class GpuSampleWire(TypedDict):
    index: U64
    uuid: Name
    name: Label
    fb_used: U64
    fb_total: U64
    mig: NotRequired[Label | None]
    fb_reserved: NotRequired[U64 | None]
    gpu_util: NotRequired[NonNegative | None]
    mem_copy_util: NotRequired[NonNegative | None]
    temp_c: NotRequired[Number | None]
    power_w: NotRequired[NonNegative | None]
    procs: NotRequired[list[ProcessWire]]
    namespace: NotRequired[Label | None]
    pod: NotRequired[Label | None]
    container: NotRequired[Label | None]


class GpuWireDict(TypedDict):
    v: Literal[1]
    kind: Literal["gpu"]
    host: Name
    ts: NonNegative
    gpus: list[GpuSampleWire]


_DECODER = msgspec.json.Decoder(GpuWireDict)


def decode(data: bytes) -> dict[str, Any] | None:
    """The wire dict of a valid ``gpu`` message; None if it is not one, or if this path
    cannot tell (the checked path decides)."""
    if not _plain(data):
        return None
    try:
        typed: Any = _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None
    d: dict[str, Any] = typed  # a GpuWireDict: plain dicts and lists
    keys = len(d)
    for g in d["gpus"]:
        if g["fb_used"] > g["fb_total"]:
            return None
        keys += len(g) + sum(len(p) for p in g.get("procs", ()))
    # every key of the message was read into the dicts (msgspec skips the value of a key
    # it does not know without the checks orjson makes: numbers beyond a double, bytes
    # that are not UTF-8): each key has its colon, so more colons than keys means an
    # unknown key, a duplicate or a colon inside a string (all go the checked way)
    return d if data.count(b":") == keys else None


def _plain(data: bytes) -> bool:
    """What agents write: ASCII without escapes or DEL, so every string in it is printable
    (JSON strings hold no raw control characters)."""
    return data.isascii() and b"\\" not in data and b"\x7f" not in data
