"""What the default rules' alerts say, firing and resolved (issue 29, point 10).

A resolved alert says what happened, in the past tense: "rag-api (rag-api-1): the cluster
of 23 unusual requests ended after 1.2 h", not the firing summary ("a new cluster of 23
unusual requests") again. Every default rule has a ``resolved_summary``; the engine makes
it the summary of a recovered alert and adds how long the alert lasted. Driven through
:class:`~ragwatch.streams.alerting.engine.AlertEngine`'s public ``evaluate`` and ``clear``.
"""

from __future__ import annotations

import math
import re
import string

import pytest

from ragwatch.agents.scenario import build
from ragwatch.catalog import EVIDENCE_SIGNAL, SERIES_LABELS, SERIES_SIGNALS
from ragwatch.schema import Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Condition, Rule, load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from tests.unit.test_hints import internal_phrases

RULES = {r.name: r for r in load_rules()}
PAST = re.compile(r"\b(\w+ed|came|fell|went|took)\b")  # a verb in the past tense
AFTER = re.compile(r" after (\d+ min|\d+\.\d h|\d+\.\d days)$")


def _satisfy(c: Condition) -> float:
    """A value of ``c``'s signal for which ``c`` holds."""
    step = abs(c.threshold) * 0.2 + 1.0
    return {
        ">": c.threshold + step,
        ">=": c.threshold,
        "<": c.threshold - step,
        "<=": c.threshold,
        "==": c.threshold,
        "!=": c.threshold + step,
    }[c.op]


def _signals(rule: Rule, conditions: tuple[Condition, ...], evidence: float) -> dict[str, float]:
    """Every signal of the rule's series known (so templates have numbers), baselines not
    re-learned, ``conditions`` holding and the evidence counter at ``evidence``."""
    sig = {
        s: 1.0
        for s in SERIES_SIGNALS[rule.series]
        if not s.endswith(("_relearned_at", "_relearned_from"))
    }
    sig |= {c.signal: _satisfy(c) for c in conditions}
    if rule.series in EVIDENCE_SIGNAL:
        sig[EVIDENCE_SIGNAL[rule.series]] = evidence
    return sig


def _cleared(rule: Rule) -> tuple[Condition, ...]:
    """Conditions under which a firing alert of ``rule`` may resolve."""
    if rule.resolve:
        return rule.resolve[0]  # its first alternative
    first = rule.conditions[0]  # without `resolve`: expr stops holding
    negated = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}[first.op]
    return (Condition(first.signal, negated, first.threshold),)


def _fire_and_recover(rule: Rule, lasting_s: float) -> tuple[Transition, Transition]:
    """(the firing transition, the resolved one) of ``rule`` on one series whose condition
    holds from 0 and clears at ``lasting_s``."""
    eng = AlertEngine()
    labels = {k: f"{k}-1" for k in SERIES_LABELS[rule.series]}
    firing = None
    for ts in (0.0, rule.for_s):
        t = eng.evaluate(rule, labels, _signals(rule, rule.conditions, 0.0), ts)
        firing = t if t is not None and t.alert.status == "firing" else firing
    assert firing is not None, rule.name
    resolved = None
    need = float(rule.keep_firing_requests)
    clear_from = lasting_s - rule.keep_firing_for_s
    for ts, evidence in ((clear_from, 1000.0), (lasting_s, 1000.0 + need)):
        resolved = resolved or eng.evaluate(
            rule, labels, _signals(rule, _cleared(rule), evidence), ts
        )
    assert resolved is not None and resolved.alert.status == "resolved", rule.name
    return firing, resolved


def test_every_default_rule_has_a_resolution_text() -> None:
    missing = [name for name, r in RULES.items() if "resolved_summary" not in r.annotations]
    assert not missing


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_default_annotation_reads_as_text_for_a_person(name: str) -> None:
    for key, template in RULES[name].annotations.items():
        text = "".join(lit for lit, *_ in string.Formatter().parse(template))
        assert not internal_phrases(text), (name, key, template)


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_recovered_alert_says_what_happened_in_the_past_tense(name: str) -> None:
    rule = RULES[name]
    lasting_s = 4320.0 if rule.for_s < 3600 else rule.for_s + 4320.0  # fired, then 1.2 h
    firing, resolved = _fire_and_recover(rule, lasting_s=lasting_s)
    fired, done = firing.alert.annotations, resolved.alert.annotations
    assert "resolved_summary" not in fired and "resolved_summary" not in done
    assert resolved.alert.resolution == "recovered"
    summary = done["summary"]
    assert summary != fired["summary"]
    assert AFTER.search(summary) and summary.endswith(f" after {lasting_s / 3600:.1f} h"), summary
    assert PAST.search(summary), summary
    assert "n/a" not in summary and not internal_phrases(summary), summary
    assert "description" not in done  # the firing alert's present tense ("runs out in")


