"""Kubernetes labels (namespace, pod, container) from the agent reach series, alerts, hints,
the status snapshot and routing; a GPU allocated to another pod starts a new series and
resolves the old pod's alerts.

The agent side (the kubelet's PodResources API, /proc cgroups) is tested in
tests/unit/test_podresources.py; here the envelopes carry what it adds.
"""

from __future__ import annotations

import random

from ragwatch.schema import GpuEnvelope, GpuSample, ProcessSample, Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.notifier.routing import parse_config
from ragwatch.streams.pipelines.fleet import Live
from ragwatch.streams.pipelines.gpu import GpuPipeline
from ragwatch.streams.pipelines.hints import Correlator
from ragwatch.streams.pipelines.requests import RequestPipeline
from tests.unit.test_gpu_leak import LEAK_AT, T0, H, gpu_memory

GB = 1e9
POD = {"namespace": "rag-prod", "pod": "retriever-7d9f", "container": "worker"}


def sample(t: float, rng: random.Random, *, pod: dict[str, str], process: bool) -> GpuSample:
    v = gpu_memory(t, rng)
    procs = ()
    if process:
        ns, name = pod["namespace"], pod["pod"]
        mem = int(v - 2 * GB)
        procs = (
            ProcessSample(4011, "rag-worker", mem, container="worker", namespace=ns, pod=name),
        )
    return GpuSample(0, "GPU-8f2c", "H100", int(v), int(80 * GB), procs=procs, **pod)


def run(
    pipe: GpuPipeline, start: float, end: float, *, pod: dict[str, str], process: bool
) -> list[Transition]:
    rng, out, t = random.Random(0), [], start
    while t < end:
        env = GpuEnvelope("gpu-node-01", T0 + t, (sample(t, rng, pod=pod, process=process),))
        out += [tr for tr in pipe.process(env) if tr.notify]
        t += 30.0
    return out


def test_a_gpu_level_leak_names_the_pod_the_device_is_allocated_to() -> None:
    pipe = GpuPipeline(load_rules())
    (page,) = run(pipe, 0.0, LEAK_AT + 2 * H, pod=POD, process=False)
    labels = page.alert.labels
    assert page.alert.rule == "GpuMemoryLeakUnattributed"
    assert {k: labels[k] for k in POD} == POD
    gpu = pipe.host_snapshot("gpu-node-01")["gpus"][0]
    assert {k: gpu[k] for k in POD} == POD


def test_a_process_leak_carries_its_pod_to_the_alert_the_hint_and_the_snapshot() -> None:
    pipe = GpuPipeline(load_rules())
    (page,) = run(pipe, 0.0, LEAK_AT + 2 * H, pod=POD, process=True)
    assert page.alert.rule == "GpuMemoryLeak"
    assert {k: page.alert.labels[k] for k in POD} == POD
    rules = load_rules()
    requests = RequestPipeline(rules, engine=pipe.engine)
    hint = Correlator(rules, pipe.engine).hint(page.alert, Live(pipe, requests))
    assert "pod rag-prod/retriever-7d9f, container worker" in hint, hint
    (proc,) = pipe.host_snapshot("gpu-node-01")["gpus"][0]["procs"]
    assert (proc["namespace"], proc["pod"], proc["container"]) == (
        "rag-prod",
        "retriever-7d9f",
        "worker",
    )


def test_a_route_on_namespace_picks_the_team_receiver() -> None:
    pipe = GpuPipeline(load_rules())
    (page,) = run(pipe, 0.0, LEAK_AT + 2 * H, pod=POD, process=True)
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/hook"}
    config = parse_config(
        {
            "receivers": [{"name": n, **hook} for n in ("default", "search-team", "other")],
            "route": {
                "receiver": "default",
                "routes": [
                    {"receiver": "search-team", "matchers": {"namespace": "rag-prod"}},
                    {"receiver": "other", "matchers": {"namespace": "=~.+"}},
                ],
            },
        },
        {},
    )
    assert [r.receiver for r in config.route.match(page.alert.labels)] == ["search-team"]
    other = {**page.alert.labels, "namespace": "batch"}
    assert [r.receiver for r in config.route.match(other)] == ["other"]


def test_a_gpu_given_to_another_pod_resolves_the_old_pods_alert_and_starts_afresh() -> None:
    pipe = GpuPipeline(load_rules())
    (page,) = run(pipe, 0.0, LEAK_AT + 2 * H, pod=POD, process=False)
    assert page.alert.status == "firing"
    new_pod = {**POD, "pod": "retriever-55c1"}
    out = run(pipe, LEAK_AT + 2 * H, LEAK_AT + 2 * H + 600, pod=new_pod, process=False)
    (resolved,) = out
    assert resolved.alert.status == "resolved"
    assert resolved.alert.fingerprint == page.alert.fingerprint
    assert "retriever-7d9f" in resolved.alert.annotations["resolution"]
    (gpu,) = pipe.host_snapshot("gpu-node-01")["gpus"]
    assert gpu["pod"] == "retriever-55c1"


def test_a_gpu_whose_pod_is_unknown_for_a_tick_keeps_its_series() -> None:
    pipe = GpuPipeline(load_rules())
    assert len(run(pipe, 0.0, LEAK_AT + 2 * H, pod=POD, process=False)) == 1
    none = {"namespace": None, "pod": None, "container": None}
    later = LEAK_AT + 2 * H
    out = run(pipe, later, later + 120, pod=none, process=False)  # type: ignore[arg-type]
    assert out == []  # the kubelet did not answer: nothing resolved, nothing new
    assert pipe.host_snapshot("gpu-node-01")["gpus"][0]["pod"] == "retriever-7d9f"
