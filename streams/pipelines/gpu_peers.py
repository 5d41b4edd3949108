"""Like GPUs compared with one another: memory growth, utilisation, power, temperature.

A GPU compared only with its own past follows a slow change (its baselines learn it);
the GPUs that do the same work elsewhere do not. GPUs are *alike* when they are the same
model and allocated to pods of the same template (the pod's name less its ReplicaSet
hash and random suffix, or less a StatefulSet's ordinal: :func:`template_of`) and
container, in the same namespace: the replicas of one Deployment, wherever they run. A GPU
no pod holds (no Kubernetes, or the agent without the kubelet's PodResources socket) has
no group: which GPUs do the same work is then unknown, and ragwatch does not guess (a
host's idle GPUs beside its busy ones would page).

Once per minute of the GPU pipeline's event time (:data:`PERIOD_S`), its grouped GPUs
whose newest sample is within :data:`FRESH_S` are compared with the other members of
their groups (those of its own hosts, and, with several workers, those of the other
workers' hosts as the facts topic has them at that minute:
:class:`~ragwatch.schema.GpuFact` in each :class:`~ragwatch.schema.HostFacts`), one
signal at a time, by :func:`ragwatch.detectors.replicas.judge`: the peers' median
(itself excluded), the ratio to it and whether it is *deviant* (at least 3 known
members, a robust z of 4 and far enough from the median in the signal's direction, with
absolute floors so a tight group does not page on noise: :data:`COMPARED`). Power is
compared per percent of utilisation while the GPU is busy (:data:`BUSY_PCT`): replicas
carry unequal shares of the load, and a cap or low clocks show as less power for the
same work. With other workers a minute is compared once every live worker that reads GPU
telemetry has processed it (its facts of that minute are in), at most
:data:`MAX_PENDING` minutes later.

What is compared is each GPU's values smoothed over about :data:`SMOOTH_S` (an
exponential moving average updated each minute: one noisy sample neither makes nor ends
a streak), the GPU signals ``replica_gpu_<name>_value``; the results are
``replica_gpu_<name>_peers`` (the median of the others), ``_ratio`` and ``_deviant`` (1
or 0; NaN: not compared), held in the pipeline's rows until the next comparison; how
long a GPU stays deviant is the rules' ``for:`` (``ReplicaGpu*Outlier`` in the default
rules).

>>> template_of("rag-api-7d9f8c6b5-x2k4p"), template_of("vllm-2"), template_of("trainer")
('rag-api', 'vllm', 'trainer')
>>> labels = {"host": "h1", "gpu": "0", "mig": "", "gpu_name": "NVIDIA H100",
...           "namespace": "prod", "pod": "rag-api-7d9f8c6b5-x2k4p", "container": "server"}
>>> group_of(labels), member_of(labels), group_of({"gpu_name": "NVIDIA H100"})
('NVIDIA H100 prod/rag-api/server', 'h1/0', None)
>>> import numpy as np
>>> util = np.full((4, len(COMPARED)), np.nan)
>>> util[:, 1] = [80.0, 5.0, 76.0, 82.0]  # four like GPUs: one stopped working
>>> out = compare(["g"] * 4, util)
>>> out[:, PEER_AT["replica_gpu_util_deviant"]].tolist()
[0.0, 1.0, 0.0, 0.0]
>>> float(out[1, PEER_AT["replica_gpu_util_peers"]])
80.0
"""

from __future__ import annotations

import logging
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.replicas import ReplicaParams, judge
from ragwatch.schema import GpuFact, Transition
from ragwatch.streams.alerting import gating
from ragwatch.streams.alerting.rules import Rule

if TYPE_CHECKING:
    from ragwatch.streams.pipelines.gpu import GpuPipeline

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
SeriesKey = tuple[str, int, str, int]

