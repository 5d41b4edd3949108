"""Wire format: every envelope kind round-trips through the codec, and every way a message
can be wrong is refused with a :class:`~ragwatch.errors.SchemaError` naming the field.

Tests go through the public entry points only (``codec.encode/decode/decode_as/from_dict``
and the records' ``from_dict``); no mocks.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch import codec
from ragwatch.errors import RagwatchError, SchemaError
from ragwatch.schema import (
    KINDS,
    SCHEMA_VERSION,
    Alert,
    EventEnvelope,
    GpuEnvelope,
    GpuSample,
    ProcessSample,
    RequestRecord,
    RequestsEnvelope,
)

# Deterministic hypothesis runs: fixed seed, no example database written to disk.
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)

FieldPath = tuple[str | int, ...]

# ---------------------------------------------------------------- valid messages


def gpu_dict() -> dict[str, Any]:
    """A valid ``gpu`` message: one full GPU with processes, one MIG slice with nulls."""
    return {
        "v": 1,
        "kind": "gpu",
        "host": "node-a",
        "ts": 1_700_000_000.25,
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-0000",
                "name": "NVIDIA H100 80GB HBM3",
                "fb_used": 40 * 2**30,
                "fb_total": 80 * 2**30,
                "gpu_util": 87.5,
                "mem_copy_util": 31.0,
                "temp_c": 64.0,
                "power_w": 512.25,
                "procs": [
                    {
                        "pid": 4242,
                        "name": "vllm",
                        "gpu_mem": 30 * 2**30,
                        "rss": 8 * 2**30,
                        "container": "abc123",
                    },
                    {"pid": 4243, "name": "", "gpu_mem": 0, "rss": None, "container": None},
                ],
            },
            {
                "index": 1,
                "uuid": "MIG-1111",
                "name": "NVIDIA A100 MIG 1g.10gb",
                "mig": "1g.10gb",
                "fb_used": 0,
                "fb_total": 10 * 2**30,
                "gpu_util": None,
                "mem_copy_util": None,
                "temp_c": None,
                "power_w": None,
                "procs": [],
            },
        ],
    }


def requests_dict() -> dict[str, Any]:
    return {
        "v": 1,
        "kind": "requests",
        "service": "rag-api",
        "instance": "pod-7",
        "ts": 1_700_000_001.0,
        "records": [
            {
                "ts": 1_700_000_000.5,
                "status": "ok",
                "e2e_ms": 812.5,
                "queue_ms": 3.25,
                "ttft_ms": 120.0,
                "stages": {"embed": 12.5, "retrieve": 40.0, "rerank": 8.0, "generate": 700.0},
                "context_tokens": 3500,
                "output_tokens": 256,
            },
            {
                "ts": 1_700_000_000.75,
                "status": "error",
                "e2e_ms": 0.0,
                "queue_ms": None,
                "ttft_ms": None,
                "stages": {},
                "context_tokens": 0,
                "output_tokens": 0,
            },
        ],
    }


def event_dict() -> dict[str, Any]:
    return {
        "v": 1,
        "kind": "event",
        "host": "node-a",
        "ts": 1_700_000_002.0,
        "type": "xid",
        "gpu": 3,
        "xid": 79,
        "message": "GPU has fallen off the bus",
        "pci": {"bus": "0000:3b:00.0", "retries": [1, 2]},
        "severity": None,
        "ratio": 0.5,
    }


def alert_dict() -> dict[str, Any]:
    return {
        "v": 1,
        "kind": "alert",
        "rule": "gpu_memory_leak",
        "severity": "critical",
        "status": "firing",
        "labels": {"host": "node-a", "gpu": "0"},
        "annotations": {"summary": "framebuffer grows 2 GiB/h"},
        "value": 0.97,
        "expected": 0.4,
        "starts_at": 1_700_000_000.0,
        "ends_at": None,
        "fingerprint": "f00dfeed",
    }


VALID = {"gpu": gpu_dict, "requests": requests_dict, "event": event_dict, "alert": alert_dict}


def gpu_record() -> GpuEnvelope:
    return GpuEnvelope(
        host="node-a",
        ts=1_700_000_000.25,
        gpus=(
            GpuSample(
                index=0,
                uuid="GPU-0000",
                name="NVIDIA H100 80GB HBM3",
                fb_used=40 * 2**30,
                fb_total=80 * 2**30,
                gpu_util=87.5,
                mem_copy_util=31.0,
                temp_c=64.0,
                power_w=512.25,
                procs=(
                    ProcessSample(
                        pid=4242,
                        name="vllm",
                        gpu_mem=30 * 2**30,
                        rss=8 * 2**30,
                        container="abc123",
                    ),
                    ProcessSample(pid=4243, name="", gpu_mem=0),
                ),
            ),
            GpuSample(
                index=1,
                uuid="MIG-1111",
                name="NVIDIA A100 MIG 1g.10gb",
                mig="1g.10gb",
                fb_used=0,
                fb_total=10 * 2**30,
            ),
        ),
    )


def requests_record() -> RequestsEnvelope:
    return RequestsEnvelope(
        service="rag-api",
        instance="pod-7",
        ts=1_700_000_001.0,
        records=(
            RequestRecord(
                ts=1_700_000_000.5,
                status="ok",
                e2e_ms=812.5,
                queue_ms=3.25,
                ttft_ms=120.0,
                stages={"embed": 12.5, "retrieve": 40.0, "rerank": 8.0, "generate": 700.0},
                context_tokens=3500,
                output_tokens=256,
            ),
            RequestRecord(
                ts=1_700_000_000.75,
                status="error",
                e2e_ms=0.0,
                context_tokens=0,
                output_tokens=0,
            ),
        ),
    )


def event_record() -> EventEnvelope:
    return EventEnvelope(
        host="node-a",
        ts=1_700_000_002.0,
        type="xid",
        attrs={
            "gpu": 3,
            "xid": 79,
            "message": "GPU has fallen off the bus",
            "pci": {"bus": "0000:3b:00.0", "retries": [1, 2]},
            "severity": None,
            "ratio": 0.5,
        },
    )


def alert_record() -> Alert:
    return Alert(
        rule="gpu_memory_leak",
        severity="critical",
        status="firing",
        labels={"host": "node-a", "gpu": "0"},
        annotations={"summary": "framebuffer grows 2 GiB/h"},
        value=0.97,
        expected=0.4,
        starts_at=1_700_000_000.0,
        ends_at=None,
        fingerprint="f00dfeed",
    )


RECORDS = {
    "gpu": gpu_record,
    "requests": requests_record,
    "event": event_record,
    "alert": alert_record,
}
KIND_NAMES = sorted(RECORDS)


# ---------------------------------------------------------------- path helpers


def _parent(d: Any, path: FieldPath) -> Any:
    for step in path[:-1]:
        d = d[step]
    return d


def with_value(kind: str, path: FieldPath, value: Any) -> dict[str, Any]:
    """A valid message of ``kind`` with the field at ``path`` set to ``value``."""
    d = VALID[kind]()
    _parent(d, path)[path[-1]] = value
    return d


def without(kind: str, path: FieldPath) -> dict[str, Any]:
    """A valid message of ``kind`` with the field at ``path`` removed."""
    d = VALID[kind]()
    del _parent(d, path)[path[-1]]
    return d


def reason_path(path: FieldPath) -> str:
    """``("gpus", 0, "procs", 1, "pid")`` -> ``gpus[0].procs[1].pid`` (as reasons spell it)."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def dumps(d: dict[str, Any]) -> bytes:
    return orjson.dumps(d)


