"""The GPU pipeline end to end, fed by the fleet simulator: envelopes in, alerts out.

No Kafka and no mocks: :class:`~ragwatch.agents.sim.FleetSimulator` plays the agents,
:class:`~ragwatch.streams.pipelines.gpu.GpuPipeline` runs the detectors, the default rules and the
alert engine, exactly as the Faust agent drives it.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from dataclasses import dataclass, field

import orjson
import pytest

from ragwatch.agents.sim import FleetSimulator, SimConfig
from ragwatch.catalog import SCORE_FIELDS, SCORED
from ragwatch.codec import gpu_wire
from ragwatch.schema import (
    EventEnvelope,
    GpuEnvelope,
    MetricSample,
    MetricsEnvelope,
    RequestRecord,
    RequestsEnvelope,
    Transition,
)
from ragwatch.streams.alerting.rules import Rule, load_rules, parse_rule
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.gpu import GpuPipeline
from ragwatch.streams.pipelines.metrics import MetricsPipeline
from ragwatch.streams.pipelines.requests import RequestPipeline

HOUR = 3600.0
DAY = 86400.0


@dataclass
class Run:
    sim: FleetSimulator
    pipe: GpuPipeline
    transitions: list[tuple[float, Transition]] = field(default_factory=list)
    events: list[EventEnvelope] = field(default_factory=list)
    last: list[GpuEnvelope] = field(default_factory=list)

    def elapsed(self, ts: float) -> float:
        return ts - self.sim.config.start_ts


def run(
    config: SimConfig, seconds: float, rules: list[Rule] | None = None, **pipe_kw: float
) -> Run:
    """Play ``seconds`` of event time through a fresh pipeline."""
    sim = FleetSimulator(config)
    r = Run(sim, GpuPipeline(load_rules() if rules is None else rules, **pipe_kw))
    for _, (ts, envelopes, events) in zip(
        range(int(seconds / config.interval_s)), sim.ticks(), strict=False
    ):
        r.events += events
        r.transitions += [(ts, t) for t in r.pipe.process_batch(map(gpu_wire, envelopes))]
        r.last = envelopes
    return r


def proc_key(labels: dict[str, str]) -> tuple[str, str, str, str]:
    return labels["host"], labels["gpu"], labels["pid"], labels["process"]


# ---------------------------------------------------------------- the incident


@pytest.fixture(scope="module")
def leak_run() -> Run:
    """Four GPUs on two hosts, one leaking rag-worker from t = 20 min, for 20 + 90 min."""
    return run(SimConfig(hosts=2, gpus=2, interval_s=10), 1200 + 90 * 60)


def test_leak_fires_for_exactly_the_leaking_process(leak_run: Run) -> None:
    target = leak_run.sim.leak_target
    assert target is not None
    host, gpu, pid, name = target
    firing = [(ts, t) for ts, t in leak_run.transitions if t.alert.status == "firing"]
    assert len(firing) == 1
    ts, t = firing[0]
    assert t.alert.rule == "GpuMemoryLeak" and t.notify and t.previous == "pending"
    assert proc_key(t.alert.labels) == (host, str(gpu), str(pid), name)
    leak_start = leak_run.sim.config.leak_start_s
    assert leak_start < leak_run.elapsed(ts) <= leak_start + 90 * 60
    assert ts - t.alert.starts_at >= 300  # the rule's for: 5m


def test_nothing_else_fires_or_even_pends(leak_run: Run) -> None:
    assert {t.alert.fingerprint for _, t in leak_run.transitions} == {
        t.alert.fingerprint for _, t in leak_run.transitions if t.alert.status == "firing"
    }
    assert [(t.previous, t.alert.status) for _, t in leak_run.transitions] == [
        ("inactive", "pending"),
        ("pending", "firing"),
    ]
    assert leak_run.events == []  # no OOM in the first two hours


def test_firing_alert_describes_the_leak(leak_run: Run) -> None:
    (alert,) = leak_run.pipe.engine.active.values()
    assert alert.status == "firing"
    assert 0.9 < alert.value < 1.5  # recent_gb_per_hour
    assert alert.expected == 0.0
    assert alert.labels["team"] == "ml-platform" and alert.labels["severity"] == "critical"
    summary = alert.annotations["summary"]
    assert summary.startswith("GPU memory leak: rag-worker (pid ")
    gb_per_hour = float(summary.rsplit("grows ", 1)[1].split()[0])
    assert gb_per_hour == pytest.approx(1.2, rel=0.15)
    assert "<" not in "".join(alert.annotations.values())  # every field was known


def test_gpu_series_rule_fires_for_the_leaking_gpu() -> None:
    gpu_rule = parse_rule(
        {
            "name": "FramebufferGrowth",
            "series": "gpu",
            "expr": "mem_increase_bytes > 1GB and fb_used_ratio > 0.5",
            "for": "10m",
            "annotations": {"s": "{gpu_name} {host}/{gpu}"},
        }
    )
    r = run(SimConfig(hosts=2, gpus=2, interval_s=30), 1200 + 90 * 60, rules=[gpu_rule])
    target = r.sim.leak_target
    assert target is not None
    firing = [t.alert for _, t in r.transitions if t.alert.status == "firing"]
    assert [(a.labels["host"], a.labels["gpu"]) for a in firing] == [(target[0], str(target[1]))]
    assert "pid" not in firing[0].labels
    assert firing[0].annotations == {"s": f"NVIDIA H100 80GB HBM3 {target[0]}/{target[1]}"}


def test_healthy_fleet_is_quiet_for_three_days() -> None:
    r = run(SimConfig(hosts=2, gpus=2, scenario="healthy", interval_s=60), 3 * DAY)
    assert r.transitions == []
    assert r.events == []
    assert r.pipe.stats.envelopes == 2 * 3 * 24 * 60
    assert r.pipe.stats.dropped_samples == r.pipe.stats.evicted_series == 0
    assert len(r.pipe) == 2 * 2 * 3  # per GPU: itself, vllm-serve, rag-worker


# ---------------------------------------------------------------- OOM and restart


@pytest.fixture(scope="module")
def oom_run() -> Run:
    """One GPU leaking from t = 20 min until the OOM killer takes it (~12.2 h), then on."""
    return run(SimConfig(hosts=1, gpus=1, interval_s=60), 13 * HOUR)


def test_oom_kill_restarts_the_worker_with_a_new_pid(oom_run: Run) -> None:
    (oom,) = oom_run.events
    assert oom.type == "oom_kill"
    old_pid = oom.attrs["pid"]
    target = oom_run.sim.leak_target
    assert target is not None
    assert target[2] == old_pid + 1
    assert oom.attrs["process"] == target[3] == "rag-worker"
    assert 11 * HOUR < oom_run.elapsed(oom.ts) < 13 * HOUR


def test_memory_above_95_percent_pages_before_the_oom_kill(oom_run: Run) -> None:
    (oom,) = oom_run.events
    high = [(ts, t) for ts, t in oom_run.transitions if t.alert.rule == "GpuMemoryHigh"]
    assert [(t.previous, t.alert.status) for _, t in high] == [
        ("inactive", "pending"),
        ("pending", "firing"),
        ("firing", "resolved"),
    ]
    (fired_ts, t_fired), (resolved_ts, _) = high[1], high[2]
    fired = t_fired.alert
    assert fired.labels["gpu"] == str(oom.attrs["gpu"]) and "pid" not in fired.labels
    assert fired.value > 0.95 and "% of framebuffer memory" in fired.annotations["summary"]
    assert oom.ts - fired_ts > 1.5 * HOUR  # hours of warning before the OOM killer acts
    assert oom.ts <= resolved_ts <= oom.ts + 2 * oom_run.sim.config.interval_s


def test_old_pid_alert_resolves_after_stale_s(oom_run: Run) -> None:
    (oom,) = oom_run.events
    old_pid, step = str(oom.attrs["pid"]), oom_run.sim.config.interval_s
    stale_s = oom_run.pipe.stale_s
    old = [(ts, t) for ts, t in oom_run.transitions if t.alert.labels.get("pid") == old_pid]
    assert [(t.previous, t.alert.status) for _, t in old] == [
        ("inactive", "pending"),
        ("pending", "firing"),
        ("firing", "resolved"),
    ]
    ts, resolved = old[-1]
    assert resolved.notify
    last_seen = oom.ts - step  # the old pid's last sample was the tick before the kill
    assert last_seen + stale_s < ts <= last_seen + stale_s + step
    assert resolved.alert.ends_at == ts
    assert resolved.alert.starts_at == old[0][1].alert.starts_at


def test_new_pid_gets_its_own_series(oom_run: Run) -> None:
    (oom,) = oom_run.events
    host, gpu, new_pid, _ = oom_run.sim.leak_target or ("", 0, 0, "")
    keys = set(oom_run.pipe.index)
    assert (host, gpu, "", new_pid) in keys
    assert (host, gpu, "", oom.attrs["pid"]) not in keys
    assert oom_run.pipe.stats.evicted_series == 1
    est = oom_run.pipe.estimate((host, gpu, "", new_pid))
    assert est is not None
    assert est.span_s <= oom_run.elapsed(oom_run.last[0].ts) - oom_run.elapsed(oom.ts)
    procs = oom_run.pipe.host_snapshot(host)["gpus"][0]["procs"]
    assert sorted(p["pid"] for p in procs) == sorted(p.pid for p in oom_run.last[0].gpus[0].procs)


def test_series_cap_frees_up_when_a_series_is_evicted() -> None:
    r = run(SimConfig(hosts=1, gpus=1, interval_s=60), 13 * HOUR, max_series=3)
    (oom,) = r.events
    host, gpu, new_pid, _ = r.sim.leak_target or ("", 0, 0, "")
    assert r.pipe.stats.dropped_samples > 0  # the new pid waited for the old one to go
    assert len(r.pipe) == 3
    assert (host, gpu, "", new_pid) in r.pipe.index
    assert (host, gpu, "", oom.attrs["pid"]) not in r.pipe.index


# ---------------------------------------------------------------- limits and edges


def test_series_cap_drops_and_counts_new_series() -> None:
    sim = FleetSimulator(SimConfig(hosts=1, gpus=2, interval_s=30))  # leak on GPU 1
    pipe = GpuPipeline(load_rules(), max_series=3)
    ticks = sim.ticks()
    _, (env,), _ = next(ticks)
    assert pipe.process(env) == []
    assert len(pipe) == 3  # GPU 0, its two processes
    assert pipe.stats.dropped_samples == 3  # GPU 1, its two processes
    assert {k[1] for k in pipe.index} == {0}
    out = []
    for _, (_, (env,), _) in zip(range(int(2 * HOUR / 30)), ticks, strict=False):
        out += pipe.process(env)
    assert out == []  # the leaking process was never tracked
    assert len(pipe) == 3
    assert [g["index"] for g in pipe.host_snapshot(env.host)["gpus"]] == [0]


def test_one_series_budget_for_the_whole_worker_and_caps_per_service_and_host() -> None:
    """With max_series 100,000 one worker held 100k GPU + 100k request + 100k engine series
    (4.4 GB), a service any number of instances and a host any number of targets."""
    pipes = Pipelines(load_rules(), max_series=10)
    sim = FleetSimulator(SimConfig(hosts=1, gpus=2, interval_s=30))
    _, (env,), _ = next(sim.ticks())
    pipes.process(env)
    gpus = len(pipes.gpus)
    assert gpus == 6 and pipes.budget.room() == 4  # 2 GPUs, 4 processes
    t0 = env.ts
    for k in range(6):
        rec = RequestRecord(ts=t0, status="ok", e2e_ms=800.0, context_tokens=10, output_tokens=5)
        pipes.process(RequestsEnvelope(f"svc{k}", "i0", t0, (rec,)))
    for k in range(3):
        scrape = MetricSample("ragwatch_generation_tokens_total", {}, 1.0)
        pipes.process(MetricsEnvelope("node-9", f"http://e{k}/metrics", t0, (scrape,)))
    assert len(pipes.requests.series) == 4 and pipes.requests.stats.dropped_records == 2
    assert len(pipes.metrics.series) == 0 and pipes.metrics.stats.dropped_series == 3
    assert pipes.budget.room() == 0

    per_service = RequestPipeline([], max_instances=3)
    for k in range(5):
        rec = RequestRecord(ts=t0, status="ok", e2e_ms=800.0, context_tokens=10, output_tokens=5)
        per_service.process(RequestsEnvelope("svc", f"i{k}", t0, (rec,)))
    assert len(per_service.series) == 3 and per_service.stats.dropped_records == 2
    per_host = MetricsPipeline([], max_targets=2)
    for k in range(4):
        scrape = MetricSample("ragwatch_generation_tokens_total", {}, 1.0)
        per_host.process(MetricsEnvelope("node-1", f"http://e{k}/metrics", t0, (scrape,)))
    per_host.process(MetricsEnvelope("node-2", "http://e0/metrics", t0, (scrape,)))
    assert len(per_host.series) == 3 and per_host.stats.dropped_series == 2


def _flood(pipes: Pipelines, services: range) -> None:
    """One request envelope for each of ``services`` new services."""
    t0 = 1_700_000_000.0
    stages = {"retriever": 100.0, "llm": 600.0}
    for k in services:
        ts = t0 + k * 1e-3
        rec = RequestRecord(ts, "ok", 800.0, 3000, 250, stages=stages)
        pipes.process(RequestsEnvelope(f"svc{k}", "i0", ts, (rec,)))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_flood_of_new_services_stays_within_the_documented_memory() -> None:
    """docs/security.md: a new request series costs about 50 KB (13 KB before issue 30's
    decode, TTFT and queue baselines and weekly tables; a row of the banks, whose
    arrays grow by doubling: up to half of them still unused; it was 44 KB as objects
    holding a week of cells and a count ring of 90 buckets when only one bucket of one day
    had been seen, 11 KB once they grew as data came), and the budget holds whatever
    arrives: 100,000 services flood a worker whose budget is 1,000 and it holds 1,000."""
    pipes = Pipelines(load_rules(), max_series=100_000)
    _flood(pipes, range(50))  # the first series compile what every later one shares
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _flood(pipes, range(50, 2050))
        gc.collect()
        per_series = (tracemalloc.get_traced_memory()[0] - before) / 2000
    finally:
        tracemalloc.stop()
    assert per_series < 56 * 1024, per_series

    capped = Pipelines(load_rules(), max_series=1_000)
    gc.collect()
    rss = _rss()
    _flood(capped, range(100_000))
    gc.collect()
    assert len(capped.requests.series) == 1_000
    assert capped.requests.stats.dropped_records == 99_000
    assert _rss() - rss < 1_000 * per_series + 32 * 2**20  # the 1,000 series, not 100,000


def test_replayed_old_envelope_changes_nothing() -> None:
    """At-least-once delivery: a stale envelope must neither resolve nor re-page."""
    sim = FleetSimulator(SimConfig(hosts=1, gpus=1, interval_s=30, leak_start_s=0))
    pipe = GpuPipeline(load_rules())
    history = []
    for _, (_, (env,), _) in zip(range(int(2 * HOUR / 30)), sim.ticks(), strict=False):
        pipe.process(env)
        history.append(env)
    (before,) = pipe.engine.active.values()
    assert before.status == "firing"
    assert pipe.process(history[len(history) // 2]) == []  # an hour behind: refused whole
    assert pipe.process(history[-1]) == []  # the newest again: a producer retry
    # the GPU and its two processes, each time
    assert (pipe.stats.clock_jumps_back, pipe.stats.duplicates) == (3, 3)
    assert list(pipe.engine.active.values()) == [before]
    assert pipe.stats.samples == len(history) + 2


def test_host_snapshot_structure() -> None:
    r = run(SimConfig(hosts=2, gpus=2, scenario="healthy", interval_s=30), 1 * HOUR)
    env = r.last[0]
    snap = r.pipe.host_snapshot(env.host)
    assert snap["host"] == env.host
    assert [g["index"] for g in snap["gpus"]] == [0, 1]
    for g, sample in zip(snap["gpus"], env.gpus, strict=True):
        assert set(g) == {
            "index",
            "mig",
            "procs",
            "fb_used_bytes",
            "fb_total_bytes",
            "gb_per_hour",
            "mem_increase_gb",
            "tte_h",
            "name",
            "uuid",
            "gpu_util",
            "ts",
            "scores",  # signal: SCORE_FIELDS (streams/pipelines/scoring.py)
        }
        assert set(g["scores"]) == set(SCORED["gpu"])
        assert all(len(v) == len(SCORE_FIELDS) for v in g["scores"].values())
        assert (g["mig"], g["name"], g["uuid"]) == (None, sample.name, sample.uuid)
        assert (g["fb_used_bytes"], g["fb_total_bytes"]) == (sample.fb_used, sample.fb_total)
        assert (g["gpu_util"], g["ts"]) == (sample.gpu_util, env.ts)
        assert abs(g["gb_per_hour"]) < 0.2 and abs(g["mem_increase_gb"]) < 0.3
        assert [p["pid"] for p in g["procs"]] == sorted(p.pid for p in sample.procs)
        for p in g["procs"]:
            (want,) = [s for s in sample.procs if s.pid == p["pid"]]
            assert set(p) == {"pid", "name", "container", "gpu_mem_bytes", "gb_per_hour", "scores"}
            assert set(p["scores"]) == set(SCORED["process"])
            assert (p["name"], p["container"], p["gpu_mem_bytes"]) == (
                want.name,
                want.container,
                want.gpu_mem,
            )
    by_util = sorted(env.gpus, key=lambda g: -(g.gpu_util or 0.0))
    assert snap["top_gpus"]["util"] == [
        {"index": g.index, "mig": None, "value": g.gpu_util} for g in by_util
    ]
    by_mem = sorted(env.gpus, key=lambda g: -g.fb_used)
    assert [t["index"] for t in snap["top_gpus"]["memory"]] == [g.index for g in by_mem]
    assert len(snap["top_gpus"]["growth"]) == 2
    orjson.dumps(snap)  # `ragwatch status` serialises it
    empty = {"util": [], "memory": [], "growth": []}
    assert r.pipe.host_snapshot("no-such-host") == {
        "host": "no-such-host",
        "gpus": [],
        "top_gpus": empty,
    }


def test_top_gpus_are_capped_at_k() -> None:
    r = run(SimConfig(hosts=1, gpus=5, scenario="leak", leak_gpu=3, interval_s=60), 2 * HOUR)
    top = r.pipe.host_snapshot(r.last[0].host)["top_gpus"]
    assert [len(v) for v in top.values()] == [3, 3, 3]
    assert top["growth"][0]["index"] == 3 and top["growth"][0]["value"] > 0.8  # the leak


def test_snapshot_during_warm_up_has_unknown_trends() -> None:
    r = run(SimConfig(hosts=1, gpus=1, scenario="healthy", interval_s=10), 300)
    (g,) = r.pipe.host_snapshot(r.last[0].host)["gpus"]
    assert (g["gb_per_hour"], g["mem_increase_gb"], g["tte_h"]) == (None, None, None)
    assert all(p["gb_per_hour"] is None for p in g["procs"])


def test_bug_silent_host_series_are_evicted_and_alerts_resolve() -> None:
    sim = FleetSimulator(SimConfig(hosts=2, gpus=1, interval_s=30, leak_start_s=0))
    pipe = GpuPipeline(load_rules(), stale_s=300)
    ticks = sim.ticks()
    for _, (_, envelopes, _) in zip(range(int(2 * HOUR / 30)), ticks, strict=False):
        for env in envelopes:
            pipe.process(env)
    assert [a.status for a in pipe.engine.active.values()] == ["firing"]
    resolved = []
    for _, (_, (_, alive), _) in zip(range(int(2 * HOUR / 30)), ticks, strict=False):
        resolved += [t for t in pipe.process(alive) if t.alert.status == "resolved"]
    assert len(resolved) == 1 and resolved[0].notify
    assert all(key[0] == alive.host for key in pipe.index)


def test_a_full_gpu_that_still_grows_has_no_time_left_not_forever() -> None:
    from ragwatch.schema import GpuEnvelope, GpuSample, ProcessSample

    pipe = GpuPipeline(load_rules())
    total = 80 * 10**9
    for i in range(0, 2 * 3600, 30):
        used = min(total, 70 * 10**9 + int(i * 2e6))  # +7.2 GB/h, full after ~83 min
        gpu = GpuSample(
            index=0,
            uuid="u",
            name="n",
            fb_used=used,
            fb_total=total,
            procs=(ProcessSample(pid=7, name="p", gpu_mem=used - 10**9),),
        )
        pipe.process(GpuEnvelope(host="h", ts=1_767_225_600.0 + i, gpus=(gpu,)))
    proc = next(s for k, s in pipe.host_series("h").items() if k[3] == 7)
    assert proc.signals["tte_s"] == 0.0 and proc.signals["tte_h"] == 0.0