PERIOD_S = 60.0  # like GPUs compared once a minute of event time
FRESH_S = 120.0  # a member counts while its newest sample is this recent
# minutes waiting for slower workers' facts, then compared without them: the facts table
# keeps an hour of each host's GPUs (facts_table.GPU_HISTORY)
MAX_PENDING = 60
SMOOTH_S = 600.0  # each GPU's values are compared as moving averages over ~10 minutes
# signal -> (its short name in the peer signals, when a GPU is deviant among its peers)
COMPARED: dict[str, tuple[str, ReplicaParams]] = {
    # growing while its peers hold: the leak detector's rate (a caching allocator's steps
    # and a sawtooth's collections are not growth to it)
    "leak_gb_per_hour": ("mem", ReplicaParams("high", abs_floor=0.05)),
    # working far less than its peers (hung without an XID, drained by the balancer); z 3:
    # a balancer's shares spread replicas' load +-30 %, which puts an idle one only 3-5
    # robust deviations below the others (and at night, less)
    "gpu_util": ("util", ReplicaParams("low", z_min=3.0, abs_floor=5.0)),
    # drawing less power for the same work (a power cap, clocks held low): watts per
    # percent of utilisation, which the load's share does not move; only while busy
    # (25 % less: a cap that costs a quarter of the power for the same work is worth a look)
    "watts_per_util": ("power", ReplicaParams("low", z_min=3.0, abs_floor=0.5, rel_min=0.25)),
    # running hot (a fan, a blocked inlet): 12 C above its peers at least, at its own load
    # (load_shift: a replica that carries more of the load runs warmer)
    "temp_c": ("temp", ReplicaParams("high", z_min=3.0, abs_floor=3.0, rel_floor=0.05,
                                     rel_min=0.2)),
}  # fmt: skip
BUSY_PCT = 20.0  # watts per utilisation are compared while the GPU is at least this busy
MAX_C_PER_PCT = 1.0  # temperatures are compared at one load: at most 1 C per % utilisation
FIT_MEMBERS = 64  # ... the slope fitted on a group's first 64 members (2,016 pairs)
FIELDS = ("value", "peers", "ratio", "deviant")
PEER_SIGNALS: tuple[str, ...] = tuple(
    f"replica_gpu_{short}_{field}" for short, _ in COMPARED.values() for field in FIELDS
)
PEER_AT = {name: i for i, name in enumerate(PEER_SIGNALS)}
UTIL_AT, TEMP_AT = list(COMPARED).index("gpu_util"), list(COMPARED).index("temp_c")

_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated suffixes
_POD_SUFFIX = re.compile(rf"-[{_SAFE}]{{5}}$")  # a ReplicaSet's or DaemonSet's pod
_TEMPLATE_HASH = re.compile(rf"-[{_SAFE}]{{6,10}}$")  # a Deployment's pod-template-hash
_ORDINAL = re.compile(r"-\d+$")  # a StatefulSet's pod


def template_of(pod: str) -> str:
    """The pod's template: its name less the suffixes Kubernetes generates."""
    base = _POD_SUFFIX.sub("", pod)
    if base != pod:
        return _TEMPLATE_HASH.sub("", base)
    return _ORDINAL.sub("", pod)


def group_of(labels: Mapping[str, str]) -> str | None:
    """The group of a GPU series (its labels): its model, and its pod's namespace,
    template and container; None without a pod or a model."""
    pod, model = labels.get("pod"), labels.get("gpu_name")
    if not pod or not model:
        return None
    where = f"{labels.get('namespace', '')}/{template_of(pod)}/{labels.get('container', '')}"
    return f"{model} {where}"


def member_of(labels: Mapping[str, str]) -> str:
    """A GPU's name among its peers: ``host/gpu``, and ``/mig`` for a MIG instance."""
    name = f"{labels['host']}/{labels['gpu']}"
    return f"{name}/{labels['mig']}" if labels.get("mig") else name


def smooth(held: F64, new: F64, dt_s: float) -> F64:
    """The moving averages ``held`` moved towards ``new`` over ``dt_s`` (NaN held: start
    at the new value; NaN new: keep what is held).

    >>> smooth(np.array([10.0, np.nan, 5.0]), np.array([20.0, 3.0, np.nan]), 60.0).round(2)
    array([10.95,  3.  ,  5.  ])
    """
    alpha = 1.0 - np.exp(-max(dt_s, 0.0) / SMOOTH_S)
    moved = np.where(np.isnan(held), new, held + alpha * (new - held))
    return np.where(np.isnan(new), held, moved)


def compared_values(signals: Mapping[str, F64]) -> F64:
    """The values compared of some GPU rows (a column per :data:`COMPARED` quantity) from
    their signals' arrays."""
    util, power = signals["gpu_util"], signals["power_w"]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_util = np.where(util >= BUSY_PCT, power / util, np.nan)
    columns = {"leak_gb_per_hour": signals["leak_gb_per_hour"], "gpu_util": util,
               "watts_per_util": per_util, "temp_c": signals["temp_c"]}  # fmt: skip
    return np.column_stack([columns[name] for name in COMPARED])


def fact_values(fact: GpuFact) -> list[float]:
    """The compared signals of a published GPU, in :data:`COMPARED` order (NaN: unknown)."""
    return [float("nan") if (v := getattr(fact, s)) is None else v for s in COMPARED]