def rejects(data: bytes | str | dict[str, Any], reason: str) -> SchemaError:
    """Assert that decoding ``data`` raises SchemaError whose reason starts with ``reason``."""
    with pytest.raises(SchemaError) as info:
        if isinstance(data, dict):
            codec.from_dict(data)
        else:
            codec.decode(data)
    assert info.value.reason.startswith(reason), info.value.reason
    assert str(info.value) == info.value.reason
    return info.value


# ---------------------------------------------------------------- the error type


def test_schema_error_is_a_value_error_and_a_ragwatch_error() -> None:
    err = SchemaError("ts: required field missing")
    assert isinstance(err, ValueError)
    assert isinstance(err, RagwatchError)
    assert err.reason == "ts: required field missing"
    assert str(err) == "ts: required field missing"


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_encode_then_decode_gives_back_the_same_record(kind: str) -> None:
    record = RECORDS[kind]()
    data = codec.encode(record)
    assert isinstance(data, bytes)
    back = codec.decode(data)
    assert type(back) is type(record)
    assert back == record


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_decode_of_the_wire_dict_gives_the_expected_record(kind: str) -> None:
    assert codec.decode(dumps(VALID[kind]())) == RECORDS[kind]()


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_decode_as_returns_the_requested_record_type(kind: str) -> None:
    record = RECORDS[kind]()
    cls = type(record)
    assert codec.decode_as(cls, codec.encode(record)) == record


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_record_from_dict_matches_codec_from_dict(kind: str) -> None:
    d = VALID[kind]()
    assert KINDS[kind].from_dict(d) == codec.from_dict(d) == RECORDS[kind]()


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_encoded_message_starts_with_version_and_kind(kind: str) -> None:
    obj = orjson.loads(codec.encode(RECORDS[kind]()))
    assert list(obj)[:2] == ["v", "kind"]
    assert obj["v"] == SCHEMA_VERSION == 1
    assert obj["kind"] == kind


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_to_dict_is_what_encode_writes(kind: str) -> None:
    record = RECORDS[kind]()
    assert orjson.loads(codec.encode(record)) == orjson.loads(orjson.dumps(codec.to_dict(record)))


def test_decode_accepts_text_as_well_as_bytes() -> None:
    text = codec.encode(gpu_record()).decode()
    assert codec.decode(text) == gpu_record()
    assert codec.decode_as(GpuEnvelope, text) == gpu_record()


def test_gpu_envelope_with_no_gpus_round_trips() -> None:
    env = GpuEnvelope(host="h1", ts=10.0, gpus=())
    assert codec.encode(env) == b'{"v":1,"kind":"gpu","host":"h1","ts":10.0,"gpus":[]}'
    assert codec.decode(codec.encode(env)) == env


def test_gpu_sample_wire_shape_has_nested_processes_and_nulls() -> None:
    obj = orjson.loads(codec.encode(gpu_record()))
    full, mig = obj["gpus"]
    assert full["procs"][0] == {
        "pid": 4242,
        "name": "vllm",
        "gpu_mem": 30 * 2**30,
        "rss": 8 * 2**30,
        "container": "abc123",
        "dead": False,
        "namespace": None,
        "pod": None,
    }
    assert full["procs"][1]["rss"] is None
    assert full["namespace"] is None and full["pod"] is None and full["container"] is None
    assert mig["mig"] == "1g.10gb"
    assert mig["gpu_util"] is None and mig["power_w"] is None and mig["temp_c"] is None
    assert mig["procs"] == []


def test_gpu_optional_fields_may_be_absent_and_take_their_defaults() -> None:
    d = gpu_dict()
    d["gpus"] = [{"index": 2, "uuid": "GPU-2", "name": "L4", "fb_used": 1, "fb_total": 2}]
    sample = codec.decode_as(GpuEnvelope, dumps(d)).gpus[0]
    assert sample == GpuSample(index=2, uuid="GPU-2", name="L4", fb_used=1, fb_total=2)
    assert sample.mig is None and sample.gpu_util is None and sample.procs == ()


def test_pod_labels_round_trip_on_gpus_and_processes() -> None:
    d = gpu_dict()
    d["gpus"][0].update(namespace="rag", pod="retriever-7d9f", container="worker")
    d["gpus"][0]["procs"][0].update(namespace="rag", pod="retriever-7d9f")
    env = codec.decode_as(GpuEnvelope, dumps(d))
    gpu = env.gpus[0]
    assert (gpu.namespace, gpu.pod, gpu.container) == ("rag", "retriever-7d9f", "worker")
    assert (gpu.procs[0].namespace, gpu.procs[0].pod) == ("rag", "retriever-7d9f")
    assert codec.decode_gpu_wire(dumps(d)).gpus[0].pod == "retriever-7d9f"
    d["gpus"][0]["procs"][0]["pod"] = 7
    with pytest.raises(SchemaError, match=r"gpus\[0\]\.procs\[0\]\.pod"):
        codec.decode_gpu_wire(dumps(d))


