"""The harness of the independent scenarios (issue 30): shapes of telemetry from real systems,
played through the worker's pipelines with the shipped rules, and scored against what an
SRE would accept.

A :class:`Shape` is a generator of envelopes in event-time order, written apart from
ragwatch's own simulators (``ragwatch.agents.sim``, ``sim_requests``), with the faults it
holds (:class:`Expect`) and the healthy series-days it contributes. :func:`play` feeds it
to one :class:`~ragwatch.streams.pipelines.fleet.Pipelines`, as the worker does (one
partition a topic, read in event-time order), and scores the transitions:

- a firing transition of one of a fault's ``rules``, on labels that carry its ``target``,
  from ``start_ts`` until an hour after ``end_ts``, belongs to that fault: ``pages`` counts
  them (acceptance: at most ``max_pages`` per rule, as bench/space.py counts them: rules
  that see one fault from two sides, TTFT and queue wait, may each page once, but a rule
  that fires, resolves and fires again on it fails), ``delay_s`` is the first one's time
  after the start, ``resolved_after_s`` the time from ``end_ts`` to the resolution of the
  last one (None: still firing at the end of the shape), ``resolved_during`` counts
  resolutions while the fault lasts;
- firings the notifier mutes without a notify file (its default inhibition: a GPU's leak
  alert mutes its ``GpuMemoryHigh``) are not pages (:func:`notified`);
- every other firing transition is a false one: a page if its severity is warning or above,
  an info alert apart. Those on a fault's target during its window say which fault
  (``near``): a second rule on a real fault is still a second page.

Modules ``bench/shape_*.py`` register their shapes in a module-level ``SHAPES`` (a list, or
a function returning one); ``python bench/shapes.py`` plays them all. Bench modules import
each other by name with ``bench/`` on ``sys.path`` (as ``python bench/x.py`` has it; tests
put it there).

>>> from ragwatch.schema import RequestsEnvelope
>>> quiet = Shape("quiet", lambda: iter([RequestsEnvelope("s", "s-0", MONDAY, ())]),
...               faults=(), series_days=0.0, note="one heartbeat")
>>> play(quiet).ok
True
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from ragwatch.schema import Alert, Envelope, Transition
from ragwatch.streams.alerting.rules import Rule, load_rules
from ragwatch.streams.notifier.inhibition import DEFAULT_INHIBIT_RULES, InhibitRule
from ragwatch.streams.pipelines.fleet import Pipelines

DAY = 86400.0
HOUR = 3600.0
MINUTE = 60.0
MONDAY = 1_767_571_200.0  # 2026-01-05T00:00:00Z: shapes start on a known weekday
SETTLE_S = HOUR  # a fault's rules firing on its target up to this long after it ended are its own
PAGE_SEVERITIES = ("warning", "error", "critical")


@dataclass(frozen=True)
class Expect:
    """One fault in a shape, and what acceptance asks of it."""

    kind: str  # "leak", "decode", "errors", "queue", "retrieval", ...
    rules: tuple[str, ...]  # rules that count as detecting it
    target: dict[str, str]  # labels an alert must carry (subset match)
    start_ts: float
    end_ts: float | None  # None: lasts to the end
    max_delay_s: float | None = None  # first firing within this
    max_pages: int = 1
    resolve_within_s: float | None = None  # resolved within this after end_ts


@dataclass(frozen=True)
class Shape:
    name: str
    make: Callable[[], Iterator[Envelope]]  # envelopes in event-time order
    faults: tuple[Expect, ...]
    series_days: float  # healthy series-days it contributes (for false pages per series-day)
    note: str  # what it models and why


@dataclass(frozen=True)
class Firing:
    """A firing transition that belongs to no fault."""

    rule: str
    severity: str
    labels: dict[str, str]
    at: float
    near: str | None = None  # the kind of the fault on whose target and window it fired


@dataclass(frozen=True)
class FaultOutcome:
    expect: Expect
    pages: int  # firing transitions of its rules
    pages_by_rule: dict[str, int]
    delay_s: float | None  # None: never fired
    resolved_after_s: float | None  # the last page's resolution - end_ts (< 0: before the end);
    # None: still firing when the shape ended, or no page, or no end
    resolved_during: int  # resolutions of its alerts while it lasted
    failures: tuple[str, ...]  # what acceptance asked and did not get

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Outcome:
    shape: str
    faults: tuple[FaultOutcome, ...]
    false_pages: tuple[Firing, ...]  # severity warning and above
    info: tuple[Firing, ...]  # info alerts that belong to no fault
    series_days: float
    envelopes: int
    wall_s: float

    @property
    def false_pages_per_series_day(self) -> float:
        return len(self.false_pages) / self.series_days if self.series_days > 0 else 0.0

    @property
    def ok(self) -> bool:
        """Every fault met its acceptance and nothing else paged."""
        return not self.false_pages and all(f.ok for f in self.faults)


def play(shape: Shape, rules: list[Rule] | None = None) -> Outcome:
    """Run ``shape`` through one worker's pipelines (shipped rules by default) and score it."""
    start = time.perf_counter()
    counted = _Counted(shape.make())
    transitions = feed(counted, load_rules() if rules is None else rules)
    faults, false, info = score(shape.faults, transitions)
    return Outcome(
        shape=shape.name,
        faults=faults,
        false_pages=false,
        info=info,
        series_days=shape.series_days,
        envelopes=counted.n,
        wall_s=round(time.perf_counter() - start, 2),
    )


