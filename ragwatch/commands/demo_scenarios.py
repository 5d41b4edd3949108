"""What each ``ragwatch demo`` scenario does: the fault it injects and when, the alerts it
must raise (:class:`Expectation`), and the other alerts its faults explain
(:class:`Consequence`), so that the demo can say why they fire and still fail on an
alert that nothing in the scenario explains.

The texts are built from the simulators' own parameters (``ragwatch.agents.sim`` and
``sim_requests``), so they stay true when those change.

>>> s = story("healthy")
>>> s.expected, s.consequences
([], [])
>>> print(s.fault)  # doctest: +NORMALIZE_WHITESPACE
no fault is injected (only daily seasonality, a deploy and a model reload); the demo
passes if nothing pages for 3 simulated days
>>> a = story("all")
>>> [e.rule for e in a.expected]  # doctest: +NORMALIZE_WHITESPACE
['GpuOomKill', 'GpuMemoryLeak', 'DecodeSpeedDrop', 'TokensPerRequestDrop',
 'RetrievalSlowdown', 'RequestOutlierCluster']
>>> high = {"status": "firing", "labels": {"alertname": "GpuMemoryHigh",
...         "host": "gpu-node-01", "gpu": "1"}}
>>> print(a.explain(high))  # doctest: +NORMALIZE_WHITESPACE
the leak fills GPU 1 of gpu-node-01: over 95 % of its memory, the last warning before
the CUDA OOM killer
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HOSTS, GPUS, SERVICES = 4, 2, 2
# the throughput fault is two symptoms at once: answers decode slower (DecodeSpeedDrop, the
# seed's "token/s per request") and come shorter (TokensPerRequestDrop); its requests fall
# by about a third, far from the demand collapse ThroughputDrop pages on (docs/rules.md)
REQUEST_RULES = {
    "throughput": ("DecodeSpeedDrop", "TokensPerRequestDrop"),
    "retrieval": ("RetrievalSlowdown",),
    "outliers": ("RequestOutlierCluster",),
    "all": (
        "DecodeSpeedDrop",
        "TokensPerRequestDrop",
        "RetrievalSlowdown",
        "RequestOutlierCluster",
    ),
}
OOM_SCENARIOS = ("oom", "all")
HEALING, HEAL_AFTER = ("all",), "5h"  # the request faults of `all` end 5 h in
HEALTHY_DAYS = 3


def _matches(alert: Mapping[str, Any], rule: str, labels: tuple[tuple[str, str], ...]) -> bool:
    lab = alert.get("labels", {})
    return (
        alert.get("status") == "firing"
        and lab.get("alertname") == rule
        and all(lab.get(k) == v for k, v in labels)
    )


@dataclass(frozen=True)
class Expectation:
    """An alert the scenario must produce: its rule, the labels naming the culprit, and a
    root-cause hint."""

    rule: str
    labels: tuple[tuple[str, str], ...]
    what: str

    def met_by(self, alert: Mapping[str, Any]) -> bool:
        return _matches(alert, self.rule, self.labels) and bool(
            alert.get("annotations", {}).get("hint")
        )


@dataclass(frozen=True)
class Consequence:
    """An alert the scenario does not wait for but explains: a rule on the culprit's
    labels, and why the injected faults make it fire."""

    rule: str
    labels: tuple[tuple[str, str], ...]
    why: str

    def explains(self, alert: Mapping[str, Any]) -> bool:
        return _matches(alert, self.rule, self.labels)


@dataclass(frozen=True)
class Story:
    """One scenario as the demo tells it."""

    scenario: str
    fault: str  # what is injected and when, or that nothing is
    expected: list[Expectation] = field(default_factory=list)
    consequences: list[Consequence] = field(default_factory=list)

    def explain(self, alert: Mapping[str, Any]) -> str | None:
        """Why a firing alert that the scenario does not wait for fires (None: nothing in
        the scenario explains it)."""
        return next((c.why for c in self.consequences if c.explains(alert)), None)

    def expects(self, alert: Mapping[str, Any]) -> bool:
        return any(_matches(alert, e.rule, e.labels) for e in self.expected)


def story(scenario: str) -> Story:
    """The story of ``scenario`` on the demo's fleet; ValueError for an unknown one."""
    from ragwatch.agents.scenario import GPU_LEAK_SCENARIOS, build

    world = build(scenario, hosts=HOSTS, gpus=GPUS, services=SERVICES)
    if scenario == "healthy":
        return Story(
            scenario,
            "no fault is injected (only daily seasonality, a deploy and a model reload); the "
            f"demo passes if nothing pages for {HEALTHY_DAYS} simulated days",
        )
    minute = world.fleet.config.leak_start_s / 60
    faults, expected, consequences = [], [], []
    if scenario in GPU_LEAK_SCENARIOS:
        text, exp, cons = _leak(world, scenario)
        faults.append(text)
        expected += exp
        consequences += cons
    target = world.requests.fault_target if world.requests is not None else None
    if target is not None:
        host = target.host or "its host"
        text, cons = _requests(scenario, target.service, target.instance, host)
        faults += [text] if text else []
        consequences += cons
        expected += [
            Expectation(
                rule,
                (("service", target.service), ("instance", target.instance)),
                f"{rule} alert for {target.service} ({target.instance})",
            )
            for rule in REQUEST_RULES.get(scenario, ())
        ]
    fault = f"at minute {minute:.0f}, " + "; ".join(faults)
    if scenario in HEALING:
        fault += f"; the request faults heal {HEAL_AFTER} later"
    return Story(scenario, fault, expected, consequences)


