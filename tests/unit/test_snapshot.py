"""Snapshots: a worker restarted from a snapshot continues exactly where the old one was,
a replay from an older Kafka offset changes nothing, and hostile snapshots are refused
(pickles of the previous format included: the allow-list). The format itself (version 7)
is tested in ``test_snapshot_format.py``."""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator

import pytest

from ragwatch.agents.scenario import build
from ragwatch.schema import Envelope, GpuEnvelope, RequestsEnvelope, Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.snapshot import (
    SnapshotError,
    dump_host,
    dump_service,
    load_host,
    load_service,
)

RULES = load_rules()
CUT = 300  # envelopes before the "crash": 75 minutes in, the leak alert is firing


def stream() -> list[Envelope]:
    world = build("all", hosts=2, gpus=1, services=1, interval_s=60.0, heal_after_s=3600.0)
    return list(world.envelopes(hours=2.5))  # the request faults heal after the cut


def keys(envs: list[Envelope]) -> tuple[set[str], set[str]]:
    hosts = {e.host for e in envs if isinstance(e, GpuEnvelope)}
    services = {e.service for e in envs if isinstance(e, RequestsEnvelope)}
    return hosts, services


def restored(old: Pipelines, envs: list[Envelope]) -> Pipelines:
    new = Pipelines(RULES)
    hosts, services = keys(envs)
    for h in hosts:
        load_host(new, h, dump_host(old, h))
    for s in services:
        load_service(new, s, dump_service(old, s))
    return new


def summary(ts: Iterator[Transition] | list[Transition]) -> list[tuple[str, str, str, float]]:
    return [(t.alert.rule, t.previous, t.alert.status, t.alert.starts_at) for t in ts]


@pytest.fixture(scope="module")
def envs() -> list[Envelope]:
    return stream()


def test_a_restored_worker_continues_exactly_like_the_one_that_never_stopped(
    envs: list[Envelope],
) -> None:
    assert len(envs) > CUT + 100
    reference = Pipelines(RULES)
    before = list(reference.run(envs[:CUT]))
    assert any(t.alert.status == "firing" for t in before)  # something is active at the cut
    snapshot_of = Pipelines(RULES)
    list(snapshot_of.run(envs[:CUT]))
    new = restored(snapshot_of, envs)
    assert new.engine.active.keys() == reference.engine.active.keys()
    expected = summary(reference.run(envs[CUT:]))
    assert expected  # alerts still change after the cut
    assert summary(new.run(envs[CUT:])) == expected


def test_replaying_from_an_older_offset_after_a_restore_pages_nothing_twice(
    envs: list[Envelope],
) -> None:
    old = Pipelines(RULES)
    list(old.run(envs[:CUT]))
    new = restored(old, envs)
    # Kafka redelivers the last 100 envelopes before the crash (offsets not yet committed)
    assert list(new.run(envs[CUT - 100 : CUT])) == []
    dup = new.gpus.stats.duplicates + new.requests.stats.duplicates
    assert dup > 0
    reference = Pipelines(RULES)
    list(reference.run(envs[:CUT]))
    assert summary(new.run(envs[CUT:])) == summary(reference.run(envs[CUT:]))


def test_a_pending_timer_survives_the_restart() -> None:
    envs = stream()
    ref = Pipelines(RULES)
    cut = None
    for i, env in enumerate(envs):
        if any(t.alert.status == "pending" for t in ref.process(env)):
            cut = i + 1
            break
    assert cut is not None
    pending = {fp: a for fp, a in ref.engine.active.items() if a.status == "pending"}
    new = restored(ref, envs)
    assert {fp: a.starts_at for fp, a in new.engine.active.items() if fp in pending} == {
        fp: a.starts_at for fp, a in pending.items()
    }
    fired = [t for t in new.run(envs[cut:]) if t.alert.fingerprint in pending]
    assert fired and fired[0].previous == "pending"  # not inactive: the timer was kept


def test_what_the_worker_knows_wins_over_a_snapshot(envs: list[Envelope]) -> None:
    old = Pipelines(RULES)
    list(old.run(envs[:100]))
    data = dump_host(old, "gpu-node-01")
    current = Pipelines(RULES)
    list(current.run(envs[:200]))
    assert load_host(current, "gpu-node-01", data) == 0


def test_a_forgotten_host_is_restored_from_its_snapshot_not_from_stale_memory(
    envs: list[Envelope],
) -> None:
    """A worker that lost a host's partition and gets it back (after another worker moved
    it on and snapshotted it) must carry on from that snapshot."""
    hosts, services = keys(envs)
    stale = Pipelines(RULES)
    list(stale.run(envs[: CUT - 100]))  # then the partition went to another worker
    other = Pipelines(RULES)
    list(other.run(envs[:CUT]))  # which saw 100 more envelopes and snapshotted
    for h in hosts:
        stale.forget("host", h)
    for s_ in services:
        stale.forget("service", s_)
    assert not len(stale.gpus) and not stale.requests.series and not stale.engine.active
    assert all(load_host(stale, h, dump_host(other, h)) > 0 for h in hosts)
    assert all(load_service(stale, s_, dump_service(other, s_)) > 0 for s_ in services)
    reference = Pipelines(RULES)
    list(reference.run(envs[:CUT]))
    assert summary(stale.run(envs[CUT:])) == summary(reference.run(envs[CUT:]))


def test_silent_hosts_are_swept_against_the_slowest_partition_only() -> None:
    """A catch-up reads one partition hours ahead of another: gpu-node-01 (behind) is not
    silent, and its firing leak must not be resolved as if its series were gone."""
    world = build("leak", hosts=2, gpus=1, services=0, interval_s=60.0)
    gpu = [e for e in world.envelopes(hours=3.0) if isinstance(e, GpuEnvelope)]
    behind = [e for e in gpu if e.host == "gpu-node-01"][:60]  # its first hour
    ahead = [e for e in gpu if e.host == "gpu-node-02"]  # three hours

    def run(sweep_mark: float) -> list[Transition]:
        p = Pipelines(RULES)
        list(p.run(behind))
        assert any(a.status == "firing" for a in p.engine.active.values())
        p.gpus.sweep_mark = sweep_mark
        return [t for e in ahead for t in p.process(e) if t.alert.labels["host"] == "gpu-node-01"]

    # without a mark, the other host's hours of event time make gpu-node-01 look silent
    assert any(t.alert.status == "resolved" for t in run(math.inf))
    # the worker's mark is the slowest partition's newest event time: nothing is swept
    assert run(behind[-1].ts) == []


@pytest.mark.parametrize(
    "data",
    [
        b"not a pickle",
        pickle.dumps({"v": 999, "kind": "host", "key": "gpu-node-01"}),
        pickle.dumps({"v": 1, "kind": "service", "key": "gpu-node-01"}),
        pickle.dumps({"v": 1, "kind": "host", "key": "other"}),
        pickle.dumps({"v": 1, "kind": "host", "key": "gpu-node-01"}),  # fields missing
    ],
)
def test_a_broken_snapshot_is_refused_with_a_reason(data: bytes) -> None:
    with pytest.raises(SnapshotError):
        load_host(Pipelines(RULES), "gpu-node-01", data)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("echo pwned",))


def test_a_snapshot_cannot_call_anything() -> None:
    """A pickle is never read: one that would run a command is refused unread."""
    data = pickle.dumps({"v": 6, "kind": "host", "key": "h", "series": _Evil()})
    with pytest.raises(SnapshotError, match="is a pickle"):
        load_host(Pipelines(RULES), "h", data)
