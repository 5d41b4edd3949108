"""The worker's hot paths: request records decoded without the field readers when well typed;
the GPU path: ``codec.decode_gpu_wire`` (msgspec structs, checked as strictly as
``decode_as(GpuEnvelope)``) and ``GpuPipeline.process_wire`` (rules that read only the leak
estimate evaluated when it changes), held to the strict decoder and to evaluating every
rule on every sample."""

from __future__ import annotations

import copy
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch import gpu_wire
from ragwatch.agents.scenario import build
from ragwatch.codec import _gpu_wire_ok, decode_as, decode_gpu_wire, encode
from ragwatch.codec import gpu_wire as gpu_wire_of
from ragwatch.errors import SchemaError
from ragwatch.schema import MAX_UINT, GpuEnvelope, RequestRecord
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import load_rules, parse_rule
from ragwatch.streams.pipelines.gpu import GpuPipeline
from tests.mutations import ODD_VALUES, dict_at, mutate

VALID: dict[str, Any] = {
    "v": 1,
    "kind": "gpu",
    "host": "h1",
    "ts": 1_700_000_000.0,
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-0",
            "name": "H200",
            "fb_used": 10,
            "fb_total": 100,
            "mig": None,
            "gpu_util": 50.0,
            "temp_c": -3,
            "procs": [{"pid": 7, "name": "w", "gpu_mem": 5, "rss": 9, "container": None}],
        }
    ],
}

FIELDS = {
    (): ["v", "kind", "host", "ts", "gpus"],
    ("gpus", 0): [
        "index", "uuid", "name", "fb_used", "fb_total", "mig", "fb_reserved", "gpu_util",
        "mem_copy_util", "temp_c", "power_w", "procs",
    ],
    ("gpus", 0, "procs", 0): ["pid", "name", "gpu_mem", "rss", "container", "dead"],
}  # fmt: skip


def _at(d: dict[str, Any], path: tuple[Any, ...]) -> Any:
    for p in path:
        d = d[p]
    return d


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """VALID with a few fields replaced by odd values or removed."""
    return mutate(draw, VALID, FIELDS, ODD_VALUES, rounds=3)


def _strict(d: dict[str, Any]) -> str | None:
    try:
        GpuEnvelope.from_dict(d)
    except SchemaError as exc:
        return exc.reason
    return None


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_the_fast_check_accepts_only_what_the_strict_decoder_accepts(d: dict[str, Any]) -> None:
    if _gpu_wire_ok(d):
        assert _strict(d) is None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_decode_gpu_wire_fails_exactly_like_decode_as(d: dict[str, Any]) -> None:
    try:
        data = orjson.dumps(d)
    except TypeError:  # integers beyond 64 bits: not even JSON we can write
        return
    reason = _strict(orjson.loads(data))
    if reason is None:
        assert decode_gpu_wire(data) == gpu_wire.from_mapping(orjson.loads(data))
        decode_as(GpuEnvelope, data)
    else:
        with pytest.raises(SchemaError) as fast:
            decode_gpu_wire(data)
        with pytest.raises(SchemaError) as strict:
            decode_as(GpuEnvelope, data)
        assert fast.value.reason == strict.value.reason == reason


ODD_LABELS = st.one_of(
    st.text(max_size=4),  # any code point: controls, U+00A0, U+2028, surrogates escaped
    st.sampled_from(["\x7f", "a\u00a0", "\u200b", "é", "\\", "\n", "x" * 256, "x" * 257, ""]),
)
LABEL_FIELDS = {(): ["host"], ("gpus", 0): ["uuid", "name", "mig", "namespace", "pod",
    "container"], ("gpus", 0, "procs", 0): ["name", "container", "namespace", "pod"]}  # fmt: skip


