"""The worker's input topics, one row each: what a topic's key names, how its bytes
decode, the key and newest event time of an envelope, and the pipeline that processes it
(one envelope at a time, and a batch at a time where the pipeline has that seam)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ragwatch.codec import decode_as, decode_gpu_wire, decode_requests_wire
from ragwatch.gpu_wire import GpuMessage
from ragwatch.schema import EventEnvelope, MetricsEnvelope, Transition
from ragwatch.streams.pipelines.base import Domain  # what an input topic's key names
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.requests import RequestsMessage

Key = tuple[Domain, str]


class Sweeper(Protocol):
    """A pipeline that sweeps silent series against a mark of event time."""

    sweep_mark: float


@dataclass(frozen=True)
class InputTopic:
    """One input topic: what its key names, how its bytes decode, the key and newest event
    time of a decoded envelope, and the pipeline that processes it (``sweeper``: the
    pipeline whose silence sweeps follow this topic's partitions, if any)."""

    kind: str  # the topic's name without the prefix: gpu, events, requests, metrics
    domain: Domain
    decode: Callable[[bytes], Any]
    key: Callable[[Any], str]
    newest: Callable[[Any], float]
    process: Callable[[Any], list[Transition]]
    sweeper: Sweeper | None = None
    # envelopes in order, the transitions of ``process`` one at a time (None: no batches)
    process_batch: Callable[[list[Any]], list[Transition]] | None = None


def _key(env: Any) -> str:
    return str(env.key)


def _ts(env: Any) -> float:
    return float(env.ts)


def _gpu_ts(env: GpuMessage) -> float:
    return float(env.ts)


def _requests_ts(env: RequestsMessage) -> float:
    return max((r.ts for r in env.records), default=env.ts)


def input_topics(pipes: Pipelines) -> tuple[InputTopic, ...]:
    """The worker's input topics. GPU and request envelopes are decoded into msgspec
    structs (``decode_gpu_wire`` and ``decode_requests_wire`` validate them as strictly):
    building ~90 frozen records per host envelope, or one per request, cost more than the
    analysis."""
    return (
        InputTopic(
            "gpu", "host", decode_gpu_wire, operator.attrgetter("host"), _gpu_ts,
            pipes.gpu_wire, pipes.gpus, pipes.gpu_batch,
        ),
        InputTopic("events", "host", partial(decode_as, EventEnvelope), _key, _ts, pipes.event),
        InputTopic(
            "requests", "service", decode_requests_wire, operator.attrgetter("service"),
            _requests_ts, pipes.request, pipes.requests, pipes.request_batch,
        ),
        InputTopic(
            "metrics", "host", partial(decode_as, MetricsEnvelope), _key, _ts, pipes.metric,
            pipes.metrics,
        ),
    )  # fmt: skip
