"""Root-cause hints: what else is wrong on the same host and service when an alert fires.

An alert says what crossed a line; the hint says what that probably means, from the other
signals of the same host and of the service instances running on it (a
:class:`~ragwatch.schema.RequestsEnvelope` names its ``host``), within ``window_s`` of
event time:

- GPU side (causes): processes whose GPU memory grows steadily (the leak detector's slope,
  ``mem_increase_bytes`` >= ``facts.LEAK_MIN_BYTES`` and steadiness >= 0.7), GPUs above 90 %
  of their framebuffer, and OOM kills and critical XIDs still active on the host;
- request side (effects): each instance's tokens per request and output tokens/s below
  their forecast, retrieval P99 and P95 latency above their baselines, errors, decode
  speed below its baseline, queue wait and time to first token above theirs, and a
  cluster of unusual requests (with its label, e.g. "long context, short output");
- demand (context, first in a service alert's hint): its requests/s and tokens per
  request against their forecasts, "demand 0.18 requests/s (+26% vs forecast), answers
  of 30 tokens (+30% vs forecast); ...": fewer users, or a mix of shorter answers,
  explain a drop of tokens/s without a fault.

The hint joins both with a suspicion, for example::

    GPU 1 memory +1.20 GB/h in pid 4011 (rag-worker, container 5d1c0e2f9a3b) on
    gpu-node-01, while rag-api-1 on the same host shows tokens/request -29 %, retrieval
    P99 4.2x: suspect a leak in that process degrading rag-api-1

The alert's own signal is left out of its hint (its summary already says it). Hints read
the facts each pipeline publishes (:mod:`.facts`), never a pipeline: the facts of the
alert's own side as of the wave in which it starts firing, the other side's as they are
after the batch (it did not move during it). They are the facts of the worker that raises
the alert: the host's GPU telemetry and its services' requests must be consumed by the
same worker to be joined (always true with one worker; see the README for several). They
are joined only within ``window_s`` of the alert's own event time: a worker reads topics
and partitions at different paces (a catch-up reads one hours ahead of another), so the
other side's facts are used only if they are about the same time, and the hint says so
when they are not ("GPU telemetry of gpu-node-01 has not caught up with this alert yet
(2.0 h behind), so GPU causes cannot be checked: look at the service itself first").

Every hint reads as advice to a person: what else is wrong, and what to suspect or do;
never the worker's internal state.

>>> from ragwatch.schema import Alert, HostFacts
>>> from ragwatch.streams.alerting.engine import AlertEngine
>>> class Nothing:  # a Summary with no facts
...     def host(self, host): return HostFacts(host)
...     def instance(self, service, instance): return None
...     def instances_on(self, host): return []
>>> c = Correlator([], AlertEngine())
>>> a = Alert(rule="X", severity="info", status="firing", labels={"host": "h9"},
...           annotations={}, value=1.0, expected=None, starts_at=0.0, ends_at=None,
...           fingerprint="f")
>>> print(c.hint(a, Nothing()))  # doctest: +NORMALIZE_WHITESPACE
nothing else on the GPUs of h9 stands out, and no RAG service reports requests from h9:
the alert's own signal is all there is to go on
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from ragwatch.advisor import fact_moves, gpu_words, rank, summary
from ragwatch.schema import Alert, AnomalyFact, InstanceFacts, LeakFact, Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import Domain
from ragwatch.streams.pipelines.facts import Summary

EVENT_RULE_SERIES = "event"


def describe(leak: LeakFact, host: str) -> str:
    """A leak as a hint names it."""
    container = leak.container if leak.container == "none" else leak.container[:12]
    where = f"pod {leak.pod}, container {container}" if leak.pod else f"container {container}"
    return (
        f"GPU {leak.gpu} memory {leak.gb_per_hour:+.2f} GB/h in pid {leak.pid} "
        f"({leak.process}, {where}) on {host}"
    )


# (signal, test, phrase): what counts as a symptom of a service instance
_SYMPTOMS: tuple[tuple[str, float, str], ...] = (
    # at the alert levels of the default rules: a bucket's tokens/s is noisy (+-10 %)
    ("tpr_deviation", -0.2, "tokens/request {v:+.0%}"),
    ("tps_deviation", -0.25, "output tokens/s {v:+.0%}"),
    ("retriever_p99_ratio", 2.0, "retrieval P99 {v:.1f}x"),
    ("e2e_p95_ratio", 1.3, "P95 latency {v:.1f}x"),
    ("errors_ratio", 0.05, "errors {v:.0%}"),
    ("decode_deviation", -0.2, "decode speed {v:+.0%}"),
    ("queue_p95_excess_ms", 500.0, "queue wait +{v:.0f} ms"),
    ("ttft_net_p95_ratio", 1.5, "time to first token {v:.1f}x"),
)


# signals that say what another says (over another window): an alert on one leaves both out
_SAME = {"tpr_recent_deviation": "tpr_deviation", "tpr_recent_z": "tpr_z"}
# a symptom counts only when its test says it is more than noise (|z| >= 3), if it has one
_SIGNIFICANCE = {
    "tpr_deviation": "tpr_z",
    "tps_deviation": "tps_z",
    "errors_ratio": "errors_z",
    "decode_deviation": "decode_z",
}


# every signal of an instance a hint reads (what the facts topic carries of an instance:
# tests/unit/test_catalog.py holds it to what this module reads)
HINT_SIGNALS = frozenset(
    {signal for signal, _, _ in _SYMPTOMS}
    | set(_SIGNIFICANCE.values())
    | {"new_outlier_cluster", "outlier_ratio", "rps", "rps_deviation", "tokens_per_request",
       "tpr_deviation"}
)  # fmt: skip


class Correlator:
    """Explains firing alerts with the published facts of their host and services."""

    def __init__(self, rules: Iterable[Rule], engine: AlertEngine, *, window_s: float = 1800.0):
        self.engine = engine
        self.window_s = window_s
        self._rules: dict[str, Rule] = {r.name: r for r in rules}

    def annotate(self, transitions: list[Transition], facts: Summary) -> list[Transition]:
        """The transitions, each alert that starts firing with a ``hint`` annotation."""
        return [
            replace(t, alert=self.explain(t.alert, facts)) if t.fires else t for t in transitions
        ]

    def explain(self, alert: Alert, facts: Summary) -> Alert:
        """``alert`` with ``annotations["hint"]`` set."""
        hint = self.hint(alert, facts)
        return replace(alert, annotations={**alert.annotations, "hint": hint})

    def hint(self, alert: Alert, facts: Summary) -> str:
        labels = alert.labels
        rule = self._rules.get(alert.rule)
        own = {c.signal for c in rule.conditions} if rule else set()
        own |= {_SAME[x] for x in own if x in _SAME}
        at = self.at(alert)
        if "instance" in labels and "service" in labels:
            hint = self._service_hint(labels, own, at, facts)
        else:
            hint = self._host_hint(alert, rule.series if rule else "", own, at, facts)
        also = self._also(labels, own, at, facts)
        return f"{hint}; also anomalous: {also}" if also else hint

    def _also(self, labels: Mapping[str, str], own: set[str], at: float, facts: Summary) -> str:
        """The advisor's words on the other signals of the alert's host and the service
        instances on it whose peak anomaly score of the last hour reached its bar (the
        alert's own signals on its own series left out), highest first."""
        instance = labels.get("instance") if "service" in labels else None
        if instance is not None:
            s = facts.instance(labels["service"], instance)
            host, mine = (s.host if s is not None else None), instance
        else:
            host = labels.get("host")
            pid = labels.get("pid")
            mine = f"pid {pid}" if pid else gpu_words(labels.get("gpu"), labels.get("mig"))
        found: list[AnomalyFact] = []
        if host:
            found += facts.host(host).anomalous
            found += [f for s in facts.instances_on(host) for f in s.anomalous]
        elif instance is not None and (s := facts.instance(labels["service"], instance)):
            found += s.anomalous
        near = [
            f
            for f in found
            if f.at is not None and abs(f.at - at) <= self.window_s
            and not (
                (f.signal in own or f"{f.signal}_score" in own)
                and (f.where == mine or f.where.startswith(mine + " "))
            )
        ]  # fmt: skip
        return summary(rank(fact_moves(dict.fromkeys(near))), limit=4)

    @staticmethod
    def at(alert: Alert) -> float:
        """The event time an alert's hint is about."""
        return alert.at if alert.at is not None else alert.starts_at

    def joins(self, alert: Alert, facts: Summary) -> tuple[Domain, str] | None:
        """The other side ``alert``'s hint reads: ("host", h) the GPU facts of host h (a
        service alert, its instance on h), ("service", h) the service instances on h (an
        alert of host h); None: neither (the instance's host is unknown)."""
        labels = alert.labels
        if "instance" in labels and "service" in labels:
            s = facts.instance(labels["service"], labels["instance"])
            return ("host", s.host) if s is not None and s.host else None
        host = labels.get("host")
        return ("service", host) if host else None

    def _gpu_lag(self, host: str, at: float, facts: Summary) -> str | None:
        """Why the host's GPU facts cannot be joined with an alert at ``at`` (None: they
        can): the worker has its GPU telemetry only from far from that time."""
        newest = facts.host(host).ts
        if newest is None:
            return None  # nothing to join: the hint says what it knows without it
        gap = newest - at
        if abs(gap) <= self.window_s:
            return None
        hours = f"{abs(gap) / 3600:.1f} h"
        if gap < 0:
            return (
                f"GPU telemetry of {host} has not caught up with this alert yet ({hours} "
                "behind), so GPU causes cannot be checked"
            )
        return (
            f"the GPU telemetry of {host} at hand is from {hours} after this alert (the "
            "worker is catching up), so GPU causes at its time cannot be checked"
        )

    # ------------------------------------------------------------------ the two views

    def _service_hint(
        self, labels: Mapping[str, str], own: set[str], at: float, facts: Summary
    ) -> str:
        instance = labels["instance"]
        s = facts.instance(labels["service"], instance)
        host = s.host if s is not None else None
        symptoms = _symptoms(s, own) if s is not None else []
        lag = self._gpu_lag(host, at, facts) if host else None
        causes = self._causes(host, facts) if host and not lag else []
        effects = f"{instance} also shows {', '.join(symptoms)}" if symptoms else ""
        text = ", while ".join(x for x in (", ".join(causes), effects) if x)
        if lag:
            suspicion = f"{lag}: look at the service itself first"
        elif host is None:
            suspicion = (
                f"the host of {instance} is unknown (set host= in the SDK), so GPU causes "
                "cannot be checked: suspect the service itself"
            )
        elif self._active_events(host, "oom_kill"):
            suspicion = f"suspect GPU memory exhaustion on {host}: the OOM killer took a process"
        elif leaks := facts.host(host).leaks:
            suspicion = f"suspect a leak in pid {leaks[0].pid} degrading {instance}"
        elif "retriever_p99_ratio" in own:
            memory = (
                f"GPU memory on {host} is steady"
                if facts.host(host).ts is not None
                else f"no GPU telemetry of {host} is at hand"
            )
            suspicion = f"{memory}: suspect the retriever (the vector index or its store)"
        elif "new_outlier_cluster" in own and s is not None and s.outlier_label:
            suspicion = f"suspect a change in the traffic mix ({s.outlier_label} requests)"
        else:
            suspicion = (
                f"no GPU signal on {host} explains it: suspect the model server or the "
                "service itself (a deploy, a configuration or an upstream change)"
            )
        hint = f"{text}: {suspicion}" if text else suspicion
        demand = _demand(s, own) if s is not None else ""
        return f"{demand}; {hint}" if demand else hint

    def _host_hint(
        self, alert: Alert, series: str, own: set[str], at: float, facts: Summary
    ) -> str:
        labels = alert.labels
        host = labels.get("host", "")
        leaks = facts.host(host).leaks
        mine = [lk for lk in leaks if lk.pid == labels.get("pid")]
        on_gpu = [lk for lk in leaks if lk.gpu == labels.get("gpu")]
        culprit = next(iter(mine or on_gpu), None)
        skip = labels.get("pid") if series == "process" else None
        causes = self._causes(host, facts, skip_pid=skip)
        if series == "process" and culprit is not None:
            causes.insert(0, describe(culprit, host))
        instances = self._instances_on(host, at, facts)
        degraded = [inst for inst, symptoms in instances if symptoms]
        effects = "; ".join(
            f"{inst} on the same host shows {', '.join(symptoms)}"
            for inst, symptoms in instances
            if symptoms
        )
        text = ", while ".join(x for x in (", ".join(causes), effects) if x)
        names = ", ".join(degraded)
        if series == EVENT_RULE_SERIES and labels.get("type") == "oom_kill":
            leaked = f"a leak in pid {labels.get('pid')}" if culprit else "GPU memory exhaustion"
            suspicion = f"suspect {leaked}" + (f": it hit {names}" if names else "")
        elif culprit is not None and degraded:
            suspicion = f"suspect a leak in that process degrading {names}"
        elif culprit is not None:
            tte = culprit.tte_h
            when = (
                f" (GPU {culprit.gpu} full in ~{tte:.1f} h)" if tte and math.isfinite(tte) else ""
            )
            served = [i for i, _ in instances]
            suspicion = (
                f"services on {host} ({', '.join(served)}) are not degraded yet: restart "
                f"pid {culprit.pid} before the CUDA OOM killer does{when}"
                if served
                else f"suspect a leak in pid {culprit.pid}{when}; no RAG service reports "
                f"requests from {host}, so none can be checked for harm"
            )
        elif degraded:
            suspicion = f"suspect the GPU problem on {host} degrading {names}"
        else:
            served = [i for i, _ in instances]
            suspicion = (
                f"services on {host} ({', '.join(served)}) look healthy and nothing else on "
                "its GPUs stands out: the alert's own signal is all there is to go on"
                if served
                else f"nothing else on the GPUs of {host} stands out, and no RAG service "
                f"reports requests from {host}: the alert's own signal is all there is to "
                "go on"
            )
        return f"{text}: {suspicion}" if text else suspicion

    # ------------------------------------------------------------------ facts

    def _causes(self, host: str, facts: Summary, skip_pid: str | None = None) -> list[str]:
        known = facts.host(host)
        out = [describe(lk, host) for lk in known.leaks if lk.pid != skip_pid][:2]
        out += [f"GPU {gpu} at {ratio:.0%} memory" for gpu, ratio in known.full]
        ooms = [
            f"the OOM killer took pid {a.labels.get('pid', '?')} on GPU {a.labels.get('gpu', '?')}"
            for a in self._active_events(host, "oom_kill")
        ]
        xids = [
            f"XID {a.labels.get('xid', '?')} on GPU {a.labels.get('gpu', '?')}"
            for a in self._active_events(host, "xid")
        ]
        return out + _first(ooms, "OOM kills") + _first(xids, "XIDs")

    def _active_events(self, host: str, kind: str) -> list[Alert]:
        return [
            a
            for a in self.engine.active.values()
            if a.labels.get("host") == host and a.labels.get("type") == kind
        ]

    def _instances_on(self, host: str, at: float, facts: Summary) -> list[tuple[str, list[str]]]:
        """(instance, its symptoms) of every service instance running on ``host`` whose
        signals are about the alert's time (within ``window_s`` of ``at``)."""
        return [
            (s.instance, _symptoms(s, set()))
            for s in facts.instances_on(host)
            if s.bucket_end is not None and abs(s.bucket_end - at) <= self.window_s
        ]


def _symptoms(s: InstanceFacts, own: set[str]) -> list[str]:
    out = []
    for signal, limit, phrase in _SYMPTOMS:
        v = s.signals.get(signal)
        if signal in own or v is None:
            continue
        sure = s.signals.get(_SIGNIFICANCE.get(signal, ""))
        if sure is not None and abs(sure) < 3:  # within the window's sampling noise
            continue
        if (limit < 0 and v <= limit) or (limit > 0 and v >= limit):
            out.append(phrase.format(v=v))
    if "new_outlier_cluster" not in own and (
        s.signals.get("new_outlier_cluster") or (s.signals.get("outlier_ratio") or 0) > 0.01
    ):
        label = f" ({s.outlier_label})" if s.outlier_label else ""
        out.append(f"a cluster of outlier requests{label}")
    return out


def _demand(s: InstanceFacts, own: set[str]) -> str:
    """The instance's demand as context for a person (how many requests, how long the
    answers, against their forecasts): fewer users or shorter questions explain a drop
    of tokens/s and are not a fault themselves (docs/rules.md, "Demand is context"). The
    answers' length is left out of a tokens-per-request alert's (its own signal)."""
    sig = s.signals
    rps, tpr = sig.get("rps"), sig.get("tokens_per_request")
    if rps is None:
        return ""
    parts = [f"{rps:.2f} requests/s" + _vs(sig.get("rps_deviation"))]
    if tpr is not None and not own & {"tpr_deviation", "tpr_z"}:
        parts.append(f"answers of {tpr:.0f} tokens" + _vs(sig.get("tpr_deviation")))
    return "demand " + ", ".join(parts)


def _vs(deviation: float | None) -> str:
    return "" if deviation is None else f" ({deviation:+.0%} vs forecast)"


def _first(causes: list[str], what: str, n: int = 3) -> list[str]:
    """The first ``n`` causes and how many more (a hint stays short in a flood)."""
    return causes if len(causes) <= n else [*causes[:n], f"{len(causes) - n} more {what}"]
