"""A realistic Redis state for the status and serve tests, written by the worker's writer.

The simulated leak scenario (2 hosts x 2 GPUs, one RAG service with 2 instances, plus a
scraped vLLM engine whose target URL puts '/' in its series id) runs through the real
:class:`Pipelines` and :class:`SeriesRecorder`; what the worker would write goes to Redis
through the real :class:`RedisState`. Then what other components write: a firing alert
whose labels are hostile (a process can name itself anything), silences and the
notifier's backlog, in the shapes the notifier and ``ragwatch silence add`` store.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

from ragwatch.agents.scenario import build
from ragwatch.chart_ids import series_prefix
from ragwatch.schema import (
    Alert,
    GpuEnvelope,
    MetricSample,
    MetricsEnvelope,
    RequestsEnvelope,
    Transition,
)
from ragwatch.silences import Silence
from ragwatch.store import Keys, RedisState
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.notifier.delivery_stats import ReceiverStats
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines

HOSTILE = '<img src=x onerror=alert(1)>"\x1b[2J{{name}}'
ENGINE_TARGET = "http://vllm-0:8000/metrics"
HOURS = 2.0


@dataclass
class Fleet:
    leak: Alert  # the firing GpuMemoryLeak
    hostile: Alert  # a firing alert with hostile label values
    leak_series: str  # its process series id
    engine_series: str  # an id with '/' in it
    series_points: dict[str, int]  # id -> points written
    silences: list[str]  # ids: active, pending (a recurring window), expired


def _engine(host: str, start: float, hours: float) -> list[MetricsEnvelope]:
    out, tokens, requests = [], 0.0, 0.0
    for i in range(int(hours * 60)):
        tokens += 60 * (900.0 + 50.0 * (i % 7))
        requests += 60 * 3.5
        samples = (
            MetricSample("ragwatch_generation_tokens_total", {"engine": "vllm"}, tokens),
            MetricSample("ragwatch_requests_total", {"engine": "vllm"}, requests),
            MetricSample("ragwatch_requests_waiting", {"engine": "vllm"}, float(i % 4)),
        )
        out.append(MetricsEnvelope(host, ENGINE_TARGET, start + 60.0 * i, samples))
    return out


@dataclass
class Run:
    pipes: Pipelines
    transitions: list[Transition]
    steps: list[dict[str, Any]]  # the series points of each step, in order
    hosts: set[str]
    services: set[str]


def simulate() -> Run:
    """Run the scenario as a worker would, without Kafka."""
    world = build("leak", hosts=2, gpus=2, services=1, interval_s=60.0)
    envs = list(world.envelopes(hours=HOURS))
    start = min(e.ts for e in envs)
    merged = heapq.merge(envs, _engine("gpu-node-01", start, HOURS), key=lambda e: e.ts)
    pipes = Pipelines(load_rules())
    recorder = SeriesRecorder(pipes.rules)
    run = Run(pipes, [], [], set(), set())
    for env in merged:
        run.transitions += pipes.process(env)
        hosts = {env.host} if isinstance(env, GpuEnvelope | MetricsEnvelope) else set()
        services = {env.service} if isinstance(env, RequestsEnvelope) else set()
        run.hosts |= hosts
        run.services |= services
        for p in pipes.of("host"):
            recorder.observe(p, [(h, env.ts) for h in hosts])
        recorder.observe(pipes.requests, [(s, env.ts) for s in services])
        if points := recorder.take():
            run.steps.append(points)
    return run


async def write_run(url: str, prefix: str, run: Run, extra: Sequence[Alert] = ()) -> None:
    """What a worker would have written of ``run`` to Redis, and ``extra`` alerts (each a
    transition from inactive)."""
    client = aioredis.from_url(url)
    state = RedisState(client, prefix)
    pipes = run.pipes
    try:
        for t in run.transitions:
            await state.write_transition(t)
        for a in extra:
            await state.write_transition(Transition(a, "inactive"))
        for points in run.steps:
            await state.write_series(points)
        await state.write_hosts(
            {h: {**pipes.gpus.host_snapshot(h), "engines": pipes.metrics.engine_snapshot(h)}
             for h in run.hosts}
        )  # fmt: skip
        await state.write_services({s: pipes.requests.service_snapshot(s) for s in run.services})
        await state.write_worker("worker-1", {"messages": 1234, "deadletter": 0, "series": 42})
    finally:
        await client.aclose()


def hostile_alert(leak: Alert) -> Alert:
    labels = {**leak.labels, "host": "gpu-node-02", "gpu": "0", "pid": "6666",
              "process": HOSTILE, "container": "</script><script>alert(2)</script>"}  # fmt: skip
    return replace(
        leak,
        labels=labels,
        annotations={**leak.annotations, "summary": f"leak in {HOSTILE}", "hint": HOSTILE},
        fingerprint="hostile0000000001",
        starts_at=leak.starts_at + 600,
    )


def pending_decode_drop(leak: Alert) -> Alert:
    """A pending service alert, so status has one of each state whatever the rules' timing
    (the leak slows rag-api-1's decoding down on its host)."""
    labels = {
        "alertname": "DecodeSpeedDrop",
        "severity": "error",
        "service": "rag-api",
        "instance": "rag-api-1",
    }
    summary = (
        "rag-api (rag-api-1): answers decode at 400.0 tokens/s per request, -28% vs its "
        "baseline 555.0 (median of 180 requests)"
    )
    return Alert(
        rule="DecodeSpeedDrop",
        severity="error",
        status="pending",
        labels=labels,
        annotations={"summary": summary},
        value=400.0,
        expected=555.0,
        starts_at=leak.starts_at + 900,
        ends_at=None,
        fingerprint="pending000000001",
        at=leak.starts_at + 900,
    )


def slack_deliveries() -> ReceiverStats:
    """What the notifier counted for its Slack receiver: 3 delivered (one 2 minutes late,
    after retries), 2 retried, 1 failed."""
    stats = ReceiverStats(retried=2, failed=1)
    for seconds in (0.4, 0.9, 120.0):
        stats.delivered_after(seconds)
    return stats


def write_fleet(url: str, prefix: str, now: float | None = None) -> Fleet:
    run = simulate()
    leak = next(t.alert for t in run.transitions if t.alert.status == "firing")
    assert leak.rule == "GpuMemoryLeak", leak
    hostile = hostile_alert(leak)
    run.transitions.append(Transition(hostile, "pending"))
    if not any(a.rule == "DecodeSpeedDrop" for a in run.pipes.engine.active.values()):
        run.transitions.append(Transition(pending_decode_drop(leak), "inactive"))
    asyncio.run(write_run(url, prefix, run))

    now = time.time() if now is None else now
    keys = Keys(prefix)
    silences = [
        Silence.new({"alertname": "DecodeSpeedDrop"}, comment="deploy of rag-api",
                    author="ana", now=now - 600, duration_s=4200.0),
        # a window that is open one minute every leap day: pending whenever a test runs
        Silence.new({"host": "=~gpu-node-0[12]"}, comment="leap day maintenance",
                    author="bo", now=now - 86400, cron="0 0 29 2 *", duration_s=60.0),
        Silence.new({"alertname": "X"}, comment="over", author="cy", now=now - 7200,
                    duration_s=3600.0),
    ]  # fmt: skip
    client = redis.Redis.from_url(url)
    try:
        client.hset(keys.silences, mapping={s.id: orjson.dumps(s.to_dict()) for s in silences})
        client.zadd(keys.outbox_due, {"n1": now, "n2": now + 30})
        client.lpush(keys.outbox_dead, orjson.dumps({"key": "n0", "reason": "HTTP 410"}))
        client.hset(
            keys.notifier,
            mapping={
                "counters": orjson.dumps(
                    {
                        "groups": 2,
                        "receivers": {"slack": {"sent": 3, "failed": 1}},
                        "deliveries": {"slack": asdict(slack_deliveries())},
                    }
                ),
                "seen": orjson.dumps(now - 5),
            },
        )
    finally:
        client.close()

    counts: dict[str, int] = {}
    for points in run.steps:
        for sid, (_, taken) in points.items():
            counts[sid] = counts.get(sid, 0) + len(taken)
    lab = leak.labels
    return Fleet(
        leak=leak,
        hostile=hostile,
        leak_series=f"process:{lab['host']}:{lab['gpu']}:{lab['pid']}:gpu_mem",
        # the target's ':' are escaped in the id (%3A): names cannot run into each other
        engine_series=series_prefix("engine", {"host": "gpu-node-01", "target": ENGINE_TARGET})
        + "tokens_per_s",
        series_points=counts,
        silences=[s.id for s in silences],
    )
