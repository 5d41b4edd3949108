"""Like GPUs compared with one another (streams/pipelines/gpu_peers.py, the ReplicaGpu*
rules): a GPU that stops working or runs hot among the GPUs of the same pod template
pages after two hours, its peers do not, a group of two never pages, GPUs without a pod
are never compared, and with the hosts split over two workers (their facts passed through
a facts table as the topic carries them) the pages are those of one worker."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

import pytest

from ragwatch.facts_wire import encode_facts, facts_key
from ragwatch.schema import GpuEnvelope, GpuSample, Transition, WorkerProgress
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.gpu_peers import template_of
from ragwatch.streams.worker.facts_table import FactsTable

GB = 1 << 30
MODEL = "NVIDIA H100 80GB HBM3"
STEP_S = 60.0
T0 = 1_700_000_000.0 - (1_700_000_000.0 % 86_400)
Fault = Callable[[float, float, float], tuple[float, float, float]]  # (h, util, temp) ->


def healthy(_h: float, util: float, temp: float) -> tuple[float, float, float]:
    return util, 150.0 + 4.0 * util, temp


def hung(at_h: float) -> Fault:
    """Utilisation and power collapse at ``at_h``, memory stays: hung without an XID."""

    def fault(h: float, util: float, temp: float) -> tuple[float, float, float]:
        return (0.0, 70.0, temp - 10.0) if h >= at_h else healthy(h, util, temp)

    return fault


def hot(at_h: float) -> Fault:
    """A fan fails at ``at_h``: 22 C hotter than the load explains."""

    def fault(h: float, util: float, temp: float) -> tuple[float, float, float]:
        u, p, t = healthy(h, util, temp)
        return u, p, t + (22.0 if h >= at_h else 0.0)

    return fault


def capped(at_h: float) -> Fault:
    """A power cap from ``at_h``: half the power for the same work, so it is busier."""

    def fault(h: float, util: float, temp: float) -> tuple[float, float, float]:
        if h < at_h:
            return healthy(h, util, temp)
        busier = min(100.0, 1.3 * util)
        return busier, 0.55 * (150.0 + 4.0 * util), temp

    return fault


def fleet(
    hosts: int, gpus: int, hours: float, faults: dict[tuple[int, int], Fault], *, pods: bool = True
) -> Iterator[GpuEnvelope]:
    """``hosts`` x ``gpus`` GPUs, each held by a pod of one Deployment: a shared daily
    load with a share per GPU (the balancer is not exact), a temperature offset per host
    (its rack position), a caching allocator's steps of memory, noise."""
    rng = random.Random(7)
    share = {(h, g): rng.uniform(0.8, 1.2) for h in range(hosts) for g in range(gpus)}
    rack = {h: rng.uniform(-5.0, 5.0) for h in range(hosts)}
    used = {(h, g): 30.0 * GB for h in range(hosts) for g in range(gpus)}
    for i in range(int(hours * 3600 / STEP_S)):
        ts = T0 + i * STEP_S
        h_of_day = (ts % 86_400) / 3600
        load = 55.0 + 25.0 * math.sin(2 * math.pi * (h_of_day - 9) / 24)
        for h in range(hosts):
            samples = []
            for g in range(gpus):
                util = min(100.0, max(0.0, load * share[h, g] + rng.gauss(0, 4)))
                temp = 38.0 + 0.35 * util + rack[h] + rng.gauss(0, 1)
                fault = faults.get((h, g), healthy)
                util, power, temp = fault(i * STEP_S / 3600, util, temp)
                if rng.random() < 0.01:  # the allocator caches a block more, or frees some
                    used[h, g] = min(
                        60.0 * GB, max(20.0 * GB, used[h, g] + rng.choice([2, -2]) * GB)
                    )
                pod = (
                    f"vllm-7d9f8c6b5-{'bcdfg'[h % 5]}{'hjklm'[g % 5]}x{'2456789bcdfg'[h]}z"
                    if pods
                    else None
                )
                samples.append(
                    GpuSample(
                        g,
                        f"GPU-{h}-{g}",
                        MODEL,
                        int(used[h, g]),
                        80 * GB,
                        gpu_util=util,
                        temp_c=temp,
                        power_w=power + rng.gauss(0, 5),
                        namespace="prod" if pods else None,
                        pod=pod,
                        container="server" if pods else None,
                    )
                )
            yield GpuEnvelope(f"node-{h:02d}", ts, tuple(samples))


