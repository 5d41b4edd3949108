"""The facts topic's records: what each worker tells the others about the keys it owns.

Every worker publishes, on ``ragwatch.facts`` (one partition, compacted), the facts of its
hosts (:class:`~ragwatch.schema.HostFacts`) and of its service instances
(:class:`~ragwatch.schema.InstanceFacts`) as their event time moves on, and its own
progress (:class:`~ragwatch.schema.WorkerProgress`); every worker reads the whole topic,
so the hint of an alert joins the other side's facts wherever they are consumed
(docs/status.md, "The fleet view"). A record's key names what it is about, so compaction
keeps the newest of each: ``h/<host>``, ``i/<service>/<instance>``, ``w/<worker>``; a
record without a value (a tombstone) says the key is gone.

>>> from ragwatch.schema import HostFacts
>>> key, value = facts_key(HostFacts("h1", 60.0)), encode_facts(HostFacts("h1", 60.0), by="w1")
>>> key
b'h/h1'
>>> value  # doctest: +NORMALIZE_WHITESPACE
b'{"v":1,"by":"w1","host":{"host":"h1","ts":60.0,"leaks":[],"full":[],"gpus":[],"anomalous":[]}}'
>>> decode_facts(value)
('w1', HostFacts(host='h1', ts=60.0, leaks=(), full=(), gpus=(), anomalous=()))
"""

from __future__ import annotations

import msgspec

from ragwatch.errors import SchemaError
from ragwatch.schema import HostFacts, InstanceFacts, WorkerProgress

FACTS_VERSION = 1
FactsRecord = HostFacts | InstanceFacts | WorkerProgress


class _Wire(msgspec.Struct, frozen=True, omit_defaults=True):
    v: int
    by: str
    host: HostFacts | None = None
    instance: InstanceFacts | None = None
    progress: WorkerProgress | None = None


_decoder = msgspec.json.Decoder(_Wire)
_encoder = msgspec.json.Encoder()


def host_key(host: str) -> bytes:
    return f"h/{host}".encode()


def instance_key(service: str, instance: str) -> bytes:
    return f"i/{service}/{instance}".encode()


def worker_key(worker: str) -> bytes:
    return f"w/{worker}".encode()


def facts_key(record: FactsRecord) -> bytes:
    """The record's key on the facts topic (compaction keeps the newest per key)."""
    if isinstance(record, HostFacts):
        return host_key(record.host)
    if isinstance(record, InstanceFacts):
        return instance_key(record.service, record.instance)
    return worker_key(record.worker)


def key_parts(key: bytes) -> tuple[str, str, str]:
    """(kind, name, instance) of a key: ("h", host, ""), ("i", service, instance) or
    ("w", worker, "") (a tombstone names what is gone by its key alone).

    >>> key_parts(instance_key("rag-api", "rag-api-1")), key_parts(host_key("h1"))
    (('i', 'rag-api', 'rag-api-1'), ('h', 'h1', ''))
    """
    kind, _, name = key.decode(errors="replace").partition("/")
    if kind == "i":
        service, _, instance = name.partition("/")
        return kind, service, instance
    return kind, name, ""


def encode_facts(record: FactsRecord, *, by: str) -> bytes:
    """The record as the worker ``by`` publishes it (JSON)."""
    if isinstance(record, HostFacts):
        return _encoder.encode(_Wire(FACTS_VERSION, by, host=record))
    if isinstance(record, InstanceFacts):
        return _encoder.encode(_Wire(FACTS_VERSION, by, instance=record))
    return _encoder.encode(_Wire(FACTS_VERSION, by, progress=record))


def decode_facts(data: bytes) -> tuple[str, FactsRecord]:
    """(the publishing worker, the record); :class:`SchemaError` if it is not one."""
    try:
        wire = _decoder.decode(data)
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise SchemaError(f"facts record: {exc}") from None
    if wire.v != FACTS_VERSION:
        raise SchemaError(f"facts record: version {wire.v}, expected {FACTS_VERSION}")
    found = [r for r in (wire.host, wire.instance, wire.progress) if r is not None]
    if len(found) != 1:
        raise SchemaError("facts record: expected exactly one of host, instance, progress")
    return wire.by, found[0]
