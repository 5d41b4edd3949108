"""OTLP traces in: spans made and encoded by the OpenTelemetry SDK itself, decoded in both
of the Collector's encodings, assembled into the request records the ragwatch SDK would
have sent for the same requests, and paging exactly as that path does."""

from __future__ import annotations

import io
import itertools
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanLimits

from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
from ragwatch.commands.replay import replay
from ragwatch.errors import SchemaError
from ragwatch.otlp import MAX_SPANS, Encoding, decode_traces
from ragwatch.schema import RequestRecord, RequestsEnvelope, Span
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.buckets import decode_ms_per_token
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.traces import StageMap, TraceAssembler
from tests.otel_spans import NS, Fleet, Service, otlp_json, otlp_proto, spans_of

T0 = 1_767_225_600.0
MS = 1_000_000  # span times are nanoseconds


def records(envs: list[RequestsEnvelope]) -> dict[tuple[str, str], list[RequestRecord]]:
    out: dict[tuple[str, str], list[RequestRecord]] = {}
    for env in envs:
        out.setdefault((env.service, env.instance), []).extend(env.records)
    return {k: sorted(v, key=lambda r: r.ts) for k, v in out.items()}


def assemble(payloads: list[bytes], end: float) -> list[RequestsEnvelope]:
    asm = TraceAssembler(grace_s=30.0)
    out = []
    for p in payloads:
        out += asm.add(decode_traces(p))
    return out + asm.advance(end)


def test_the_sdks_spans_decode_alike_in_both_encodings() -> None:
    svc = Service("rag-api", "pod-7", "gpu-node-01")
    rec = RequestRecord(T0, "ok", 812.0, 3100, 220, {"retriever": 95.0, "llm": 700.0})
    svc.request(rec)
    spans = svc.take()
    proto, json = decode_traces(otlp_proto(spans)), decode_traces(otlp_json(spans))
    assert sorted(proto, key=lambda s: s.span_id) == sorted(json, key=lambda s: s.span_id)
    root = next(s for s in proto if s.parent_id is None)
    assert (root.service, root.instance, root.host) == ("rag-api", "pod-7", "gpu-node-01")
    assert root.duration_ms == 812.0 and root.name == "POST /ask"
    ((key, (got,)),) = records(assemble([otlp_proto(spans)], T0 + 60)).items()
    assert key == ("rag-api", "pod-7") and got == rec


def test_a_simulated_days_requests_come_back_as_the_same_records() -> None:
    """Every record of the request simulator (with a retrieval slowdown) made into SDK
    spans, split into messages of a few spans, shuffled within a window, some sent twice:
    assembled, they are the records again."""
    sim = RequestSimulator(RequestSimConfig(services=1, scenario="retrieval", batch_s=10.0))
    envs = [e for _, batch in itertools.islice(sim.ticks(), 180) for e in batch]  # 30 min
    spans = spans_of(envs)
    rng = random.Random(3)
    chunks = [spans[i : i + 7] for i in range(0, len(spans), 7)]
    for i in range(0, len(chunks) - 3, 3):  # out of order within a few messages
        window = chunks[i : i + 3]
        rng.shuffle(window)
        chunks[i : i + 3] = window
    payloads = [
        (otlp_proto if i % 2 else otlp_json)(c) for i, c in enumerate(chunks)
    ]  # both encodings, one stream
    payloads += payloads[10:20]  # redelivered (at-least-once)
    got = records(assemble(payloads, envs[-1].ts + 120))
    want = records([e for e in envs if e.records])
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key])
        for g, w in zip(got[key], want[key], strict=True):
            assert_same(g, w)


def assert_same(got: RequestRecord, want: RequestRecord) -> None:
    """Spans carry nanoseconds: times come back to within a microsecond."""
    assert got.ts == pytest.approx(want.ts, abs=1e-6)
    assert got.e2e_ms == pytest.approx(want.e2e_ms, abs=1e-3)
    assert got.stages == pytest.approx(want.stages, abs=1e-3)
    assert (got.status, got.context_tokens, got.output_tokens) == (
        want.status, want.context_tokens, want.output_tokens,
    )  # fmt: skip


