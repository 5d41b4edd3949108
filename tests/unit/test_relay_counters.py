"""The worker's OTLP relay (streams/worker/relay.py) counts what it read, relayed and
dropped in the worker's counters, which ``/metrics`` and ``ragwatch status`` show: spans
made and encoded by the OpenTelemetry SDK (tests/otel_spans.py), read from memory through a
real :class:`~ragwatch.streams.worker.loop.WorkerLoop` as the relay reads the OTLP topic.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ragwatch.config import Settings
from ragwatch.schema import RequestRecord, RequestsEnvelope
from ragwatch.streams.worker.app import WorkerCounters
from ragwatch.streams.worker.relay import TraceRelay
from tests.faust_messages import TP, Event, Message
from tests.otel_spans import Service, otlp_json, otlp_proto
from tests.unit.test_worker_loop_batch import BurstStream, make_run

T0 = 1_767_225_600.0
SETTINGS = Settings.from_env({"RAGWATCH_SLOW_MESSAGE": "1800", "RAGWATCH_OTLP_GRACE": "5"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_relay_counts_spans_requests_duplicates_and_bad_process_times() -> None:
    topic = SETTINGS.otlp_topic_name()
    assert topic is not None
    good = Service("rag-api", "pod-1", resource={"process.creation.time": "2025-12-31T23:00:00Z"})
    bad = Service("rag-api", "pod-2", resource={"process.creation.time": "yesterday"})
    for i in range(3):
        good.request(RequestRecord(T0 + i, "ok", 800.0, 3000, 200, {"retriever": 90.0}))
    bad.request(RequestRecord(T0 + 1, "ok", 900.0, 3000, 210, {"retriever": 95.0}))
    spans_good, spans_bad = good.take(), bad.take()
    values = [
        otlp_proto(spans_good),
        otlp_json(spans_good),  # the same spans again (at-least-once): all duplicates
        b"not an OTLP message",  # dead-lettered with its reason
        otlp_json(spans_bad),
    ]
    sent: list[RequestsEnvelope] = []

    async def send(env: RequestsEnvelope) -> None:
        sent.append(env)

    async def main() -> tuple[Any, TraceRelay]:
        run = make_run()
        run.loop.counters = counters = WorkerCounters()
        clock = Clock()
        relay = TraceRelay(SETTINGS, run.loop, send, clock=clock)
        await run.loop.assigned({TP(topic, 0)})
        stream = BurstStream([])
        for offset, value in enumerate(values):
            await relay.handle(stream, Event(Message(topic, 0, offset, b"", value)))
        clock.now += 10.0  # no message for the grace in wall time: the open traces are done
        await relay.tick()
        return counters, relay

    counters, relay = asyncio.run(main())
    stats = relay.assembler.stats
    assert counters.messages == 4 and counters.deadletter == 1
    assert counters.otlp_spans == 2 * len(spans_good) + len(spans_bad)
    assert counters.otlp_duplicate_spans == stats.duplicates == len(spans_good)
    assert counters.otlp_requests == sum(len(e.records) for e in sent) == 4
    assert counters.otlp_bad_process_times == stats.bad_process_times == 1
    assert (counters.otlp_late_spans, counters.otlp_evicted_traces) == (0, 0)
    assert counters.otlp_bad_latencies == stats.bad_latencies == 0
    started = {e.instance: e.started for e in sent}
    assert started == {"pod-1": T0 - 3600.0, "pod-2": None}
