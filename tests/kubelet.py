"""A real kubelet PodResources peer for tests: the published v1 ``api.proto``
(tests/protos/podresources/v1/, vendored verbatim) compiled with ``grpc_tools.protoc``
into a temporary folder, served by ``grpc.server`` on a unix socket.

The agent's client builds its own message types; this side uses the generated code of
the published proto, so the two meet on the wire as the agent and a kubelet would.
"""

from __future__ import annotations

import importlib
import importlib.resources
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

PROTOS = Path(__file__).resolve().parent / "protos"
PROTO = "podresources/v1/api.proto"


@dataclass(frozen=True)
class Api:
    pb2: ModuleType
    grpc: ModuleType


def compile_api(out: Path) -> Api:
    """Compile the vendored proto into ``out`` and import the generated modules."""
    from grpc_tools import protoc

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}"]
    assert protoc.main([*args, f"--grpc_python_out={out}", PROTO]) == 0
    sys.path.insert(0, str(out))
    try:
        return Api(
            importlib.import_module("podresources.v1.api_pb2"),
            importlib.import_module("podresources.v1.api_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory) -> Api:
    return compile_api(tmp_path_factory.mktemp("podresources_pb"))


# (resource name, device ids) per container, by (namespace, pod)
Devices = list[tuple[str, list[str]]]


@dataclass
class Kubelet:
    """What the fake kubelet answers, and how: ``pods`` maps (namespace, pod) to
    {container: [(resource, device ids)]}; ``hold`` delays every answer until
    ``release`` is set (a stuck kubelet)."""

    api: Api
    socket: Path
    pods: dict[tuple[str, str], dict[str, Devices]] = field(default_factory=dict)
    calls: int = 0
    hold: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    server: Any = None

    def response(self) -> Any:
        pb = self.api.pb2
        resp = pb.ListPodResourcesResponse()
        for (namespace, name), containers in self.pods.items():
            pod = resp.pod_resources.add(name=name, namespace=namespace)
            for cname, devices in containers.items():
                c = pod.containers.add(name=cname, cpu_ids=[2, 3])  # fields the agent skips
                c.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
                c.dynamic_resources.add(claim_name="claim", claim_namespace=namespace)
                for resource, ids in devices:
                    d = c.devices.add(resource_name=resource, device_ids=ids)
                    d.topology.nodes.add(ID=1)
        return resp

    def start(self) -> Kubelet:
        kubelet = self

        class Lister(self.api.grpc.PodResourcesListerServicer):  # type: ignore[misc]
            def List(self, request: Any, context: Any) -> Any:
                kubelet.calls += 1
                if kubelet.hold:
                    kubelet.release.wait(10)
                return kubelet.response()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.api.grpc.add_PodResourcesListerServicer_to_server(Lister(), self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.stop(grace=None).wait(5)
            self.server = None


@pytest.fixture
def kubelet(api: Api, tmp_path: Path) -> Iterator[Kubelet]:
    """A running fake kubelet with no pods, on ``<tmp_path>/kubelet.sock``."""
    k = Kubelet(api, tmp_path / "kubelet.sock").start()
    yield k
    k.stop()