def test_the_resolved_outlier_cluster_names_the_cluster_that_ended() -> None:
    """The issue's example: the resolved alert said "a new cluster of 23 unusual
    requests" again."""
    rule = RULES["RequestOutlierCluster"]
    eng = AlertEngine()
    labels = {"service": "rag-api", "instance": "rag-api-1"}
    cluster = {"new_outlier_cluster": 1.0, "outlier_cluster_size": 23.0}
    fired = eng.evaluate(rule, labels, {**cluster, "outlier_cluster_active": 1.0}, 0.0)
    assert fired is not None and fired.alert.status == "firing"
    assert "a new cluster of 23 unusual requests" in fired.alert.annotations["summary"]
    over = {**cluster, "new_outlier_cluster": 0.0, "outlier_cluster_active": 0.0}
    eng.evaluate(rule, labels, over, 3420.0)
    resolved = eng.evaluate(rule, labels, over, 4320.0)
    assert resolved is not None and resolved.alert.annotations == {
        "summary": "rag-api (rag-api-1): the cluster of 23 unusual requests ended after 1.2 h"
    }


def test_a_resolved_retrieval_slowdown_says_where_the_p99_came_back_to() -> None:
    rule = RULES["RetrievalSlowdown"]
    eng = AlertEngine()
    labels = {"service": "rag-api", "instance": "rag-api-1"}

    def p99(ms: float, requests: float) -> dict[str, float]:
        base = 111.0
        above = 0.9 if ms > base else 0.005  # the share of the window above the baseline P99
        return {
            "retriever_p99_ms": ms,
            "retriever_p99_baseline_ms": base,
            "retriever_p99_ratio": ms / base,
            "retriever_tail_ratio": above / 0.01,
            "retriever_tail_z": (above - 0.01) * 100 / math.sqrt(0.99 + 0.0625),
            "retriever_tail_cusum": 12.0 if ms > base else 0.0,  # the sum's cap, or none
            "retriever_p99_recurring": 0.0,  # at no hour it came before
            "requests_total": requests,
        }

    for ts in (0.0, 120.0):
        eng.evaluate(rule, labels, p99(480.0, ts), ts)
    eng.evaluate(rule, labels, p99(108.0, 5000.0), 7260.0)
    resolved = eng.evaluate(rule, labels, p99(108.0, 6000.0), 7560.0)
    assert resolved is not None and resolved.alert.annotations["summary"] == (
        "rag-api (rag-api-1): retrieval P99 came back to 108 ms (baseline 111 ms) after 2.1 h"
    )


def test_an_alert_whose_series_ended_says_so_in_the_past_tense() -> None:
    rule = RULES["GpuMemoryLeak"]
    eng = AlertEngine()
    labels = {"host": "gpu-node-01", "gpu": "1", "pid": "4011", "process": "rag-worker"}
    leak = {"leak_gb_per_hour": 1.19, "recent_gb_per_hour": 1.19, "tte_h": 3.2}
    for ts in (0.0, 300.0):
        eng.evaluate(rule, labels, leak, ts)
    (gone,) = eng.clear({"host": "gpu-node-01", "pid": "4011"}, 42840.0)
    ann = gone.alert.annotations
    assert gone.alert.resolution == "gone"
    assert ann["resolution"] == "its series went silent (no data since then)"
    assert ann["summary"] == (
        "ended after 11.9 h: its series went silent (no data since then); while firing: "
        "GPU memory leak: rag-worker (pid 4011) on gpu-node-01 GPU 1 grows 1.19 GB/h, OOM in ~3 h"
    )
    assert "description" not in ann  # "runs out of memory in ~3.2 h": not any more


def test_the_outliers_scenario_resolves_in_the_past_tense() -> None:
    """End to end through the pipelines: the cluster of the outliers scenario heals after
    40 minutes; its resolution names the cluster that fired, in the past tense."""
    world = build("outliers", hosts=1, gpus=1, services=1, interval_s=60, heal_after_s=2400)
    pipes = Pipelines(load_rules())
    summaries = [
        (t.alert.status, t.alert.annotations["summary"])
        for env in world.envelopes(hours=2.0)
        for t in pipes.process(env)
        if t.alert.rule == "RequestOutlierCluster" and t.notify
    ]
    (fired, fired_text), (resolved, resolved_text) = summaries
    assert (fired, resolved) == ("firing", "resolved")
    size = re.search(r"a new cluster of (\d+) unusual requests", fired_text)
    assert size, fired_text
    assert re.fullmatch(
        rf"rag-api \(rag-api-\d\): the cluster of {size[1]} unusual requests ended after "
        r"\d+ min",
        resolved_text,
    ), resolved_text
