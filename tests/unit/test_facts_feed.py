"""The hint's wait for the other side (:meth:`FactsFeed.settle`) and what a worker tells the
others of how far it has read (:meth:`WorkerLoop.read_up_to`), without a broker: the facts
a feed publishes go straight into its own table, as its reader would hand them back.

A service alert's hint names the GPU side of its instance's host, which another worker
reads: while that worker has not published the host's facts of the alert's time, the hint
waits for them (at most ``wait_s``), and says so when it gives up; it never says "no GPU
telemetry of h is at hand" while they are still to come.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ragwatch.codec import encode
from ragwatch.facts_wire import FactsRecord, decode_facts, encode_facts, facts_key
from ragwatch.schema import (
    Alert,
    GpuEnvelope,
    HostFacts,
    InstanceFacts,
    RequestRecord,
    RequestsEnvelope,
    Transition,
    WorkerProgress,
)
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Join, Pipelines
from ragwatch.streams.worker.facts_feed import ORPHAN_S, FactsFeed
from ragwatch.streams.worker.facts_table import FactsTable
from tests.faust_messages import TP, Event, Message
from tests.unit.test_worker_loop_batch import GPU_TOPIC, BurstStream, make_run

AT = 1_790_000_000.0  # the retrieval alert's event time
HOST = "gpu-node-01"
STEADY = f"GPU memory on {HOST} is steady"
NOTHING = f"no GPU telemetry of {HOST} is at hand"


class Feed:
    """A worker's facts feed and table (its records read back at once), and its pipelines."""

    def __init__(self, wait_s: float, clock: list[float] | None = None) -> None:
        now = (lambda: clock[0]) if clock is not None else time.monotonic
        self.table = FactsTable("w-requests", clock=now)
        self.pipes = Pipelines(load_rules(), remote=self.table)
        self.feed = FactsFeed(
            "w-requests", self.pipes, self.table, self.send, wait_s=wait_s, clock=now
        )
        self.sent: list[object] = []

    async def send(self, key: bytes, value: bytes | None) -> None:
        self.table.apply([(key, value)])
        if value is not None:
            self.sent.append(decode_facts(value)[1])

    def theirs(self, *records: FactsRecord) -> None:
        """Records another worker published, as the reader hands them over."""
        self.table.apply([(facts_key(r), encode_facts(r, by="w-gpu")) for r in records])

    def fired(self, fingerprint: str = "slow") -> Transition:
        """The requests agent raised a retrieval alert on rag-api-1 (on HOST), with the hint
        of that moment, and noted that it joins HOST's GPU side."""
        alert = Alert(
            rule="RetrievalSlowdown", severity="error", status="firing",
            labels={"alertname": "RetrievalSlowdown", "service": "rag-api",
                    "instance": "rag-api-1"},
            annotations={}, value=4.0, expected=None, starts_at=AT, ends_at=None,
            fingerprint=fingerprint, at=AT,
        )  # fmt: skip
        alert = self.pipes.correlator.explain(alert, self.table.as_of(AT))
        self.pipes.joins.append(Join(fingerprint, "host", HOST, AT, self.table.as_of(AT)))
        return Transition(alert, "pending")


def requests_side(f: Feed) -> None:
    """rag-api-1 runs on HOST; the GPU worker began reading HOST's partition (0: how far
    is not known yet) and has published nothing of it."""
    f.theirs(
        InstanceFacts("rag-api", "rag-api-1", HOST, AT, {"retriever_p99_ratio": 4.0}),
        WorkerProgress("w-gpu", host_ts=0.0, seq=1),
    )


async def test_another_agents_settle_leaves_the_join_to_the_alerts_own() -> None:
    """The worker's agents settle in turn on one event loop: one that settles between the
    requests agent's processing and its settle (a device event's alert, sent without a
    wait) must not take the retrieval alert's join, or the alert goes out at once with the
    hint of the moment it fired ("no GPU telemetry at hand") and nothing logged."""
    f = Feed(wait_s=10.0)
    requests_side(f)
    t = f.fired()
    assert NOTHING in t.alert.annotations["hint"]  # as it fired: HOST's facts are to come
    assert await f.feed.settle([], (None, AT), wait=False) == []  # the events agent's
    assert await f.feed.settle([], (None, AT)) == []  # the GPU agent's: nothing to wait for
    assert f.feed.waited == 0

    async def gpu_worker_catches_up() -> None:
        await asyncio.sleep(0.3)
        f.theirs(HostFacts(HOST, AT - 10.0), WorkerProgress("w-gpu", host_ts=AT, seq=2))

    caught_up = asyncio.create_task(gpu_worker_catches_up())
    [out] = await f.feed.settle([t], (None, AT))
    await caught_up
    assert STEADY in out.alert.annotations["hint"], out.alert.annotations["hint"]
    assert (f.feed.waited, f.feed.incomplete) == (1, 0)