def test_a_retrieval_slowdown_pages_from_spans_as_it_does_from_the_sdk() -> None:
    # the fault an hour in: a latency baseline judges after 1,500 values (30 a minute here)
    cfg = RequestSimConfig(
        services=2, scenario="retrieval", batch_s=10.0, base_qps=5.0, fault_start_s=3600.0
    )
    envs = [e for _, batch in itertools.islice(RequestSimulator(cfg).ticks(), 900) for e in batch]
    sdk = Pipelines(load_rules())
    direct = [t for env in envs for t in sdk.process(env)]
    asm, traced, fleet = TraceAssembler(grace_s=30.0), Pipelines(load_rules()), Fleet()
    via_spans = []
    for env in envs:  # 2.5 h: each batch of requests as the instance's exporter would send it
        spans = fleet.spans(env)
        out = asm.add(decode_traces(otlp_proto(spans))) if spans else asm.advance(env.ts)
        for assembled in out:
            via_spans += traced.process(assembled)
    fired = {(t.alert.rule, t.alert.labels.get("instance")) for t in direct if t.notify}
    assert {i for r, i in fired if r == "RetrievalSlowdown"} == {"rag-api-1"}  # the faulty one
    key = [(t.alert.rule, t.alert.status, t.alert.labels.get("instance")) for t in direct]
    got = [(t.alert.rule, t.alert.status, t.alert.labels.get("instance")) for t in via_spans]
    assert got == key


def test_a_decode_slowdown_pages_from_vllms_spans_as_it_does_from_the_sdk() -> None:
    """The LLM span is vLLM's own request span, in process (``Fleet(engine=True)``): its
    queue wait and time to first token make the records' ``queue_ms`` and ``ttft_ms``, so
    decode speed is told as the SDK tells it (from the first token on, not with the
    prefill), and the engine's slower decoding pages the same alerts at the same times."""
    cfg = RequestSimConfig(
        services=2, scenario="throughput", batch_s=10.0, base_qps=5.0, fault_start_s=3600.0
    )
    envs = [e for _, batch in itertools.islice(RequestSimulator(cfg).ticks(), 900) for e in batch]
    sdk = Pipelines(load_rules())
    direct = [t for env in envs for t in sdk.process(env)]
    asm, traced, fleet = TraceAssembler(grace_s=30.0), Pipelines(load_rules()), Fleet(engine=True)
    via_spans, got_records = [], []
    for env in [*envs, None]:  # (None: the end, the last traces' grace over)
        spans = fleet.spans(env) if env else []
        now = env.ts if env else envs[-1].ts + 120
        out = asm.add(decode_traces(otlp_json(spans))) if spans else asm.advance(now)
        for assembled in out:
            got_records += assembled.records
            via_spans += traced.process(assembled)
    want = sorted((r for e in envs for r in e.records), key=lambda r: r.ts)
    got = sorted(got_records, key=lambda r: r.ts)
    assert len(got) == len(want) and asm.stats.bad_latencies == 0
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
        assert g.queue_ms == pytest.approx(w.queue_ms, abs=1e-3)
        assert (g.ttft_ms is None) == (w.ttft_ms is None)
        assert g.ttft_ms is None or g.ttft_ms == pytest.approx(w.ttft_ms, abs=1e-3)
    fired = {(t.alert.rule, t.alert.labels.get("instance")) for t in direct if t.notify}
    assert ("DecodeSpeedDrop", "rag-api-1") in fired, fired
    key = [(t.alert.rule, t.alert.status, t.alert.labels.get("instance")) for t in direct]
    assert [
        (t.alert.rule, t.alert.status, t.alert.labels.get("instance")) for t in via_spans
    ] == key