def test_process_optional_fields_may_be_absent() -> None:
    proc = ProcessSample.from_dict({"pid": 1, "name": "python", "gpu_mem": 5})
    assert proc == ProcessSample(pid=1, name="python", gpu_mem=5, rss=None, container=None)


def test_fb_used_equal_to_fb_total_is_accepted() -> None:
    d = with_value("gpu", ("gpus", 0, "fb_used"), 80 * 2**30)
    assert codec.from_dict(d).gpus[0].fb_used == 80 * 2**30  # type: ignore[union-attr]


def test_requests_stages_round_trip_as_a_mapping_of_floats() -> None:
    env = codec.decode_as(RequestsEnvelope, codec.encode(requests_record()))
    assert env.records[0].stages == {
        "embed": 12.5,
        "retrieve": 40.0,
        "rerank": 8.0,
        "generate": 700.0,
    }
    assert env.records[1].stages == {}
    assert env.records[1].queue_ms is None and env.records[1].ttft_ms is None


def test_requests_stages_may_be_absent() -> None:
    d = requests_dict()
    del d["records"][0]["stages"]
    assert codec.decode_as(RequestsEnvelope, dumps(d)).records[0].stages == {}


def test_event_extra_fields_are_kept_as_attrs_and_written_back_at_top_level() -> None:
    ev = codec.decode_as(EventEnvelope, dumps(event_dict()))
    assert ev.attrs == {
        "gpu": 3,
        "xid": 79,
        "message": "GPU has fallen off the bus",
        "pci": {"bus": "0000:3b:00.0", "retries": [1, 2]},
        "severity": None,
        "ratio": 0.5,
    }
    obj = orjson.loads(codec.encode(ev))
    assert "attrs" not in obj
    assert obj == event_dict()


@pytest.mark.parametrize("event_type", ["xid", "oom_kill", "process_exit"])
def test_every_event_type_is_accepted(event_type: str) -> None:
    ev = codec.from_dict(with_value("event", ("type",), event_type))
    assert isinstance(ev, EventEnvelope)
    assert ev.type == event_type


def test_event_without_attrs_round_trips() -> None:
    ev = EventEnvelope(host="h", ts=0.0, type="oom_kill")
    assert orjson.loads(codec.encode(ev)) == {
        "v": 1,
        "kind": "event",
        "host": "h",
        "ts": 0.0,
        "type": "oom_kill",
    }
    assert codec.decode(codec.encode(ev)) == ev


@pytest.mark.parametrize("status", ["pending", "firing", "resolved"])
def test_every_alert_status_round_trips(status: str) -> None:
    d = alert_dict()
    d["status"] = status
    d["ends_at"] = 1_700_000_100.0 if status == "resolved" else None
    alert = codec.decode_as(Alert, dumps(d))
    assert alert.status == status
    assert codec.decode(codec.encode(alert)) == alert


def test_alert_without_labels_or_annotations_gets_empty_mappings() -> None:
    d = alert_dict()
    del d["labels"], d["annotations"]
    alert = codec.decode_as(Alert, dumps(d))
    assert alert.labels == {} and alert.annotations == {}


def test_alert_value_and_temperature_may_be_negative() -> None:
    alert = codec.from_dict(with_value("alert", ("value",), -3.5))
    assert isinstance(alert, Alert) and alert.value == -3.5
    gpu = codec.from_dict(with_value("gpu", ("gpus", 0, "temp_c"), -10))
    assert isinstance(gpu, GpuEnvelope) and gpu.gpus[0].temp_c == -10.0


@pytest.mark.parametrize(
    ("kind", "key"),
    [("gpu", "node-a"), ("requests", "rag-api"), ("event", "node-a"), ("alert", "f00dfeed")],
)
def test_message_key_is_host_service_or_fingerprint(kind: str, key: str) -> None:
    assert RECORDS[kind]().key == key


def test_records_are_frozen() -> None:
    env = gpu_record()
    with pytest.raises(AttributeError):
        env.host = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- ints for floats


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("gpu", ("ts",)),
        ("gpu", ("gpus", 0, "gpu_util")),
        ("gpu", ("gpus", 0, "mem_copy_util")),
        ("gpu", ("gpus", 0, "temp_c")),
        ("gpu", ("gpus", 0, "power_w")),
        ("requests", ("ts",)),
        ("requests", ("records", 0, "ts")),
        ("requests", ("records", 0, "e2e_ms")),
        ("requests", ("records", 0, "queue_ms")),
        ("requests", ("records", 0, "ttft_ms")),
        ("requests", ("records", 0, "stages", "retrieve")),
        ("event", ("ts",)),
        ("alert", ("value",)),
        ("alert", ("expected",)),
        ("alert", ("starts_at",)),
        ("alert", ("ends_at",)),
    ],
)
def test_integers_are_accepted_for_float_fields_and_become_floats(
    kind: str, path: FieldPath
) -> None:
    record = codec.decode(dumps(with_value(kind, path, 7)))
    got: Any = record
    for step in path:
        got = got[step] if isinstance(step, int) or isinstance(got, dict) else getattr(got, step)
    assert got == 7.0
    assert type(got) is float


# ---------------------------------------------------------------- extra fields


def test_unknown_fields_are_ignored_at_every_level() -> None:
    d = gpu_dict()
    d["future_top"] = {"a": 1}
    d["gpus"][0]["ecc_errors"] = 3
    d["gpus"][0]["procs"][0]["cmdline"] = ["python", "-m", "vllm"]
    assert codec.decode(dumps(d)) == gpu_record()

    r = requests_dict()
    r["region"] = "eu"
    r["records"][0]["trace_id"] = "abc"
    assert codec.decode(dumps(r)) == requests_record()

    a = alert_dict()
    a["generator_url"] = "http://x"
    assert codec.decode(dumps(a)) == alert_record()


