"""msgspec's typed decoding of ``requests`` messages (:mod:`ragwatch.request_wire`) held to
the strict decoder: it vouches only for messages ``RequestsEnvelope.from_dict`` accepts,
builds the same envelope, and :func:`ragwatch.codec.decode_as` fails with the strict
decoder's reason for everything else."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch import request_wire
from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
from ragwatch.codec import decode_as, decode_requests_wire, encode, loads
from ragwatch.errors import SchemaError
from ragwatch.schema import RequestsEnvelope
from tests.mutations import ODD_VALUES, mutate

VALID: dict[str, Any] = {
    "v": 1,
    "kind": "requests",
    "service": "rag-api",
    "instance": "rag-api-0",
    "ts": 1_700_000_001.0,
    "records": [
        {
            "ts": 1_700_000_000.5,
            "status": "ok",
            "e2e_ms": 820.0,
            "context_tokens": 1800,
            "output_tokens": 240,
            "stages": {"retriever": 80.0, "llm": 700.0},
            "queue_ms": 3.0,
            "ttft_ms": None,
        },
        {"ts": 1_700_000_000.7, "status": "error", "e2e_ms": 5.0, "context_tokens": 0,
         "output_tokens": 0},
    ],
    "host": "gpu-1",
    "pid": 4242,
    "started": 1_699_990_000.25,
}  # fmt: skip
FIELDS = {
    (): ["v", "kind", "service", "instance", "ts", "records", "host", "pid", "started"],
    ("records", 0): [
        "ts", "status", "e2e_ms", "context_tokens", "output_tokens", "stages", "queue_ms",
        "ttft_ms",
    ],
    ("records", 0, "stages"): ["retriever", "llm"],
}  # fmt: skip
ODD_REQUEST_VALUES = st.one_of(
    ODD_VALUES,
    st.sampled_from([-0.0, 0, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, "ok", "error"]),
    st.sampled_from(["\x7f", "a\u00a0", "\u200b", "é", "\\", "\n", "x" * 256, "x" * 257, ""]),
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """VALID with fields replaced by odd values, removed, or added (unknown ones)."""
    return mutate(draw, VALID, FIELDS, ODD_REQUEST_VALUES, rounds=4, unknown=["extra"])


def _wire(data: bytes) -> RequestsEnvelope | str:
    """What the worker decodes (structs, or the checked envelope), as an envelope."""
    try:
        got = decode_requests_wire(data)
    except SchemaError as exc:
        return exc.reason
    return got if isinstance(got, RequestsEnvelope) else request_wire.to_envelope(got)


def _strict(data: bytes) -> RequestsEnvelope | str:
    """The checked way, without the typed pass: the reference."""
    try:
        return RequestsEnvelope.from_dict(loads(data))
    except SchemaError as exc:
        return exc.reason


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_typed_decoding_accepts_only_what_the_strict_decoder_accepts_alike(
    d: dict[str, Any],
) -> None:
    try:
        data = orjson.dumps(d)
    except TypeError:  # integers beyond 64 bits: not even JSON orjson writes
        return
    want = _strict(data)
    typed = request_wire.decode(data)
    if typed is not None:
        assert not isinstance(want, str), want
        assert typed == want
        assert repr(typed) == repr(want)  # -0.0 and 0.0, 1 and 1.0 are told apart
    if isinstance(want, str):
        with pytest.raises(SchemaError) as got:
            decode_as(RequestsEnvelope, data)
        assert got.value.reason == want
        assert _wire(data) == want
    else:
        assert repr(decode_as(RequestsEnvelope, data)) == repr(want)
        assert repr(_wire(data)) == repr(want)


HEAD = b'{"v":1,"kind":"requests","service":"s","instance":"i","ts":1.0,'
REC = b'{"ts":0.5,"status":"ok","e2e_ms":1.0,"context_tokens":1,"output_tokens":2'


@pytest.mark.parametrize(
    "data",
    [
        HEAD + b'"records":[],"extra":1e400}',  # beyond a double, in a field msgspec skips
        HEAD + b'"records":[],"extra":"\xff"}',  # not UTF-8, in an unknown field
        HEAD + b'"records":[' + REC + b',"x":1e400}]}',  # ... in an unknown record field
        HEAD + b'"records":[' + REC + b',"ts":7.0}]}',  # a key twice: the last one counts
        HEAD + b'"records":[' + REC + b',"ts":-7.0}]}',  # ... and is checked
        HEAD + b'"records":[' + REC + b',"context_tokens":18446744073709551615}]}',  # 2**64-1
        HEAD + b'"records":[' + REC + b',"context_tokens":18446744073709551616}]}',
        HEAD + b'"records":[' + REC + b',"stages":{"llm":1e400}}]}',
        HEAD + b'"records":[' + REC + b',"stages":{"llm":1,"a\\"b":2.0}}]}',  # escapes
        HEAD + b'"records":[' + REC + b',"stages":null}]}',
        HEAD + b'"records":[' + REC + b',"queue_ms":null,"ttft_ms":3}]}',
        HEAD + b'"records":[' + REC + b'}],"host":""}',  # an empty host is no host
        HEAD + b'"records":[' + REC + b'}],"host":"h\x01"}',  # a raw control character
        HEAD + b'"records":[' + REC + b'}],"host":"h\x7f"}',  # DEL
        HEAD + b'"records":[' + REC + b'}],"host":"h\xc2\xa0"}',  # U+00A0: not printable
        HEAD + b'"records":[' + REC + b'}],"host":"h\\u0041"}',  # an escaped printable
        HEAD + b'"records":[' + REC + b'}],"pid":true}',
        HEAD + b'"records":[' + REC + b'}],"service":""}',
        HEAD + b'"records":' + b"[" * 1100 + b"]" * 1100 + b"}",  # deeper than either goes
        b'{"v":true,"kind":"requests","service":"s","instance":"i","ts":1.0,"records":[]}',
        b'{"v":1,"kind":"requests","service":"s","instance":"i","ts":1,"records":[]}',
    ],
)
def test_typed_decoding_of_edge_cases_agrees_with_the_checked_path(data: bytes) -> None:
    want = _strict(data)
    typed = request_wire.decode(data)
    if isinstance(want, str):
        assert typed is None
        with pytest.raises(SchemaError) as got:
            decode_as(RequestsEnvelope, data)
        assert got.value.reason == want
    else:
        assert typed is None or repr(typed) == repr(want)
        assert repr(decode_as(RequestsEnvelope, data)) == repr(want)
    assert repr(_wire(data)) == repr(want)  # the worker's decode: the same, or the same reason


def test_what_the_sdk_and_the_simulator_write_takes_the_typed_path() -> None:
    """Else the worker silently pays the checked path's cost again."""
    sim = RequestSimulator(RequestSimConfig(services=2, instances=2, batch_s=5.0))
    envs = [e for _, (_, batch) in zip(range(30), sim.ticks(), strict=False) for e in batch]
    assert sum(len(e.records) for e in envs) > 100
    for env in envs:
        typed = request_wire.decode(encode(env))
        assert typed is not None and repr(typed) == repr(env)
        assert isinstance(decode_requests_wire(encode(env)), request_wire.RequestsWire)


def test_records_do_not_share_their_stages() -> None:
    env = request_wire.decode(HEAD + b'"records":[' + REC + b"}," + REC + b"}]}")
    assert env is not None and env.records[0].stages == {}
    assert env.records[0].stages is not env.records[1].stages
