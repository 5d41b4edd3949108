r"""Typed decoding of ``gpu`` messages with msgspec: the worker's fast path.

One pass of msgspec's JSON decoder parses a message and checks every field's type and
range against typed dicts (:class:`GpuWireDict`), in C; what types cannot say (labels
printable, ``fb_used <= fb_total``) is checked after, over the labels only. It accepts only
what :meth:`~ragwatch.schema.GpuEnvelope.from_dict` accepts (a property test in
``tests/unit/test_fast_paths.py`` holds the two together) and returns the same plain dicts
as ``orjson.loads``, less the fields no version of the schema knows (the strict decoder
ignores those too). Anything it refuses (also what the strict decoder would accept, such
as a number nested deeper than msgspec recurses) goes the checked way,
:func:`ragwatch.codec.decode_gpu_wire`, for the same result or the same reason.

>>> d = decode(b'{"v":1,"kind":"gpu","host":"h1","ts":10.0,"gpus":[],"extra":1}')
>>> d
{'v': 1, 'kind': 'gpu', 'host': 'h1', 'ts': 10.0, 'gpus': []}
>>> decode(b'{"v":1,"kind":"gpu","host":"h\\u0007","ts":10.0,"gpus":[]}') is None
True
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict

import msgspec
from msgspec import Meta

from ragwatch.schema import MAX_LABEL_LEN, MAX_UINT, SCHEMA_VERSION, is_label

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
_GPU_LABELS = ("uuid", "name", "mig", "namespace", "pod", "container")
_PROCESS_LABELS = ("name", "container", "namespace", "pod")


def decode(data: bytes) -> dict[str, Any] | None:
    """The wire dict of a valid ``gpu`` message; None if it is not one, or if this path
    cannot tell (the checked path decides)."""
    try:
        typed: Any = _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None
    d: dict[str, Any] = typed  # a GpuWireDict: plain dicts and lists
    for g in d["gpus"]:
        if g["fb_used"] > g["fb_total"]:
            return None
    # JSON strings hold no raw control characters, so in ASCII without escapes (what
    # agents write) or DEL every string is printable; else each label is looked at
    if data.isascii() and b"\\" not in data and b"\x7f" not in data:
        return d
    return d if _labels_ok(d) else None


def _labels_ok(d: Any) -> bool:
    if not d["host"].isprintable():
        return False
    for g in d["gpus"]:
        for name in _GPU_LABELS:
            v = g.get(name)
            if v is not None and not is_label(v):
                return False
        for p in g.get("procs", ()):
            for name in _PROCESS_LABELS:
                v = p.get(name)
                if v is not None and not is_label(v):
                    return False
    return True
