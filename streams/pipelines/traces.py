"""Traces in, request records out: OTLP spans assembled into one
:class:`~ragwatch.schema.RequestRecord` per request, for the request pipeline.

Spans of one trace may arrive in several messages, out of order and more than once
(at-least-once). :class:`TraceAssembler` keeps each trace's spans by span id (a duplicate
is counted and dropped) until event time (the newest span end seen) is ``grace_s`` past
the trace's newest span (``orphan_wait`` graces while none of its spans is a root: every
parent it names is missing, and the request's own span may still come), then emits one
record per *local root*: a span with no parent, or whose parent is another service's or
was never seen (the entry of a service called by another). Its duration is the request's
``e2e_ms``; its status, or any error in its subtree, the record's; each span below it that
maps to a stage adds its duration to that stage (a span inside another of the same stage is
not counted twice); the LLM spans' token counts are the record's (an LLM span inside
another that has counts adds none). Memory is bounded: at most ``max_traces`` open traces
(the oldest is emitted early beyond it, counted ``evicted``), and a bounded memory of
emitted trace ids so a redelivered trace is not a second request (``late_spans``).

Stages (documented in docs/otel.md, configurable by name patterns):

- OpenInference ``openinference.span.kind``: RETRIEVER, RERANKER, LLM, EMBEDDING, TOOL
  (CHAIN and AGENT hold other spans: no stage);
- OTel GenAI ``gen_ai.operation.name``: chat, text_completion, generate_content -> llm;
  embeddings -> embedding; execute_tool -> tool;
- OpenLLMetry ``traceloop.span.kind`` tool -> tool, ``llm.request.type`` chat or
  completion -> llm, embedding -> embedding, rerank -> reranker;
- Langfuse's ``langfuse.observation.type``: generation -> llm, retriever, embedding, tool;
- vLLM's own request span (its ``gen_ai.latency.*`` attributes) -> llm;
- a vector-database (or any database) client span (``db.system`` / ``db.system.name``)
  -> retriever;
- ``patterns``: (stage, regular expression on the span name), checked first.

Tokens: ``gen_ai.usage.input_tokens`` / ``output_tokens``, the older
``gen_ai.usage.prompt_tokens`` / ``completion_tokens`` (vLLM writes them), OpenInference's
``llm.token_count.prompt`` / ``completion``, else Langfuse's usage details (JSON).

Queue wait: from vLLM's request span (the record's root, or the first such span below it),
``gen_ai.latency.time_in_queue`` (seconds). Time to first token: from the first span that
has one, vLLM's ``gen_ai.latency.time_to_first_token`` (from the request's arrival at the
engine) or a client's streamed call's ``gen_ai.server.time_to_first_token`` (OpenLIT; the
older ``gen_ai.server.ttft``; from the call's start; none when ``gen_ai.request.is_stream``
is false: OpenLIT writes a whole call's duration there), Langfuse's completion start time
(an instant), or the span's first streamed chunk (an event OpenInference's and
OpenLLMetry's instrumentations add: ``Span.first_chunk_ns``). The record's TTFT counts from
its own start, so an engine called 300 ms into the request adds 300 ms. A value that is not
a number of seconds from 0 to a day (an instant within a day of the start) is not used,
and counted (``bad_latencies``).

>>> from ragwatch.schema import Span
>>> def span(sid, parent, name, start, end, **attrs):
...     return Span("t1", sid, parent, name, start, end, False, attrs, "rag", "pod-1")
>>> asm = TraceAssembler(grace_s=5.0)
>>> ms = 1_000_000  # span times are nanoseconds
>>> asm.add([span("c", "a", "qdrant.search", 100 * ms, 300 * ms, **{"db.system": "qdrant"})])
[]
>>> asm.add([span("a", None, "POST /ask", 0, 1000 * ms),
...          span("b", "a", "chat", 300 * ms, 900 * ms, **{"gen_ai.operation.name": "chat",
...               "gen_ai.usage.input_tokens": 3000, "gen_ai.usage.output_tokens": 250})])
[]
>>> (env,) = asm.advance(10.0)
>>> rec = env.records[0]
>>> env.service, env.instance, rec.e2e_ms, rec.stages, rec.context_tokens, rec.output_tokens
('rag', 'pod-1', 1000.0, {'llm': 600.0, 'retriever': 200.0}, 3000, 250)
"""