def _leak(world: Any, scenario: str) -> tuple[str, list[Expectation], list[Consequence]]:
    host, gpu, pid, name = world.fleet.leak_target
    where = (("host", host), ("gpu", str(gpu)))
    rate = world.fleet.config.leak_gb_per_h
    text = f"{name} pid {pid} on {host} GPU {gpu} starts leaking {rate:g} GB/h"
    expected = []
    if scenario in OOM_SCENARIOS:
        text += " until the CUDA OOM killer takes it (~12.4 h in)"
        expected.append(
            Expectation(
                "GpuOomKill",
                (*where, ("pid", str(pid))),
                f"GpuOomKill alert for {host} GPU {gpu} pid {pid}",
            )
        )
    expected.append(
        Expectation(
            "GpuMemoryLeak",
            (*where, ("pid", str(pid))),
            f"GpuMemoryLeak alert for {host} GPU {gpu} pid {pid}",
        )
    )
    consequences = [
        Consequence(
            "GpuMemoryHigh",
            where,
            f"the leak fills GPU {gpu} of {host}: over 95 % of its memory, the last warning "
            "before the CUDA OOM killer",
        ),
        Consequence(
            "GpuMemoryLeak",
            (*where, ("process", name)),
            f"after the OOM kill, {name} restarted with a new pid and the same bug: it leaks again",
        ),
    ]
    return text, expected, consequences


def _requests(
    scenario: str, service: str, instance: str, host: str
) -> tuple[str, list[Consequence]]:
    """What the scenario does to the faulty instance's requests, and the alerts on it that
    follow from that."""
    from ragwatch.agents.sim_requests import (
        LEAK_PER_10MIN,
        OOM_BURST_S,
        OOM_ERROR_P,
        OUTLIER_CONTEXT,
        OUTLIER_OUTPUT,
        SLOW_RETRIEVAL,
        SLOW_RETRIEVAL_P,
        THROUGHPUT,
    )

    on = (("service", service), ("instance", instance))
    qps, tokens, decode = THROUGHPUT["qps"], THROUGHPUT["tokens"], THROUGHPUT["decode"]
    texts, why = [], {}
    if scenario in ("leak", "oom", "all"):
        texts.append(
            f"{instance} of {service} on the same host slows down {LEAK_PER_10MIN:.0%} per "
            "10 minutes"
        )
        why["DecodeSpeedDrop"] = (
            f"the leak slows {instance} on {host} down: it decodes "
            f"{LEAK_PER_10MIN:.0%} slower every 10 minutes"
        )
    if scenario == "oom":
        burst = (
            f"the OOM kill fails {OOM_ERROR_P:.0%} of {instance}'s requests for "
            f"{OOM_BURST_S:.0f} s, with no output"
        )
        why |= dict.fromkeys(("TokensPerRequestDrop", "ErrorRateHigh"), burst)
    if scenario in ("throughput", "all"):
        texts.append(
            f"{instance} of {service} (on {host}) loses {1 - tokens:.0%} of its output "
            f"tokens per request and {1 - qps:.0%} of its requests, and decodes "
            f"{decode:g}x slower"
        )
        why["E2eLatencyDeviation"] = (
            f"the throughput fault makes {instance} decode {decode:g}x slower: its end-to-end "
            "latency rises"
        )
    if scenario in ("retrieval", "all"):
        texts.append(
            f"{SLOW_RETRIEVAL_P:.0%} of {instance}'s retrievals stall (~{SLOW_RETRIEVAL[0]:.0f} ms)"
        )
        why.setdefault(
            "E2eLatencyDeviation",
            f"{instance}'s stalled retrievals add to its end-to-end latency",
        )
    if scenario in ("outliers", "all"):
        texts.append(
            f"{instance} starts getting unusual requests (~{OUTLIER_CONTEXT[0]:,.0f} context "
            f"and ~{OUTLIER_OUTPUT[0]:.0f} output tokens)"
        )
    text = "; ".join(texts) if scenario != "leak" else ""
    return text, [Consequence(rule, on, reason) for rule, reason in why.items()]