def test_unknown_fields_are_not_written_back() -> None:
    d = gpu_dict()
    d["future_top"] = 1
    d["gpus"][0]["ecc_errors"] = 3
    obj = orjson.loads(codec.encode(codec.decode(dumps(d))))
    assert "future_top" not in obj
    assert "ecc_errors" not in obj["gpus"][0]


# ---------------------------------------------------------------- bytes-level rejections


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"not json", b'{"v":1,}', b"\xff\xfe\x00", b'{"v": 1} trailing', "{'v': 1}"],
)
def test_malformed_json_is_rejected(data: bytes | str) -> None:
    rejects(data, "malformed JSON")


@pytest.mark.parametrize(
    ("data", "type_name"),
    [
        (b"[]", "list"),
        (b"[1, 2]", "list"),
        (b"1", "int"),
        (b"1.5", "float"),
        (b'"gpu"', "str"),
        (b"null", "NoneType"),
        (b"true", "bool"),
    ],
)
def test_json_that_is_not_an_object_is_rejected(data: bytes, type_name: str) -> None:
    err = rejects(data, "message: expected a JSON object")
    assert err.reason.endswith(f"got {type_name}")


def test_message_over_max_bytes_is_rejected_before_parsing() -> None:
    data = codec.encode(gpu_record())
    assert codec.decode(data, max_bytes=len(data)) == gpu_record()
    with pytest.raises(SchemaError, match=r"^message too large: \d+ bytes > limit \d+$"):
        codec.decode(data, max_bytes=len(data) - 1)
    with pytest.raises(SchemaError, match="message too large"):
        codec.decode_as(GpuEnvelope, data, max_bytes=10)
    # The size check comes first: even garbage is reported as too large.
    with pytest.raises(SchemaError, match="message too large"):
        codec.decode(b"{" * 100, max_bytes=10)


def test_default_limit_is_four_mebibytes() -> None:
    assert codec.MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    padding = b" " * (codec.MAX_MESSAGE_BYTES + 1 - len(b"{}"))
    with pytest.raises(SchemaError, match="message too large"):
        codec.decode(b"{" + padding + b"}")


def test_python_json_nan_and_infinity_literals_are_rejected() -> None:
    for value in (float("nan"), float("inf"), float("-inf")):
        text = json.dumps(with_value("gpu", ("ts",), value))
        assert any(lit in text for lit in ("NaN", "Infinity"))
        rejects(text, "malformed JSON")
        rejects(text.encode(), "malformed JSON")


def test_number_too_large_for_a_double_is_rejected_at_parse_time() -> None:
    rejects(b'{"v":1,"kind":"gpu","host":"h","ts":1e400,"gpus":[]}', "malformed JSON")


# ---------------------------------------------------------------- version and kind


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("version", [2, 0, -1, "1", True, False, None, [1], {"v": 1}])
def test_wrong_version_is_rejected(kind: str, version: Any) -> None:
    err = rejects(dumps(with_value(kind, ("v",), version)), "v: unsupported schema version")
    assert repr(version) in err.reason


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_missing_version_is_rejected(kind: str) -> None:
    rejects(dumps(without(kind, ("v",))), "v: unsupported schema version None")


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_version_true_is_rejected_even_though_true_equals_one(kind: str) -> None:
    rejects(with_value(kind, ("v",), True), "v: unsupported schema version True")
    with pytest.raises(SchemaError, match=r"^v: "):
        KINDS[kind].from_dict(with_value(kind, ("v",), True))


@pytest.mark.parametrize("kind", ["nope", "GPU", "", 1, None, ["gpu"], {"gpu": 1}])
def test_unknown_kind_is_rejected(kind: Any) -> None:
    err = rejects(dumps(with_value("gpu", ("kind",), kind)), "kind: unknown kind")
    assert "gpu, requests, event, metrics, alert" in err.reason


def test_missing_kind_is_rejected() -> None:
    rejects(dumps(without("gpu", ("kind",))), "kind: unknown kind None")


def test_unknown_kind_with_bad_version_reports_the_version() -> None:
    rejects(b'{"v":2,"kind":"nope"}', "v: unsupported schema version 2")
    rejects(b"{}", "v: unsupported schema version None")


@pytest.mark.parametrize("target", KIND_NAMES)
@pytest.mark.parametrize("actual", KIND_NAMES)
def test_decode_as_refuses_a_message_of_another_kind(target: str, actual: str) -> None:
    cls = KINDS[target]
    data = dumps(VALID[actual]())
    if target == actual:
        assert codec.decode_as(cls, data) == RECORDS[actual]()
        return
    with pytest.raises(SchemaError) as info:
        codec.decode_as(cls, data)
    assert info.value.reason == f"kind: expected {target!r}, got {actual!r}"


def test_decode_as_still_checks_version() -> None:
    with pytest.raises(SchemaError, match=r"^v: unsupported schema version 2"):
        codec.decode_as(Alert, dumps(with_value("alert", ("v",), 2)))


# ---------------------------------------------------------------- missing fields


MISSING = [
    ("gpu", ("host",)),
    ("gpu", ("ts",)),
    ("gpu", ("gpus",)),
    ("gpu", ("gpus", 0, "index")),
    ("gpu", ("gpus", 0, "uuid")),
    ("gpu", ("gpus", 0, "name")),
    ("gpu", ("gpus", 0, "fb_used")),
    ("gpu", ("gpus", 1, "fb_total")),
    ("gpu", ("gpus", 0, "procs", 0, "pid")),
    ("gpu", ("gpus", 0, "procs", 1, "name")),
    ("gpu", ("gpus", 0, "procs", 0, "gpu_mem")),
    ("requests", ("service",)),
    ("requests", ("instance",)),
    ("requests", ("ts",)),
    ("requests", ("records",)),
    ("requests", ("records", 0, "ts")),
    ("requests", ("records", 1, "status")),
    ("requests", ("records", 0, "e2e_ms")),
    ("requests", ("records", 0, "context_tokens")),
    ("requests", ("records", 0, "output_tokens")),
    ("event", ("host",)),
    ("event", ("ts",)),
    ("event", ("type",)),
    ("alert", ("rule",)),
    ("alert", ("severity",)),
    ("alert", ("status",)),
    ("alert", ("value",)),
    ("alert", ("starts_at",)),
    ("alert", ("fingerprint",)),
]