def test_vllms_request_span_is_its_own_services_record_with_its_queue_and_ttft() -> None:
    """vLLM traced as its own service (``--otlp-traces-endpoint``), called by a RAG
    service: its ``llm_request`` span, with the attributes vLLM writes (seconds), is a
    request of the ``vllm`` service with the engine's queue wait and TTFT; the caller's
    record has neither (another service's times are not its own). Values that are not
    seconds in range are not used, and counted."""
    rag, engine = Service("rag-api", "pod-1"), Service("vllm", "vllm-0")
    start = round(T0 * NS)
    root = rag.tracer.start_span("POST /ask", start_time=start, kind=trace.SpanKind.SERVER)
    call = rag.tracer.start_span(
        "chat", context=trace.set_span_in_context(root), start_time=start + 200 * MS,
        attributes={"gen_ai.operation.name": "chat"}, kind=trace.SpanKind.CLIENT,
    )  # fmt: skip
    vllm_attrs = {
        "gen_ai.response.model": "llama-3-8b", "gen_ai.request.id": "cmpl-1",
        "gen_ai.usage.prompt_tokens": 3000, "gen_ai.usage.completion_tokens": 201,
        "gen_ai.latency.time_in_queue": 0.05, "gen_ai.latency.time_to_first_token": 0.25,
        "gen_ai.latency.e2e": 1.25,
    }  # fmt: skip
    served = engine.tracer.start_span(
        "llm_request", context=trace.set_span_in_context(call), start_time=start + 210 * MS,
        attributes=vllm_attrs, kind=trace.SpanKind.SERVER,
    )  # fmt: skip
    served.end(end_time=start + 1460 * MS)
    call.end(end_time=start + 1470 * MS)
    root.end(end_time=start + 1500 * MS)
    bad = [{"gen_ai.latency.time_to_first_token": v} for v in (-1.0, "0.3", 2 * 86400.0)]
    for i, attrs in enumerate(bad):  # three more requests of vLLM, each with a bad TTFT
        t = start + (i + 2) * NS
        engine.tracer.start_span("llm_request", start_time=t, attributes=attrs).end(t + MS)
    asm = TraceAssembler(grace_s=1.0)
    done = asm.add(decode_traces(otlp_proto([*rag.take(), *engine.take()])))
    got = records(done + asm.advance(T0 + 60))
    (mine,) = got[("rag-api", "pod-1")]
    assert (mine.queue_ms, mine.ttft_ms, mine.e2e_ms) == (None, None, 1500.0)
    served_rec, *bad_recs = got[("vllm", "vllm-0")]
    assert served_rec.queue_ms == pytest.approx(50.0)
    assert served_rec.ttft_ms == pytest.approx(250.0)  # from the engine's own start
    assert (served_rec.context_tokens, served_rec.output_tokens) == (3000, 201)
    assert decode_ms_per_token(served_rec) == pytest.approx((1250.0 - 250.0) / 200)
    assert [r.ttft_ms for r in bad_recs] == [None] * 3, bad_recs
    assert asm.stats.bad_latencies == 3, asm.stats


def test_the_process_start_time_of_the_resource_is_the_envelopes_started() -> None:
    """``process.creation.time`` (ISO 8601, OpenTelemetry's semantic conventions) says when
    the instance's process started: the newest of an envelope's is its ``started`` (the
    worker's warm-up after a restart); one that is not a time is not used, and counted."""
    rec = RequestRecord(T0, "ok", 812.0, 3100, 220, {"retriever": 95.0})
    old = Service("rag-api", "pod-1", resource={"process.creation.time": "2025-12-31T22:00:00Z"})
    new = Service("rag-api", "pod-1", resource={"process.creation.time": "2025-12-31T23:59:00.5Z"})
    bad = Service("rag-api", "pod-2", resource={"process.creation.time": "yesterday"})
    plain = Service("rag-api", "pod-3")
    for svc in (old, new, bad, plain):
        svc.request(rec)
    asm = TraceAssembler(grace_s=1.0)
    payload = otlp_json([*old.take(), *new.take(), *bad.take(), *plain.take()])
    envs = asm.add(decode_traces(payload)) + asm.advance(T0 + 60)
    started = {env.instance: env.started for env in envs}
    assert started == {"pod-1": T0 - 59.5, "pod-2": None, "pod-3": None}
    assert asm.stats.bad_process_times == 1