def replica_pages(transitions: list[Transition]) -> list[tuple[str, str, str, float]]:
    """(rule, host, gpu, hours after T0) of each ReplicaGpu* alert that fired."""
    return [
        (
            t.alert.rule,
            t.alert.labels["host"],
            t.alert.labels["gpu"],
            (t.alert.starts_at - T0) / 3600,
        )
        for t in transitions
        if t.fires and t.alert.rule.startswith("ReplicaGpu")
    ]


def run_one(envs: Iterator[GpuEnvelope]) -> list[Transition]:
    pipes = Pipelines(load_rules())
    return [t for env in envs for t in pipes.gpu(env)]


def test_pod_templates_strip_what_kubernetes_generates() -> None:
    assert template_of("vllm-7d9f8c6b5-x2k4p") == "vllm"
    assert template_of("vllm-0") == "vllm"  # a StatefulSet's
    assert template_of("node-agent-x2k4p") == "node-agent"  # a DaemonSet's
    assert template_of("vllm") == "vllm"


def test_a_hung_a_capped_and_a_hot_gpu_page_after_two_hours_their_peers_do_not() -> None:
    faults = {(1, 0): hung(3.0), (4, 1): hot(3.0), (2, 1): capped(3.0)}
    pages = replica_pages(run_one(fleet(6, 2, 8.0, faults)))
    rules = {(rule, host, gpu) for rule, host, gpu, _ in pages}
    assert rules == {
        ("ReplicaGpuUtilOutlier", "node-01", "0"),  # hung: idle, so its power is not judged
        ("ReplicaGpuPowerOutlier", "node-02", "1"),
        ("ReplicaGpuTempOutlier", "node-04", "1"),
    }, pages
    assert len(pages) == 3  # each once
    started = {rule: h for rule, _, _, h in pages}  # pending from then, paged 2 h later
    assert 3.0 <= started["ReplicaGpuUtilOutlier"] <= 3.3
    assert 3.0 <= started["ReplicaGpuPowerOutlier"] <= 3.3
    assert 3.0 <= started["ReplicaGpuTempOutlier"] <= 3.5


def test_the_alert_names_the_gpu_its_value_and_its_peers_median() -> None:
    transitions = run_one(fleet(4, 2, 6.0, {(2, 1): hung(1.0)}))
    fired = [t.alert for t in transitions if t.fires and t.alert.rule == "ReplicaGpuUtilOutlier"]
    assert len(fired) == 1
    alert = fired[0]
    assert alert.labels["outlier"] == "replica" and alert.labels["pod"].startswith("vllm-")
    summary = alert.annotations["summary"]
    assert summary.startswith("node-02 GPU 1 (pod prod/vllm-"), summary
    assert "utilisation 0 %, against" in summary and MODEL in summary
    assert alert.value is not None and alert.value < 1.0  # smoothed towards 0 %
    assert alert.expected is not None and alert.expected > 20.0  # its peers, at night


def test_a_healthy_fleet_of_unequal_replicas_never_pages() -> None:
    assert replica_pages(run_one(fleet(8, 2, 26.0, {}))) == []


def test_a_group_of_two_never_pages() -> None:
    assert replica_pages(run_one(fleet(1, 2, 8.0, {(0, 0): hung(2.0)}))) == []


def test_gpus_without_a_pod_are_not_compared() -> None:
    transitions = run_one(fleet(6, 2, 8.0, {(1, 0): hung(2.0)}, pods=False))
    assert replica_pages(transitions) == []