from __future__ import annotations

import heapq
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from ragwatch.config import parse_stage_patterns
from ragwatch.schema import AttrValue, RequestRecord, RequestsEnvelope, Span

OPENINFERENCE = {
    "RETRIEVER": "retriever",
    "RERANKER": "reranker",
    "LLM": "llm",
    "EMBEDDING": "embedding",
    "TOOL": "tool",
}
GEN_AI = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    "execute_tool": "tool",
}
# Langfuse's SDK (v3, on OpenTelemetry): an observation's type; a generation's usage (a
# JSON object: input, output) and when its completion started (an ISO 8601 time, JSON
# quoted as the SDK serialises it; streamed generations only)
LANGFUSE_TYPE = "langfuse.observation.type"
LANGFUSE = {"generation": "llm", "retriever": "retriever", "embedding": "embedding", "tool": "tool"}
LANGFUSE_USAGE = "langfuse.observation.usage_details"
LANGFUSE_FIRST = "langfuse.observation.completion_start_time"
TRACELOOP_REQUEST = {
    "chat": "llm",
    "completion": "llm",
    "embedding": "embedding",
    "rerank": "reranker",
}
# attribute -> (its value -> stage), in this order (after OpenInference's kind)
STAGE_TABLES: tuple[tuple[str, Mapping[str, str]], ...] = (
    ("gen_ai.operation.name", GEN_AI),
    ("traceloop.span.kind", {"tool": "tool"}),
    ("llm.request.type", TRACELOOP_REQUEST),
    (LANGFUSE_TYPE, LANGFUSE),
)
# vLLM's request span (vllm/tracing.py's SpanAttributes), in seconds
ENGINE_QUEUE_S = "gen_ai.latency.time_in_queue"
ENGINE_TTFT_S = "gen_ai.latency.time_to_first_token"
ENGINE_E2E_S = "gen_ai.latency.e2e"
# a client's LLM call (OpenLIT, and others after it), in seconds from the call's start; the
# older spelling second. A call not streamed has none: OpenLIT writes its whole duration
# there, with ``gen_ai.request.is_stream`` false
CLIENT_TTFT_S = ("gen_ai.server.time_to_first_token", "gen_ai.server.ttft")
STREAMED = "gen_ai.request.is_stream"
MAX_LATENCY_S = 86400.0
INPUT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_TOKENS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
)


