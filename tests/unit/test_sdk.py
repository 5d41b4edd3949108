"""The request telemetry SDK: what a RAG service records is what arrives, once, in batches."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ragwatch import codec
from ragwatch.agents.publisher import ListSink
from ragwatch.agents.sdk import RecorderStats, RequestRecorder
from ragwatch.schema import RequestRecord, RequestsEnvelope


class Ticker:
    """A manual perf clock: ``perf()`` returns ``now``, which the test advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000.0


class FlakySink(ListSink):
    """Raises on the writes whose numbers (1-based) are in ``fail_on``."""

    def __init__(self, fail_on: set[int]) -> None:
        super().__init__()
        self.fail_on, self.calls, self.closed = fail_on, 0, False

    def write(self, topic: str, key: str, value: bytes) -> None:
        self.calls += 1
        if self.calls in self.fail_on:
            raise ConnectionError("broker down")
        super().write(topic, key, value)

    def close(self, timeout: float = 30.0) -> None:
        self.closed = True


def recorder(sink: ListSink, **kw: Any) -> RequestRecorder:
    kw.setdefault("autostart", False)
    kw.setdefault("clock", lambda: 1000.0)
    return RequestRecorder(sink, service="rag-api", instance="pod-1", **kw)


def envelopes(sink: ListSink) -> list[RequestsEnvelope]:
    out = []
    for _topic, key, value in sink.records:
        env = codec.decode(value)
        assert isinstance(env, RequestsEnvelope)
        assert env.kind == "requests" and key == env.key == env.service
        out.append(env)
    return out


def records(sink: ListSink) -> list[RequestRecord]:
    return [r for env in envelopes(sink) for r in env.records]


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def accounted(s: RecorderStats) -> int:
    return s.sent_records + s.dropped + s.invalid + s.failed_records


# ---------------------------------------------------------------- request() path


def test_request_times_stages_tokens_and_end_to_end() -> None:
    sink, perf = ListSink(), Ticker()
    rec = recorder(sink, perf=perf)
    with rec.request() as r:
        r.queue_ms = 4.0
        with r.stage("retriever"):
            perf.advance(30)
        with r.stage("reranker"):
            perf.advance(10)
        with r.stage("llm"):
            perf.advance(200)
            r.ttft()
            perf.advance(100)
            r.ttft()  # only the first token counts
        r.tokens(context=1200, output=250)
        r.tokens(output=50)  # a second LLM call adds up
        perf.advance(5)
    assert rec.flush() == 1
    (x,) = records(sink)
    assert x.status == "ok" and x.ts == 1000.0
    assert x.stages == pytest.approx({"retriever": 30.0, "reranker": 10.0, "llm": 300.0})
    assert x.e2e_ms == pytest.approx(345.0)
    assert x.ttft_ms == pytest.approx(240.0)
    assert x.queue_ms == 4.0
    assert (x.context_tokens, x.output_tokens) == (1200, 300)


def test_repeated_stage_names_add_up() -> None:
    sink, perf = ListSink(), Ticker()
    rec = recorder(sink, perf=perf)
    with rec.request() as r:
        for _ in range(3):
            with r.stage("retriever"):
                perf.advance(10)
    rec.flush()
    assert records(sink)[0].stages == pytest.approx({"retriever": 30.0})


def test_exception_marks_error_and_propagates() -> None:
    sink, perf = ListSink(), Ticker()
    rec = recorder(sink, perf=perf)
    with pytest.raises(KeyError, match="doc-7"), rec.request() as r, r.stage("retriever"):
        perf.advance(12)
        raise KeyError("doc-7")
    rec.flush()
    (x,) = records(sink)
    assert x.status == "error"
    assert x.stages == pytest.approx({"retriever": 12.0})
    assert x.e2e_ms == pytest.approx(12.0)


