"""The worker loop's batches (GPU telemetry: :meth:`WorkerLoop.handle_batch`) without a
broker or Redis: an in-memory stream of real encoded envelopes that arrive in bursts, and an
in-memory :class:`~ragwatch.streams.worker.loop.Delivery`.

A batch is every message read while the next one was at hand (buffered, or handed over by
Faust's fetcher within a few turns of the event loop), up to ``MAX_BATCH``; it gives what one
message at a time (:meth:`WorkerLoop.handle`) gives: the same dead letters with the same
reasons, the same transitions, each sent before its message's ack is held, and the acks in
offset order once the snapshots are written.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.codec import decode_gpu_wire as decode_gpu
from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.gpu_wire import GpuMessage
from ragwatch.outage import RedisTrouble
from ragwatch.schema import (
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_REASON,
    EventEnvelope,
    GpuEnvelope,
    Transition,
)
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.batches import FETCH_TURNS, MAX_BATCH
from ragwatch.streams.worker.loop import WorkerLoop
from tests.faust_messages import TP, Event, Message

# a slow message is counted by the wall clock: on a busy CI machine a batch of 180 went
# over the default 1 s once; these tests compare counts, not speed (30 min: the most allowed)
SETTINGS = Settings.from_env({"RAGWATCH_SLOW_MESSAGE": "1800"})
GPU_TOPIC = SETTINGS.topic("gpu")


class Channel:
    """What the loop asks of a Faust stream's channel: whether a message is buffered."""

    def __init__(self) -> None:
        self.buffered = 0

    def empty(self) -> bool:
        return self.buffered == 0


@dataclass
class BurstStream:
    """A Faust stream's surface that the loop uses (``noack``, ``events``, ``ack``,
    ``channel``). Messages arrive in bursts: within one, the next message is buffered when
    one is read; after its last, nothing is. ``before(i)`` runs before the i-th message
    is read (a rebalance, say)."""

    bursts: list[list[Message]]
    before: Callable[[int], Awaitable[None]] | None = None
    channel: Channel = field(default_factory=Channel)
    acked: list[int] = field(default_factory=list)

    def noack(self) -> BurstStream:
        return self

    async def events(self) -> AsyncIterator[Event]:
        n = 0
        for burst in self.bursts:
            for i, m in enumerate(burst):
                if self.before is not None:
                    await self.before(n)
                self.channel.buffered = len(burst) - i - 1
                n += 1
                yield Event(m)

    async def ack(self, event: Event) -> None:
        self.acked.append(event.message.offset)


class FetcherStream:
    """Faust's delivery, as ``Consumer._drain_messages`` does it: a fetcher task hands each
    record of a fetch to the stream's queue, ``turns`` turns of the event loop apart; it
    fetches the next burst once the stream waits on an empty queue (the broker's answer)."""

    def __init__(self, bursts: list[list[Message]], turns: int) -> None:
        self.bursts, self.turns = bursts, turns
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.channel = self.queue  # its ``empty`` is what the loop looks at
        self.waiting = asyncio.Event()
        self.acked: list[int] = []

    def noack(self) -> FetcherStream:
        return self

    async def _fetch(self) -> None:
        for burst in self.bursts:
            await self.waiting.wait()
            self.waiting.clear()
            for m in burst:
                await self.queue.put(Event(m))
                for _ in range(self.turns):
                    await asyncio.sleep(0)

    async def events(self) -> AsyncIterator[Event]:
        fetcher = asyncio.ensure_future(self._fetch())
        for _ in range(sum(map(len, self.bursts))):
            if self.queue.empty():
                self.waiting.set()
            yield await self.queue.get()
        await fetcher

    async def ack(self, event: Event) -> None:
        self.acked.append(event.message.offset)


