"""Inhibition rules as Alertmanager defines them, and the warnings a set of them earns.

A firing alert matching a rule's source mutes the alerts matching its target that have
the same values of the rule's ``equal`` labels (and, with the rule's ``linger``, a
ragwatch extension, for that long after it resolved). An alert that matches both sides is muted
only by a source that does not match the target side, never by itself. Rules that can
match one alert on both sides, and cycles of rules that can mute each other's sources,
are accepted (as Alertmanager does) with a warning naming them
(:func:`warn_about_inhibit_rules`). The notify file's ``inhibit_rules`` are read by
:mod:`~ragwatch.streams.notifier.routing`; the grouper applies them at flush time.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ragwatch.matchers import Matcher, may_overlap, shown

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InhibitRule:
    """A firing alert matching ``source`` mutes alerts matching ``target`` that have the
    same values of the ``equal`` labels, as Alertmanager's inhibition does. With
    ``linger_s`` (ours; 0 in Alertmanager's terms) a source that resolved still mutes the
    targets whose condition began to hold after it for that long (a target firing on past
    it is told then), and those whose condition began while it fired until they resolve,
    for up to :data:`TAIL_S`, whenever they fire: they are its incident's tail (windows
    still draining the fault's requests; the grouper applies it, :meth:`mutes_after`).

    A label missing on an alert counts as the empty value, so ``equal`` labels missing on
    both alerts are equal. An alert that matches both sides can be muted only by a source
    that does not match the target side (Alertmanager's rule): alerts of one kind never
    mute each other, and an alert never mutes itself.

    >>> gpu = InhibitRule((Matcher("alertname", "Gpu.*", regex=True),),
    ...                   (Matcher("alertname", "GpuMemoryLeak"),), ("host",))
    >>> leak = {"alertname": "GpuMemoryLeak", "host": "h1", "gpu": "0"}
    >>> gpu.inhibits({"alertname": "GpuXid", "host": "h1"}, leak)
    True
    >>> gpu.inhibits({**leak, "gpu": "1"}, leak), gpu.inhibits(leak, leak)
    (False, False)
    """

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()
    linger_s: float = 0.0

    def is_source(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.source)

    def is_target(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.target)

    def inhibits(self, source: Mapping[str, str], target: Mapping[str, str]) -> bool:
        """Whether a firing alert labelled ``source`` mutes the one labelled ``target``."""
        return (
            self.is_target(target)
            and self.is_source(source)
            and all(source.get(k, "") == target.get(k, "") for k in self.equal)
            and not (self.is_source(target) and self.is_target(source))
        )

    def mutes_until(self, ended: float, target_since: float) -> float:
        """Until when a source that resolved at ``ended`` mutes a target whose condition
        has held since ``target_since`` (its ``starts_at``; both matched,
        :meth:`inhibits`); -inf without a linger."""
        if not self.linger_s:
            return -math.inf
        tail = target_since <= ended  # its deviation began while the source fired
        return ended + (TAIL_S if tail else self.linger_s)

    def mutes_after(self, ended: float, target_since: float, at: float) -> bool:
        """Whether a source that resolved at ``ended`` still mutes, at ``at``, a target
        whose condition has held since ``target_since`` (both matched, :meth:`inhibits`)."""
        return at < self.mutes_until(ended, target_since)

    def __str__(self) -> str:
        equal = f" equal [{', '.join(self.equal)}]" if self.equal else ""
        linger = f" linger {self.linger_s:g}s" if self.linger_s else ""
        return f"source {shown(self.source)} target {shown(self.target)}{equal}{linger}"


def warn_about_inhibit_rules(rules: Sequence[InhibitRule], source: str) -> None:
    """Log a warning for each rule whose source and target can match one alert, and for
    each cycle of rules that can mute each other's sources. Alertmanager accepts both,
    and so does the notifier; the warnings say what they will do."""
    for i, rule in enumerate(rules):
        if may_overlap(rule.source, rule.target):
            log.warning(
                "%s: inhibit_rules[%d] (%s): an alert can match both its source and its "
                "target; such an alert is muted only by a source that does not match the "
                "target, never by an alert that matches both sides nor by itself "
                "(Alertmanager's rule)",
                source,
                i,
                rule,
            )
    for cycle in inhibit_cycles(rules):
        log.warning(
            "%s: inhibit rules that can mute each other's sources form a cycle, %s (%s): "
            "while their alerts fire together with equal labels, each can be muted by "
            "another and none is sent (Alertmanager does the same); narrow a rule's "
            "matchers to break the cycle",
            source,
            " -> ".join(f"inhibit_rules[{i}]" for i in cycle.path),
            "; ".join(f"inhibit_rules[{i}]: {rules[i]}" for i in cycle.rules),
        )


class InhibitCycle(NamedTuple):
    """Rules that can mute each other's sources: ``rules``, every one on some cycle
    through the others (a strongly connected set), and ``path``, a shortest cycle through
    the first (its index repeated last)."""

    rules: tuple[int, ...]
    path: tuple[int, ...]


def inhibit_cycles(rules: Sequence[InhibitRule]) -> list[InhibitCycle]:
    """Each set of two or more rules that can mute each other's sources, in a cycle.

    Rule ``i`` leads to rule ``j`` when an alert could match ``i``'s target and ``j``'s
    source (:func:`~ragwatch.matchers.may_overlap`, conservative: a cycle may be reported
    that no alerts can close, never the other way round); ``equal`` labels are not looked
    at. A rule that leads to itself is an overlap, warned about on its own.

    >>> def rule(source: str, target: str) -> InhibitRule:
    ...     return InhibitRule((Matcher("alertname", source),), (Matcher("alertname", target),))
    >>> inhibit_cycles([rule("A", "B"), rule("X", "Y"), rule("B", "A")])
    [InhibitCycle(rules=(0, 2), path=(0, 2, 0))]
    """
    edges = [
        [j for j, r in enumerate(rules) if j != i and may_overlap(rule.target, r.source)]
        for i, rule in enumerate(rules)
    ]
    seen: set[int] = set()
    cycles = []
    for i in range(len(rules)):
        if i in seen:
            continue
        paths = _paths(edges, i)
        back = [paths[j] for j in paths if j != i and i in edges[j]]
        if not back:
            continue
        members = sorted(j for j in paths if i in _paths(edges, j))
        seen.update(members)
        cycles.append(InhibitCycle(tuple(members), (*min(back, key=len), i)))
    return cycles


def _paths(edges: Sequence[Sequence[int]], start: int) -> dict[int, list[int]]:
    """A shortest path from ``start`` to each node it reaches (breadth first)."""
    paths, queue = {start: [start]}, deque([start])
    while queue:
        i = queue.popleft()
        for j in edges[i]:
            if j not in paths:
                paths[j] = [*paths[i], j]
                queue.append(j)
    return paths


GENERIC_LINGER_S = 1800.0
# how long a resolved source (of a rule with a linger) keeps muting the alerts that fired
# while it fired, at most: a generic alert relearning a fault of hours resolves within it
TAIL_S = 86400.0
# The inhibition the notifier applies without a notify file (a file states its own; the
# example in docs/notifications.md carries this one): a firing leak alert of a GPU, which
# already says when it will OOM, mutes that GPU's "memory over 95 %". The leak filling
# the GPU is one fault, paged once; a GPU full with no leak alert still pages. And a
# firing cause of slow answers on an instance (queue, TTFT, retrieval, decode) mutes its
# latency backstop, E2eLatencyDeviation: a queue of 10 s keeps the instance's P95 high
# for as long as its 200-request window holds the queued requests (hours at night).
DEFAULT_INHIBIT_RULES = (
    InhibitRule(
        (Matcher("alertname", "GpuMemoryLeak.*", regex=True),),
        (Matcher("alertname", "GpuMemoryHigh"),),
        ("host", "gpu"),
    ),
    # the latency backstop says nothing a page of its cause has not said
    InhibitRule(
        (
            Matcher(
                "alertname",
                "QueueWaitHigh|TtftDeviation|RetrievalSlowdown|DecodeSpeedDrop",
                regex=True,
            ),
        ),
        (Matcher("alertname", "E2eLatencyDeviation"),),
        ("service", "instance"),
    ),
    # the generic anomaly rules (label anomaly=generic) say nothing that a specific rule
    # on the same series says: its alert mutes theirs (a GPU's or a process's on its GPU;
    # an instance's; an engine's); after it resolved, a generic alert whose deviation
    # began while it fired stays muted until it resolves, even if it fires after (the
    # incident's tail: windows still holding the fault's requests at a quiet hour, a
    # rhythm that learnt part of a long fault), and one whose deviation began after it,
    # firing within GENERIC_LINGER_S, is told only if it still fires then
    *(
        InhibitRule(
            (Matcher("anomaly", ""), Matcher(key, ".+", regex=True)),
            (Matcher("alertname", target, regex=True),),
            equal,
            GENERIC_LINGER_S,
        )
        for target, key, equal in (
            ("GpuAnomaly|GpuRunningHot", "gpu", ("host", "gpu")),
            ("ServiceAnomaly", "instance", ("service", "instance")),
            ("EngineAnomaly", "target", ("host", "target")),
        )
    ),
)