@pytest.mark.parametrize(
    ("kind", "path"), MISSING, ids=lambda x: reason_path(x) if isinstance(x, tuple) else x
)
def test_missing_required_field_is_rejected_with_its_path(kind: str, path: FieldPath) -> None:
    err = rejects(dumps(without(kind, path)), reason_path(path))
    assert err.reason == f"{reason_path(path)}: required field missing"


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("gpu", ("gpus", 0, "procs")),
        ("gpu", ("gpus", 1, "mig")),
        ("gpu", ("gpus", 0, "gpu_util")),
        ("gpu", ("gpus", 0, "procs", 0, "rss")),
        ("gpu", ("gpus", 0, "procs", 0, "container")),
        ("requests", ("records", 0, "queue_ms")),
        ("requests", ("records", 0, "ttft_ms")),
        ("requests", ("records", 0, "stages")),
        ("alert", ("expected",)),
        ("alert", ("ends_at",)),
        ("alert", ("labels",)),
        ("event", ("gpu",)),
    ],
)
def test_optional_fields_may_be_left_out(kind: str, path: FieldPath) -> None:
    assert isinstance(codec.decode(dumps(without(kind, path))), KINDS[kind])


# ---------------------------------------------------------------- wrong types


WRONG_TYPES: list[tuple[str, FieldPath, Any, str]] = [
    # strings
    ("gpu", ("host",), 1, "expected string, got int"),
    ("gpu", ("host",), None, "expected string, got NoneType"),
    ("gpu", ("host",), "", "must not be empty"),
    ("gpu", ("gpus", 0, "uuid"), "", "must not be empty"),
    ("gpu", ("gpus", 0, "name"), ["x"], "expected string, got list"),
    ("gpu", ("gpus", 1, "mig"), 7, "expected string or null, got int"),
    ("gpu", ("gpus", 0, "procs", 0, "container"), True, "expected string or null, got bool"),
    ("requests", ("service",), {"a": 1}, "expected string, got dict"),
    ("requests", ("instance",), "", "must not be empty"),
    ("event", ("host",), 5, "expected string, got int"),
    ("event", ("type",), 3, "expected string, got int"),
    ("alert", ("rule",), "", "must not be empty"),
    ("alert", ("severity",), 2, "expected string, got int"),
    ("alert", ("fingerprint",), None, "expected string, got NoneType"),
    # integers: bools, floats and strings are not integers
    ("gpu", ("gpus", 0, "index"), True, "expected integer, got bool"),
    ("gpu", ("gpus", 0, "index"), False, "expected integer, got bool"),
    ("gpu", ("gpus", 0, "fb_used"), 1.5, "expected integer, got float"),
    ("gpu", ("gpus", 0, "fb_total"), 80.0, "expected integer, got float"),
    ("gpu", ("gpus", 0, "fb_used"), "10", "expected integer, got str"),
    ("gpu", ("gpus", 0, "procs", 0, "pid"), "4242", "expected integer, got str"),
    ("gpu", ("gpus", 0, "procs", 0, "gpu_mem"), None, "expected integer, got NoneType"),
    ("gpu", ("gpus", 0, "procs", 0, "rss"), "1", "expected integer, got str"),
    ("gpu", ("gpus", 0, "procs", 0, "rss"), True, "expected integer, got bool"),
    ("requests", ("records", 0, "context_tokens"), True, "expected integer, got bool"),
    ("requests", ("records", 0, "output_tokens"), 2.5, "expected integer, got float"),
    # numbers: bools and strings are not numbers
    ("gpu", ("ts",), "1", "expected number, got str"),
    ("gpu", ("ts",), True, "expected number, got bool"),
    ("gpu", ("ts",), None, "expected number, got NoneType"),
    ("gpu", ("gpus", 0, "gpu_util"), "50", "expected number, got str"),
    ("gpu", ("gpus", 0, "power_w"), False, "expected number, got bool"),
    ("gpu", ("gpus", 0, "temp_c"), [64], "expected number, got list"),
    ("requests", ("ts",), "now", "expected number, got str"),
    ("requests", ("records", 0, "e2e_ms"), "fast", "expected number, got str"),
    ("requests", ("records", 0, "queue_ms"), True, "expected number, got bool"),
    ("requests", ("records", 0, "stages", "retrieve"), "3", "expected number, got str"),
    ("requests", ("records", 0, "stages", "embed"), None, "expected number, got NoneType"),
    ("requests", ("records", 0, "stages", "rerank"), True, "expected number, got bool"),
    ("event", ("ts",), "1", "expected number, got str"),
    ("alert", ("value",), "0.9", "expected number, got str"),
    ("alert", ("expected",), True, "expected number, got bool"),
    ("alert", ("starts_at",), None, "expected number, got NoneType"),
    ("alert", ("ends_at",), "later", "expected number, got str"),
    # containers
    ("gpu", ("gpus",), "x", "expected array, got str"),
    ("gpu", ("gpus",), {"0": {}}, "expected array, got dict"),
    ("gpu", ("gpus",), None, "expected array, got NoneType"),
    ("gpu", ("gpus", 0), 1, "expected object, got int"),
    ("gpu", ("gpus", 1), [], "expected object, got list"),
    ("gpu", ("gpus", 0, "procs"), {}, "expected array, got dict"),
    ("gpu", ("gpus", 0, "procs"), None, "expected array, got NoneType"),
    ("gpu", ("gpus", 0, "procs", 1), "p", "expected object, got str"),
    ("requests", ("records",), {}, "expected array, got dict"),
    ("requests", ("records", 1), None, "expected object, got NoneType"),
    ("requests", ("records", 0, "stages"), "x", "expected object, got str"),
    ("requests", ("records", 0, "stages"), [1.0], "expected object, got list"),
    ("requests", ("records", 0, "stages"), None, "expected object, got NoneType"),
    ("alert", ("labels",), "x", "expected object, got str"),
    ("alert", ("labels",), None, "expected object, got NoneType"),
    ("alert", ("annotations",), ["a"], "expected object, got list"),
]


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    WRONG_TYPES,
    ids=[f"{k}-{reason_path(p)}-{m}" for k, p, _, m in WRONG_TYPES],
)
def test_wrong_type_is_rejected_with_field_and_reason(
    kind: str, path: FieldPath, value: Any, message: str
) -> None:
    err = rejects(dumps(with_value(kind, path, value)), reason_path(path))
    assert err.reason == f"{reason_path(path)}: {message}"