@dataclass
class MemoryDelivery:
    """The Redis side, in memory: every snapshot written; ``on_restore`` runs inside each
    restore (a rebalance while Redis answers, say)."""

    closed: bool = False
    redis_down_since: float | None = None
    redis_trouble: RedisTrouble = field(
        default_factory=lambda: RedisTrouble(logging.getLogger("test"), "memory")
    )
    restored: list[str] = field(default_factory=list)
    snapshots: list[set[str]] = field(default_factory=list)
    on_restore: Callable[[], Awaitable[None]] | None = None

    async def restore(self, pipes: Pipelines, domain: str, key: str) -> None:
        self.restored.append(key)
        if self.on_restore is not None:
            await self.on_restore()

    async def write_snapshots(self, pipes: Pipelines, hosts: set[str], services: set[str]) -> bool:
        self.snapshots.append(hosts | services)
        return True

    async def write_status(self, pipes: Pipelines, hosts: set[str], services: set[str]) -> None:
        pass

    async def write_series(self, points: Any) -> None:
        pass

    async def prune(self, hosts: set[str], services: set[str], prefixes: Any) -> None:
        pass


@dataclass
class Counters:
    messages: int = 0
    deadletter: int = 0
    slow_messages: int = 0


class Pipes(Pipelines):
    """The worker's pipelines, with the GPU batches they are given recorded (host, ts);
    ``failing``: the (host, ts) of an envelope whose processing raises, a bug in the
    columnar code (a batch holding it raises before it changes anything)."""

    def __init__(self, failing: tuple[str, float] | None = None) -> None:
        super().__init__(load_rules())
        self.failing = failing
        self.batches: list[list[tuple[str, float]]] = []

    def gpu_batch(self, envs: list[GpuMessage]) -> list[Transition]:
        self._check(envs)
        self.batches.append([(e.host, float(e.ts)) for e in envs])
        return super().gpu_batch(envs)

    def gpu_wire(self, env: GpuMessage) -> list[Transition]:
        self._check([env])
        return super().gpu_wire(env)

    def _check(self, envs: list[dict[str, Any]]) -> None:
        if any((e.host, float(e.ts)) == self.failing for e in envs):
            raise RuntimeError("boom")


@dataclass
class Run:
    """A loop and what came out of it: transitions and dead letters in the order they went,
    and how many acks of its host were held when each transition was sent."""

    loop: WorkerLoop
    pipes: Pipes
    delivery: MemoryDelivery
    counters: Counters
    stream: BurstStream = field(default_factory=lambda: BurstStream([]))
    transitions: list[Transition] = field(default_factory=list)
    held_at_send: list[int] = field(default_factory=list)
    dead: list[tuple[int, str]] = field(default_factory=list)  # offset, reason


def make_run(pipes: Pipes | None = None, delivery: MemoryDelivery | None = None) -> Run:
    pipes = pipes or Pipes()
    delivery = delivery or MemoryDelivery()
    counters = Counters()
    run: Run

    async def send_alert(t: Transition) -> None:
        key = ("host", t.alert.labels["host"])
        held = run.loop.held.take([key])  # a look at what is held, given straight back
        run.loop.held.give_back(held)
        run.held_at_send.append(sum(len(v) for v in held.values()))
        run.transitions.append(t)

    async def send_dead_letter(key: Any, value: bytes, headers: dict[str, bytes]) -> None:
        run.dead.append((int(headers[DLQ_HEADER_OFFSET]), headers[DLQ_HEADER_REASON].decode()))

    loop = WorkerLoop(
        SETTINGS, pipes, delivery, counters,
        send_alert=send_alert, send_dead_letter=send_dead_letter,
    )  # fmt: skip
    run = Run(loop, pipes, delivery, counters)
    return run


def gpu_values(hosts: int, ticks: int) -> list[bytes]:
    """``ticks`` minutes of GPU telemetry of ``hosts`` hosts, a leak on the first from the
    start (it fires within two hours)."""
    sim = FleetSimulator(SimConfig(hosts=hosts, gpus=1, interval_s=60, leak_start_s=0))
    return [encode(env) for _, envs, _ in itertools.islice(sim.ticks(), ticks) for env in envs]


def messages(values: list[bytes], topic: str = GPU_TOPIC) -> list[Message]:
    return [Message(topic, 0, i, b"k", v) for i, v in enumerate(values)]


async def batched(values: list[bytes], bursts: list[int], run: Run | None = None) -> Run:
    """``values`` consumed in bursts of these sizes (the loop batches them)."""
    run = run or make_run()
    msgs = messages(values)
    cuts = list(itertools.accumulate(bursts, initial=0))
    assert cuts[-1] == len(msgs)
    stream = BurstStream([msgs[a:b] for a, b in itertools.pairwise(cuts)])
    await run.loop.assigned({TP(GPU_TOPIC, 0)})
    run.stream = stream
    await run.loop.consume("gpu", stream)
    return run