@pytest.mark.parametrize("client", ["openlit", "langfuse", "openinference"])
def test_a_clients_streamed_calls_give_the_sdks_ttft_and_decode_speed(client: str) -> None:
    """The LLM span is a client's call as OpenLIT records it: streamed, its time to first
    chunk (seconds, from the call's start) is the record's TTFT once the call's offset in
    the request is added, so decode speed is told from the first token on, as from the SDK;
    a call with no output is not streamed, and OpenLIT's whole call duration in the same
    attribute is no TTFT. Or a generation as Langfuse's SDK writes it, without the GenAI
    conventions: its type, its usage as JSON, its completion start time as an instant
    (microseconds: the TTFTs to within 2 µs). Or OpenInference's: a span event at the
    first streamed chunk."""
    sim = RequestSimulator(RequestSimConfig(services=2, scenario="throughput", batch_s=10.0,
                                            fault_start_s=600.0))  # fmt: skip
    envs = [e for _, batch in itertools.islice(sim.ticks(), 180) for e in batch]  # 30 min
    fleet = Fleet(client=client)
    payloads = [otlp_json(spans) for env in envs if (spans := fleet.spans(env))]
    asm = TraceAssembler(grace_s=30.0)
    done = [env for p in payloads for env in asm.add(decode_traces(p))]
    got, want = records(done + asm.advance(envs[-1].ts + 120)), records(envs)
    assert got.keys() == want.keys() and asm.stats.bad_latencies == 0
    pairs = [(g, w) for key in want for g, w in zip(got[key], want[key], strict=True)]
    assert len(pairs) == sum(len(e.records) for e in envs)
    assert sum(w.ttft_ms is None for _, w in pairs) > 0  # some not streamed
    for g, w in pairs:
        assert_same(g, w)
        assert g.queue_ms is None  # a client does not see the engine's queue
        assert (g.ttft_ms is None) == (w.ttft_ms is None)
        if w.ttft_ms is not None:
            assert g.ttft_ms == pytest.approx(w.ttft_ms, abs=2e-3)
            assert decode_ms_per_token(g) == pytest.approx(decode_ms_per_token(w), abs=1e-4)


def test_ttft_from_the_older_spelling_and_from_the_first_span_that_has_one() -> None:
    """OpenLIT's older ``gen_ai.server.ttft``; a client's streamed call around vLLM's own
    span in the same process: the queue wait is the engine's, the TTFT the client's (its
    call began first); a call marked not streamed gives none, and counts as no bad value."""
    client = {"gen_ai.operation.name": "chat", "gen_ai.request.is_stream": True,
              "gen_ai.server.time_to_first_token": 0.3}  # fmt: skip
    vllm = {"gen_ai.latency.time_in_queue": 0.02, "gen_ai.latency.time_to_first_token": 0.25}
    whole = {"gen_ai.operation.name": "chat", "gen_ai.request.is_stream": False,
             "gen_ai.server.time_to_first_token": 0.8}  # fmt: skip
    asm = TraceAssembler(grace_s=1.0)
    asm.add([
        span("a", "r", None, end=1000 * MS),
        span("a", "c", "r", start=100 * MS, end=900 * MS,
             attrs={"gen_ai.operation.name": "chat", "gen_ai.server.ttft": 0.2}),
        span("b", "r", None, end=1000 * MS),
        span("b", "c", "r", start=100 * MS, end=900 * MS, attrs=client),
        span("b", "v", "c", name="llm_request", start=120 * MS, end=880 * MS, attrs=vllm),
        span("c", "r", None, end=1000 * MS),
        span("c", "c", "r", start=100 * MS, end=900 * MS, attrs=whole),
    ])  # fmt: skip
    ((env,),) = [asm.advance(100.0)]
    older, around, not_streamed = env.records
    assert (older.queue_ms, older.ttft_ms) == (None, pytest.approx(300.0))
    assert (around.queue_ms, around.ttft_ms) == (pytest.approx(20.0), pytest.approx(400.0))
    assert (not_streamed.queue_ms, not_streamed.ttft_ms) == (None, None)
    assert asm.stats.bad_latencies == 0


def test_langfuses_generation_gives_its_tokens_and_ttft_and_bad_values_none() -> None:
    """Langfuse's SDK serialises a generation's usage as a JSON object and its completion
    start time as a JSON-quoted instant: the tokens and the TTFT from the request's start.
    A time that is no ISO instant, before the request or a day after it is not used, and
    counted; usage that is no JSON object gives no tokens."""
    start = round(T0 * NS)
    usage = '{"input":3000,"output":250,"total":3250}'
    gen = {"langfuse.observation.type": "generation", "langfuse.observation.usage_details": usage}
    firsts = ['"2026-01-01T00:00:00.700000+00:00"', "2026-01-01T00:00:00.7Z",
              "yesterday", '"2025-12-31T23:59:59Z"', '"2026-01-03T00:00:00Z"']  # fmt: skip
    spans = []
    for i, first in enumerate(firsts):
        tid = f"t{i}"
        spans += [
            span(tid, "r", None, start=start, end=start + 1000 * MS),
            span(tid, "g", "r", start=start + 300 * MS, end=start + 900 * MS,
                 attrs={**gen, "langfuse.observation.completion_start_time": first}),
        ]  # fmt: skip
    spans += [
        span("t9", "r", None, start=start, end=start + 1000 * MS),
        span("t9", "g", "r", start=start + 300 * MS, end=start + 900 * MS,
             attrs={"langfuse.observation.type": "generation",
                    "langfuse.observation.usage_details": "3250"}),
    ]  # fmt: skip
    asm = TraceAssembler(grace_s=1.0)
    asm.add(spans)
    ((env,),) = [asm.advance(T0 + 100.0)]
    *timed, no_usage = env.records
    assert [r.ttft_ms for r in timed] == [pytest.approx(700.0)] * 2 + [None] * 3
    assert all((r.context_tokens, r.output_tokens, r.stages) == (3000, 250, {"llm": 600.0})
               for r in timed)  # fmt: skip
    assert (no_usage.context_tokens, no_usage.output_tokens) == (0, 0)
    assert asm.stats.bad_latencies == 3