# ---------------------------------------------------------------- NaN and infinity

NON_FINITE = [float("nan"), float("inf"), float("-inf")]
FLOAT_PATHS: list[tuple[str, FieldPath]] = [
    ("gpu", ("ts",)),
    ("gpu", ("gpus", 0, "gpu_util")),
    ("gpu", ("gpus", 0, "mem_copy_util")),
    ("gpu", ("gpus", 0, "temp_c")),
    ("gpu", ("gpus", 1, "power_w")),
    ("requests", ("ts",)),
    ("requests", ("records", 0, "ts")),
    ("requests", ("records", 0, "e2e_ms")),
    ("requests", ("records", 1, "queue_ms")),
    ("requests", ("records", 0, "ttft_ms")),
    ("requests", ("records", 0, "stages", "generate")),
    ("event", ("ts",)),
    ("alert", ("value",)),
    ("alert", ("expected",)),
    ("alert", ("starts_at",)),
    ("alert", ("ends_at",)),
]


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("kind", "path"), FLOAT_PATHS, ids=[f"{k}-{reason_path(p)}" for k, p in FLOAT_PATHS]
)
def test_non_finite_numbers_are_rejected(kind: str, path: FieldPath, value: float) -> None:
    d = with_value(kind, path, value)
    err = rejects(d, f"{reason_path(path)}: must be finite")
    assert err.reason == f"{reason_path(path)}: must be finite, got {value!r}"
    with pytest.raises(SchemaError, match=r"must be finite"):
        KINDS[kind].from_dict(with_value(kind, path, value))


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_top_level_event_attribute_is_rejected(value: float) -> None:
    d = event_dict()
    d["ratio"] = value
    with pytest.raises(SchemaError) as info:
        EventEnvelope.from_dict(d)
    assert info.value.reason == f"ratio: must be finite, got {value!r}"


def test_record_from_dict_rejects_non_finite_values_with_its_path_prefix() -> None:
    sample = {
        "index": 0,
        "uuid": "u",
        "name": "n",
        "fb_used": 0,
        "fb_total": 1,
        "temp_c": float("nan"),
    }
    with pytest.raises(SchemaError, match=r"^gpus\[4\]\.temp_c: must be finite"):
        GpuSample.from_dict(sample, "gpus[4].")
    record = {
        "ts": 1.0,
        "status": "ok",
        "e2e_ms": float("inf"),
        "context_tokens": 0,
        "output_tokens": 0,
    }
    with pytest.raises(SchemaError, match=r"^e2e_ms: must be finite, got inf$"):
        RequestRecord.from_dict(record)


# ---------------------------------------------------------------- ranges


NEGATIVE: list[tuple[str, FieldPath, Any]] = [
    ("gpu", ("ts",), -1.0),
    ("gpu", ("gpus", 0, "index"), -1),
    ("gpu", ("gpus", 0, "fb_used"), -1),
    ("gpu", ("gpus", 0, "fb_total"), -1),
    ("gpu", ("gpus", 0, "gpu_util"), -0.5),
    ("gpu", ("gpus", 0, "mem_copy_util"), -1),
    ("gpu", ("gpus", 0, "power_w"), -1.0),
    ("gpu", ("gpus", 0, "procs", 0, "pid"), -1),
    ("gpu", ("gpus", 0, "procs", 0, "gpu_mem"), -1),
    ("gpu", ("gpus", 0, "procs", 0, "rss"), -4096),
    ("requests", ("ts",), -5),
    ("requests", ("records", 0, "ts"), -1e-9),
    ("requests", ("records", 0, "e2e_ms"), -1.0),
    ("requests", ("records", 0, "queue_ms"), -1.0),
    ("requests", ("records", 0, "ttft_ms"), -1.0),
    ("requests", ("records", 0, "stages", "embed"), -0.25),
    ("requests", ("records", 0, "context_tokens"), -1),
    ("requests", ("records", 0, "output_tokens"), -1),
    ("event", ("ts",), -1.0),
    ("alert", ("starts_at",), -1.0),
    ("alert", ("ends_at",), -1.0),
]


@pytest.mark.parametrize(
    ("kind", "path", "value"), NEGATIVE, ids=[f"{k}-{reason_path(p)}" for k, p, _ in NEGATIVE]
)
def test_negative_memory_counts_and_times_are_rejected(
    kind: str, path: FieldPath, value: Any
) -> None:
    err = rejects(dumps(with_value(kind, path, value)), f"{reason_path(path)}: must be >= 0")
    assert "got -" in err.reason


def test_fb_used_above_fb_total_is_rejected() -> None:
    d = gpu_dict()
    d["gpus"][1]["fb_used"] = 10 * 2**30 + 1
    err = rejects(dumps(d), "gpus[1].fb_used")
    assert err.reason == f"gpus[1].fb_used: {10 * 2**30 + 1} exceeds fb_total {10 * 2**30}"


def test_fb_check_also_applies_to_gpu_sample_from_dict() -> None:
    with pytest.raises(SchemaError, match=r"^fb_used: 2 exceeds fb_total 1$"):
        GpuSample.from_dict({"index": 0, "uuid": "u", "name": "n", "fb_used": 2, "fb_total": 1})


def test_zero_is_accepted_where_values_must_not_be_negative() -> None:
    d = gpu_dict()
    d["ts"] = 0
    d["gpus"][0].update(index=0, fb_used=0, fb_total=0, gpu_util=0, power_w=0.0, procs=[])
    env = codec.decode_as(GpuEnvelope, dumps(d))
    assert env.ts == 0.0 and env.gpus[0].fb_total == 0


def test_large_unsigned_64_bit_memory_values_are_accepted() -> None:
    big = 2**64 - 1
    d = with_value("gpu", ("gpus", 0, "fb_total"), big)
    env = codec.decode_as(GpuEnvelope, dumps(d))
    assert env.gpus[0].fb_total == big
    assert codec.decode(codec.encode(env)) == env