async def one_by_one(values: list[bytes], run: Run | None = None) -> Run:
    """``values`` handled one message at a time (the path of the other topics)."""
    run = run or make_run()
    run.stream = stream = BurstStream([messages(values)])
    await run.loop.assigned({TP(GPU_TOPIC, 0)})
    async for event in stream.events():
        await run.loop.handle(run.loop.topics["gpu"], stream, event)
    return run


# ---------------------------------------------------------------- the same as one at a time


async def test_bad_messages_in_a_batch_are_dead_lettered_as_one_at_a_time() -> None:
    values = gpu_values(hosts=2, ticks=120)
    values.insert(7, b'{"v":1,"kind":"gpu","host":')  # broken JSON
    ahead = GpuEnvelope(host="gpu-node-01", ts=time.time() + 7200, gpus=())
    values.insert(20, encode(ahead))  # two hours ahead of this worker's clock
    batch = await batched(values, [len(values)])
    single = await one_by_one(values)

    assert [o for o, _ in batch.dead] == [7, 20]
    # the same reasons (how far ahead is read off the wall clock: the two runs may straddle
    # a second)
    assert [(o, re.sub(r"\d+", "N", r)) for o, r in batch.dead] == [
        (o, re.sub(r"\d+", "N", r)) for o, r in single.dead
    ]
    assert "JSON" in batch.dead[0][1] and "ahead of this worker's clock" in batch.dead[1][1]
    assert batch.counters == single.counters == Counters(len(values), 2, 0)
    assert [len(b) for b in batch.pipes.batches] == [len(values) - 2]
    assert any(t.alert.rule == "GpuMemoryLeak" and t.notify for t in batch.transitions)
    assert batch.transitions == single.transitions  # hints included
    # nothing is acked before its host's snapshot (the dead letters wait behind offsets 0-6)
    assert batch.stream.acked == []
    await batch.loop.tick()
    assert batch.delivery.snapshots == [{"gpu-node-01", "gpu-node-02"}]
    assert batch.stream.acked == list(range(len(values)))  # all, in offset order


async def test_transitions_are_sent_before_their_acks_are_held() -> None:
    values = gpu_values(hosts=1, ticks=120)
    batch = await batched(values, [len(values)])
    single = await one_by_one(values)
    assert batch.transitions == single.transitions and batch.transitions
    # one message at a time, the earlier messages are held when one's transitions go; in a
    # batch none is held until every transition of the batch is sent
    assert all(n > 0 for n in single.held_at_send)
    assert batch.held_at_send == [0] * len(batch.transitions)
    held = batch.loop.held.take([("host", "gpu-node-01")])
    assert [h.event.message.offset for h in held[("host", "gpu-node-01")]] == list(range(120))


async def test_a_failed_batch_goes_again_one_by_one_and_only_the_culprit_is_dead() -> None:
    values = gpu_values(hosts=3, ticks=60)
    culprit = 3 * 10 + 1  # gpu-node-02's envelope of the eleventh minute
    failing = ("gpu-node-02", SimConfig().start_ts + 600)
    batch = await batched(values, [len(values)], make_run(Pipes(failing)))
    single = await one_by_one(values, make_run(Pipes(failing)))

    assert batch.dead == single.dead == [(culprit, "internal error: RuntimeError: boom")]
    assert batch.counters == single.counters == Counters(len(values), 1, 0)
    # the batch raised; each envelope went again alone, through the batch seam
    assert [len(b) for b in batch.pipes.batches] == [1] * (len(values) - 1)
    assert batch.transitions == single.transitions
    await batch.loop.tick()
    assert batch.stream.acked == list(range(len(values)))


def fail_flushing(pipes: Pipes, failing: tuple[str, float]) -> None:
    """A bug in the GPU pipeline: the flush of the wave holding ``failing`` raises, after
    the waves before it were learnt and their transitions made."""
    gpus, flush = pipes.gpus, pipes.gpus._flush

    def _flush() -> None:
        if failing in gpus._wave.after:
            raise RuntimeError("boom")
        flush()

    gpus._flush = _flush  # type: ignore[method-assign]


