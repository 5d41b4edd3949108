"""Replica outliers paged: an instance that drifts away from its peers, slowly enough that
its own baselines follow, pages (``Replica*Outlier``, streams/pipelines/replica_signals.py
and the default rules); its peers do not, and a group of two never does."""

from __future__ import annotations

import itertools

import pytest

from ragwatch.agents.sim_requests import Fault, RequestSimConfig, RequestSimulator
from ragwatch.schema import Transition
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines

HOURS = 9.0
DRIFT_AT_S = 2 * 3600.0


def play(instances: int, hours: float = HOURS) -> list[Transition]:
    """``instances`` instances of one service, the second drifting to 3x its retrieval
    latency over 4 hours from ``DRIFT_AT_S``."""
    sim = RequestSimulator(
        RequestSimConfig(
            services=1, instances=instances, batch_s=60.0, base_qps=20.0,
            faults=(Fault("drift", DRIFT_AT_S, instance=1),),
        )
    )  # fmt: skip
    start = sim.config.start_ts
    ticks = itertools.takewhile(lambda t: t[0] <= start + hours * 3600, sim.ticks())
    envelopes = [env for _, envs in ticks for env in envs]
    return list(Pipelines(load_rules()).run(envelopes))


def replica_pages(transitions: list[Transition]) -> list[Transition]:
    return [t for t in transitions if t.fires and t.alert.rule.startswith("Replica")]


@pytest.fixture(scope="module")
def four() -> list[Transition]:
    return play(4)


def test_a_replica_drifting_from_its_peers_pages_within_hours_and_its_peers_do_not(
    four: list[Transition],
) -> None:
    pages = replica_pages(four)
    assert pages, [t.alert.rule for t in four if t.fires]
    assert {t.alert.labels["instance"] for t in pages} == {"rag-api-1"}
    first = min(pages, key=lambda t: t.alert.starts_at)
    assert first.alert.rule == "ReplicaRetrievalOutlier", [t.alert.rule for t in pages]
    start = RequestSimConfig().start_ts
    hours = (first.alert.starts_at - start - DRIFT_AT_S) / 3600
    assert hours < 6.0, hours  # (the drift is 3x at 4 h; 2 h of deviance before a page)
    summary = first.alert.annotations["summary"]
    assert "the median of the other instances of rag-api" in summary, summary
    assert first.alert.labels["outlier"] == "replica"
    assert first.alert.expected is not None and first.alert.value > 1.5 * first.alert.expected


def test_a_group_of_two_never_pages() -> None:
    assert replica_pages(play(2)) == []