@pytest.mark.parametrize("encode", [otlp_proto, otlp_json], ids=["proto", "json"])
@pytest.mark.parametrize("max_events", [128, 3])
def test_the_first_chunk_event_gives_the_ttft_in_both_encodings(
    encode: Any, max_events: int
) -> None:
    """OpenLLMetry adds an event at each streamed chunk (``llm.content.completion.chunk``):
    the earliest is the first token; other events are not. A span that dropped events
    (the SDK keeps the newest ``max_events``) may have lost its first chunk's: no TTFT."""
    svc = Service("rag-api", "pod-1", limits=SpanLimits(max_events=max_events))
    start = round(T0 * NS)
    root = svc.tracer.start_span("POST /ask", start_time=start, kind=trace.SpanKind.SERVER)
    call = svc.tracer.start_span(
        "openai.chat", context=trace.set_span_in_context(root), start_time=start + 200 * MS,
        attributes={"llm.request.type": "chat"},
    )  # fmt: skip
    call.add_event("gen_ai.content.prompt", timestamp=start + 210 * MS)
    for ms in (520, 400, 450):
        call.add_event("llm.content.completion.chunk", timestamp=start + ms * MS)
    call.end(end_time=start + 900 * MS)
    root.end(end_time=start + 1000 * MS)
    asm = TraceAssembler(grace_s=1.0)
    asm.add(decode_traces(encode(svc.take())))
    ((env,),) = [asm.advance(T0 + 60)]
    (rec,) = env.records
    assert rec.stages == {"llm": 700.0}
    assert rec.ttft_ms == (pytest.approx(400.0) if max_events > 4 else None)


def test_an_engine_called_inside_the_request_adds_when_it_was_called() -> None:
    ms = 1_000_000
    asm = TraceAssembler(grace_s=1.0)
    asm.add([
        span("t", "r", None, end=1000 * ms),
        span("t", "a", "r", start=100 * ms, end=300 * ms, attrs={"db.system": "qdrant"}),
        span("t", "c", "r", name="llm_request", start=300 * ms, end=1000 * ms,
             attrs={"gen_ai.latency.time_in_queue": 0.02,
                    "gen_ai.latency.time_to_first_token": 0.1,
                    "gen_ai.usage.prompt_tokens": 40, "gen_ai.usage.completion_tokens": 7}),
    ])  # fmt: skip
    ((env,),) = [asm.advance(100.0)]
    (rec,) = env.records
    assert rec.stages == {"llm": 700.0, "retriever": 200.0}  # vLLM's span times the LLM
    assert (rec.context_tokens, rec.output_tokens) == (40, 7)
    assert rec.queue_ms == pytest.approx(20.0) and rec.ttft_ms == pytest.approx(400.0)