async def test_a_batch_that_fails_halfway_still_sends_what_it_did_before() -> None:
    """The batch got far (the leak's pages made) before a wave raised: what it did is not
    done again when its envelopes go one by one (they read as seen), so its transitions
    come with the exception and are sent; the pipeline takes the next batch afresh (the
    failed wave's samples do not stay in it)."""
    values = gpu_values(hosts=3, ticks=120)
    failing = ("gpu-node-02", SimConfig().start_ts + 110 * 60)
    pipes = [Pipes(), Pipes()]
    for p in pipes:
        fail_flushing(p, failing)
    batch = await batched(values, [len(values)], make_run(pipes[0]))
    single = await one_by_one(values, make_run(pipes[1]))
    assert [t.alert.status for t in single.transitions] == ["pending", "firing"]
    assert batch.transitions == single.transitions
    assert batch.dead == single.dead == [(3 * 110 + 1, "internal error: RuntimeError: boom")]
    more = gpu_values(hosts=3, ticks=125)[len(values) :]
    await batched(more, [len(more)], batch)  # the next batch: processed, not failing
    assert batch.pipes.batches[-1] == [(e.host, float(e.ts)) for e in map(decode_gpu, more)]
    assert batch.dead == single.dead


async def test_a_host_pruned_while_its_batch_is_sent_does_not_hold_its_ack() -> None:
    """A batch holds a host's last envelope and an hour and a half after it: the host is
    swept, and the 1-second tick that runs while the batch's pages are sent prunes it. Its
    messages' acks are released, not held for a snapshot that will never come (the
    partition would stop committing)."""
    sim = FleetSimulator(SimConfig(hosts=2, gpus=1, interval_s=60, leak_start_s=0))
    envs = [
        e
        for k, (_, es, _) in enumerate(itertools.islice(sim.ticks(), 175))
        for e in es
        if not (e.host == "gpu-node-01" and k > 100)
    ]
    cut = sum(e.ts < SimConfig().start_ts + 90 * 60 for e in envs)
    values = [*(encode(e) for e in envs), b'{"v":1,"kind":"gpu","host":']  # and a bad one
    run = make_run()
    send_alert, send_dead_letter = run.loop._send_alert, run.loop._send_dead_letter

    async def send_then_tick(t: Transition) -> None:  # the timer fires during the sends
        await send_alert(t)
        await run.loop.tick()

    async def dead_letter_then_tick(key: Any, value: bytes, headers: dict[str, bytes]) -> None:
        await send_dead_letter(key, value, headers)  # (the sweep marks move on: decoded)
        await run.loop.tick()

    run.loop._send_alert = send_then_tick  # type: ignore[method-assign]
    run.loop._send_dead_letter = dead_letter_then_tick  # type: ignore[method-assign]
    msgs = messages(values)
    await run.loop.assigned({TP(GPU_TOPIC, 0)})
    run.stream = stream = BurstStream([msgs[:cut], msgs[cut:]])
    await run.loop.consume("gpu", stream)
    assert any(t.alert.labels["host"] == "gpu-node-01" for t in run.transitions)
    for _ in range(3):
        run.loop.snap_at.clear()  # snapshots due at once, not a second apart
        await run.loop.tick()
    assert not run.pipes.gpus.tracks("gpu-node-01")  # swept, pruned
    assert stream.acked == list(range(len(values)))


async def test_a_rebalance_while_a_bad_message_is_dead_lettered_leaves_the_rest_unread() -> None:
    """A rebalance comes while a batch's first bad message is dead-lettered: the rest of
    the batch is read again from the committed offset, so its bad messages are
    dead-lettered then, once each (as one message at a time does), not also now."""
    bad = b'{"v":1,"kind":"gpu","host":'
    values = [bad, bad, bad, *gpu_values(hosts=1, ticks=3)]
    run = make_run()
    send_dead_letter, rebalanced = run.loop._send_dead_letter, []

    async def dead_letter_then_rebalance(key: Any, value: bytes, headers: dict[str, bytes]) -> None:
        await send_dead_letter(key, value, headers)
        if not rebalanced:  # the partition stays: Faust reads it again from offset 0
            rebalanced.append(True)
            await run.loop.assigned({TP(GPU_TOPIC, 0)})

    run.loop._send_dead_letter = dead_letter_then_rebalance  # type: ignore[method-assign]
    await run.loop.assigned({TP(GPU_TOPIC, 0)})
    await run.loop.consume("gpu", BurstStream([messages(values)]))
    run.stream = again = BurstStream([messages(values)])
    await run.loop.consume("gpu", again)
    assert [o for o, _ in run.dead] == [0, 0, 1, 2]  # offset 0 before the rebalance, then all
    assert run.counters.deadletter == 4
    await run.loop.tick()
    assert again.acked == list(range(len(values)))