def test_integer_too_large_for_64_bits_arrives_as_float_and_is_rejected() -> None:
    # orjson parses integers beyond 64 bits as floats, which are not integers.
    data = (
        b'{"v":1,"kind":"gpu","host":"h","ts":1,"gpus":[{"index":0,"uuid":"u","name":"n",'
        b'"fb_used":0,"fb_total":100000000000000000000000}]}'
    )
    rejects(data, "gpus[0].fb_total: expected integer, got float")


# ---------------------------------------------------------------- choices


@pytest.mark.parametrize(
    ("kind", "path", "value", "reason"),
    [
        ("requests", ("records", 0, "status"), "OK", "records[0].status: must be one of ok, error"),
        (
            "requests",
            ("records", 1, "status"),
            "timeout",
            "records[1].status: must be one of ok, error",
        ),
        ("requests", ("records", 0, "status"), "", "records[0].status: must not be empty"),
        ("requests", ("records", 0, "status"), 200, "records[0].status: expected string"),
        ("alert", ("status",), "active", "status: must be one of pending, firing, resolved"),
        ("alert", ("status",), "Firing", "status: must be one of pending, firing, resolved"),
        ("event", ("type",), "reboot", "type: must be one of xid, oom_kill, process_exit"),
        ("event", ("type",), "XID", "type: must be one of xid, oom_kill, process_exit"),
    ],
)
def test_values_outside_their_choices_are_rejected(
    kind: str, path: FieldPath, value: Any, reason: str
) -> None:
    err = rejects(dumps(with_value(kind, path, value)), reason)
    if isinstance(value, str) and value:
        assert err.reason.endswith(f"got {value!r}")


# ---------------------------------------------------------------- alert labels


@pytest.mark.parametrize("field", ["labels", "annotations"])
@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (0, "int"),
        (1.5, "float"),
        (None, "NoneType"),
        (True, "bool"),
        (["a"], "list"),
        ({"a": "b"}, "dict"),
    ],
)
def test_alert_labels_and_annotations_must_map_to_strings(
    field: str, value: Any, type_name: str
) -> None:
    d = alert_dict()
    d[field] = {"ok": "fine", "bad": value}
    err = rejects(dumps(d), f"{field}.bad")
    assert err.reason == f"{field}.bad: expected string, got {type_name}"


def test_alert_labels_are_copied_not_shared() -> None:
    d = alert_dict()
    alert = codec.from_dict(d)
    d["labels"]["host"] = "changed"
    assert isinstance(alert, Alert) and alert.labels["host"] == "node-a"


# ---------------------------------------------------------------- properties

# names become labels: printable only (control characters are refused, tested below)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20).filter(str.isprintable)
_NAME = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20).filter(
    str.isprintable
)
_U64 = st.integers(min_value=0, max_value=2**63 - 1)
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
_NONNEG = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)


@st.composite
def process_samples(draw: st.DrawFn) -> ProcessSample:
    return ProcessSample(
        pid=draw(st.integers(min_value=0, max_value=2**31)),
        name=draw(_TEXT),
        gpu_mem=draw(_U64),
        rss=draw(st.none() | _U64),
        container=draw(st.none() | _TEXT),
    )


@st.composite
def gpu_samples(draw: st.DrawFn) -> GpuSample:
    fb_total = draw(_U64)
    return GpuSample(
        index=draw(st.integers(min_value=0, max_value=64)),
        uuid=draw(_NAME),
        name=draw(_TEXT),
        fb_used=draw(st.integers(min_value=0, max_value=fb_total)),
        fb_total=fb_total,
        mig=draw(st.none() | _TEXT),
        gpu_util=draw(st.none() | _NONNEG),
        mem_copy_util=draw(st.none() | _NONNEG),
        temp_c=draw(st.none() | _FLOAT),
        power_w=draw(st.none() | _NONNEG),
        procs=tuple(draw(st.lists(process_samples(), max_size=3))),
    )


gpu_envelopes = st.builds(
    GpuEnvelope,
    host=_NAME,
    ts=_NONNEG,
    gpus=st.lists(gpu_samples(), max_size=4).map(tuple),
)


@FUZZ
@given(gpu_envelopes)
def test_property_gpu_envelope_round_trips(env: GpuEnvelope) -> None:
    assert codec.decode(codec.encode(env)) == env
    assert codec.decode_as(GpuEnvelope, codec.encode(env)) == env


request_records = st.builds(
    RequestRecord,
    ts=_NONNEG,
    status=st.sampled_from(["ok", "error"]),
    e2e_ms=_NONNEG,
    context_tokens=_U64,
    output_tokens=_U64,
    stages=st.dictionaries(_TEXT, _NONNEG, max_size=4),
    queue_ms=st.none() | _NONNEG,
    ttft_ms=st.none() | _NONNEG,
)


@FUZZ
@given(
    st.builds(
        RequestsEnvelope,
        service=_NAME,
        instance=_NAME,
        ts=_NONNEG,
        records=st.lists(request_records, max_size=4).map(tuple),
    )
)
def test_property_requests_envelope_round_trips(env: RequestsEnvelope) -> None:
    assert codec.decode(codec.encode(env)) == env


# ---------------------------------------------------------------- fuzz: only SchemaError


def _decode_or_schema_error(data: bytes | str) -> None:
    try:
        record = codec.decode(data)
    except SchemaError as exc:
        assert exc.reason
    else:
        assert isinstance(record, GpuEnvelope | RequestsEnvelope | EventEnvelope | Alert)


@FUZZ
@given(st.binary(max_size=512))
def test_fuzz_decode_arbitrary_bytes_raises_only_schema_error(data: bytes) -> None:
    _decode_or_schema_error(data)


@FUZZ
@given(st.text(max_size=256))
def test_fuzz_decode_arbitrary_text_raises_only_schema_error(data: str) -> None:
    _decode_or_schema_error(data)


def test_decode_text_with_lone_surrogate_raises_schema_error() -> None:
    _decode_or_schema_error('{"v":1,"kind":"gpu","host":"\ud800","ts":1,"gpus":[]}')
    rejects('{"v":1,"kind":"gpu","host":"\ud800","ts":1,"gpus":[]}', "malformed JSON")


