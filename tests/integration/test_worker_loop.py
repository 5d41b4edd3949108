"""The worker loop without a broker: an in-memory stream of real encoded envelopes, a real
redis-server, the loop's checkpoint order checked at each ack.

(The live tests run the same loop under Faust against Tansu; this one drives it message by
message, so the order of snapshots, acks, dead letters and rebalances can be asserted.)
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis

from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.codec import encode
from ragwatch.config import Settings
from ragwatch.schema import DLQ_HEADER_OFFSET, DLQ_HEADER_REASON, Transition
from ragwatch.store import Keys, read_alerts
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.app import Delivery
from ragwatch.streams.worker.loop import WorkerLoop
from tests.faust_messages import TP, Event, Message


@dataclass
class MemoryStream:
    """A Faust stream's surface that the loop uses: ``noack``, ``events``, ``ack``. Each
    ack checks, with a blocking Redis client, that a snapshot of its host was written
    first (dead letters excepted: they hold no state)."""

    messages: list[Message]
    redis: redis.Redis
    keys: Keys
    dead: set[int] = field(default_factory=set)
    acked: list[int] = field(default_factory=list)
    acked_without_snapshot: list[int] = field(default_factory=list)

    def noack(self) -> MemoryStream:
        return self

    async def events(self) -> AsyncIterator[Event]:
        for m in self.messages:
            yield Event(m)

    async def ack(self, event: Event) -> None:
        offset = event.message.offset
        if offset not in self.dead and not self.redis.hexists(
            self.keys.snapshots["host"], "gpu-node-01"
        ):
            self.acked_without_snapshot.append(offset)
        self.acked.append(offset)


def test_the_loop_snapshots_before_it_acks_and_dead_letters_in_order(
    rw_env: dict[str, str], redis_client: redis.Redis
) -> None:
    asyncio.run(_scenario(Settings.from_env(rw_env), redis_client))


async def _scenario(settings: Settings, client: redis.Redis) -> None:
    pipes = Pipelines(load_rules())
    delivery = Delivery(settings, "loop-test")
    alerts: list[tuple[bytes, bytes]] = []
    dead: list[tuple[bytes, dict[str, bytes]]] = []

    class AlertsTopic:  # as Faust's: send returns the future of the broker's ack
        async def send(self, *, key: bytes, value: bytes) -> asyncio.Future[None]:
            alerts.append((key, value))
            acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            acked.set_result(None)
            return acked

    async def send_alert(t: Transition) -> None:
        await delivery.send(t, AlertsTopic())

    async def send_dead_letter(key: Any, value: bytes, headers: dict[str, bytes]) -> None:
        dead.append((value, headers))

    loop = WorkerLoop(
        settings, pipes, delivery, delivery.counters,
        send_alert=send_alert, send_dead_letter=send_dead_letter,
    )  # fmt: skip
    topic = settings.topic("gpu")
    ticks = FleetSimulator(SimConfig(hosts=1, gpus=1, interval_s=60, leak_start_s=0)).ticks()
    values = [encode(envs[0]) for _, envs, _ in itertools.islice(ticks, 120)]  # 2 h, a leak
    values.insert(5, b'{"v":1,"kind":"gpu","host":')  # a broken message, offset 5
    messages = [Message(topic, 0, i, b"gpu-node-01", v) for i, v in enumerate(values)]
    stream = MemoryStream(messages, client, Keys(settings.redis_prefix), dead={5})
    await loop.assigned({TP(topic, 0)})

    async for event in stream.events():
        await loop.handle(loop.topics["gpu"], stream, event)
    # the broken one is dead-lettered with its reason and its ack released, but acks go
    # in offset order: offsets 0-4 wait for the host's snapshot, and it waits with them
    ((value, headers),) = dead
    assert value == values[5] and headers[DLQ_HEADER_OFFSET] == b"5"
    assert b"JSON" in headers[DLQ_HEADER_REASON] or b"json" in headers[DLQ_HEADER_REASON]
    assert delivery.counters.deadletter == 1 and stream.acked == []
    assert any(b"GpuMemoryLeak" in v and b'"firing"' in v for _, v in alerts)
    assert {a["rule"] for a in read_alerts(client, settings.redis_prefix)} >= {"GpuMemoryLeak"}

    await loop.tick()  # marks the host's snapshot due and writes it (never written before)
    assert stream.acked == list(range(len(messages)))  # all, in offset order
    assert stream.acked_without_snapshot == []

    # a rebalance that takes the partition away forgets the host and its held acks
    more = Message(topic, 0, len(messages), b"gpu-node-01", encode(next(ticks)[1][0]))
    await loop.handle(loop.topics["gpu"], stream, Event(more))
    await loop.assigned(set())
    assert not pipes.gpus.tracks("gpu-node-01") and loop.known["host"] == set()
    await loop.tick()  # nothing is left to snapshot or ack
    assert stream.acked[-1] == len(messages) - 1  # the forgotten one is read again elsewhere
    await delivery.redis.aclose()
