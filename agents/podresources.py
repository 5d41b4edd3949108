"""Which Kubernetes container holds each GPU: the kubelet's PodResources API (v1, ``List``).

The kubelet serves ``PodResourcesLister`` over a unix socket (:data:`DEFAULT_SOCKET`);
``List`` names, for every pod on the node, the devices each container was allocated.
:class:`PodResources` turns the answer into *holders*: device id -> the
:class:`ContainerRef` (namespace, pod, container) that hold it. Only NVIDIA devices are
kept (``nvidia.com/gpu``, ``nvidia.com/gpu.shared`` and ``nvidia.com/mig-*``); their ids
are GPU UUIDs or MIG device UUIDs, with a time-slicing replica suffix (``GPU-<uuid>::3``)
stripped, so a time-sliced GPU lists every container that got a replica.

The messages are built at run time from a ``FileDescriptorProto`` with the field numbers
of the published ``api.proto`` (no generated code pinned to a protobuf version); fields
the kubelet sends that are not declared here (CPU ids, memory, topology, DRA) are
ignored.

The sampling tick never waits on the kubelet: :meth:`PodResources.holders` starts a
``List`` (with a deadline of ``timeout_s``) at most every ``refresh_s`` seconds and
takes its answer at a later tick. If the kubelet stops answering, the last answer is
kept for ``keep_s`` seconds, then dropped; errors are counted in ``stats`` and logged
once per failure spell. If the socket does not exist at :meth:`PodResources.open`,
attribution is off for good (logged once).

>>> device_id("GPU-8f2c41d0-1b7e-4c5a-9d3e-6a0b1c2d3e4f::3")
'GPU-8f2c41d0-1b7e-4c5a-9d3e-6a0b1c2d3e4f'
>>> is_gpu_resource("nvidia.com/mig-1g.10gb"), is_gpu_resource("example.com/fpga")
(True, False)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ragwatch.agents.podmap import ContainerRef, Holders
from ragwatch.schema import is_label

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared"})
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_ROOT_HINT = " (only root may connect to the kubelet's socket: docs/kubernetes.md)"
MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # a node with hundreds of pods stays far below

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_ONE = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_MANY = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
# message -> its fields (name, number, label, type, message type), as in the published
# staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto; the rest is left out.
_MESSAGES: dict[str, tuple[tuple[str, int, int, int, str], ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, _MANY, _MESSAGE, "PodResources"),),
    "PodResources": (
        ("name", 1, _ONE, _STRING, ""),
        ("namespace", 2, _ONE, _STRING, ""),
        ("containers", 3, _MANY, _MESSAGE, "ContainerResources"),
    ),
    "ContainerResources": (
        ("name", 1, _ONE, _STRING, ""),
        ("devices", 2, _MANY, _MESSAGE, "ContainerDevices"),
    ),
    "ContainerDevices": (
        ("resource_name", 1, _ONE, _STRING, ""),
        ("device_ids", 2, _MANY, _STRING, ""),
    ),
}


@cache
def messages() -> tuple[Any, Any]:
    """The (request, response) classes of ``List``, from a private descriptor pool."""
    f = descriptor_pb2.FileDescriptorProto(
        name="ragwatch/kubelet_podresources_v1.proto", package="v1", syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        m = f.message_type.add(name=name)
        for field_name, number, label, kind, type_name in fields:
            fd = m.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                fd.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("v1.ListPodResourcesRequest")),
        get(pool.FindMessageTypeByName("v1.ListPodResourcesResponse")),
    )


def device_id(raw: str) -> str:
    """The device's own id: a time-slicing replica suffix (``::<n>``) stripped."""
    return raw.split("::", 1)[0]


def is_gpu_resource(name: str) -> bool:
    """Whether a resource name is an NVIDIA GPU or MIG device (or a shared one)."""
    return name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)


def _label(v: str) -> bool:
    return bool(v) and is_label(v)  # the kubelet's names are never empty


def holders_from_response(resp: Any) -> dict[str, tuple[ContainerRef, ...]]:
    """Device id -> the containers holding it, in the kubelet's order, each once."""
    out: dict[str, list[ContainerRef]] = {}
    for pod in resp.pod_resources:
        for c in pod.containers:
            ref = ContainerRef(pod.namespace, pod.name, c.name)
            if not all(map(_label, (ref.namespace, ref.pod, ref.container))):
                continue
            for dev in c.devices:
                if not is_gpu_resource(dev.resource_name):
                    continue
                for raw in dev.device_ids:
                    refs = out.setdefault(device_id(raw), [])
                    if ref not in refs:
                        refs.append(ref)
    return {k: tuple(v) for k, v in out.items()}