async def test_a_hint_gives_up_after_wait_s_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    f = Feed(wait_s=0.3)
    requests_side(f)
    t = f.fired()
    with caplog.at_level(logging.WARNING):
        [out] = await f.feed.settle([t], (None, AT))
    assert NOTHING in out.alert.annotations["hint"]
    assert (f.feed.waited, f.feed.incomplete) == (1, 1)
    assert "hint of alert slow sent without the GPU telemetry of worker(s) w-gpu" in caplog.text


async def test_a_join_whose_alert_is_never_settled_is_dropped() -> None:
    clock = [0.0]
    f = Feed(wait_s=1.0, clock=clock)
    f.fired("lost")  # noted, and its processing failed after: it is never settled
    await f.feed.settle([], (None, AT))
    assert [j.fingerprint for j, _ in f.feed._noted] == ["lost"]  # kept for its settle
    clock[0] += ORPHAN_S
    await f.feed.settle([], (None, AT))
    assert f.feed._noted == []


# ------------------------------------------------------------- how far a worker has read


async def test_a_partition_found_empty_is_behind_again_once_messages_come() -> None:
    """A worker assigned before its partitions' first messages (the fleet's agents start
    after it) finds them empty: idle, none of it to wait for; once messages come, it is
    behind them until it reads them."""
    loop = make_run().loop
    tp = TP(GPU_TOPIC, 1)
    await loop.assigned({tp})
    assert loop.read_up_to()[0] == 0.0  # assigned, not read yet
    loop.found_empty(tp, 0)
    assert loop.read_up_to()[0] is None  # nothing to come
    loop.came(tp, 0)
    assert loop.read_up_to()[0] is None
    loop.came(tp, 12)  # messages came, not read yet (in Faust's buffers, say)
    assert loop.read_up_to()[0] == 0.0


def gpu_events(partition: int, host: str, start: float, n: int) -> list[Event]:
    return [
        Event(Message(GPU_TOPIC, partition, i, host.encode(),
                      encode(GpuEnvelope(host=host, ts=start + 60.0 * i, gpus=()))))
        for i in range(n)
    ]  # fmt: skip


async def test_reading_a_new_partition_says_how_far_behind_it_is() -> None:
    """The heartbeat that says a worker began reading a partition it was just given says
    how far that partition is (its oldest message read), not how far the others were."""
    run = make_run()
    loop, f = run.loop, Feed(wait_s=1.0)
    loop.facts = FactsFeed("w1", run.pipes, f.table, f.send)
    now = time.time() // 60 * 60
    tp0, tp1 = TP(GPU_TOPIC, 0), TP(GPU_TOPIC, 1)
    await loop.assigned({tp0})
    stream = BurstStream([])
    await loop.handle_batch(loop.topics["gpu"], stream, gpu_events(0, "h-a", now - 600.0, 10))
    assert loop.read_up_to()[0] == now - 60.0
    await loop.assigned({tp0, tp1})
    f.sent.clear()
    behind = now - 3 * 3600.0  # its last committed offset, three hours back
    await loop.handle_batch(loop.topics["gpu"], stream, gpu_events(1, "h-b", behind, 10))
    began = next(r for r in f.sent if isinstance(r, WorkerProgress))
    assert began.host_ts == behind
    assert loop.read_up_to()[0] == behind + 540.0  # processed: its newest


def test_an_instances_facts_are_taken_once_each_time_its_bucket_closes() -> None:
    """The worker calls observe after every wave with every envelope of its batch (a
    service many times over): each instance's facts are taken when it closes a bucket,
    once, as ``facts_of`` has them then, and never before its first close."""
    f = Feed(wait_s=1.0)
    requests, want, ends = f.pipes.requests, [], {}
    for i in range(60):  # 10 minutes of two instances, 10 s apart
        ts = AT + 10.0 * i
        envs = [
            RequestsEnvelope("rag-api", f"rag-api-{n}", ts,
                             (RequestRecord(ts - 1.0, "ok", 800.0 + n, 3000, 250),), host=HOST)
            for n in range(2)
        ]  # fmt: skip
        requests.process_batch(envs)
        f.feed.observe(requests, [(e.service, e.ts) for e in envs] * 3)
        for facts in requests.facts_of("rag-api"):  # all of them: the reference
            key = (facts.service, facts.instance)
            if facts.bucket_end is not None and ends.get(key) != facts.bucket_end:
                ends[key] = facts.bucket_end
                want.append((*key, facts.bucket_end, facts.anomalous))
    due = f.feed.due((None, None))
    got = [(r.service, r.instance, r.bucket_end, r.anomalous) for r in due
           if isinstance(r, InstanceFacts)]  # fmt: skip
    assert got == want
    assert len(got) >= 2 * 8  # a bucket a minute, per instance