def feed(envelopes: Iterable[Envelope], rules: list[Rule]) -> list[Transition]:
    """Every transition of ``envelopes`` through one :class:`Pipelines`, in runs of GPU and of
    request envelopes as the worker batches them (:meth:`Pipelines.run`: the same
    transitions as one at a time). The worker's sweep marks (bench/space.py) are not needed
    here: with one partition a topic, read in event-time order, a topic's mark is its
    pipeline's own watermark, and a pipeline sweeps against the lower of the two."""
    return list(Pipelines(rules).run(envelopes))


class _Counted:
    """An iterator that counts what went through it."""

    def __init__(self, it: Iterator[Envelope]) -> None:
        self.it, self.n = it, 0

    def __iter__(self) -> Iterator[Envelope]:
        for env in self.it:
            self.n += 1
            yield env


# ---------------------------------------------------------------------- scoring


def matches(labels: dict[str, str], target: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in target.items())


def _window(e: Expect, alert: Alert) -> bool:
    end = math.inf if e.end_ts is None else e.end_ts + SETTLE_S
    return matches(alert.labels, e.target) and e.start_ts <= (alert.at or 0.0) < end


def score(
    expects: tuple[Expect, ...], transitions: list[Transition]
) -> tuple[tuple[FaultOutcome, ...], tuple[Firing, ...], tuple[Firing, ...]]:
    """Per fault, then the false pages and the info alerts that belong to no fault."""
    firing = notified(transitions)
    owned: set[int] = set()
    faults = []
    for e in expects:
        mine = [i for i, a in enumerate(firing) if a.rule in e.rules and _window(e, a)]
        owned.update(mine)
        faults.append(_fault(e, [firing[i] for i in mine], transitions))
    false: list[Firing] = []
    info: list[Firing] = []
    for i, a in enumerate(firing):
        if i in owned:
            continue
        near = next((e.kind for e in expects if _window(e, a)), None)
        f = Firing(a.rule, a.severity, dict(a.labels), a.at or 0.0, near)
        (false if a.severity in PAGE_SEVERITIES else info).append(f)
    return tuple(faults), tuple(false), tuple(info)


