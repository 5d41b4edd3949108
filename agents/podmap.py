"""Kubernetes labels for GPU and process samples: who holds a device, who runs on it.

Pure functions over one tick's samples; the kubelet's answer (*holders*: device id ->
the containers allocated that device, :mod:`ragwatch.agents.podresources`) and each
process's pod UID (from ``/proc/<pid>/cgroup``, :mod:`ragwatch.agents.procinfo`) come in
as arguments. A sample's device id is its MIG device UUID if it is a MIG instance, else
its GPU UUID.

- A GPU (or MIG instance) sample gets ``namespace``/``pod``/``container`` when exactly
  one container holds its device.
- A process gets them only if its cgroup puts it in a pod (a host process on the same
  GPU stays unlabelled) *and* its pod UID is bound to a pod name: the kubelet names pods
  but not their UIDs, so a UID is bound to ``namespace/pod`` where it is the only pod
  UID running on a device that exactly one container holds. A binding that contradicts
  another (one UID on devices of two pods, two UIDs on devices of one pod) is not used.
  The process then takes the one container of its pod among its device's holders.
- So on a time-sliced (or MPS) GPU held by several containers, a process is labelled
  when its pod also runs alone on a device it holds exclusively, and its pod has one
  container among the holders. Otherwise it keeps the runtime's container id, and is
  counted as *unresolved*.

>>> web = ContainerRef("rag", "web-0", "server")
>>> gpu = GpuSample(0, "GPU-1", "H100", 1, 2, procs=(ProcessSample(7, "python", 1),))
>>> (labelled,), unresolved = attribute([gpu], {"GPU-1": (web,)}, {7: "uid-a"}.get)
>>> labelled.pod, labelled.procs[0].container, unresolved
('web-0', 'server', 0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ragwatch.schema import GpuSample, ProcessSample


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """One Kubernetes container: its namespace, pod name and container name."""

    namespace: str
    pod: str
    container: str


Holders = Mapping[str, tuple[ContainerRef, ...]]
PodUid = Callable[[int], str | None]  # pid -> pod UID from its cgroup, None outside pods
PodKey = tuple[str, str]  # (namespace, pod)


class HolderSource(Protocol):
    """What :class:`~ragwatch.agents.nvml.NvmlSource` needs of a kubelet client."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def holders(self) -> Holders: ...


def device_of(g: GpuSample) -> str:
    """The device id the kubelet uses for a sample: the MIG UUID, else the GPU UUID."""
    return g.mig or g.uuid


def bindings(gpus: Iterable[GpuSample], holders: Holders, pod_uid: PodUid) -> dict[str, PodKey]:
    """Pod UID -> (namespace, pod), from devices one container holds and one pod runs on."""
    pods_of: dict[str, set[PodKey]] = {}
    for g in gpus:
        held = holders.get(device_of(g), ())
        uids = {u for p in g.procs if (u := pod_uid(p.pid)) is not None}
        if len(held) == 1 and len(uids) == 1:
            pods_of.setdefault(uids.pop(), set()).add((held[0].namespace, held[0].pod))
    bound = {uid: next(iter(pods)) for uid, pods in pods_of.items() if len(pods) == 1}
    uids_of: dict[PodKey, int] = {}
    for key in bound.values():
        uids_of[key] = uids_of.get(key, 0) + 1
    return {uid: key for uid, key in bound.items() if uids_of[key] == 1}


def attribute(
    gpus: Sequence[GpuSample], holders: Holders, pod_uid: PodUid
) -> tuple[list[GpuSample], int]:
    """The samples with their Kubernetes labels, and how many pod processes stayed
    unresolved (see the module docstring)."""
    bound = bindings(gpus, holders, pod_uid)
    out, unresolved = [], 0
    for g in gpus:
        held = holders.get(device_of(g), ())
        procs = []
        for p in g.procs:
            labelled = _process(p, held, bound, pod_uid)
            unresolved += labelled is None
            procs.append(labelled or p)
        out.append(_gpu(g, held, tuple(procs)))
    return out, unresolved


def _process(
    p: ProcessSample, held: tuple[ContainerRef, ...], bound: Mapping[str, PodKey], pod_uid: PodUid
) -> ProcessSample | None:
    """``p`` labelled; ``p`` itself outside pods; None if in a pod that cannot be told."""
    uid = pod_uid(p.pid)
    if uid is None:
        return p
    key = bound.get(uid)
    mine = [c for c in held if (c.namespace, c.pod) == key]
    if len(mine) != 1:
        return None
    c = mine[0]
    return dataclasses.replace(p, namespace=c.namespace, pod=c.pod, container=c.container)


def _gpu(
    g: GpuSample, held: tuple[ContainerRef, ...], procs: tuple[ProcessSample, ...]
) -> GpuSample:
    if len(held) == 1:
        c = held[0]
        return dataclasses.replace(
            g, namespace=c.namespace, pod=c.pod, container=c.container, procs=procs
        )
    return dataclasses.replace(g, procs=procs) if procs != g.procs else g