def test_error_marks_without_raising_and_defaults_are_empty() -> None:
    sink = ListSink()
    rec = recorder(sink)
    with rec.request() as r:
        r.error()
    with rec.request():
        pass
    rec.flush()
    a, b = records(sink)
    assert a.status == "error" and b.status == "ok"
    assert (b.stages, b.context_tokens, b.output_tokens, b.queue_ms, b.ttft_ms) == (
        {},
        0,
        0,
        None,
        None,
    )


async def test_async_with_request_and_stage() -> None:
    sink, perf = ListSink(), Ticker()
    rec = recorder(sink, perf=perf)
    async with rec.request() as r:
        async with r.stage("llm"):
            perf.advance(20)
            await asyncio.sleep(0)
        r.tokens(context=7, output=3)
    with pytest.raises(asyncio.CancelledError):  # a cancelled request counts as failed
        async with rec.request():
            raise asyncio.CancelledError
    rec.flush()
    ok, err = records(sink)
    assert ok.status == "ok" and ok.stages == pytest.approx({"llm": 20.0})
    assert (ok.context_tokens, ok.output_tokens) == (7, 3)
    assert err.status == "error"


async def test_concurrent_tasks_each_get_their_own_request() -> None:
    sink = ListSink()
    rec = recorder(sink)

    async def handle(i: int) -> None:
        async with rec.request() as r:
            async with r.stage(f"s{i}"):
                await asyncio.sleep(0)
            r.tokens(context=i)
            await asyncio.sleep(0)
            r.tokens(output=i)
            if i % 2:
                r.error()

    await asyncio.gather(*(handle(i) for i in range(100)))
    rec.flush()
    got = {x.context_tokens: x for x in records(sink)}
    assert sorted(got) == list(range(100))
    for i, x in got.items():
        assert x.output_tokens == i and list(x.stages) == [f"s{i}"]
        assert x.status == ("error" if i % 2 else "ok")


# ---------------------------------------------------------------- record() path


def test_record_keeps_what_the_service_timed() -> None:
    sink = ListSink()
    rec = recorder(sink)
    stages = {"retriever": 40.0, "llm": 700.0}
    rec.record(e2e_ms=812.5, stages=stages, context_tokens=900, output_tokens=120, ts=5.0)
    rec.record(e2e_ms=1.0, status="error", queue_ms=0.5, ttft_ms=0.7)
    stages["llm"] = -1.0  # mutating after the call does not change what was recorded
    rec.flush()
    a, b = records(sink)
    assert a == RequestRecord(
        ts=5.0,
        status="ok",
        e2e_ms=812.5,
        context_tokens=900,
        output_tokens=120,
        stages={"retriever": 40.0, "llm": 700.0},
    )
    assert (b.ts, b.status, b.queue_ms, b.ttft_ms) == (1000.0, "error", 0.5, 0.7)


def test_envelopes_decode_with_kind_requests_keyed_by_service() -> None:
    sink = ListSink()
    rec = RequestRecorder(
        sink, topic="t.req", service="svc", instance="i-9", clock=lambda: 77.0, autostart=False
    )
    rec.record(e2e_ms=3.0)
    rec.close()
    ((topic, key, value),) = sink.records
    env = codec.decode_as(RequestsEnvelope, value)
    assert (topic, key) == ("t.req", "svc")
    assert (env.kind, env.service, env.instance, env.ts) == ("requests", "svc", "i-9", 77.0)


def test_envelopes_say_when_the_process_started() -> None:
    """``started`` (the worker's warm-up after a restart): the clock when the recorder was
    made, or what the service says; a bad one is refused at once, a broken clock sends none."""
    now = [1000.0]
    sink = ListSink()
    rec = recorder(sink, clock=lambda: now[0])
    now[0] = 1060.0
    rec.record(e2e_ms=3.0)
    rec.flush()
    told = recorder(sink, started=900.5)
    told.record(e2e_ms=3.0)
    told.flush()
    assert [(e.ts, e.started) for e in envelopes(sink)] == [(1060.0, 1000.0), (1000.0, 900.5)]
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="started"):
            recorder(sink, started=bad)

    def broken() -> float:
        raise OSError("clock gone")

    assert recorder(sink, clock=broken).started is None