TWO_WORKERS_FAULTS = {(1, 0): hung(3.0), (4, 1): hot(3.0)}


@pytest.fixture(scope="module")
def one_worker_pages() -> set[tuple[str, str, str, float]]:
    """The pages of the fleet of the two-worker test on one worker (computed once for
    both lags)."""
    pages = replica_pages(run_one(fleet(6, 2, 8.0, TWO_WORKERS_FAULTS)))
    return {(r, h, g, round(t, 3)) for r, h, g, t in pages}


@pytest.mark.parametrize("lag_minutes", [0, 7])
def test_hosts_on_two_workers_page_as_one_worker(
    lag_minutes: int, one_worker_pages: set[tuple[str, str, str, float]]
) -> None:
    """Hosts 0-2 on worker a, 3-5 on worker b: each publishes its hosts' facts every
    minute (and its progress), both read them from one table per worker as the facts
    topic delivers them; b runs ``lag_minutes`` behind a, so a waits for its facts."""
    faults, one = TWO_WORKERS_FAULTS, one_worker_pages
    clock = [0.0]
    tables = {w: FactsTable(w, clock=lambda: clock[0]) for w in ("a", "b")}
    pipes = {w: Pipelines(load_rules(), remote=tables[w]) for w in ("a", "b")}
    owner = {f"node-{h:02d}": ("a" if h < 3 else "b") for h in range(6)}
    queued: dict[str, list[GpuEnvelope]] = {"a": [], "b": []}
    out: list[Transition] = []

    def publish(w: str, ts: float) -> None:
        p = pipes[w]
        records = [*p.gpus.facts_of(sorted(h for h, o in owner.items() if o == w))]
        records.append(WorkerProgress(w, host_ts=ts))
        for table in tables.values():
            table.apply([(facts_key(r), encode_facts(r, by=w)) for r in records])

    by_minute: dict[float, list[GpuEnvelope]] = {}
    for env in fleet(6, 2, 8.0, faults):
        by_minute.setdefault(env.ts, []).append(env)
    minutes = sorted(by_minute)
    for i, ts in enumerate(minutes):
        for env in by_minute[ts]:
            queued[owner[env.host]].append(env)
        for w in ("a", "b"):
            if w == "b" and i < lag_minutes:
                continue
            for env in queued[w]:
                out += pipes[w].gpu(env)
            if queued[w]:
                publish(w, queued[w][-1].ts)
            queued[w] = []
    for env in queued["b"]:
        out += pipes["b"].gpu(env)
    two = {(r, h, g, round(t, 3)) for r, h, g, t in replica_pages(out)}
    assert two == one and len(replica_pages(out)) == len(one)  # at the same minutes
    # each GPU's pages come from the worker that owns its host
    assert {h for _, h, _, _ in two} == {"node-01", "node-04"}


def test_published_host_facts_are_those_a_hint_reads() -> None:
    """facts_of (what a worker publishes, its processes screened by arrays) gives each
    host the facts that facts() (a hint's read, series by series) gives."""
    from ragwatch.agents.scenario import build

    leaking, pods = Pipelines(load_rules()), Pipelines(load_rules())
    world = build("leak", hosts=3, gpus=2, services=1, interval_s=60.0)
    for env in world.envelopes(hours=2):
        if isinstance(env, GpuEnvelope):
            leaking.gpu(env)
    for env in fleet(4, 2, 1.0, {}):
        pods.gpu(env)
    hosts = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "node-00", "node-03", "nowhere"]
    for pipes in (leaking, pods):
        assert pipes.gpus.facts_of(hosts) == [pipes.gpus.facts(h) for h in hosts]
    assert leaking.gpus.facts("gpu-node-01").leaks  # a leak named
    assert len(pods.gpus.facts("node-03").gpus) == 2  # grouped GPUs carried