@dataclass(frozen=True)
class StageMap:
    """Which stage a span times (None: no stage of its own)."""

    patterns: tuple[tuple[str, re.Pattern[str]], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> StageMap:
        """``stage=regex`` pairs separated by ``;``, e.g. ``retriever=^search;llm=generate``
        (``RAGWATCH_OTLP_STAGE_PATTERNS``)."""
        return cls(parse_stage_patterns(spec))

    def stage(self, span: Span) -> str | None:
        for stage, rx in self.patterns:
            if rx.search(span.name):
                return stage
        a = span.attributes
        kind = a.get("openinference.span.kind")
        if isinstance(kind, str):
            return OPENINFERENCE.get(kind.upper())
        for name, table in STAGE_TABLES:
            v = a.get(name)
            if isinstance(v, str) and v in table:
                return table[v]
        if ENGINE_TTFT_S in a or ENGINE_E2E_S in a:
            return "llm"
        if "db.system" in a or "db.system.name" in a:
            return "retriever"
        return None


@dataclass
class _Trace:
    spans: dict[str, Span] = field(default_factory=dict)
    last: float = 0.0  # the newest span end
    rooted: bool = False  # it holds a span with no parent, or whose parent is another service's


@dataclass
class TraceStats:
    spans: int = 0
    duplicates: int = 0
    late_spans: int = 0  # a span of a trace already emitted (or a redelivered trace)
    traces: int = 0  # traces emitted
    records: int = 0
    evicted: int = 0  # traces emitted early: more than max_traces were open
    bad_latencies: int = 0  # an engine's queue or TTFT attribute not used: not seconds in range
    bad_process_times: int = 0  # a process.creation.time not used: not an ISO 8601 time
    open: int = 0


class TraceAssembler:
    """Spans in (``add``), request envelopes out once their traces are done (see module)."""

    def __init__(
        self,
        *,
        grace_s: float = 30.0,
        orphan_wait: float = 4.0,
        max_traces: int = 100_000,
        remember: int = 200_000,
        stages: StageMap | None = None,
    ) -> None:
        """``orphan_wait``: a trace none of whose spans is a root yet (every parent it names
        is missing: the request's own span may still come) waits this many graces."""
        self.grace_s, self.max_traces, self.remember = grace_s, max_traces, remember
        self.orphan_wait = orphan_wait
        self.stages = stages or StageMap()
        self.stats = TraceStats()
        self.watermark = 0.0
        self._traces: OrderedDict[str, _Trace] = OrderedDict()  # by first arrival
        self._due: list[tuple[float, str]] = []  # (deadline, trace id), lazily cleaned
        self._emitted: OrderedDict[str, None] = OrderedDict()

    def add(self, spans: Iterable[Span]) -> list[RequestsEnvelope]:
        """Take spans; return the envelopes of the traces that are done by now."""
        evicted: list[RequestRecordAt] = []
        for span in spans:
            self.stats.spans += 1
            if span.trace_id in self._emitted:
                self.stats.late_spans += 1
                continue
            trace = self._traces.get(span.trace_id)
            if trace is None:
                trace = self._traces[span.trace_id] = _Trace()
                if len(self._traces) > self.max_traces:
                    self.stats.evicted += 1
                    evicted += self._emit(next(iter(self._traces)))
            if span.span_id in trace.spans:
                self.stats.duplicates += 1
                continue
            trace.spans[span.span_id] = span
            trace.last = max(trace.last, span.end)
            trace.rooted = trace.rooted or _is_root(trace.spans, span)
            heapq.heappush(self._due, (self._deadline(trace), span.trace_id))
            self.watermark = max(self.watermark, span.end)
        return _envelopes([*evicted, *self._flush()])

    def advance(self, now: float) -> list[RequestsEnvelope]:
        """Event time moved to ``now`` without spans (a replay's end, a quiet topic)."""
        self.watermark = max(self.watermark, now)
        return _envelopes(self._flush())

    def close_open(self) -> list[RequestsEnvelope]:
        """Every open trace, done now, event time unchanged (the input went quiet in wall
        time: the last requests of a quiet service are not held until more spans come)."""
        out: list[RequestRecordAt] = []
        while self._traces:
            out += self._emit(next(iter(self._traces)))
        self._due.clear()
        self.stats.open = 0
        return _envelopes(out)

    def _flush(self) -> list[RequestRecordAt]:
        out: list[RequestRecordAt] = []
        while self._due and self._due[0][0] <= self.watermark:
            _, tid = heapq.heappop(self._due)
            trace = self._traces.get(tid)
            if trace is not None and self._deadline(trace) <= self.watermark:
                out += self._emit(tid)
        self.stats.open = len(self._traces)
        return out

    def _deadline(self, trace: _Trace) -> float:
        wait = self.grace_s if trace.rooted else self.grace_s * self.orphan_wait
        return trace.last + wait

    def _emit(self, tid: str) -> list[RequestRecordAt]:
        trace = self._traces.pop(tid)
        self._emitted[tid] = None
        while len(self._emitted) > self.remember:
            self._emitted.popitem(last=False)
        children = _children(trace.spans)
        out = [self._record(trace, root, children) for root in _local_roots(trace.spans)]
        self.stats.traces += 1
        self.stats.records += len(out)
        return out

    def _record(
        self, trace: _Trace, root: Span, children: Mapping[str, list[Span]]
    ) -> RequestRecordAt:
        below = _subtree(children, root)
        stage_of = {s.span_id: self.stages.stage(s) for s in below}
        stages: dict[str, float] = {}
        tokens = {s.span_id: _tokens(s) for s in below if stage_of[s.span_id] == "llm"}
        inputs = outputs = 0
        error = root.error
        for s in below:
            error = error or s.error
            stage = stage_of[s.span_id]
            if stage is None:
                continue
            if stage == "llm" and not _under_counted(trace.spans, s, tokens, root):
                inputs, outputs = inputs + tokens[s.span_id][0], outputs + tokens[s.span_id][1]
            if not _inside_same_stage(trace.spans, s, stage, stage_of, root):
                stages[stage] = stages.get(stage, 0.0) + s.duration_ms
        if not inputs and not outputs:  # tokens on the request's own span
            inputs, outputs = _tokens(root)
        queue_ms, ttft_ms = self._engine_times(root, below)
        rec = RequestRecord(
            ts=root.end,
            status="error" if error else "ok",
            e2e_ms=root.duration_ms,
            context_tokens=inputs,
            output_tokens=outputs,
            stages=dict(sorted(stages.items())),
            queue_ms=queue_ms,
            ttft_ms=ttft_ms,
        )
        return RequestRecordAt(root.service, root.instance, root.host, rec, self._started(root))

    def _started(self, root: Span) -> float | None:
        """When the request's process started (epoch s), from its resource's
        ``process.creation.time`` (None: none, or not a time: counted in
        ``bad_process_times``)."""
        if root.process_created is None:
            return None
        ns = _instant_ns(root.process_created)
        if ns is None or ns < 0:
            self.stats.bad_process_times += 1
            return None
        return ns / 1e9

    def _engine_times(self, root: Span, below: Sequence[Span]) -> tuple[float | None, float | None]:
        """``(queue_ms, ttft_ms)``, each from the request's first span (the root, or the
        earliest below it) that has it: the engine's queue wait (vLLM's attribute), and a
        time to first token (vLLM's, or a client's streamed call's) plus how far into the
        request that span began."""
        queue = ttft = None
        for s in sorted((root, *below), key=lambda s: s.start_ns):  # the root first on a tie
            a = s.attributes
            if queue is None and ENGINE_QUEUE_S in a:
                queue = self._seconds(a, ENGINE_QUEUE_S)
            if ttft is None and (name := _ttft_name(a)) is not None:
                first = self._seconds(a, name)
                called_ms = max(0, s.start_ns - root.start_ns) / 1e6
                ttft = None if first is None else called_ms + first * 1000.0
            elif ttft is None and LANGFUSE_FIRST in a:
                ttft = self._since_start_ms(_instant_ns(a[LANGFUSE_FIRST]), root)
            elif ttft is None and s.first_chunk_ns is not None:
                ttft = self._since_start_ms(s.first_chunk_ns, root)
            if queue is not None and ttft is not None:
                break
        return None if queue is None else queue * 1000.0, ttft

    def _since_start_ms(self, at: int | None, root: Span) -> float | None:
        """The time from the request's start to ``at`` (ns; None: not within a day after
        the start, or no time: counted in ``bad_latencies``)."""
        ms = None if at is None else (at - root.start_ns) / 1e6
        if ms is not None and 0 <= ms <= MAX_LATENCY_S * 1000.0:
            return ms
        self.stats.bad_latencies += 1
        return None

    def _seconds(self, attrs: Mapping[str, AttrValue], name: str) -> float | None:
        """``attrs[name]`` as seconds (None: absent, or not a number from 0 to a day:
        counted in ``bad_latencies``)."""
        v = attrs.get(name)
        if v is None:
            return None
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= MAX_LATENCY_S:
            return float(v)
        self.stats.bad_latencies += 1
        return None


@dataclass(frozen=True)
class RequestRecordAt:
    service: str
    instance: str
    host: str | None
    record: RequestRecord
    started: float | None = None  # when its process started (process.creation.time)


def _ttft_name(attrs: Mapping[str, AttrValue]) -> str | None:
    """The attribute that holds a span's time to first token (None: it has none, or the
    call was not streamed)."""
    if ENGINE_TTFT_S in attrs:
        return ENGINE_TTFT_S
    if attrs.get(STREAMED) is False:
        return None
    return next((name for name in CLIENT_TTFT_S if name in attrs), None)


def _is_root(spans: Mapping[str, Span], s: Span) -> bool:
    """No parent, or a parent of another service (a child that came first and was an
    orphan becomes rooted when its own service's root, or its caller, arrives)."""
    if s.parent_id is None:
        return True
    parent = spans.get(s.parent_id)
    return parent is not None and parent.service != s.service


def _local_roots(spans: Mapping[str, Span]) -> list[Span]:
    roots = []
    for s in spans.values():
        parent = spans.get(s.parent_id) if s.parent_id else None
        if s.parent_id is None or parent is None or parent.service != s.service:
            roots.append(s)
    return sorted(roots, key=lambda s: (s.end, s.span_id))


def _children(spans: Mapping[str, Span]) -> dict[str, list[Span]]:
    """Span id -> the spans whose parent it is."""
    children: dict[str, list[Span]] = {}
    for s in spans.values():
        if s.parent_id:
            children.setdefault(s.parent_id, []).append(s)
    return children


def _subtree(children: Mapping[str, list[Span]], root: Span) -> list[Span]:
    """The spans below ``root`` in its own service (not ``root`` itself)."""
    out, todo = [], list(children.get(root.span_id, ()))
    while todo:
        s = todo.pop()
        if s.service != root.service:
            continue  # another service called from here: its own request
        out.append(s)
        todo += children.get(s.span_id, ())
    return out


def _above(spans: Mapping[str, Span], s: Span, root: Span) -> Iterator[Span]:
    """The spans between ``s`` and ``root``, its parent first (those seen)."""
    parent = spans.get(s.parent_id) if s.parent_id else None
    while parent is not None and parent.span_id != root.span_id:
        yield parent
        parent = spans.get(parent.parent_id) if parent.parent_id else None


def _inside_same_stage(
    spans: Mapping[str, Span],
    s: Span,
    stage: str,
    stage_of: Mapping[str, str | None],
    root: Span,
) -> bool:
    return any(stage_of.get(p.span_id) == stage for p in _above(spans, s, root))


def _tokens(s: Span) -> tuple[int, int]:
    a = s.attributes
    inputs, outputs = _count(a, INPUT_TOKENS), _count(a, OUTPUT_TOKENS)
    if inputs or outputs or LANGFUSE_USAGE not in a:
        return inputs, outputs
    return _usage(a[LANGFUSE_USAGE])


def _usage(details: AttrValue) -> tuple[int, int]:
    """Input and output tokens of Langfuse's usage details, a JSON object (0 where it is
    not one, or has no such count).

    >>> _usage('{"input": 3000, "output": 250, "total": 3250}'), _usage("3000")
    ((3000, 250), (0, 0))
    """
    try:
        d: Any = orjson.loads(details) if isinstance(details, str) else None
    except orjson.JSONDecodeError:
        return 0, 0
    if not isinstance(d, dict):
        return 0, 0
    return _count(d, ("input", "input_tokens")), _count(d, ("output", "output_tokens"))


def _instant_ns(when: AttrValue) -> int | None:
    """An ISO 8601 time (JSON quoted or not; UTC if it names no zone) in nanoseconds.

    >>> _instant_ns('"2026-01-01T00:00:00.250Z"'), _instant_ns("2026-01-01 00:00:00.25")
    (1767225600250000000, 1767225600250000000)
    """
    if not isinstance(when, str):
        return None
    try:
        t = datetime.fromisoformat(when.strip().strip('"'))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return (t - _EPOCH) // _US * 1000  # whole microseconds, as datetime holds them


_EPOCH, _US = datetime(1970, 1, 1, tzinfo=UTC), timedelta(microseconds=1)


def _under_counted(
    spans: Mapping[str, Span], s: Span, tokens: Mapping[str, tuple[int, int]], root: Span
) -> bool:
    """Whether an LLM span above ``s`` (below ``root``) has token counts: they are the
    call's, and ``s`` (the client's span inside a framework's, or vLLM's own inside the
    client's) counts the same tokens again."""
    return any(any(tokens.get(p.span_id, (0, 0))) for p in _above(spans, s, root))


def _count(attrs: Mapping[str, AttrValue], names: Sequence[str]) -> int:
    for name in names:
        v = attrs.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 2**63:
            return int(v)
    return 0


def _envelopes(recs: Iterable[RequestRecordAt]) -> list[RequestsEnvelope]:
    """One envelope per service instance (and host), records in event-time order."""
    groups: dict[tuple[str, str, str | None], list[RequestRecord]] = {}
    started: dict[tuple[str, str, str | None], float] = {}
    for r in recs:
        key = (r.service, r.instance, r.host)
        groups.setdefault(key, []).append(r.record)
        if r.started is not None:  # the newest process's start
            started[key] = max(started.get(key, r.started), r.started)
    out = []
    for key, records in groups.items():
        records.sort(key=lambda r: r.ts)
        service, instance, host = key
        env = RequestsEnvelope(
            service, instance, records[-1].ts, tuple(records), host=host, started=started.get(key)
        )
        out.append(env)
    return out