async def test_a_partition_lost_while_a_batch_is_retried_leaves_nothing_to_snapshot() -> None:
    """The batch fails (a bug on its first envelope) and the partition is revoked while the
    culprit is dead-lettered: what the retry then does to the partition's hosts is not this
    worker's any more, so nothing of them is kept or snapshotted (empty snapshots written
    over the new owner's)."""
    values = gpu_values(hosts=3, ticks=2)
    run = make_run(Pipes(("gpu-node-01", SimConfig().start_ts)))
    send_dead_letter = run.loop._send_dead_letter

    async def dead_letter_then_revoke(key: Any, value: bytes, headers: dict[str, bytes]) -> None:
        await send_dead_letter(key, value, headers)
        await run.loop.assigned(set())

    run.loop._send_dead_letter = dead_letter_then_revoke  # type: ignore[method-assign]
    await run.loop.assigned({TP(GPU_TOPIC, 0)})
    await run.loop.consume("gpu", BurstStream([messages(values)]))
    assert [o for o, _ in run.dead] == [0]
    assert not run.loop.known["host"] and not run.loop.dirty["gpu"]
    assert not any(run.pipes.gpus.tracks(f"gpu-node-0{i}") for i in (1, 2, 3))
    await run.loop.tick()
    assert run.delivery.snapshots == []


# ---------------------------------------------------------------- where a batch ends


