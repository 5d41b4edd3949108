"""Spans made by the OpenTelemetry Python SDK and encoded by its own OTLP encoder
(``opentelemetry-exporter-otlp-proto-common``), in the two encodings the Collector's Kafka
exporter writes: ``otlp_proto`` (the message's bytes) and ``otlp_json`` (the OTLP/JSON
mapping: hex trace and span ids, integer enums, 64-bit integers as decimal strings).

:func:`spans_of` turns request records (what the ragwatch SDK would send) into the traces
an instrumented RAG service would export for the same requests: a server span, then a
retriever (OpenInference RETRIEVER), a reranker (RERANKER) and an LLM span (GenAI ``chat``
with its token usage), one after another, for the stages a record has.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from ragwatch.schema import RequestRecord, RequestsEnvelope

NS = 1_000_000_000
STAGE_ATTRIBUTES = {
    "retriever": {"openinference.span.kind": "RETRIEVER"},
    "reranker": {"openinference.span.kind": "RERANKER"},
    "llm": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-3-8b"},
}


class Service:
    """One instrumented service instance: a tracer provider with its resource, spans kept
    in memory until :meth:`take`."""

    def __init__(
        self,
        service: str,
        instance: str,
        host: str | None = None,
        *,
        engine: bool = False,
        client: str | None = None,
        limits: SpanLimits | None = None,
        resource: dict[str, str] | None = None,
    ) -> None:
        """``engine``: the LLM span is vLLM's own request span in the service's process,
        with its queue wait and time to first token (seconds, from the engine's start);
        ``client``: it is a client's call as ``"openlit"`` records it
        (:func:`client_latencies`), a generation as ``"langfuse"``'s SDK does
        (:func:`langfuse_generation`), or an LLM call as ``"openinference"``'s
        instrumentations do: its kind and token counts, and a span event at its first
        streamed chunk. ``limits``: the SDK's span limits (its defaults if None);
        ``resource``: more resource attributes."""
        self.engine, self.client = engine, client
        attrs = {"service.name": service, "service.instance.id": instance}
        if host:
            attrs["host.name"] = host
        attrs.update(resource or {})
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create(attrs), span_limits=limits)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("rag-app")

    def request(self, rec: RequestRecord) -> None:
        """The spans of one request: ``rec.ts`` is its end, ``rec.e2e_ms`` its length."""
        end = round(rec.ts * NS)
        start = end - round(rec.e2e_ms * 1e6)
        root = self.tracer.start_span("POST /ask", start_time=start, kind=trace.SpanKind.SERVER)
        ctx = trace.set_span_in_context(root)
        t = start
        for stage in ("retriever", "reranker", "llm"):
            if stage not in rec.stages:
                continue
            length = round(rec.stages[stage] * 1e6)
            attrs: dict[str, Any] = dict(STAGE_ATTRIBUTES[stage])
            if stage == "llm":
                attrs["gen_ai.usage.input_tokens"] = rec.context_tokens
                attrs["gen_ai.usage.output_tokens"] = rec.output_tokens
                if self.engine:
                    attrs.update(engine_latencies(rec, (t - start) / 1e6))
                if self.client == "openlit":
                    attrs.update(client_latencies(rec, (t - start) / 1e6, rec.stages[stage]))
                elif self.client == "langfuse":
                    attrs = langfuse_generation(rec, start)
                elif self.client == "openinference":
                    attrs = {"openinference.span.kind": "LLM",
                             "llm.token_count.prompt": rec.context_tokens,
                             "llm.token_count.completion": rec.output_tokens}  # fmt: skip
            child = self.tracer.start_span(stage, context=ctx, start_time=t, attributes=attrs)
            if stage == "llm" and self.client == "openinference" and rec.ttft_ms is not None:
                first = start + round(rec.ttft_ms * 1e6)
                child.add_event("First Token Stream Event", timestamp=first)
            child.end(end_time=t + length)
            t += length
        if rec.status == "error":
            root.set_status(Status(StatusCode.ERROR, "upstream failed"))
        root.end(end_time=end)

    def take(self) -> list[ReadableSpan]:
        spans = list(self.exporter.get_finished_spans())
        self.exporter.clear()
        return spans


def engine_latencies(rec: RequestRecord, called_ms: float) -> dict[str, float]:
    """vLLM's latency attributes (seconds) of an engine called ``called_ms`` into ``rec``:
    its queue wait, and the time to first token from the engine's start."""
    out = {}
    if rec.queue_ms is not None:
        out["gen_ai.latency.time_in_queue"] = rec.queue_ms / 1000
    if rec.ttft_ms is not None:
        out["gen_ai.latency.time_to_first_token"] = (rec.ttft_ms - called_ms) / 1000
    return out


def client_latencies(rec: RequestRecord, called_ms: float, call_ms: float) -> dict[str, Any]:
    """What OpenLIT writes on a client's LLM call (``call_ms`` long, ``called_ms`` into
    ``rec``): streamed, the time to its first chunk (seconds, from the call's start); not
    streamed (``rec`` without a TTFT), the call's whole duration in the same attribute."""
    if rec.ttft_ms is None:
        return {"gen_ai.request.is_stream": False,
                "gen_ai.server.time_to_first_token": call_ms / 1000}  # fmt: skip
    return {"gen_ai.request.is_stream": True,
            "gen_ai.server.time_to_first_token": (rec.ttft_ms - called_ms) / 1000}  # fmt: skip


def langfuse_generation(rec: RequestRecord, start_ns: int) -> dict[str, Any]:
    """A generation as Langfuse's SDK writes it (each value through its ``_serialize``:
    the usage a JSON object, the completion start time a JSON-quoted ISO 8601 instant, set
    for a streamed completion only), without the GenAI conventions' attributes."""
    out = {
        "langfuse.observation.type": "generation",
        "langfuse.observation.model.name": "llama-3-8b",
        "langfuse.observation.usage_details": json.dumps(
            {
                "input": rec.context_tokens,
                "output": rec.output_tokens,
                "total": rec.context_tokens + rec.output_tokens,
            }
        ),
    }
    if rec.ttft_ms is not None:
        first = datetime.fromtimestamp(start_ns / 1e9 + rec.ttft_ms / 1e3, tz=UTC)
        out["langfuse.observation.completion_start_time"] = json.dumps(first.isoformat())
    return out


class Fleet:
    """One :class:`Service` per service instance, made when first seen (``engine``,
    ``client``: see :class:`Service`)."""

    def __init__(self, *, engine: bool = False, client: str | None = None) -> None:
        self.services: dict[tuple[str, str], Service] = {}
        self.engine, self.client = engine, client

    def spans(self, env: RequestsEnvelope) -> list[ReadableSpan]:
        """The spans of ``env``'s requests, as its instance's exporter would send them."""
        svc = self.services.get((env.service, env.instance))
        if svc is None:
            svc = self.services[(env.service, env.instance)] = Service(
                env.service, env.instance, env.host, engine=self.engine, client=self.client
            )
        for rec in env.records:
            svc.request(rec)
        return svc.take()


def spans_of(envelopes: Iterable[RequestsEnvelope]) -> list[ReadableSpan]:
    """The SDK spans of every record of ``envelopes``, one Service per instance."""
    fleet = Fleet()
    return [span for env in envelopes for span in fleet.spans(env)]


def otlp_proto(spans: Sequence[ReadableSpan]) -> bytes:
    return bytes(encode_spans(spans).SerializeToString())


def otlp_json(spans: Sequence[ReadableSpan]) -> bytes:
    """The OTLP/JSON of the SDK's own ExportTraceServiceRequest, as the Collector writes it."""
    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(key):
                        sp[key] = base64.b64decode(sp[key]).hex()
    return orjson.dumps(doc)