@pytest.mark.parametrize("outer_counts", [True, False])
def test_an_llm_span_inside_another_counts_its_tokens_once(outer_counts: bool) -> None:
    """A client's ``chat`` span around vLLM's own (both with the call's tokens, or the
    outer one without): the call's tokens once, its time once."""
    vllm = {"gen_ai.latency.time_to_first_token": 0.1, "gen_ai.usage.prompt_tokens": 40,
            "gen_ai.usage.completion_tokens": 7}  # fmt: skip
    chat: dict[str, object] = {"gen_ai.operation.name": "chat"}
    if outer_counts:
        chat |= {"gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 7}
    asm = TraceAssembler(grace_s=1.0)
    asm.add([
        span("t", "r", None, end=1000 * MS),
        span("t", "c", "r", name="chat", start=100 * MS, end=1000 * MS, attrs=chat),
        span("t", "v", "c", name="llm_request", start=110 * MS, end=990 * MS, attrs=vllm),
    ])  # fmt: skip
    ((env,),) = [asm.advance(100.0)]
    (rec,) = env.records
    assert rec.stages == {"llm": 900.0}
    assert (rec.context_tokens, rec.output_tokens) == (40, 7)
    assert rec.ttft_ms == pytest.approx(210.0)


def span(tid: str, sid: str, parent: str | None, **kw: object) -> Span:
    return Span(
        tid, sid, parent, str(kw.get("name", "op")), int(kw.get("start", 0)),
        int(kw.get("end", 1_000_000)), False, dict(kw.get("attrs", {})),  # type: ignore[call-overload]
        str(kw.get("service", "rag")), "i0",
    )  # fmt: skip


def test_stages_from_every_convention_and_name_patterns() -> None:
    ms = 1_000_000
    conv = [
        ("a1", {"openinference.span.kind": "RERANKER"}, "reranker"),
        ("a2", {"gen_ai.operation.name": "embeddings"}, "embedding"),
        ("a3", {"traceloop.span.kind": "tool"}, "tool"),
        ("a4", {"llm.request.type": "chat", "llm.token_count.prompt": 9}, "llm"),
        ("a5", {"db.system.name": "qdrant"}, "retriever"),
        ("a6", {"openinference.span.kind": "CHAIN"}, None),
        ("a7", {"llm.request.type": "rerank"}, "reranker"),  # OpenLLMetry's Cohere rerank
        ("a8", {"langfuse.observation.type": "generation"}, "llm"),  # Langfuse's SDK
        ("a9", {"langfuse.observation.type": "retriever"}, "retriever"),
        ("a10", {"langfuse.observation.type": "span"}, None),
    ]
    stages = StageMap()
    for sid, attrs, stage in conv:
        assert stages.stage(span("t", sid, "r", attrs=attrs)) == stage, attrs
    custom = StageMap.parse("retriever=^vector_search;reranker=rerank$")
    assert custom.stage(span("t", "x", "r", name="vector_search.query")) == "retriever"
    assert custom.stage(span("t", "y", "r", name="cohere.rerank")) == "reranker"
    with pytest.raises(ValueError, match="regular expression"):
        StageMap.parse("retriever=(")
    # a retriever span inside another retriever span counts once; tokens: the LLM's
    asm = TraceAssembler(grace_s=1.0)
    asm.add([
        span("t", "r", None, end=1000 * ms),
        span("t", "a", "r", start=100 * ms, end=400 * ms, attrs={"db.system": "qdrant"}),
        span("t", "b", "a", start=150 * ms, end=350 * ms, attrs={"db.system": "qdrant"}),
        span("t", "c", "r", start=400 * ms, end=900 * ms,
             attrs={"gen_ai.operation.name": "chat", "gen_ai.usage.prompt_tokens": 40,
                    "gen_ai.usage.completion_tokens": 7}),
    ])  # fmt: skip
    ((env,),) = [asm.advance(100.0)]
    (rec,) = env.records
    assert rec.stages == {"llm": 500.0, "retriever": 300.0}
    assert (rec.context_tokens, rec.output_tokens) == (40, 7)


def test_a_service_called_by_another_is_its_own_request() -> None:
    ms = 1_000_000
    asm = TraceAssembler(grace_s=1.0)
    asm.add([
        span("t", "g", None, service="gateway", end=1000 * ms),
        span("t", "r", "g", service="rag", start=100 * ms, end=900 * ms),
        span("t", "x", "missing-parent", service="search", start=0, end=50 * ms),
    ])  # fmt: skip
    out = {e.service: e.records[0].e2e_ms for e in asm.advance(100.0)}
    assert out == {"gateway": 1000.0, "rag": 800.0, "search": 50.0}


def test_duplicates_late_spans_and_a_flood_of_trace_ids_are_bounded() -> None:
    asm = TraceAssembler(grace_s=1.0, max_traces=100, remember=1_000)
    emitted = []
    for i in range(1_000):  # a flood of trace ids within one second of event time
        emitted += asm.add([span(f"t{i}", "s", None, end=i * 1_000_000)])
    assert asm.stats.open == 100 and asm.stats.evicted == 900 and len(emitted) == 900
    assert len(asm.advance(10.0)) == 1 and asm.stats.open == 0  # one instance, 100 records
    assert asm.stats.records == 1_000
    asm.add([span("t999", "s", None, end=999 * 1_000_000)])  # a trace redelivered
    assert asm.stats.late_spans == 1 and asm.advance(20.0) == []
    twice = span("v", "r", None, end=30 * 10**9)
    asm.add([twice, twice])
    assert asm.stats.duplicates == 1 and len(asm.advance(40.0)[0].records) == 1


@pytest.mark.parametrize(
    ("payload", "encoding", "reason"),
    [
        (b"\x0a\xff\xff\xff", "auto", "not an OTLP protobuf"),
        (b"[1, 2]", "otlp_json", "not an ExportTraceServiceRequest"),
        (b"[1, 2]", "auto", "not an OTLP protobuf"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "auto",
         "traceId"),
        (b"{not json", "auto", "not JSON"),
    ],
)  # fmt: skip
def test_bad_otlp_is_a_schema_error_with_a_reason(
    payload: bytes, encoding: Encoding, reason: str
) -> None:
    with pytest.raises(SchemaError, match=reason):
        decode_traces(payload, encoding)


def test_hostile_names_too_many_spans_and_zero_ids_are_refused() -> None:
    svc = Service("rag\x00api", "i0")
    svc.request(RequestRecord(T0, "ok", 10.0, 1, 1))
    with pytest.raises(SchemaError, match="control character"):
        decode_traces(otlp_proto(svc.take()))
    base = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x",
            "startTimeUnixNano": "1", "endTimeUnixNano": "2"}  # fmt: skip
    many = {"resourceSpans": [{"scopeSpans": [{"spans": [base] * (MAX_SPANS + 1)}]}]}
    with pytest.raises(SchemaError, match="more than"):
        decode_traces(orjson.dumps(many))
    zero = {"resourceSpans": [{"scopeSpans": [{"spans": [{**base, "traceId": "0" * 32}]}]}]}
    with pytest.raises(SchemaError, match="all-zero"):
        decode_traces(orjson.dumps(zero))