# ---------------------------------------------------------------- validation off the hot path


def test_invalid_records_are_dropped_and_counted_without_poisoning_the_batch() -> None:
    sink = ListSink()
    rec = recorder(sink)
    bad: list[dict[str, Any]] = [
        {"e2e_ms": -1.0},
        {"e2e_ms": math.nan},
        {"e2e_ms": math.inf},
        {"e2e_ms": "fast"},
        {"e2e_ms": True},
        {"e2e_ms": 1.0, "stages": {"llm": -5.0}},
        {"e2e_ms": 1.0, "stages": {"llm": math.nan}},
        {"e2e_ms": 1.0, "stages": {3: 1.0}},
        {"e2e_ms": 1.0, "context_tokens": -1},
        {"e2e_ms": 1.0, "output_tokens": 1.5},
        {"e2e_ms": 1.0, "output_tokens": 2**64},
        {"e2e_ms": 1.0, "status": "timeout"},
        {"e2e_ms": 1.0, "queue_ms": -0.1},
        {"e2e_ms": 1.0, "ttft_ms": math.nan},
        {"e2e_ms": 1.0, "ts": -5.0},
        {"e2e_ms": 1.0, "stages": 42},  # not a mapping: refused when captured
    ]
    for i, kw in enumerate(bad):
        rec.record(**kw)  # never raises
        rec.record(e2e_ms=1.0, context_tokens=i)
    assert rec.flush() == len(bad)
    assert [x.context_tokens for x in records(sink)] == list(range(len(bad)))
    s = rec.stats
    assert (s.invalid, s.sent_records, s.sent_envelopes) == (len(bad), len(bad), 1)
    assert s.recorded == accounted(s) == 2 * len(bad)


def test_a_broken_clock_never_raises_into_the_request() -> None:
    def clock() -> float:
        raise OSError("clock gone")

    rec = RequestRecorder(ListSink(), service="s", instance="i", clock=clock, autostart=False)
    rec.record(e2e_ms=1.0)
    with rec.request():
        pass
    assert rec.stats.invalid == 2 and rec.stats.recorded == 2


def test_bad_values_in_a_request_never_raise_and_count_as_invalid() -> None:
    sink = ListSink()
    rec = recorder(sink)
    with rec.request() as r:
        r.tokens(context=None)  # type: ignore[arg-type]
    with rec.request() as r, r.stage(["not", "hashable"]):  # type: ignore[arg-type]
        pass
    with rec.request() as r:
        r.queue_ms = -3.0
    with rec.request() as r:
        r.tokens(context=1, output=2.5)  # type: ignore[arg-type]
        r.error()  # still dropped: 2.5 is no token count
    with rec.request() as r:
        r.tokens(context=42)
    rec.flush()
    assert [x.context_tokens for x in records(sink)] == [42]
    assert rec.stats.invalid == 4 and rec.stats.recorded == 5


# ---------------------------------------------------------------- buffering and batching


def test_full_buffer_drops_the_oldest_and_counts_exactly() -> None:
    sink = ListSink()
    rec = recorder(sink, buffer_size=10)
    for i in range(25):
        rec.record(e2e_ms=1.0, context_tokens=i)
    assert rec.stats.dropped == 15
    rec.flush()
    assert [x.context_tokens for x in records(sink)] == list(range(15, 25))
    s = rec.stats
    assert (s.recorded, s.dropped, s.sent_records) == (25, 15, 10)


