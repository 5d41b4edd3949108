"""OTLP traces in, request records out: the worker's relay from the OTLP topic to
``ragwatch.requests``.

The Collector's Kafka exporter does not key messages by service (by trace id at most,
with ``partition_traces_by_id``), so traces cannot be owned by the worker that owns their
service. The relay assembles them where they are read
(:class:`~ragwatch.streams.pipelines.traces.TraceAssembler`) and publishes each finished
request to the requests topic keyed by service, where the request pipeline of the owning
worker reads it like SDK telemetry (same signals, rules, hints, snapshots and acks).

A bad message is dead-lettered with its reason. A message's ack is released once its spans
are assembled and what they finished is sent: the spans of traces still open at a crash
(at most ``RAGWATCH_OTLP_GRACE`` of event time) are lost, not replayed. Event time moves
with the spans; when no OTLP message has come for the grace in wall time, the open traces
are taken as done (the last requests of a quiet service are not held forever).
Spans of one trace must reach one worker: set the exporter's ``partition_traces_by_id``
(docs/otel.md) when there are several workers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ragwatch.config import Settings
from ragwatch.errors import SchemaError
from ragwatch.otlp import Encoding, decode_traces
from ragwatch.schema import RequestsEnvelope
from ragwatch.streams.pipelines.traces import StageMap, TraceAssembler
from ragwatch.streams.worker.loop import WorkerLoop

log = logging.getLogger(__name__)

SendRequests = Callable[[RequestsEnvelope], Awaitable[None]]


class TraceRelay:
    """Reads the OTLP topic through a :class:`WorkerLoop`'s acks and dead letters."""

    def __init__(
        self,
        settings: Settings,
        loop: WorkerLoop,
        send_requests: SendRequests,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.encoding: Encoding = settings.otlp_encoding  # type: ignore[assignment]
        self.loop, self._send, self._clock = loop, send_requests, clock
        self.assembler = TraceAssembler(
            grace_s=settings.otlp_grace, stages=StageMap.parse(settings.otlp_stage_patterns)
        )
        self._last_read = clock()

    async def consume(self, stream: Any) -> None:
        stream = stream.noack()
        async for event in stream.events():
            await self.handle(stream, event)

    async def handle(self, stream: Any, event: Any) -> None:
        """One OTLP message: decode, assemble, send what is finished, release its ack."""
        msg, loop = event.message, self.loop
        loop.counters.messages += 1
        raw = msg.value or b""
        h = loop.held.add(msg.tp, stream, event)
        self._last_read = self._clock()
        try:
            spans = decode_traces(raw, self.encoding)
        except SchemaError as exc:
            await loop.dead_letter(msg, exc.reason, raw)
        else:
            loop.counters.otlp_spans += len(spans)
            await self._relay(self.assembler.add(spans))
        await loop.held.release([h])

    async def tick(self) -> None:
        """Every second: after a grace of wall time without OTLP messages, the open
        traces are done."""
        idle = self._clock() - self._last_read
        if self.assembler.stats.open and idle >= self.assembler.grace_s:
            # not by moving event time on: spans that come later must still wait their grace
            await self._relay(self.assembler.close_open())

    async def _relay(self, envelopes: list[RequestsEnvelope]) -> None:
        c, stats = self.loop.counters, self.assembler.stats
        for env in envelopes:
            await self._send(env)
            c.otlp_requests += len(env.records)
        c.otlp_duplicate_spans = stats.duplicates
        c.otlp_late_spans = stats.late_spans
        c.otlp_evicted_traces = stats.evicted
        c.otlp_bad_latencies = stats.bad_latencies
        c.otlp_bad_process_times = stats.bad_process_times