def test_replay_of_an_otlp_json_file_pages_the_slow_instance_only(tmp_path: Path) -> None:
    """``ragwatch replay traces.otlp.jsonl``: one ExportTraceServiceRequest per line, as
    the Collector's file exporter writes them, from the SDK's own encoder."""
    # the fault an hour in: a latency baseline judges after 1,500 values (30 a minute here)
    cfg = RequestSimConfig(
        services=2, scenario="retrieval", batch_s=10.0, base_qps=5.0, fault_start_s=3600.0
    )
    path = tmp_path / "traces.otlp.jsonl"
    fleet = Fleet()
    with path.open("wb") as f:
        # 3 h: 3 % of stalls at 30 requests a minute page by evidence over ~800 of them
        for _, batch in itertools.islice(RequestSimulator(cfg).ticks(), 1080):
            for env in batch:
                if spans := fleet.spans(env):
                    f.write(otlp_json(spans) + b"\n")
    out = io.StringIO()
    assert replay([path], load_rules(), out, as_json=True, err=io.StringIO()) == 0
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    fired = {
        (a["labels"]["alertname"], a["labels"].get("instance"))
        for a in lines
        if a.get("kind") != "summary" and a.get("status") == "firing"
    }
    assert fired == {("RetrievalSlowdown", "rag-api-1")}
    (summary,) = [x for x in lines if x.get("kind") == "summary"]
    assert summary["bad_lines"] == 0 and summary["envelopes"] > 1_000


def test_closing_open_traces_on_a_quiet_input_leaves_event_time_alone() -> None:
    """The worker closes open traces after a grace of wall time without OTLP messages;
    moving event time on instead would have emitted the next trace split across two
    messages before its second half came."""
    ms = 1_000_000
    asm = TraceAssembler(grace_s=30.0)
    asm.add([span("t1", "r", None, end=1000 * ms)])
    (env,) = asm.close_open()
    assert env.records[0].e2e_ms == 1000.0 and asm.watermark == 1.0
    first_half = [span("t2", "c", "r2", start=2000 * ms, end=2500 * ms,
                       attrs={"db.system": "qdrant"})]  # fmt: skip
    assert asm.add(first_half) == []
    (env,) = asm.add([span("t2", "r2", None, start=2000 * ms, end=3000 * ms)]) or asm.advance(40.0)
    assert env.records[0].stages == {"retriever": 500.0}
