"""Chart points on event time (issue 29, point 11): a point a minute of each series
whatever the batches the worker reads (so whatever the replay speed), what the live page
draws beside a memory chart, and its API document."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest

from ragwatch.agents.scenario import build
from ragwatch.chart_ids import owner_prefixes
from ragwatch.console import serve
from ragwatch.console.openapi import spec
from ragwatch.schema import Envelope, GpuEnvelope
from ragwatch.store import SERIES_POINTS
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines

Points = dict[str, list[list[Any]]]


def envelopes(hours: float) -> list[Envelope]:
    world = build("leak", hosts=2, gpus=2, services=1, interval_s=10.0)
    return list(world.envelopes(hours=hours))


def recorded(envs: Iterable[Envelope], batch: int, takes_every: int = 0) -> Points:
    """The points a worker takes of ``envs`` read in batches of ``batch`` (and taken
    every ``takes_every`` envelopes, as a worker's ticks do; 0: once at the end)."""
    pipes = Pipelines(load_rules())
    rec = SeriesRecorder(pipes.rules)
    pipes.tap(rec.observe)
    out: Points = {}

    def take() -> None:
        for sid, (meta, points) in rec.take().items():
            assert meta["kind"] == sid.split(":")[0]
            out.setdefault(sid, []).extend(points)

    envs = list(envs)
    step = takes_every or len(envs)
    for i in range(0, len(envs), step):
        for _ in pipes.run(envs[i : i + step], batch=batch):
            pass
        take()
    return out


def test_a_point_a_minute_of_event_time_whatever_the_batches() -> None:
    """The worker took a point of each series at each tick (a second of wall time): 6-7
    points over 2.5 h after the demo at 720x, and another chart at another speed."""
    envs = envelopes(3.0)
    one_by_one = recorded(envs, batch=1)
    assert recorded(envs, batch=512) == one_by_one
    assert recorded(envs, batch=37, takes_every=101) == one_by_one
    leak = one_by_one["process:gpu-node-01:1:4011:gpu_mem"]
    assert len(leak) == 180  # 3 hours
    assert {b[0] - a[0] for a, b in itertools.pairwise(leak)} == {60.0}
    assert leak[-1][1] > leak[0][1] + 2e9  # it leaks
    assert {sid.split(":")[0] for sid in one_by_one} == {"gpu", "process", "service"}
    for sid, points in one_by_one.items():
        ts = [p[0] for p in points]
        assert all(b - a >= 60.0 for a, b in itertools.pairwise(ts)), sid
        if sid.startswith(("gpu:", "process:")):
            assert len(points) >= 175, sid


def test_what_is_not_taken_is_bounded_and_a_swept_hosts_points_go() -> None:
    pipes = Pipelines(load_rules())
    rec = SeriesRecorder(pipes.rules, keep=5)
    for env in envelopes(1.0):
        pipes.process(env)
        rec.observe(pipes.gpus, [(env.host, env.ts)])
    taken = rec.take()
    assert {len(points) for _, points in taken.values()} == {5}  # the newest 5 of 60
    assert rec.take() == {}
    for env in envelopes(1.5)[-200:]:
        pipes.process(env)
        rec.observe(pipes.gpus, [(env.host, env.ts)])
    rec.forget(owner_prefixes(["gpu-node-01"], []))
    assert rec.take() and not any(":gpu-node-01:" in sid for sid in rec.take())


def test_a_new_series_on_a_known_host_is_charted_within_a_step() -> None:
    """One look per envelope at a host none of whose series is due: a series new to the
    host (a process that starts) gets its first point at most a step late."""
    envs = [e for e in envelopes(1.0) if isinstance(e, GpuEnvelope)]
    starts = envs[0].ts + 1800.0 + 25.0  # pid 4011 starts between two points of the host

    def later(env: GpuEnvelope) -> GpuEnvelope:
        if env.ts >= starts:
            return env
        gpus = [replace(g, procs=tuple(p for p in g.procs if p.pid != 4011)) for g in env.gpus]
        return replace(env, gpus=tuple(gpus))

    pipes = Pipelines(load_rules())
    rec = SeriesRecorder(pipes.rules)
    for env in map(later, envs):
        pipes.process(env)
        rec.observe(pipes.gpus, [(env.host, env.ts)])
    taken = rec.take()
    (first, *_) = taken["process:gpu-node-01:1:4011:gpu_mem"][1]
    seen = min(e.ts for e in envs if e.ts >= starts)
    assert seen <= first[0] <= seen + 60.0
    host = taken["gpu:gpu-node-01:1:fb_used"][1]
    assert {b[0] - a[0] for a, b in itertools.pairwise(host)} == {60.0}  # on its own step


# ---------------------------------------------------------------------------- memory

HOST = {
    "gpus": [
        {"index": 0, "mig": None, "fb_total_bytes": 8.0e10, "fb_used_bytes": 1.0e10,
         "gb_per_hour": 0.0, "tte_h": None, "ts": 50.0},
        {"index": 0, "mig": "1g.10gb", "fb_total_bytes": 1.0e10, "fb_used_bytes": 9.0e9,
         "gb_per_hour": 0.36, "tte_h": 2.5, "ts": 60.0},
    ]
}  # fmt: skip


def test_a_memory_chart_gets_its_gpus_total_growth_and_time_of_oom() -> None:
    gpu = {"kind": "gpu", "labels": {"host": "h", "gpu": "0", "mig": ""}}
    assert serve.memory_of(gpu, HOST) == {
        "gpu_series": "gpu:h:0:fb_used",
        "total_bytes": 8.0e10,
        "used_bytes": 1.0e10,
        "growth_bytes_per_s": 0.0,
        "oom_at": None,  # not growing
        "ts": 50.0,
    }
    mig = {"kind": "process", "labels": {"host": "h", "gpu": "0", "mig": "1g.10gb", "pid": "7"}}
    found = serve.memory_of(mig, HOST)
    assert found is not None
    assert found["gpu_series"] == "gpu:h:0:1g.10gb:fb_used"  # the MIG instance, not the GPU
    assert (found["total_bytes"], found["oom_at"]) == (1.0e10, 60.0 + 2.5 * 3600)
    assert found["growth_bytes_per_s"] == pytest.approx(0.36e9 / 3600)
    # no status of that GPU (yet): the series id only
    other = {"kind": "gpu", "labels": {"host": "h", "gpu": "3", "mig": ""}}
    assert serve.memory_of(other, HOST) == {
        "gpu_series": "gpu:h:3:fb_used", "total_bytes": None, "used_bytes": None,
        "growth_bytes_per_s": None, "oom_at": None, "ts": None,
    }  # fmt: skip
    assert serve.memory_of(other, None) == serve.memory_of(other, {"gpus": "junk"})
    assert serve.memory_of({"kind": "service", "labels": {"service": "s"}}, HOST) is None


def test_the_api_document_says_what_a_memory_chart_gets() -> None:
    doc = spec(series_points=SERIES_POINTS, index_max=1, alerts_max=1)
    schemas = doc["components"]["schemas"]
    series = schemas["Series"]["allOf"][1]["properties"]
    assert series["memory"]["$ref"] == "#/components/schemas/Memory"
    gpu = {"kind": "gpu", "labels": {"host": "h", "gpu": "0", "mig": ""}}
    assert set(schemas["Memory"]["properties"]) == set(serve.memory_of(gpu, HOST) or {})
