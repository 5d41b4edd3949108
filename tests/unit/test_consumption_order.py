"""Alerts do not depend on the order partitions are read in.

Kafka keeps order per partition only: a worker catching up reads one partition ahead of
another, one topic ahead of another. The same telemetry played in event-time order and
in a consumption order (each topic's partitions read in uneven chunks of up to hours of
event time, with the worker's sweep marks: the slowest partition being read) must give
the same transitions: rule, status, labels and ``starts_at``, per alert, in order.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import pytest

from ragwatch.agents.scenario import build
from ragwatch.schema import Envelope, EventEnvelope, GpuEnvelope, RequestsEnvelope, Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.marks import SweepMarks

RULES = load_rules()
PARTITIONS = 3
HOUR = 3600.0
BATCH = 120  # messages a worker reads of a partition at a time: 2 h of a host's

Queue = tuple[str, int]  # topic, partition


def topic_of(env: Envelope) -> str:
    if isinstance(env, RequestsEnvelope):
        return "requests"
    return "events" if isinstance(env, EventEnvelope) else "gpu"


def key_of(env: Envelope) -> str:
    """The message key: its service or host."""
    return env.service if isinstance(env, RequestsEnvelope) else env.host  # type: ignore[union-attr]


def partition_of(env: Envelope) -> int:
    return zlib.crc32(key_of(env).encode()) % PARTITIONS


def newest(env: Envelope) -> float:
    if isinstance(env, RequestsEnvelope):
        return max((r.ts for r in env.records), default=env.ts)
    return float(env.ts)  # type: ignore[union-attr]


def consumption(envs: Sequence[Envelope], seed: int, ahead_s: float) -> Iterator[Queue | Envelope]:
    """The envelopes as a consumer reads them: a random partition of a random topic, a
    chunk of up to ``ahead_s`` of event time at a time; a queue it has read to its end
    is yielded once as (topic, partition), done."""
    rng = random.Random(seed)
    queues: dict[Queue, list[Envelope]] = {}
    for env in envs:
        queues.setdefault((topic_of(env), partition_of(env)), []).append(env)
    pos = dict.fromkeys(queues, 0)
    while open_ := [q for q in queues if pos[q] < len(queues[q])]:
        q = rng.choice(open_)
        items, i = queues[q], pos[q]
        until = items[i].ts + rng.uniform(0.0, ahead_s)  # type: ignore[union-attr]
        while i < len(items) and items[i].ts <= until:  # type: ignore[union-attr]
            yield items[i]
            i += 1
        pos[q] = i
        if i == len(items):
            yield q


class Read(NamedTuple):
    """A message read at an offset of its queue."""

    queue: Queue
    offset: int
    env: Envelope


def in_turn(
    queues: dict[Queue, list[Envelope]], batch: int, rewind: Queue, at: float
) -> Iterator[Read]:
    """The envelopes as a worker with a backlog reads them: a batch of up to ``batch``
    messages of one partition at a time, the partitions in turn. When ``rewind`` first
    reaches event time ``at`` it is read again from its start: a rebalance, after which
    Faust reads a partition from its committed offset (none was committed yet)."""
    pos, rewound = dict.fromkeys(queues, 0), False
    while open_ := [q for q in queues if pos[q] < len(queues[q])]:
        for q in open_:
            for _ in range(batch):
                if pos[q] == len(queues[q]):
                    break
                if q == rewind and not rewound and newest(queues[q][pos[q]]) >= at:
                    rewound, pos[q] = True, 0
                yield Read(q, pos[q], queues[q][pos[q]])
                pos[q] += 1


def by_host(envs: Sequence[Envelope]) -> dict[Queue, list[Envelope]]:
    """A partition per host (or service): the hosts of other partitions move on together,
    a batch apart."""
    keys: dict[str, int] = {}
    queues: dict[Queue, list[Envelope]] = {}
    for env in envs:
        queues.setdefault((topic_of(env), keys.setdefault(key_of(env), len(keys))), []).append(env)
    return queues


def play(
    stream: Iterator[Queue | Envelope | Read],
    wall_step: float = 0.0,
    highwater: dict[Queue, int] | None = None,
) -> list[Transition]:
    """Like the worker: sweep marks per topic from the partitions being read, each item
    read ``wall_step`` wall seconds after the one before (``highwater``: each queue's
    length, all of it produced; the marks then know a partition's backlog)."""
    pipes = Pipelines(RULES)
    wall = [0.0]
    marks = SweepMarks(clock=lambda: wall[0])
    if highwater is not None:
        marks.highwater = lambda topic, p: highwater.get((topic, p))
    sweepers = {"gpu": pipes.gpus, "requests": pipes.requests, "metrics": pipes.metrics}
    out: list[Transition] = []
    for item in stream:
        wall[0] += wall_step
        if isinstance(item, Read):
            (topic, partition), offset, item = item
        elif isinstance(item, tuple):  # read to its end: idle from now on
            marks.forget([item])
            continue
        else:
            topic, partition, offset = topic_of(item), partition_of(item), None
        marks.read(topic, partition, newest(item), offset)
        if topic in sweepers:
            sweepers[topic].sweep_mark = marks.mark(topic, default=math.inf) or math.inf
        out += pipes.process(item)
    return out


def per_alert(ts: list[Transition]) -> dict[str, list[tuple[object, ...]]]:
    out: dict[str, list[tuple[object, ...]]] = {}
    for t in ts:
        a = t.alert
        out.setdefault(a.fingerprint, []).append(
            (a.rule, t.previous, a.status, tuple(sorted(a.labels.items())), a.starts_at)
        )
    return out


@pytest.fixture(scope="module")
def telemetry() -> list[Envelope]:
    # base_qps 20 (120 recorded requests a minute): the latency baselines judge after 1,500
    # values, so the retrieval fault 20 minutes in meets a baseline (at 8, 48 a minute, it
    # met none and was learnt)
    world = build(
        "all", hosts=4, gpus=1, services=2, interval_s=60.0, heal_after_s=2 * HOUR, base_qps=20.0
    )
    return list(world.envelopes(hours=4.0))


@pytest.fixture(scope="module")
def in_order(telemetry: list[Envelope]) -> list[Transition]:
    return play(iter(telemetry))


def test_the_stream_has_alerts_of_every_kind(
    telemetry: list[Envelope], in_order: list[Transition]
) -> None:
    rules = {t.alert.rule for t in in_order if t.alert.status == "firing"}
    assert {"GpuMemoryLeak", "TokensPerRequestDrop", "RetrievalSlowdown"} <= rules
    assert {t.alert.status for t in in_order} == {"pending", "firing", "resolved"}
    assert {type(e) for e in telemetry} >= {GpuEnvelope, RequestsEnvelope}


@pytest.mark.parametrize(("seed", "ahead_h"), [(1, 0.5), (2, 3.0)])
def test_uneven_partitions_give_the_same_transitions(
    telemetry: list[Envelope], in_order: list[Transition], seed: int, ahead_h: float
) -> None:
    got = per_alert(play(consumption(telemetry, seed, ahead_h * HOUR)))
    assert got == per_alert(in_order)


def test_without_sweep_marks_a_partition_read_ahead_sweeps_live_hosts(
    telemetry: list[Envelope], in_order: list[Transition]
) -> None:
    """The guard matters: judged on the newest event time anywhere, hosts of a partition
    read hours behind look silent, their alerts resolve and fire again."""
    pipes = Pipelines(RULES)
    out = [t for env in consumption(telemetry, 2, 3 * HOUR) if not isinstance(env, tuple)
           for t in pipes.process(env)]  # fmt: skip
    assert per_alert(out) != per_alert(in_order)


def test_a_partition_waiting_behind_a_backlog_or_read_again_keeps_its_hosts_alerts(
    telemetry: list[Envelope], in_order: list[Transition]
) -> None:
    """A worker with a backlog reads its partitions a batch at a time, in turn: under load
    (here a wall second a message) a partition waits minutes between its batches, past
    the marks' 30 s idle time, while a batch of another moves the event time on by hours.
    The partition of the leaking host is also read again from its start halfway (a
    rebalance). It has messages to read all the while (its high watermark is past what
    was read), so the sweep waits for it: its host is not silent, and the leak does not
    resolve and fire again (the three-worker demo on a loaded CI machine: the leak of the
    host a killed worker left paged twice)."""
    leak = next(t.alert for t in in_order if t.alert.rule == "GpuMemoryLeak")
    queues = by_host(telemetry)
    queue = next(q for q, envs in queues.items() if key_of(envs[0]) == leak.labels["host"])
    high = {q: len(envs) for q, envs in queues.items()}

    def reads() -> Iterator[Read]:
        return in_turn(queues, batch=BATCH, rewind=queue, at=leak.starts_at + HOUR)

    assert per_alert(play(reads(), wall_step=1.0, highwater=high)) == per_alert(in_order)
    # without the backlog, the marks judge the waiting partition idle: its host is swept
    swept = per_alert(play(reads(), wall_step=1.0))
    assert len(swept[leak.fingerprint]) > len(per_alert(in_order)[leak.fingerprint])
