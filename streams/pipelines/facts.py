"""The facts a pipeline publishes about a host or a service instance, for the hints.

A hint (:mod:`.hints`) joins two sides: what a host's GPUs say (leaking processes, GPUs
near full: :class:`~ragwatch.schema.HostFacts`) and what the service instances on it say
(their symptoms and demand: :class:`~ragwatch.schema.InstanceFacts`). Each pipeline
states its side as these records, read from its own series (:func:`host_facts`,
:func:`instance_facts`); the hints read the records, never a pipeline. A pipeline takes
the facts of its own side at the wave in which an alert starts firing (the state moves
on within a batch) and hands them on with the wave's transitions (a
:class:`~.base.Step`); the other side does not move during that batch, and is read after
it through a :class:`Summary`.

>>> from ragwatch.agents.scenario import build
>>> from ragwatch.schema import GpuEnvelope
>>> from ragwatch.streams.pipelines.gpu import GpuPipeline
>>> from ragwatch.streams.alerting.rules import load_rules
>>> pipe = GpuPipeline(load_rules())
>>> for env in build("leak", hosts=1, gpus=1, services=1, interval_s=60.0).envelopes(hours=2):
...     _ = pipe.process(env) if isinstance(env, GpuEnvelope) else None
>>> facts = pipe.facts("gpu-node-01")
>>> [(leak.pid, round(leak.gb_per_hour, 2)) for leak in facts.leaks], facts.full
([('4001', 1.18)], ())
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.leak import GB
from ragwatch.schema import GpuFact, HostFacts, InstanceFacts, LeakFact
from ragwatch.streams.pipelines.base import GpuSeriesState, InstanceState
from ragwatch.streams.pipelines.gpu_peers import group_of, member_of

F64 = npt.NDArray[np.float64]
LEAK_MIN_BYTES = 0.25 * GB  # grown over the leak window, steadily
LEAK_MIN_STEADINESS = 0.7
GPU_FULL_RATIO = 0.90


class Summary(Protocol):
    """The published facts a hint reads: a host's, an instance's, and those of the
    instances that run on a host."""

    def host(self, host: str) -> HostFacts: ...

    def instance(self, service: str, instance: str) -> InstanceFacts | None: ...

    def instances_on(self, host: str) -> list[InstanceFacts]:
        """The instances whose requests name ``host``, in (service, instance) order."""
        ...


def host_facts(
    host: str,
    series: Mapping[tuple[str, int, str, int], GpuSeriesState],
    ts: float | None = None,
) -> HostFacts:
    """The facts of ``host`` from its GPU series and its leaking process series (those
    :func:`leaking` picks), by key ``(host, gpu, mig, pid)`` (pid -1: the GPU's own
    series); ``ts``: the event time of its newest sample (the newest of ``series`` if
    None)."""
    if not series:
        return HostFacts(host)
    leaks = [_leak(s) for key, s in series.items() if key[3] >= 0]
    full, gpus = [], []
    for key, s in sorted(series.items()):
        if key[3] >= 0:
            continue
        ratio = s.signals.get("fb_used_ratio")
        if ratio is not None and ratio >= GPU_FULL_RATIO:
            full.append((s.labels["gpu"], ratio))
        if (fact := _gpu(s)) is not None:
            gpus.append(fact)
    return HostFacts(
        host,
        max(s.last_ts for s in series.values()) if ts is None else ts,
        tuple(sorted(leaks, key=lambda lk: -lk.gb_per_hour)),
        tuple(full),
        tuple(gpus),
    )


def _gpu(s: GpuSeriesState) -> GpuFact | None:
    """A GPU series as its like GPUs compare with it (None: it has no group)."""
    group = group_of(s.labels)
    if group is None:
        return None
    sig = s.signals
    return GpuFact(
        member_of(s.labels),
        group,
        s.last_ts,
        sig.get("replica_gpu_mem_value"),  # as smoothed for the comparison (.gpu_peers)
        sig.get("replica_gpu_util_value"),
        sig.get("replica_gpu_power_value"),
        sig.get("replica_gpu_temp_value"),
    )


def leaking(signals: Mapping[str, F64]) -> npt.NDArray[np.bool_]:
    """Which process series (their signals' arrays) leak: memory grown steadily enough
    to name, at a positive rate (the recent one, else the whole window's); a NaN is no
    leak."""
    recent, rate = signals["recent_gb_per_hour"], signals["gb_per_hour"]
    rate = np.where(np.isnan(recent), rate, recent)
    with np.errstate(invalid="ignore"):
        grown = signals["mem_increase_bytes"] >= LEAK_MIN_BYTES
        return grown & (signals["mem_steadiness"] >= LEAK_MIN_STEADINESS) & (rate > 0)


def _leak(s: GpuSeriesState) -> LeakFact:
    """A leaking process series (:func:`leaking`) as a hint names it."""
    sig = s.signals
    rate = sig.get("recent_gb_per_hour")
    if rate is None:
        rate = sig.get("gb_per_hour")
    assert rate is not None  # leaking: it has a rate
    lab = s.labels
    return LeakFact(
        lab["gpu"],
        lab["pid"],
        lab["process"],
        lab["container"],
        rate,
        sig.get("tte_h"),
        f"{lab['namespace']}/{lab['pod']}" if "pod" in lab else "",
    )


def instance_facts(s: InstanceState) -> InstanceFacts:
    """The facts of one service instance from its request series."""
    labels = s.labels
    return InstanceFacts(
        labels["service"],
        labels["instance"],
        s.host,
        s.bucket_end,
        dict(s.signals),
        s.outlier_label,
        s.anomalous,
    )


class Captured:
    """A :class:`Summary` that answers with the facts a wave captured first (its own
    side, as of that wave), and asks ``live`` for the rest (the other side)."""

    def __init__(
        self,
        live: Summary,
        hosts: Mapping[str, HostFacts],
        instances: Mapping[tuple[str, str], InstanceFacts],
    ) -> None:
        self.live, self.hosts, self.instances = live, hosts, instances

    def host(self, host: str) -> HostFacts:
        found = self.hosts.get(host)
        return found if found is not None else self.live.host(host)

    def instance(self, service: str, instance: str) -> InstanceFacts | None:
        found = self.instances.get((service, instance))
        return found if found is not None else self.live.instance(service, instance)

    def instances_on(self, host: str) -> list[InstanceFacts]:
        return [
            self.instances.get((f.service, f.instance), f) for f in self.live.instances_on(host)
        ]
