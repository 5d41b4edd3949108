"""Device events become alerts at once and resolve after keep_firing_for, in event time."""

from __future__ import annotations

from ragwatch.schema import Alert, EventEnvelope
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.events import MAX_EVENT_ALERTS, EventPipeline, labels_of, signals_of
from ragwatch.streams.pipelines.fleet import Pipelines
from tests.timing import chunk_seconds

T0 = 1_767_225_600.0


def oom(ts: float, pid: int = 4011) -> EventEnvelope:
    return EventEnvelope(
        host="gpu-node-01",
        ts=ts,
        type="oom_kill",
        attrs={
            "gpu": 1,
            "pid": pid,
            "process": "rag-worker",
            "container": "abc123",
            "gpu_mem": 80_000_000_000,
        },
    )


def xid(ts: float, code: int) -> EventEnvelope:
    return EventEnvelope(
        host="gpu-node-02", ts=ts, type="xid", attrs={"gpu": 0, "uuid": "GPU-1", "xid": code}
    )


def test_oom_kill_fires_at_once_naming_the_process_and_resolves_after_15_minutes() -> None:
    pipe = EventPipeline(load_rules())
    (t,) = pipe.process(oom(T0))
    a = t.alert
    assert (a.rule, a.status, a.starts_at, t.notify) == ("GpuOomKill", "firing", T0, True)
    assert {k: a.labels[k] for k in ("host", "gpu", "pid", "process", "container")} == {
        "host": "gpu-node-01",
        "gpu": "1",
        "pid": "4011",
        "process": "rag-worker",
        "container": "abc123",
    }
    assert "CUDA OOM killer took rag-worker (pid 4011" in a.annotations["summary"]
    assert pipe.advance("gpu-node-01", T0 + 14 * 60) == []
    assert pipe.advance("gpu-node-02", T0 + 20 * 60) == []  # other hosts do not age it
    (r,) = pipe.advance("gpu-node-01", T0 + 15 * 60)
    assert (r.alert.status, r.alert.ends_at, r.notify) == ("resolved", T0 + 15 * 60, True)
    assert pipe.advance("gpu-node-01", T0 + 30 * 60) == [] and pipe.stats.active == 0


def test_a_second_oom_of_a_new_pid_is_its_own_alert() -> None:
    pipe = EventPipeline(load_rules())
    first = pipe.process(oom(T0))
    second = pipe.process(oom(T0 + 60, pid=4012))
    assert first[0].alert.fingerprint != second[0].alert.fingerprint


def test_a_repeated_event_keeps_the_alert_firing_without_paging_again() -> None:
    pipe = EventPipeline(load_rules())
    assert len(pipe.process(xid(T0, 79))) == 1
    assert pipe.process(xid(T0 + 600, 79)) == []  # same GPU, same XID: still the same alert
    assert pipe.advance("gpu-node-02", T0 + 600 + 29 * 60) == []
    (r,) = pipe.advance("gpu-node-02", T0 + 600 + 30 * 60)
    assert r.alert.status == "resolved"


def test_only_critical_xids_page() -> None:
    pipe = EventPipeline(load_rules())
    assert pipe.process(xid(T0, 13)) == []  # graphics engine exception: not in the runbook
    (t,) = pipe.process(xid(T0, 48))
    assert t.alert.rule == "GpuXidCritical" and t.alert.labels["xid"] == "48"
    assert "XID 48 on gpu-node-02 GPU 0" in t.alert.annotations["summary"]


def test_signals_and_labels_of_events() -> None:
    assert signals_of(xid(T0, 79))["xid_critical"] == 1.0
    assert signals_of(oom(T0)) == {
        "oom_kill": 1.0,
        "xid": 0.0,
        "xid_critical": 0.0,
        "device_event": 0.0,
        "process_exit": 0.0,
    }
    assert "gpu_mem" not in labels_of(oom(T0))  # values are not identities


def test_shared_engine_with_other_pipelines() -> None:
    engine = AlertEngine()
    pipe = EventPipeline(load_rules(), engine)
    pipe.process(oom(T0))
    assert [a.rule for a in engine.active.values()] == ["GpuOomKill"]


def test_an_oom_flood_pages_per_culprit_up_to_a_bound_then_once_for_the_rest() -> None:
    """5,000 OOM kills of distinct pids on one host: 5,000 critical alerts, each hint listing
    every active OOM (194 KB at the end), the cost per event growing with the flood."""
    pipes = Pipelines(load_rules())
    events = [
        EventEnvelope(
            host="h1", ts=1000.0 + i, type="oom_kill", attrs={"pid": 10_000 + i, "gpu": 0}
        )
        for i in range(5000)
    ]
    fired: list[Alert] = []

    def step(e: EventEnvelope) -> None:
        fired.extend(t.alert for t in pipes.process(e) if t.notify and t.alert.status == "firing")

    chunks = chunk_seconds(step, events, 1000)
    assert len(fired) == MAX_EVENT_ALERTS + 1
    (rest,) = [a for a in fired if a.labels.get("culprits")]
    assert rest.labels["pid"] == "*" and rest.labels["host"] == "h1"
    assert pipes.events.stats.aggregated == 5000 - MAX_EVENT_ALERTS
    assert max(len(a.annotations.get("hint", "")) for a in fired) < 1500
    assert chunks[-1] < 3 * chunks[1], [round(c * 1e3) for c in chunks]