# Values orjson.loads can produce: 64-bit ints, finite floats, strings, arrays, objects.
_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_FIELD_NAMES = sorted(
    {
        "v",
        "kind",
        "host",
        "ts",
        "gpus",
        "service",
        "instance",
        "records",
        "type",
        "rule",
        "severity",
        "status",
        "labels",
        "annotations",
        "value",
        "expected",
        "starts_at",
        "ends_at",
        "fingerprint",
        "index",
        "uuid",
        "name",
        "fb_used",
        "fb_total",
        "procs",
        "stages",
        "pid",
        "gpu_mem",
    }
)
json_objects = st.dictionaries(
    st.sampled_from(_FIELD_NAMES) | _TEXT, json_values, max_size=12
).flatmap(
    lambda d: st.fixed_dictionaries(
        {
            "v": st.sampled_from([1, 1, 2, True, None]),
            "kind": st.sampled_from([*KIND_NAMES, "other", 0]),
        }
    ).map(lambda head: {**d, **head})
)


@FUZZ
@given(json_objects)
def test_fuzz_decode_arbitrary_json_objects_raises_only_schema_error(
    obj: dict[str, Any],
) -> None:
    _decode_or_schema_error(orjson.dumps(obj))
    with contextlib.suppress(SchemaError):
        codec.from_dict(obj)


def _paths(value: Any, prefix: FieldPath = ()) -> list[FieldPath]:
    out: list[FieldPath] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


_ALL_PATHS = [(kind, path) for kind in KIND_NAMES for path in _paths(VALID[kind]())]
_non_finite_or_json = json_values | st.sampled_from([math.nan, math.inf, -math.inf])


@FUZZ
@given(
    st.lists(
        st.tuples(st.sampled_from(range(len(_ALL_PATHS))), st.none() | _non_finite_or_json),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(KIND_NAMES),
)
def test_fuzz_mutated_valid_messages_raise_only_schema_error(
    mutations: list[tuple[int, Any]], kind: str
) -> None:
    """Take a valid message and overwrite (or delete, for None) up to three of its fields."""
    d = VALID[kind]()
    for i, value in mutations:
        mkind, path = _ALL_PATHS[i]
        if mkind != kind:
            continue
        try:
            parent = _parent(d, path)
            if value is None and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = copy.deepcopy(value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced an ancestor of this path
    try:
        record = codec.from_dict(d)
    except SchemaError:
        return
    assert isinstance(record, KINDS[kind])


# ---------------------------------------------------------------- regressions of fixed bugs


@pytest.mark.parametrize(
    ("kind", "path"),
    [("gpu", ("ts",)), ("requests", ("records", 0, "stages", "embed")), ("alert", ("value",))],
)
def test_bug_huge_integer_in_float_field_raises_schema_error(kind: str, path: FieldPath) -> None:
    with pytest.raises(SchemaError, match="must be finite"):
        codec.from_dict(with_value(kind, path, 10**400))


def test_bug_integer_beyond_64_bits_is_rejected_by_from_dict() -> None:
    with pytest.raises(SchemaError, match=r"gpus\[0\]\.procs\[0\]\.pid"):
        codec.from_dict(with_value("gpu", ("gpus", 0, "procs", 0, "pid"), 2**70))


def test_bug_max_bytes_counts_utf8_bytes_of_text_input() -> None:
    text = codec.encode(GpuEnvelope(host="é" * 100, ts=1.0, gpus=())).decode()
    assert len(text.encode()) > len(text)
    with pytest.raises(SchemaError, match="message too large"):
        codec.decode(text, max_bytes=len(text))


def test_bug_nested_non_finite_event_attribute_is_rejected() -> None:
    d = event_dict()
    d["pci"] = {"bus": "x", "latency": [1.0, float("nan")]}
    with pytest.raises(SchemaError, match="must be finite"):
        codec.from_dict(d)


@pytest.mark.parametrize("depth", [34, 255, 990, 1023])
def test_bug_deeply_nested_event_attributes_are_a_schema_error(depth: int) -> None:
    """orjson reads 1,023 levels; a recursive check ran out of stack (RecursionError) and
    depth 255-990 was accepted but could not be encoded again (orjson writes 254)."""
    head = codec.encode(EventEnvelope(host="h", ts=1.0, type="xid"))[:-1]
    data = head + b',"detail":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    rejects(data, "detail: nested deeper than 32 levels")


def test_event_attributes_nested_32_deep_round_trip() -> None:
    value: Any = 1
    for _ in range(31):
        value = {"x": value}
    env = EventEnvelope(host="h", ts=1.0, type="xid", attrs={"detail": value})
    assert codec.decode(codec.encode(env)) == env


def test_bug_event_attrs_cannot_override_the_envelope_header() -> None:
    with pytest.raises(SchemaError, match="would overwrite the envelope header"):
        EventEnvelope(host="h", ts=1.0, type="xid", attrs={"v": 2, "kind": "alert", "ts": -1})


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("host", "gpu-node-01\nFIRING", "host: contains the control character U+000A"),
        ("host", "h" * 257, "host: longer than 256 characters (257)"),
        ("uuid", "GPU-\x1b[31m", "gpus[0].uuid: contains the control character U+001B"),
        ("proc", "rag\u2028worker", "gpus[0].procs[0].name: contains the control character U+2028"),
    ],
)
def test_names_that_become_labels_must_be_printable_and_short(
    field: str, value: str, reason: str
) -> None:
    gpu = {"index": 0, "uuid": "GPU-0", "name": "H200", "fb_used": 1, "fb_total": 2}
    gpu["procs"] = [{"pid": 1, "name": "w", "gpu_mem": 1}]
    env = {"v": 1, "kind": "gpu", "host": "h1", "ts": 1.0, "gpus": [gpu]}
    if field == "host":
        env["host"] = value
    elif field == "uuid":
        gpu["uuid"] = value
    else:
        gpu["procs"][0]["name"] = value
    data = orjson.dumps(env)
    for decode in (codec.decode, codec.decode_gpu_wire):
        with pytest.raises(SchemaError) as err:
            decode(data)
        assert err.value.reason == reason