async def test_a_batch_ends_where_the_buffer_runs_dry_or_at_its_maximum() -> None:
    n = MAX_BATCH + 200
    values = gpu_values(hosts=4, ticks=(n + 4) // 4)[: n + 4]
    run = await batched(values, [3, 1, n])
    assert [len(b) for b in run.pipes.batches] == [3, 1, MAX_BATCH, n - MAX_BATCH]
    hosts_ts = [h for b in run.pipes.batches for h in b]
    assert hosts_ts == sorted(hosts_ts, key=lambda x: x[1])  # in order, nothing twice
    assert len(set(hosts_ts)) == len(values)
    assert run.counters.messages == len(values)
    await run.loop.tick()
    assert run.stream.acked == list(range(len(values)))


async def test_a_batch_takes_the_records_faust_hands_over_one_by_one() -> None:
    """Faust's queue is empty between two deliveries of the same fetch: the batch gives the
    next one a few turns of the event loop (no timer), and ends where the fetch does."""
    values = gpu_values(hosts=4, ticks=80)
    msgs = messages(values)
    bursts = [msgs[:5], msgs[5:305], msgs[305:306], msgs[306:]]
    run = make_run()
    await run.loop.consume("gpu", FetcherStream(bursts, turns=2))
    assert [len(b) for b in run.pipes.batches] == [5, 300, 1, len(msgs) - 306]
    # records handed over further apart than the batch looks ahead: one at a time
    run = make_run()
    await run.loop.consume("gpu", FetcherStream([messages(values[:20])], turns=FETCH_TURNS + 2))
    assert [len(b) for b in run.pipes.batches] == [1] * 20


async def test_a_topic_without_a_batch_seam_is_handled_one_message_at_a_time() -> None:
    run = make_run()
    t0 = time.time() - 60
    values = [
        encode(EventEnvelope(host="gpu-node-01", ts=t0 + i, type="xid", attrs={"xid": 79}))
        for i in range(3)
    ]
    stream = BurstStream([messages(values, SETTINGS.topic("events"))])
    await run.loop.consume("events", stream)
    assert run.counters.messages == 3 and run.pipes.batches == []
    assert run.loop.dirty["events"] == {"gpu-node-01"}


# ---------------------------------------------------------------- rebalances


async def test_messages_read_into_a_batch_before_a_rebalance_are_left_to_be_read_again() -> None:
    values = gpu_values(hosts=3, ticks=2)
    run = make_run()
    await run.loop.assigned({TP(GPU_TOPIC, 0)})

    async def rebalance(i: int) -> None:
        if i == 4:  # messages 0-3 are read, the next is buffered: Faust rebalances
            await run.loop.assigned({TP(GPU_TOPIC, 0)})

    stream = BurstStream([messages(values)], before=rebalance)
    await run.loop.consume("gpu", stream)
    # Faust reads the partition again from its committed offset: 0-3 come again later
    ts = SimConfig().start_ts + 60
    assert run.pipes.batches == [[("gpu-node-02", ts), ("gpu-node-03", ts)]]
    assert run.counters.messages == 2


async def test_a_partition_kept_through_a_rebalance_is_read_again_as_duplicates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faust reads a partition the worker keeps through a rebalance again from its
    committed offset (none yet here: 20 minutes of it): its hosts' envelopes come again
    far behind their newest. They are redeliveries, duplicates, not a clock that jumped
    back (no "check its NTP" warning, nothing refused); the host's alerts are unmoved."""
    values = gpu_values(hosts=2, ticks=20)
    run = await batched(values, [len(values)])
    firing = {t.alert.fingerprint for t in run.transitions}
    await run.loop.assigned({TP(GPU_TOPIC, 0)})  # kept: read again from offset 0
    before = run.pipes.gpus.stats.duplicates
    await run.loop.consume("gpu", BurstStream([messages(values)]))
    stats = run.pipes.gpus.stats
    assert stats.clock_jumps_back == 0 and stats.duplicates - before == samples(values)
    assert not [r for r in caplog.records if "clock jumped back" in r.getMessage()]
    assert {t.alert.fingerprint for t in run.transitions} == firing
    # then the first minute again, after the last: a clock that jumped back 19 minutes
    await run.loop.consume("gpu", BurstStream([messages(values[:2])]))
    assert stats.clock_jumps_back == samples(values[:2])
    assert [r for r in caplog.records if "clock jumped back" in r.getMessage()]


def samples(values: list[bytes]) -> int:
    """The GPU and process samples of these envelopes."""
    return sum(1 + len(g["procs"]) for v in values for g in orjson.loads(v)["gpus"])


async def test_a_rebalance_while_restoring_drops_the_batch_and_the_hosts_gone() -> None:
    delivery = MemoryDelivery()
    run = make_run(delivery=delivery)

    async def lose_the_partition() -> None:
        delivery.on_restore = None
        await run.loop.assigned(set())

    delivery.on_restore = lose_the_partition
    run = await batched(gpu_values(hosts=2, ticks=1), [2], run)
    assert delivery.restored == ["gpu-node-01", "gpu-node-02"]
    assert run.pipes.batches == [] and run.transitions == []
    # the partition's new owner restores them: here they are forgotten, not kept stale
    assert run.loop.known["host"] == set() and run.loop.partitions == {}
    assert not run.pipes.gpus.tracks("gpu-node-01") and not run.pipes.gpus.tracks("gpu-node-02")
    await run.loop.tick()
    assert run.stream.acked == [] and delivery.snapshots == []


async def test_a_changing_host_has_its_status_written_once_per_status_interval() -> None:
    """A host read many times a second (a catch-up) costs one status write per
    ``status_interval``; a new host is written at once, the last change is not lost, and
    while Redis is away every changed host is written at each tick."""
    run = make_run()
    await batched(gpu_values(2, 3), [6], run)
    loop, every = run.loop, SETTINGS.status_interval
    loop._changed()
    assert loop.statuses_due(100.0) == ({"gpu-node-01", "gpu-node-02"}, set())
    loop.dirty["gpu"].add("gpu-node-01")
    loop._changed()
    assert loop.statuses_due(100.0 + every / 2) == (set(), set())  # written lately: waits
    assert loop.statuses_due(100.0 + every) == ({"gpu-node-01"}, set())  # then goes out
    assert loop.statuses_due(100.0 + 3 * every) == (set(), set())  # nothing changed since
    run.delivery.redis_down_since = 1.0
    loop.dirty["gpu"].add("gpu-node-02")
    loop._changed()
    assert loop.statuses_due(100.0 + 3 * every + 0.1)[0] == {"gpu-node-01", "gpu-node-02"}
