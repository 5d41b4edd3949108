"""The replica-outlier detector's specification: :class:`~ragwatch.detectors.replicas.
ReplicaBank` written the simplest way, a dict per member, plain floats, a loop per member
over its peers, ``statistics.median`` recomputed from scratch.
``tests/unit/test_replicas.py`` holds the bank to it.

Rules (the bank's module docstring has the reasons): a member's peers are the update's
other members with a finite value; with ``p`` their median and ``mad`` the median of
their absolute deviations from ``p``, ``scale = max(1.4826 * mad, rel_floor * |p|,
abs_floor)``, ``z = (value - p) / scale`` (0 for no difference, +-inf on a zero scale) and
``ratio = value / p`` (NaN for ``p == 0``). Deviant: ``min_members`` known, ``z`` beyond
``z_min`` on the signal's side and ``|value - p| >= rel_min * |p|``. A judged member
(known, ``min_members`` known) that is deviant keeps its streak, or starts one if it has
none or was last judged more than ``gap_s`` ago; a judged member that is not deviant ends
it. Outlier: deviant and ``t - since >= for_s``. An update older than the group's last on
the signal changes nothing and flags nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragwatch.detectors.replicas import ReplicaParams, ReplicaScore


@dataclass
class Member:
    seen: float  # when its value was last known (or when it came)
    value: float = math.nan
    judged: float | None = None
    since: float | None = None


@dataclass
class Panel:
    t: float
    members: dict[str, Member] = field(default_factory=dict)


def score(value: float, peers: list[float], p: ReplicaParams) -> tuple[float, float, float]:
    """Peer median, ratio and z of one known value against its known peers."""
    med = statistics.median(peers)
    mad = statistics.median([abs(x - med) for x in peers])
    scale = max(1.4826 * mad, p.rel_floor * abs(med), p.abs_floor)
    diff = value - med
    if diff == 0:
        z = 0.0
    elif scale == 0:
        z = math.copysign(math.inf, diff)
    else:
        z = diff / scale
    ratio = math.nan if med == 0 else value / med
    return med, ratio, z


def deviant(value: float, med: float, z: float, n_known: int, p: ReplicaParams) -> bool:
    if n_known < p.min_members or abs(value - med) < p.rel_min * abs(med):
        return False
    high = z >= p.z_min and value > med
    low = z <= -p.z_min and value < med
    return {"high": high, "low": low, "both": high or low}[p.direction]


class ReplicaReference:
    """Every group, signal and member in nested dicts."""

    def __init__(
        self, params: ReplicaParams | None = None, signals: dict[str, ReplicaParams] | None = None
    ) -> None:
        self.params = params or ReplicaParams()
        self.signals = signals or {}
        self.panels: dict[tuple[str, str], Panel] = {}
        self.late = 0

    def update(
        self, group: str, signal: str, t: float, members: Sequence[str], values: Sequence[float]
    ) -> list[ReplicaScore]:
        p = self.signals.get(signal, self.params)
        known = {m: v for m, v in zip(members, values, strict=True) if math.isfinite(v)}
        panel = self.panels.get((group, signal))
        late = panel is not None and t < panel.t
        if late:
            self.late += 1
        elif panel is None:
            panel = self.panels[(group, signal)] = Panel(t)
        out = []
        for name, v in zip(members, values, strict=True):
            med = ratio = z = math.nan
            dev = False
            peers = [x for m, x in known.items() if m != name]
            if name in known and peers:
                med, ratio, z = score(v, peers, p)
                dev = deviant(v, med, z, len(known), p)
            if late or panel is None:
                out.append(ReplicaScore(name, v, med, ratio, z, dev, False, None))
                continue
            mem = panel.members.setdefault(name, Member(seen=t))
            if name in known:
                mem.value, mem.seen = v, t
            if name in known and len(known) >= p.min_members:
                self._streak(mem, dev, t, p)
            outlier = dev and mem.since is not None and t - mem.since >= p.for_s
            out.append(ReplicaScore(name, v, med, ratio, z, dev, outlier, mem.since))
        if panel is not None and not late:
            panel.t = t
        return out

    @staticmethod
    def _streak(mem: Member, dev: bool, t: float, p: ReplicaParams) -> None:
        if not dev:
            mem.since = None
        elif mem.since is None or mem.judged is None or t - mem.judged > p.gap_s:
            mem.since = t
        mem.judged = t

    def forget(self, group: str) -> None:
        for key in [k for k in self.panels if k[0] == group]:
            del self.panels[key]

    def forget_member(self, group: str, member: str, signal: str | None = None) -> None:
        for key, panel in list(self.panels.items()):
            if key[0] == group and (signal is None or key[1] == signal):
                panel.members.pop(member, None)
                if not panel.members:
                    del self.panels[key]

    def prune(self, before: float) -> None:
        for key, panel in list(self.panels.items()):
            for name in [n for n, m in panel.members.items() if m.seen < before]:
                del panel.members[name]
            if not panel.members:
                del self.panels[key]

    def members(self, group: str, signal: str) -> tuple[str, ...]:
        panel = self.panels.get((group, signal))
        return () if panel is None else tuple(panel.members)
