"""Batches of one input topic: the messages at hand, read and checked together.

A batch is every message read while the next one was at hand (buffered in the stream, or
handed over by Faust's fetcher within ``FETCH_TURNS`` turns of the event loop), up to
``MAX_BATCH``; it never waits on a timer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ragwatch.streams.worker.acks import Held
from ragwatch.streams.worker.topics import InputTopic, Key

# Messages of a batched topic handled together at most: those read while the next was at
# hand (a batch ends where the stream runs dry, never on a timer).
MAX_BATCH = 512
# Turns of the event loop a batch gives the next message to come. Faust's fetcher hands
# the records it has fetched to the stream one at a time, each delivery a few turns
# (``faust.transport.consumer.Consumer._drain_messages`` awaits ``wait_first`` per record),
# so the stream's queue is empty between two deliveries even with a backlog: looking at
# the queue alone made batches of one.
FETCH_TURNS = 8


@dataclass(frozen=True, slots=True)
class Read:
    """One message of a batch, decoded and checked: what processing and dead-lettering it
    need."""

    msg: Any
    raw: bytes
    env: Any
    key: Key
    held: Held


def buffered(stream: Any) -> bool:
    """Whether another message is buffered behind the one just read. A Faust stream reads
    its channel's queue (``faust.channels.Channel.empty``); a stream without one has none."""
    empty = getattr(getattr(stream, "channel", None), "empty", None)
    return empty is not None and not empty()


async def more_at_hand(stream: Any) -> bool:
    """Whether another message is buffered, or handed to ``stream`` within ``FETCH_TURNS``
    turns of the event loop."""
    for _ in range(FETCH_TURNS):
        if buffered(stream):
            return True
        await asyncio.sleep(0)
    return buffered(stream)


def describe(topic: InputTopic, reads: list[Read]) -> str:
    """A batch for the log: its size and where it starts."""
    m = reads[0].msg
    return f"{len(reads)} {topic.kind} message(s) from {m.topic}[{m.partition}] offset={m.offset}"


def largest(reads: list[Read]) -> Read:
    """The batch's largest message: a slow batch's likeliest cause (a huge envelope), named
    by the slow-message log line as a message handled alone would be."""
    return max(reads, key=lambda r: len(r.raw))
