"""The fleet simulator: deterministic, valid on the wire, and leaking as configured."""

from __future__ import annotations

import math
from itertools import islice
from typing import Any

import pytest

from ragwatch import codec
from ragwatch.agents.sim import FB_TOTAL, GB, FleetSimulator, SimConfig, host_name
from ragwatch.schema import EventEnvelope, GpuEnvelope

Tick = tuple[float, list[GpuEnvelope], list[EventEnvelope]]


def ticks(config: SimConfig, n: int) -> list[Tick]:
    return list(islice(FleetSimulator(config).ticks(), n))


def wire(ts: list[Tick]) -> list[bytes]:
    return [codec.encode(e) for _, envs, events in ts for e in (*envs, *events)]


def target_mem(tick: Tick, host: str, gpu: int, name: str = "rag-worker") -> int:
    (env,) = [e for e in tick[1] if e.host == host]
    (proc,) = [p for p in env.gpus[gpu].procs if p.name == name]
    return proc.gpu_mem


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_identical_envelopes() -> None:
    cfg = SimConfig(hosts=2, gpus=2, seed=42)
    a, b = ticks(cfg, 200), ticks(cfg, 200)
    assert a == b
    assert wire(a) == wire(b)


def test_different_seed_gives_different_envelopes() -> None:
    a = ticks(SimConfig(hosts=2, gpus=2, seed=1), 20)
    b = ticks(SimConfig(hosts=2, gpus=2, seed=2), 20)
    assert wire(a) != wire(b)
    assert [ts for ts, _, _ in a] == [ts for ts, _, _ in b]  # only the draws differ


def test_ticks_follow_the_interval_with_one_envelope_per_host() -> None:
    cfg = SimConfig(hosts=3, gpus=2, interval_s=15, start_ts=1_000_000.0)
    for k, (ts, envs, events) in enumerate(ticks(cfg, 50)):
        assert ts == 1_000_000.0 + 15 * k
        assert [e.host for e in envs] == ["gpu-node-01", "gpu-node-02", "gpu-node-03"]
        assert all(e.ts == ts for e in envs)
        assert events == []
        for env in envs:
            assert [g.index for g in env.gpus] == [0, 1]
            for g in env.gpus:
                assert [p.name for p in g.procs] == ["vllm-serve", "rag-worker"]
                assert g.fb_total == FB_TOTAL
                assert g.fb_used > sum(p.gpu_mem for p in g.procs)  # plus driver overhead
                assert 0 <= g.gpu_util <= 100  # type: ignore[operator]


def test_gpu_uuids_and_pids_are_unique_and_stable() -> None:
    _, envs, _ = ticks(SimConfig(hosts=3, gpus=4), 1)[0]
    uuids = [g.uuid for e in envs for g in e.gpus]
    assert len(set(uuids)) == 12
    pids = [(e.host, p.pid) for e in envs for g in e.gpus for p in g.procs]
    assert len(set(pids)) == len(pids)
    assert [g.uuid for e in ticks(SimConfig(hosts=3, gpus=4), 1)[0][1] for g in e.gpus] == uuids


def test_host_names() -> None:
    assert [host_name(i) for i in (0, 9, 99)] == ["gpu-node-01", "gpu-node-10", "gpu-node-100"]


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"hosts": 0}, "hosts and gpus must be >= 1"),
        ({"gpus": 0}, "hosts and gpus must be >= 1"),
        ({"hosts": -1}, "hosts and gpus must be >= 1"),
        ({"scenario": "meltdown"}, "unknown scenario 'meltdown'; known: healthy, leak"),
        ({"interval_s": 0}, "interval_s must be finite and > 0"),
        ({"interval_s": -10}, "interval_s must be finite and > 0"),
        ({"interval_s": math.nan}, "interval_s must be finite and > 0"),
        ({"hosts": 2, "leak_host": 2}, "leak_host / leak_gpu out of range"),
        ({"leak_host": -1}, "leak_host / leak_gpu out of range"),
        ({"gpus": 2, "leak_gpu": 2}, "leak_host / leak_gpu out of range"),
        ({"gpus": 2, "leak_gpu": -3}, "leak_host / leak_gpu out of range"),
    ],
)
def test_config_validation(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimConfig(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"start_ts": -1.0},
        {"leak_gb_per_h": -1.2},
        {"leak_gb_per_h": math.nan},
        {"leak_gb_per_h": math.inf},
        {"start_ts": math.inf},
    ],
    ids=["negative-start", "negative-leak", "nan-leak", "inf-leak", "inf-start"],
)
def test_bug_config_rejects_values_that_break_the_stream(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SimConfig(**fields)


def test_bug_leak_larger_than_free_memory_per_tick_does_not_recurse_forever() -> None:
    cfg = SimConfig(hosts=1, gpus=1, interval_s=86400, leak_start_s=0)  # 28.8 GB per tick
    _, _, events = next(FleetSimulator(cfg).ticks())
    assert [e.type for e in events] == ["oom_kill"]


# ---------------------------------------------------------------- the leak


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ("gpu-node-01", 1)),  # default: first host, last GPU
        ({"leak_gpu": 0}, ("gpu-node-01", 0)),
        ({"hosts": 3, "leak_host": 2, "leak_gpu": -2}, ("gpu-node-03", 0)),
        ({"gpus": 4, "leak_host": 1}, ("gpu-node-02", 3)),
    ],
)
def test_leak_target(fields: dict[str, Any], expected: tuple[str, int]) -> None:
    sim = FleetSimulator(SimConfig(**fields))
    target = sim.leak_target
    assert target is not None
    host, gpu, pid, name = target
    assert (host, gpu, name) == (*expected, "rag-worker")
    (_, envs, _) = next(sim.ticks())
    (env,) = [e for e in envs if e.host == host]
    assert pid in [p.pid for p in env.gpus[gpu].procs if p.name == name]