def test_drops_are_exact_under_threads_with_the_flusher_running() -> None:
    sink = ListSink()
    rec = recorder(sink, buffer_size=64, max_batch=16, flush_interval_s=0.001, autostart=True)

    def work(t: int) -> None:
        for i in range(5000):
            rec.record(e2e_ms=1.0, context_tokens=t * 5000 + i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rec.close()
    ids = [x.context_tokens for x in records(sink)]
    s = rec.stats
    assert len(ids) == len(set(ids)) == s.sent_records
    assert s.recorded == 20_000 == s.sent_records + s.dropped
    assert s.dropped > 0 and s.sent_records > 0  # both sides were exercised
    assert s.invalid == s.failed_records == 0
    # Each thread's surviving records keep their order: drops remove, never reorder.
    for t in range(4):
        mine = [i for i in ids if i // 5000 == t]
        assert mine == sorted(mine)


def test_max_batch_splits_envelopes_in_order() -> None:
    sink = ListSink()
    rec = recorder(sink, max_batch=100)
    for i in range(250):
        rec.record(e2e_ms=1.0, context_tokens=i)
    assert rec.flush() == 250
    assert [len(e.records) for e in envelopes(sink)] == [100, 100, 50]
    assert [x.context_tokens for x in records(sink)] == list(range(250))
    assert rec.stats.sent_envelopes == 3


def test_oversized_envelopes_are_split_below_the_message_limit() -> None:
    sink = ListSink()
    rec = recorder(sink, max_batch=2000)
    stages = {f"stage-{'x' * 60}-{j}": 1.0 for j in range(50)}  # ~4 KiB per record
    for i in range(1200):
        rec.record(e2e_ms=1.0, stages=stages, context_tokens=i)
    assert rec.flush() == 1200
    assert len(sink.records) > 1
    assert all(len(v) <= codec.MAX_MESSAGE_BYTES for _, _, v in sink.records)
    assert [x.context_tokens for x in records(sink)] == list(range(1200))


def test_flusher_sends_on_its_interval() -> None:
    sink = ListSink()
    with recorder(sink, flush_interval_s=0.05, autostart=True) as rec:
        rec.record(e2e_ms=1.0)
        rec.record(e2e_ms=2.0)
        wait_for(lambda: rec.stats.sent_records == 2, timeout=2.0)
    assert [x.e2e_ms for x in records(sink)] == [1.0, 2.0]


def test_flusher_wakes_as_soon_as_max_batch_records_wait() -> None:
    sink = ListSink()
    with recorder(sink, flush_interval_s=60.0, max_batch=10, autostart=True) as rec:
        for _ in range(10):
            rec.record(e2e_ms=1.0)
        wait_for(lambda: len(sink.records) == 1, timeout=2.0)
        assert len(envelopes(sink)[0].records) == 10


def test_close_sends_the_rest_and_leaves_the_sink_open() -> None:
    sink = FlakySink(fail_on=set())
    with recorder(sink, flush_interval_s=60.0, autostart=True) as rec:
        rec.record(e2e_ms=1.0)
    assert rec.stats.sent_records == 1 and len(sink.records) == 1
    assert not sink.closed


# ---------------------------------------------------------------- sink failures


def test_sink_error_is_counted_and_the_recorder_keeps_working() -> None:
    sink = FlakySink(fail_on={1})
    rec = recorder(sink)
    for _ in range(5):
        rec.record(e2e_ms=1.0)
    assert rec.flush() == 0
    s = rec.stats
    assert (s.sink_errors, s.failed_records, s.sent_records) == (1, 5, 0)
    rec.record(e2e_ms=2.0)
    assert rec.flush() == 1
    assert [x.e2e_ms for x in records(sink)] == [2.0]
    assert rec.stats.recorded == accounted(rec.stats) == 6


def test_flusher_thread_survives_sink_errors() -> None:
    sink = FlakySink(fail_on={1, 2})
    with recorder(sink, flush_interval_s=0.01, max_batch=1, autostart=True) as rec:
        for i in range(5):
            rec.record(e2e_ms=1.0, context_tokens=i)
        wait_for(lambda: accounted(rec.stats) == 5, timeout=2.0)
    s = rec.stats
    assert (s.sink_errors, s.failed_records, s.sent_records) == (2, 2, 3)
    assert [x.context_tokens for x in records(sink)] == [2, 3, 4]


# ---------------------------------------------------------------- concurrency


async def test_threads_and_tasks_with_the_flusher_running_add_up_exactly() -> None:
    sink = ListSink()
    rec = recorder(sink, flush_interval_s=0.005, max_batch=500, autostart=True)
    n_threads, per_thread, n_tasks, per_task = 8, 5000, 200, 50
    base = n_threads * per_thread

    def work(t: int) -> None:
        for i in range(per_thread):
            if i % 2:
                rec.record(e2e_ms=0.5, stages={"llm": 0.4}, context_tokens=t * per_thread + i)
            else:
                with rec.request() as r, r.stage("llm"):
                    r.tokens(context=t * per_thread + i)

    async def task(k: int) -> None:
        for i in range(per_task):
            async with rec.request() as r:
                async with r.stage("retriever"):
                    await asyncio.sleep(0)
                r.tokens(context=base + k * per_task + i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    await asyncio.gather(*(task(k) for k in range(n_tasks)))
    for th in threads:
        await asyncio.to_thread(th.join)
    rec.close()

    total = base + n_tasks * per_task
    ids = [x.context_tokens for x in records(sink)]
    assert len(ids) == total and set(ids) == set(range(total))  # each record exactly once
    s = rec.stats
    assert s.recorded == s.sent_records == total
    assert s.dropped == s.invalid == s.sink_errors == s.failed_records == 0
    assert s.sent_envelopes == len(sink.records) > 1
    assert all(len(e.records) <= 500 for e in envelopes(sink))


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "kw",
    [
        {"service": ""},
        {"instance": ""},
        {"topic": ""},
        {"flush_interval_s": 0.0},
        {"flush_interval_s": math.nan},
        {"max_batch": 0},
        {"buffer_size": 0},
        {"exit_timeout_s": -1.0},
    ],
)
def test_bad_arguments_raise_value_error(kw: dict[str, Any]) -> None:
    args: dict[str, Any] = {"service": "s", "instance": "i", "autostart": False, **kw}
    with pytest.raises(ValueError):
        RequestRecorder(ListSink(), **args)


@pytest.fixture(autouse=True)
def _no_leftover_flusher_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    left = [t for t in set(threading.enumerate()) - before if t.name.startswith("ragwatch-sdk")]
    assert left == []


def test_an_idle_recorder_sends_heartbeats_so_quiet_minutes_count_as_zero_traffic() -> None:
    now = [1000.0]
    sink = ListSink()
    with recorder(sink, flush_interval_s=0.01, heartbeat_s=30.0, clock=lambda: now[0],
                  autostart=True) as rec:  # fmt: skip
        rec.record(e2e_ms=1.0)
        wait_for(lambda: rec.stats.sent_records == 1)
        now[0] += 29.0
        time.sleep(0.05)
        assert rec.stats.heartbeats == 0  # sent something 29 s ago
        now[0] += 2.0
        wait_for(lambda: rec.stats.heartbeats == 1)
    envs = envelopes(sink)
    assert [len(e.records) for e in envs] == [1, 0] and envs[1].ts == 1031.0
    assert rec.stats.sent_envelopes == 1  # heartbeats are counted apart


EXIT_SCRIPT = """
import sys
from ragwatch.agents.sdk import RequestRecorder

class PrintSink:  # any sink: each envelope it gets is a line on stdout
    def write(self, topic, key, value):
        print(topic, key, len(value), flush=True)
    def flush(self, timeout=30.0):
        return 0
    def close(self, timeout=30.0):
        print("sink closed", flush=True)

rec = RequestRecorder(PrintSink(), service="rag-api", instance="pod-1", flush_interval_s=3600)
for _ in range(25):
    with rec.request() as r:
        r.tokens(context=10, output=2)
print("script ends", flush=True)
"""


def test_what_a_recorder_holds_is_drained_into_its_sink_when_the_interpreter_exits() -> None:
    """A script that records and ends without closing anything (the flusher would have
    waited an hour): the interpreter's exit drains the recorder into its sink; the sink,
    which belongs to the caller, is not closed by the recorder."""
    out = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "script ends"
    assert [line.split()[:2] for line in lines[1:]] == [["ragwatch.requests", "rag-api"]]