def compare(groups: Sequence[str], values: F64) -> F64:
    """The peer signals (a row per member, a column per :data:`PEER_SIGNALS`) of members
    in ``groups`` with ``values`` (a row per member, a column per :data:`COMPARED` signal;
    NaN: unknown): each member against the others of its group. A member alone in its
    group gets its values and no comparison (NaN)."""
    n = len(groups)
    out = np.full((n, len(PEER_SIGNALS)), np.nan)
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    temp, util = TEMP_AT, UTIL_AT
    for idx in members.values():
        at = np.array(idx, dtype=np.intp)
        for k, (_, params) in enumerate(COMPARED.values()):
            v = values[at, k]
            shift = load_shift(v, values[at, util]) if k == temp else np.zeros(len(at))
            med, _ratio, _z, dev = judge(v - shift, params)
            col = k * len(FIELDS)
            out[at, col] = v
            out[at, col + 1] = expected = med + shift  # at the member's own load
            with np.errstate(divide="ignore", invalid="ignore"):
                out[at, col + 2] = np.where(expected == 0, np.nan, v / expected)
            out[at, col + 3] = np.where(np.isfinite(med), dev, np.nan)
    return out


def load_shift(temp: F64, util: F64) -> F64:
    """How much warmer than at the group's median load each member runs for its own load:
    a Theil-Sen slope of temperature on utilisation across the group's members (the
    median of the slopes between pairs, at most :data:`FIT_MEMBERS` of them, held to 0 ..
    :data:`MAX_C_PER_PCT`) times the member's utilisation less the median. A replica that
    carries 1.8x the load runs warmer and is not hot; NaN utilisation: no shift.

    >>> load_shift(np.array([50.0, 60.0, 70.0, 90.0]), np.array([20.0, 45.0, 70.0, 70.0]))
    array([-15.,  -5.,   5.,   5.])
    """
    known = np.flatnonzero(np.isfinite(temp) & np.isfinite(util))[:FIT_MEMBERS]
    shift = np.zeros(len(temp))
    if len(known) < 3:
        return shift
    t, u = temp[known], util[known]
    i, j = np.triu_indices(len(known), 1)
    du, dt = u[j] - u[i], t[j] - t[i]
    apart = np.abs(du) >= 1.0  # pairs at the same load say nothing of the slope
    if not apart.any():
        return shift
    slope = min(max(float(np.median(dt[apart] / du[apart])), 0.0), MAX_C_PER_PCT)
    return np.where(np.isfinite(util), slope * (util - float(np.median(u))), 0.0)


def reads_peers(rule: Rule) -> bool:
    """Whether ``rule`` reads a GPU's comparison with its like GPUs (it is evaluated with
    the comparison, at the minute compared)."""
    return any(name.startswith("replica_gpu_") for name in rule.reads)


class PeerSource(Protocol):
    """The GPUs other workers own, as the facts topic has them
    (:class:`~.fleet.RemotePeers`)."""

    def gpus_at(self, at: float) -> Iterable[tuple[str, GpuFact]]:
        """Every published GPU with a group, as of event time ``at``: (host, fact)."""
        ...

    def ready(self, at: float) -> bool:
        """Whether every live worker that reads GPU telemetry has processed it up to
        ``at`` (their facts of that time are in)."""
        ...


@dataclass(frozen=True, eq=False)
class PeerSnapshot:
    """A pipeline's grouped GPUs at a minute, to compare with their like GPUs: their rows,
    keys, groups and compared values (smoothed)."""

    at: float
    rows: Rows
    keys: list[SeriesKey]
    groups: list[str]
    values: F64


