"""The kubelet PodResources client against a real gRPC peer (tests/kubelet.py): the
published v1 proto, compiled at test time, served on a unix socket."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from google.protobuf import descriptor

from ragwatch.agents import podresources
from ragwatch.agents.podmap import ContainerRef
from ragwatch.agents.podresources import PodResources
from tests.kubelet import Api, Kubelet, api, kubelet

__all__ = ["api", "kubelet"]  # fixtures

GPU_A = "GPU-8f2c41d0-1b7e-4c5a-9d3e-6a0b1c2d3e4f"
GPU_B = "GPU-1c0ffee0-2b7e-4c5a-9d3e-6a0b1c2d3e4f"
GPU_C = "GPU-2d0ffee0-2b7e-4c5a-9d3e-6a0b1c2d3e4f"
MIG_X = "MIG-4a6b8c0d-1e2f-5a3b-8c4d-9e0f1a2b3c4d"
LOGGER = "ragwatch.agents.podresources"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client(kubelet: Kubelet, clock: Clock | None = None, **kw: float) -> PodResources:
    return PodResources(kubelet.socket, clock=clock or Clock(), **kw)


def test_lists_the_gpu_and_mig_devices_of_each_container(kubelet: Kubelet) -> None:
    kubelet.pods = {
        ("rag", "retriever-0"): {"server": [("nvidia.com/gpu", [GPU_A])]},
        ("rag", "llm-0"): {
            "vllm": [("nvidia.com/mig-1g.10gb", [MIG_X])],
            "fpga-sidecar": [("example.com/fpga", ["fpga0"])],  # not a GPU: ignored
        },
        ("team", "notebook"): {"jupyter": [("nvidia.com/gpu.shared", [f"{GPU_B}::0"])]},
        ("team", "train"): {
            "trainer": [("nvidia.com/gpu", [f"{GPU_B}::3", f"{GPU_C}::1", f"{GPU_C}::2"])]
        },
        ("kube-system", "coredns"): {"coredns": []},
    }
    pods = client(kubelet)
    pods.open()
    assert pods.enabled and pods.stats.lists == 1 and kubelet.calls == 1
    assert pods.holders() == {
        GPU_A: (ContainerRef("rag", "retriever-0", "server"),),
        MIG_X: (ContainerRef("rag", "llm-0", "vllm"),),
        GPU_B: (
            ContainerRef("team", "notebook", "jupyter"),
            ContainerRef("team", "train", "trainer"),
        ),
        GPU_C: (ContainerRef("team", "train", "trainer"),),  # two replicas, one holder
    }
    pods.close()


def test_the_agents_messages_have_the_published_field_numbers(api: Api) -> None:
    """Each field the agent declares has the name, number, label and type of the
    published api.proto; a published message parses into the agent's (the rest of its
    fields ignored)."""
    request, response = podresources.messages()
    pool = request.DESCRIPTOR.file.pool
    for name, fields in podresources._MESSAGES.items():
        published = api.pb2.DESCRIPTOR.message_types_by_name[name]
        ours = pool.FindMessageTypeByName(f"v1.{name}")
        for field_name, number, *_ in fields:
            theirs: descriptor.FieldDescriptor = published.fields_by_name[field_name]
            mine = ours.fields_by_name[field_name]
            assert (mine.number, mine.type) == (number, theirs.type), (name, field_name)
            assert mine.is_repeated == theirs.is_repeated, (name, field_name)
            if theirs.message_type is not None:
                assert mine.message_type.name == theirs.message_type.name
    wire = api.pb2.ListPodResourcesResponse()
    pod = wire.pod_resources.add(name="p", namespace="n")
    pod.containers.add(name="c", cpu_ids=[1]).devices.add(
        resource_name="nvidia.com/gpu", device_ids=[GPU_A]
    ).topology.nodes.add(ID=0)
    parsed = response.FromString(wire.SerializeToString())
    assert podresources.holders_from_response(parsed) == {GPU_A: (ContainerRef("n", "p", "c"),)}


def test_refreshes_at_most_every_refresh_s(kubelet: Kubelet) -> None:
    kubelet.pods = {("rag", "a"): {"c": [("nvidia.com/gpu", [GPU_A])]}}
    clock = Clock()
    pods = client(kubelet, clock, refresh_s=10.0)
    pods.open()
    for _ in range(5):
        clock.now += 1.0
        pods.holders()
    assert kubelet.calls == 1
    kubelet.pods = {("rag", "b"): {"c": [("nvidia.com/gpu", [GPU_A])]}}
    clock.now += 5.0
    assert pods.holders()[GPU_A][0].pod == "a"  # a call started; its answer comes later
    pods.wait()
    assert pods.holders()[GPU_A][0].pod == "b" and kubelet.calls == 2
    pods.close()


def test_kubelet_down_keeps_the_last_answer_for_keep_s_then_drops_it(
    kubelet: Kubelet, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.pods = {("rag", "a"): {"c": [("nvidia.com/gpu", [GPU_A])]}}
    clock = Clock()
    pods = client(kubelet, clock, refresh_s=10.0, keep_s=30.0)
    pods.open()
    kubelet.stop()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(2):  # two failed refreshes, one warning
            clock.now += 10.0
            pods.holders()
            pods.wait()
            assert GPU_A in pods.holders()
        assert pods.stats.errors == 2 and pods.stats.last_error
        assert pods.stats.last_error.startswith("UNAVAILABLE")
        clock.now += 11.0  # 31 s since the last answer
        assert pods.holders() == {}
        assert pods.stats.expired == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # the failure spell, then the drop
    assert "List failed: UNAVAILABLE" in warnings[0] and "keeping the last answer" in warnings[0]
    assert "dropped" in warnings[1]
    pods.close()


def test_a_kubelet_back_is_used_again_and_said_so(
    api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    first = Kubelet(api, sock, pods={("rag", "a"): {"c": [("nvidia.com/gpu", [GPU_A])]}})
    first.start()
    clock = Clock()
    pods = PodResources(sock, clock=clock, timeout_s=1.0, refresh_s=1.0, keep_s=1.0)
    pods.open()
    first.stop()
    clock.now += 2.0
    pods.holders()
    pods.wait()
    assert pods.holders() == {} and pods.stats.errors == 1
    again = Kubelet(api, sock, pods={("rag", "b"): {"c": [("nvidia.com/gpu", [GPU_A])]}})
    again.start()
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            deadline = time.monotonic() + 5.0
            while not pods.holders() and time.monotonic() < deadline:
                clock.now += 2.0  # the channel reconnects on its own backoff
                pods.wait()
        assert pods.holders()[GPU_A] == (ContainerRef("rag", "b", "c"),)
        assert any("answering again" in r.getMessage() for r in caplog.records)
    finally:
        pods.close()
        again.stop()


def test_a_stuck_kubelet_hits_the_deadline_and_never_blocks_the_tick(kubelet: Kubelet) -> None:
    kubelet.pods = {("rag", "a"): {"c": [("nvidia.com/gpu", [GPU_A])]}}
    clock = Clock()
    pods = client(kubelet, clock, timeout_s=0.3, refresh_s=1.0, keep_s=60.0)
    pods.open()
    kubelet.hold = True
    clock.now += 1.0
    started = time.monotonic()
    for _ in range(20):  # ticks while the call hangs in the kubelet
        assert GPU_A in pods.holders()
    # blocked, one tick alone would wait out the 0.3 s deadline; the margin below it is
    # for a loaded machine's scheduler, not for the 20 reads (microseconds)
    assert time.monotonic() - started < 0.25
    while kubelet.calls < 2 and time.monotonic() - started < 0.3:
        time.sleep(0.005)
    assert kubelet.calls == 2  # one call in flight at a time
    pods.wait()
    assert pods.stats.errors == 1 and (pods.stats.last_error or "").startswith("DEADLINE")
    assert time.monotonic() - started < 1.0
    pods.close()


def test_a_stuck_kubelet_at_open_delays_it_by_the_deadline_only(kubelet: Kubelet) -> None:
    kubelet.hold = True
    pods = client(kubelet, timeout_s=0.2)
    started = time.monotonic()
    pods.open()
    assert time.monotonic() - started < 1.0
    assert pods.enabled and pods.holders() == {} and pods.stats.errors == 1
    pods.close()


def test_an_absent_socket_turns_attribution_off_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pods = PodResources(tmp_path / "no-kubelet.sock")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        pods.open()
        for _ in range(3):
            assert pods.holders() == {}
    assert not pods.enabled and pods.stats.errors == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "absent" in line and "attribution off" in line
    pods.close()


@pytest.mark.parametrize(
    ("raw", "device"),
    [
        (GPU_A, GPU_A),
        (f"{GPU_A}::7", GPU_A),
        (MIG_X, MIG_X),
        (
            "MIG-GPU-8f2c41d0-1b7e-4c5a-9d3e-6a0b1c2d3e4f/1/0",
            "MIG-GPU-8f2c41d0-1b7e-4c5a-9d3e-6a0b1c2d3e4f/1/0",
        ),
    ],
    ids=["gpu", "time-sliced replica", "mig", "legacy mig id"],
)
def test_device_ids(raw: str, device: str) -> None:
    assert podresources.device_id(raw) == device


def test_intervals_are_checked() -> None:
    with pytest.raises(ValueError):
        PodResources(keep_s=1.0, refresh_s=10.0)