@st.composite
def mutated_wire(draw: st.DrawFn) -> dict[str, Any]:
    """:func:`mutated`, with odd labels and fields no schema knows here and there."""
    d = draw(mutated())
    for path in FIELDS:
        obj = dict_at(d, path)
        if obj is None:
            continue
        if draw(st.booleans()):
            obj[draw(st.sampled_from(LABEL_FIELDS[path]))] = draw(ODD_LABELS)
        if draw(st.booleans()):
            obj[draw(st.sampled_from(["extra", "clock_mhz", "x" * 300]))] = draw(ODD_VALUES)
    return d


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_wire())
def test_typed_decoding_accepts_only_what_the_strict_decoder_accepts_alike(
    d: dict[str, Any],
) -> None:
    """msgspec's typed pass (:mod:`ragwatch.gpu_wire`) vouches only for valid messages,
    with orjson's dict; what it refuses goes the checked way."""
    try:
        data = orjson.dumps(d)
    except TypeError:
        return
    typed = gpu_wire.decode(data)
    if typed is not None:
        assert _strict(orjson.loads(data)) is None
        assert typed == gpu_wire.from_mapping(orjson.loads(data))
        assert decode_gpu_wire(data) == typed


@pytest.mark.parametrize(
    "raw",
    [
        b'"host":"h\\u0041"',  # an escaped printable: looked at, accepted
        b'"host":"h\\u0007"',  # an escaped control character
        b'"host":"h\x7f"',  # DEL, raw
        b'"host":"h\xc2\xa0"',  # U+00A0, raw UTF-8: not printable
        b'"host":"h","extra":' + b"[" * 1100 + b"]" * 1100,  # deeper than either parser goes
        b'"host":"h","extra":' + b"[" * 990 + b"]" * 990,  # orjson reads it, msgspec not
        b'"host":"h","extra":18446744073709551616',  # beyond 64 bits: a float to orjson
        b'"host":"h","extra":1e400',  # beyond a double: msgspec skips it unchecked
        b'"host":"h","extra":"\xff"',  # not UTF-8, where msgspec skips it unchecked
        b'"host":"h","gpus":[],"extra":1',  # "gpus" twice: the last one counts
    ],
)
def test_typed_decoding_of_edge_cases_agrees_with_the_checked_path(raw: bytes) -> None:
    data = b'{"v":1,"kind":"gpu",' + raw + b',"ts":1.0,"gpus":[]}'
    try:
        want: Any = decode_as(GpuEnvelope, data)
    except SchemaError as exc:
        want = exc.reason
    typed = gpu_wire.decode(data)
    if isinstance(want, str):
        assert typed is None
        with pytest.raises(SchemaError) as got:
            decode_gpu_wire(data)
        assert got.value.reason == want
    else:
        assert decode_gpu_wire(data).host == want.host


def test_what_agents_write_takes_the_typed_path() -> None:
    """Else the worker silently pays the checked path's cost again."""
    world = build("leak", hosts=2, gpus=2, services=0, interval_s=60.0)
    envs = [e for e in world.envelopes(hours=0.2) if isinstance(e, GpuEnvelope)]
    assert envs and all(gpu_wire.decode(encode(e)) == gpu_wire_of(e) for e in envs)


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        (("gpus", 0), "fb_used", 101),  # more than fb_total
        (("gpus", 0), "gpu_util", math.nan),
        (("gpus", 0), "gpu_util", 10**400),
        (("gpus", 0), "temp_c", -math.inf),  # any finite temperature; -inf is none
        (("gpus", 0), "index", True),
        (("gpus", 0), "procs", None),
        (("gpus", 0, "procs", 0), "dead", None),
        (("gpus", 0, "procs", 0), "rss", MAX_UINT + 1),
        ((), "ts", -1.0),
        ((), "host", ""),
    ],
)
def test_the_fast_check_sends_edge_cases_to_the_strict_decoder(
    path: tuple[Any, ...], field: str, value: Any
) -> None:
    d = copy.deepcopy(VALID)
    _at(d, path)[field] = value
    assert not _gpu_wire_ok(d)
    assert _strict(d) is not None


def test_a_valid_envelope_takes_the_fast_path_and_round_trips() -> None:
    assert _gpu_wire_ok(VALID)
    env = GpuEnvelope.from_dict(VALID)
    assert decode_gpu_wire(encode(env)) == gpu_wire_of(env) == gpu_wire.from_mapping(VALID)
    assert gpu_wire.decode(encode(env)) is not None