class LikeGpus:
    """A GPU pipeline's GPUs against their like GPUs: its grouped rows, the next minute
    to take, the minutes taken that wait for the other workers' facts (``source``: those
    facts; None with one worker, whose minutes are compared as they are taken)."""

    def __init__(self, pipe: GpuPipeline) -> None:
        self.pipe = pipe
        self.grouped: dict[int, str] = {}  # row -> its group
        self.source: PeerSource | None = None
        self._next = -math.inf
        self._pending: deque[PeerSnapshot] = deque()
        self.compared = 0  # minutes compared
        self.incomplete = 0  # ... of which with a live worker still behind (waited too long)

    def add(self, row: int, labels: Mapping[str, str]) -> None:
        """A new GPU row: grouped if it has a group."""
        if (group := group_of(labels)) is not None:
            self.grouped[row] = group

    def due(self, ts: float) -> bool:
        """Whether a sample at ``ts`` begins a minute to take (there are GPUs to compare)."""
        return ts >= self._next and bool(self.grouped)

    def take(self, ts: float) -> list[Transition]:
        """A minute of event time began at ``ts``: move the grouped GPUs' moving averages,
        take them, compare them once the other workers' facts of it are in; the
        transitions of the minutes compared now."""
        pipe = self.pipe
        at = math.floor(ts / PERIOD_S) * PERIOD_S
        dt, self._next = at - (self._next - PERIOD_S), at + PERIOD_S
        rows = np.fromiter(self.grouped, dtype=np.intp, count=len(self.grouped))
        rows = np.sort(rows[pipe.index.last_seen[rows] >= at - FRESH_S])
        values = compared_values(pipe.signal_arrays(rows, True))
        for k, (short, _) in enumerate(COMPARED.values()):
            held = getattr(pipe, f"replica_gpu_{short}_value")
            held[rows] = values[:, k] = smooth(held[rows], values[:, k], dt)
        keys = [pipe.index.key(r) for r in rows.tolist()]
        groups = [self.grouped[r] for r in rows.tolist()]
        self._pending.append(PeerSnapshot(at, rows, keys, groups, values))
        return self.compare_ready()

    def compare_ready(self) -> list[Transition]:
        """Compare the minutes whose facts every other worker has published (all, with
        one worker), or that waited :data:`MAX_PENDING` minutes; the transitions of the
        rules on them, each at its minute (the same whenever it was compared)."""
        pending, source = self._pending, self.source
        out: list[Transition] = []
        while pending:
            if source is not None and not source.ready(pending[0].at):
                if len(pending) <= MAX_PENDING:
                    break
                self.incomplete += 1
                if self.incomplete in (1, 10, 100) or self.incomplete % 10_000 == 0:
                    log.warning(
                        "like GPUs of minute %.0f compared after %d minutes with a worker "
                        "still behind: its GPUs are left out (%d minute(s) so far)",
                        pending[0].at,
                        MAX_PENDING,
                        self.incomplete,
                    )
            snap = pending.popleft()
            self._compare(snap)
            out += self._evaluate(snap.at)
        return out

    def _evaluate(self, at: float) -> list[Transition]:
        """The rules on the grouped GPUs against their like GPUs, at minute ``at``: where
        one holds, or an alert of theirs is active (:mod:`~..alerting.gating`)."""
        pipe = self.pipe
        if not pipe.peer_rules or not self.grouped:
            return []
        rows = np.sort(np.fromiter(self.grouped, dtype=np.intp, count=len(self.grouped)))
        signals = pipe.signal_arrays(rows, True)
        picked = gating.pick(
            pipe.peer_rules, rows, signals, pipe.peer_watch, every=pipe.every_sample
        )
        if not picked:
            return []
        dicts = pipe.signal_dicts(np.array([p.row for p in picked], dtype=np.intp))
        ts = np.full(len(rows), at)
        fired = gating.evaluate(pipe.engine, picked, dicts, pipe.row_keys, ts, pipe.peer_watch)
        return [tr for _, tr in fired]

    def _compare(self, snap: PeerSnapshot) -> None:
        """Compare the snapshot's GPUs with their groups (the other workers' members as
        of its minute) and hold the results in the rows (NaN: the grouped rows not in it,
        and rows given to another series since)."""
        pipe = self.pipe
        self.compared += 1
        groups, values = list(snap.groups), [snap.values]
        if self.source is not None:
            theirs = [
                (f.group, fact_values(f))
                for host, f in self.source.gpus_at(snap.at)
                if f.ts >= snap.at - FRESH_S and not pipe.tracks(host)
            ]
            groups += [g for g, _ in theirs]
            values.append(np.array([v for _, v in theirs], dtype=np.float64))
            values[-1] = values[-1].reshape(-1, len(COMPARED))
        out = compare(groups, np.vstack(values))
        rows = snap.rows.tolist()
        held = [i for i, (r, k) in enumerate(zip(rows, snap.keys, strict=True))
                if pipe.index.get(k) == r]  # fmt: skip
        grouped = np.fromiter(self.grouped, dtype=np.intp, count=len(self.grouped))
        for j, name in enumerate(PEER_SIGNALS):
            if not name.endswith("_value"):  # the values are the moving averages, as held
                column = getattr(pipe, name)
                column[grouped] = np.nan
                column[snap.rows[held]] = out[held, j]