@dataclass
class PodResourcesStats:
    """Counters of one client: answers, failed calls, answers dropped for age."""

    lists: int = 0
    errors: int = 0
    expired: int = 0
    last_error: str | None = None


class PodResources:
    """A non-blocking, refreshing view of the kubelet's device allocations.

    ``open()`` first (it waits for the first answer, at most ``timeout_s``), then
    :meth:`holders` at every tick, ``close()`` last. ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        socket: Path = DEFAULT_SOCKET,
        *,
        timeout_s: float = 2.0,
        refresh_s: float = 10.0,
        keep_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_s <= 0 or refresh_s <= 0 or keep_s < refresh_s:
            raise ValueError("need timeout_s > 0, refresh_s > 0 and keep_s >= refresh_s")
        self.socket = socket
        self.timeout_s, self.refresh_s, self.keep_s = timeout_s, refresh_s, keep_s
        self._clock = clock
        self.stats = PodResourcesStats()
        self.enabled = False
        self._channel: grpc.Channel | None = None
        self._list: Any = None
        self._call: Any = None  # the List in flight (a grpc.Future), or None
        self._holders: dict[str, tuple[ContainerRef, ...]] = {}
        self._answered_at: float | None = None
        self._due = 0.0
        self._failing = False

    def open(self) -> None:
        """Connect if the socket exists (else attribution is off) and take a first answer."""
        if self.enabled:
            return
        if not os.path.exists(self.socket):
            log.info("kubelet socket=%s absent: Kubernetes pod attribution off", self.socket)
            return
        self.enabled = True
        self.holders()
        self.wait()

    def _connect(self) -> None:
        """A new channel (after a failure too: no waiting out gRPC's reconnect backoff)."""
        if self._channel is not None:
            self._channel.close()
        request, response = messages()
        self._channel = grpc.insecure_channel(
            f"unix://{os.path.abspath(self.socket)}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )

    def close(self) -> None:
        """Cancel a call in flight and close the channel; safe to call twice."""
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self.enabled = False

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the call in flight, if any (at most its deadline), and take its answer."""
        if self._call is not None:
            self._call.exception(timeout=timeout_s or self.timeout_s + 1.0)
        self._take()

    def holders(self) -> Holders:
        """The holders of each device as last answered; never waits on the kubelet."""
        if not self.enabled:
            return {}
        self._take()
        now = self._clock()
        if self._call is None and now >= self._due:
            self._due = now + self.refresh_s
            if self._channel is None or self._failing:
                self._connect()
            self._call = self._list.future(messages()[0](), timeout=self.timeout_s)
        if self._answered_at is not None and now - self._answered_at > self.keep_s:
            self._expire(now - self._answered_at)
        return self._holders

    def _take(self) -> None:
        call = self._call
        if call is None or not call.done():
            return
        self._call = None
        if call.cancelled():
            return
        error = call.exception()
        if error is None:
            self._answered(call.result())
        else:
            self._failed(error)

    def _answered(self, resp: Any) -> None:
        self._holders = holders_from_response(resp)
        self._answered_at = self._clock()
        self.stats.lists += 1
        if self._failing:
            log.info("kubelet socket=%s: answering again", self.socket)
        self._failing = False

    def _failed(self, error: BaseException) -> None:
        code = error.code() if isinstance(error, grpc.Call) else None
        details = error.details() if isinstance(error, grpc.Call) else str(error)
        reason = f"{getattr(code, 'name', type(error).__name__)}: {details}"
        self.stats.errors += 1
        self.stats.last_error = reason
        if not self._failing:
            hint = _ROOT_HINT if "ermission denied" in reason else ""
            log.warning(
                "kubelet socket=%s: List failed: %s%s; keeping the last answer up to %gs",
                self.socket,
                reason,
                hint,
                self.keep_s,
            )
        self._failing = True

    def _expire(self, age: float) -> None:
        if self._holders:
            log.warning(
                "kubelet socket=%s: no answer for %.0fs; pod attribution dropped until it answers",
                self.socket,
                age,
            )
            self.stats.expired += 1
        self._holders = {}