def _transitions(pipe: GpuPipeline, scenario: str, hours: float) -> list[tuple[Any, ...]]:
    world = build(scenario, hosts=2, gpus=2, services=1, interval_s=20.0)
    out = []
    for env in world.envelopes(hours=hours):
        if isinstance(env, GpuEnvelope):
            for t in pipe.process(env):
                a = t.alert
                out.append((a.fingerprint, a.status, t.previous, a.at, a.starts_at, a.value))
    return out


@pytest.mark.parametrize(("scenario", "hours"), [("leak", 3.0), ("oom", 5.0)])
def test_gated_evaluation_gives_the_transitions_of_evaluating_every_sample(
    scenario: str, hours: float
) -> None:
    grows = {  # reads only the estimate, resolves on it: gated
        "name": "Grows",
        "series": "gpu",
        "expr": "gb_per_hour > 0.3",
        "for": "3m",
        "resolve": "gb_per_hour < 0.1",
    }
    # reads a per-sample signal on process series: evaluated on every sample
    big = {"name": "Big", "series": "process", "expr": "gpu_mem_bytes > 20GB", "for": "1m"}
    # its resolve condition holds while its expr still holds: resolved, then pending again
    # on the next sample, not the next bucket
    flaps = {
        "name": "Flaps",
        "series": "process",
        "expr": "gb_per_hour > 0.3",
        "resolve": "recent_steadiness < 2",
        "keep_firing_for": "1m",
    }
    rules = [*load_rules(), parse_rule(grows), parse_rule(big), parse_rule(flaps)]
    fast = _transitions(GpuPipeline(rules, AlertEngine()), scenario, hours)
    reference = _transitions(GpuPipeline(rules, AlertEngine(), every_sample=True), scenario, hours)
    assert fast == reference
    assert {t[1] for t in fast} >= {"pending", "firing"}


# ---------------------------------------------------------------- request records

RECORD: dict[str, Any] = {
    "ts": 1_700_000_000.5,
    "status": "ok",
    "e2e_ms": 820.0,
    "context_tokens": 1800,
    "output_tokens": 240,
    "stages": {"retriever": 80.0, "llm": 700.0},
    "queue_ms": 3.0,
    "ttft_ms": None,
}
RECORD_FIELDS = [*RECORD, "stages.llm"]


@st.composite
def mutated_record(draw: st.DrawFn) -> dict[str, Any]:
    d = copy.deepcopy(RECORD)
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(RECORD_FIELDS))
        target, name = (d.get("stages"), "llm") if field == "stages.llm" else (d, field)
        if not isinstance(target, dict):
            continue
        if draw(st.booleans()):
            target.pop(name, None)
        else:
            target[name] = draw(ODD_VALUES)
    return d


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_record())
def test_request_records_decode_alike_on_the_fast_and_the_checked_path(d: dict[str, Any]) -> None:
    try:
        checked: RequestRecord | str = RequestRecord._checked(d, "r.")
    except SchemaError as exc:
        checked = exc.reason
    try:
        fast: RequestRecord | str = RequestRecord.from_dict(d, "r.")
    except SchemaError as exc:
        fast = exc.reason
    assert fast == checked


def test_a_host_cannot_take_more_than_its_share_of_series() -> None:
    pipe = GpuPipeline(load_rules(), AlertEngine(), max_series_per_host=5)
    procs = [{"pid": 100 + i, "name": "w", "gpu_mem": 1} for i in range(10)]
    gpu = {"index": 0, "uuid": "GPU-0", "name": "H200", "fb_used": 10, "fb_total": 100}
    for host in ("churny", "calm"):
        n = 10 if host == "churny" else 2
        env = {
            "v": 1,
            "kind": "gpu",
            "host": host,
            "ts": 1_767_225_600.0,  # (the pipeline refuses stamps before 2000)
            "gpus": [{**gpu, "procs": procs[:n]}],
        }
        pipe.process_wire(gpu_wire.from_mapping(env))
    assert len(pipe.host_series("churny")) == 5  # the GPU and its first 4 processes
    assert pipe.stats.dropped_host_cap == 6
    assert len(pipe.host_series("calm")) == 3  # another host is not affected