def test_healthy_fleet_has_no_leak_target() -> None:
    assert FleetSimulator(SimConfig(scenario="healthy")).leak_target is None


@pytest.mark.parametrize(("rate", "interval"), [(1.2, 10.0), (3.0, 60.0), (0.5, 7.0)])
def test_leak_grows_at_the_configured_rate(rate: float, interval: float) -> None:
    """Same seed, same draws: the leaking run minus the healthy run is the leak alone."""
    base = {
        "hosts": 2,
        "gpus": 2,
        "seed": 5,
        "interval_s": interval,
        "leak_gb_per_h": rate,
        "leak_start_s": 1200.0,
    }
    n = int(3 * 3600 / interval)
    leak, healthy = ticks(SimConfig(**base), n), ticks(SimConfig(scenario="healthy", **base), n)
    target = FleetSimulator(SimConfig(**base)).leak_target
    assert target is not None
    host, gpu = target[0], target[1]
    first = math.ceil(1200.0 / interval)  # the first tick at or after leak_start_s
    for k, (a, b) in enumerate(zip(leak, healthy, strict=True)):
        leaked = max(0, k - first + 1) * rate * GB * interval / 3600
        assert abs(target_mem(a, host, gpu) - target_mem(b, host, gpu) - leaked) <= 1
        # every other process and GPU is untouched by the leak
        for ea, eb in zip(a[1], b[1], strict=True):
            for ga, gb in zip(ea.gpus, eb.gpus, strict=True):
                if (ea.host, ga.index) != (host, gpu):
                    assert ga == gb


def test_oom_kill_restarts_the_leaking_worker() -> None:
    cfg = SimConfig(hosts=1, gpus=2, interval_s=60, leak_gb_per_h=100.0, leak_start_s=0)
    sim = FleetSimulator(cfg)
    target = sim.leak_target
    assert target is not None
    host, gpu, pid, name = target
    history = list(islice(sim.ticks(), 12))  # 1.67 GB a tick: the GPU fills at tick 8
    kills = [(k, e) for k, (_, _, events) in enumerate(history) for e in events]
    assert len(kills) == 1
    k, oom = kills[0]
    assert (oom.type, oom.host, oom.ts) == ("oom_kill", host, history[k][0])
    assert {key: oom.attrs[key] for key in ("gpu", "pid", "process")} == {
        "gpu": gpu,
        "pid": pid,
        "process": name,
    }
    assert oom.attrs["gpu_mem"] > 10 * GB
    assert sim.leak_target == (host, gpu, pid + 1, name)
    before, after = history[k - 1][1][0].gpus[gpu], history[k][1][0].gpus[gpu]
    assert [p.pid for p in before.procs if p.name == name] == [pid]
    assert [p.pid for p in after.procs if p.name == name] == [pid + 1]
    assert after.fb_used < before.fb_used - 10 * GB
    for _, envs, _ in history:
        assert all(g.fb_used <= g.fb_total for g in envs[0].gpus)


# ---------------------------------------------------------------- the wire


@pytest.mark.parametrize("scenario", ["healthy", "leak"])
def test_every_envelope_round_trips_through_the_codec(scenario: str) -> None:
    cfg = SimConfig(
        hosts=2, gpus=2, scenario=scenario, interval_s=300, leak_gb_per_h=20.0, leak_start_s=0
    )
    n_events = 0
    for _, envs, events in islice(FleetSimulator(cfg).ticks(), 24 * 12):
        for env in envs:
            assert codec.decode(codec.encode(env)) == env
            assert codec.decode_as(GpuEnvelope, codec.encode(env)) == env
        for ev in events:
            assert codec.decode_as(EventEnvelope, codec.encode(ev)) == ev
            n_events += 1
    assert (n_events > 0) == (scenario == "leak")