def notified(
    transitions: list[Transition], rules: tuple[InhibitRule, ...] = DEFAULT_INHIBIT_RULES
) -> list[Alert]:
    """The firing transitions a receiver is told of, under the notifier's inhibition
    (``ragwatch notify`` without a file): one muted while an inhibiting alert fires is told
    when the last such alert resolves (and its rule's linger has passed; one whose
    condition began while its source fired, a rule with a linger mutes until it resolves,
    up to TAIL_S),
    if it still fires then (as Alertmanager does, linger aside)."""
    firing: dict[str, Alert] = {}
    ended: dict[str, tuple[Alert, float]] = {}  # resolved sources: (alert, when)
    muted: set[str] = set()
    out: list[Alert] = []

    def free_at(a: Alert) -> float:
        """When nothing mutes ``a`` any more (inf: a firing source does; -inf: none)."""
        if any(r.inhibits(s.labels, a.labels) for s in firing.values()
               if s.fingerprint != a.fingerprint for r in rules):  # fmt: skip
            return math.inf
        ends = [r.mutes_until(end, a.starts_at) for s, end in ended.values()
                if s.fingerprint != a.fingerprint
                for r in rules if r.linger_s and r.inhibits(s.labels, a.labels)]  # fmt: skip
        return max(ends, default=-math.inf)

    def release(now: float) -> None:
        for fp in sorted(muted):
            free = free_at(firing[fp])
            if free <= now and free < math.inf:
                muted.discard(fp)  # told now: nothing mutes it any more
                out.append(replace(firing[fp], at=now if free == -math.inf else free))

    for t in transitions:
        a = t.alert
        now = a.at or 0.0
        release(now)
        if a.status == "firing":
            fresh = t.previous != "firing"
            firing[a.fingerprint] = a
            ended.pop(a.fingerprint, None)
            if fresh and free_at(a) > now:
                muted.add(a.fingerprint)
            elif fresh:
                out.append(a)
            continue
        src = firing.pop(a.fingerprint, None)
        muted.discard(a.fingerprint)
        if src is not None:
            ended[a.fingerprint] = (src, now)
        release(now)
    release(math.inf)
    return out


def _fault(e: Expect, mine: list[Alert], transitions: list[Transition]) -> FaultOutcome:
    by_rule = Counter(a.rule for a in mine)
    first = min((a.at or 0.0 for a in mine), default=None)
    delay = None if first is None else first - e.start_ts
    fingerprints = {a.fingerprint for a in mine}
    resolutions = [
        t.alert.at or 0.0
        for t in transitions
        if t.alert.status == "resolved"
        and t.previous == "firing"
        and t.alert.fingerprint in fingerprints
        and (t.alert.at or 0.0) >= e.start_ts
    ]
    end = math.inf if e.end_ts is None else e.end_ts
    during = sum(at < end for at in resolutions)
    last = max((a.at or 0.0 for a in mine), default=None)
    after = [at for at in resolutions if last is not None and at >= last]
    resolved_after = None if e.end_ts is None or not after else min(after) - e.end_ts
    return FaultOutcome(
        expect=e,
        pages=len(mine),
        pages_by_rule=dict(by_rule),
        delay_s=delay,
        resolved_after_s=resolved_after,
        resolved_during=during,
        failures=_failures(e, by_rule, delay, resolved_after),
    )


def _failures(
    e: Expect, pages: Counter[str], delay: float | None, resolved_after: float | None
) -> tuple[str, ...]:
    out = [f"{r}: {n} pages > {e.max_pages}" for r, n in pages.items() if n > e.max_pages]
    if not pages:
        out.append("missed")
    if delay is not None and e.max_delay_s is not None and delay > e.max_delay_s:
        out.append(f"late: {delay / 60:.1f} min > {e.max_delay_s / 60:.0f} min")
    if e.resolve_within_s is not None and pages:
        if resolved_after is None:
            out.append("not resolved")
        elif resolved_after > e.resolve_within_s:
            out.append(
                f"resolved {resolved_after / 60:.0f} min after the end > "
                f"{e.resolve_within_s / 60:.0f} min"
            )
    return tuple(out)
