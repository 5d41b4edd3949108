"""Kubernetes labels on GPU and process samples: the NVML source (the real pynvml module
with its functions patched, tests/unit/test_nvml.py) with a fake /proc of real files and
the real kubelet client talking to a real PodResources peer (tests/kubelet.py); then the
attribution rules on their own (agents/podmap.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from ragwatch import codec
from ragwatch.agents.nvml import NvmlSource
from ragwatch.agents.podmap import ContainerRef, attribute
from ragwatch.agents.podresources import PodResources
from ragwatch.agents.procinfo import ProcInfo
from ragwatch.cli import main
from ragwatch.schema import GpuEnvelope, GpuSample, ProcessSample
from tests.kubelet import Kubelet, api, kubelet
from tests.unit.test_nvml import GIB, PAGE, FakeGpu, FakeNvml, two_migs, write_proc

__all__ = ["api", "kubelet"]  # fixtures

CID = "c0ffee" + "0" * 58
# pod UIDs, as the kubelet names the pods' cgroups
RETRIEVER, LLM, ROGUE, TRAIN, NOTEBOOK = (
    f"{n}1a2b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d" for n in ("0", "1", "2", "3", "4")
)


def systemd_cgroup(uid: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    )


def cgroupfs_cgroup(uid: str) -> str:
    return f"11:memory:/kubepods/burstable/pod{uid}/{CID}\n1:name=systemd:/\n"


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    write_proc(root, 100, "retriever", 100, systemd_cgroup(RETRIEVER))
    write_proc(root, 300, "python3", 100, "0::/user.slice/user-1000.slice/session-3.scope\n")
    write_proc(root, 400, "vllm", 100, cgroupfs_cgroup(LLM))
    write_proc(root, 500, "rogue", 100, systemd_cgroup(ROGUE))
    write_proc(root, 600, "trainer", 100, systemd_cgroup(TRAIN))
    write_proc(root, 601, "trainer", 100, systemd_cgroup(TRAIN))
    write_proc(root, 700, "jupyter", 100, systemd_cgroup(NOTEBOOK))
    return root


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    migs = two_migs()  # MIG-aaaa, MIG-bbbb
    migs[0].procs, migs[1].procs = [(400, 8 * GIB)], [(500, 1 * GIB)]
    fake = FakeNvml(
        [
            FakeGpu("GPU-0000", procs=[(100, 6 * GIB), (300, 1 * GIB)]),
            FakeGpu("GPU-1111", migs=migs),
            FakeGpu("GPU-2222", procs=[(600, 2 * GIB), (700, 2 * GIB)]),  # time-sliced
            FakeGpu("GPU-3333", procs=[(601, 4 * GIB)]),
        ]
    )
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def allocations(kubelet: Kubelet) -> Kubelet:
    kubelet.pods = {
        ("rag", "retriever-0"): {"server": [("nvidia.com/gpu", ["GPU-0000"])]},
        ("rag", "llm-0"): {"vllm": [("nvidia.com/mig-3g.40gb", ["MIG-aaaa"])]},
        ("team", "notebook"): {"jupyter": [("nvidia.com/gpu.shared", ["GPU-2222::0"])]},
        ("team", "train"): {
            "trainer": [
                ("nvidia.com/gpu.shared", ["GPU-2222::1"]),
                ("nvidia.com/gpu", ["GPU-3333"]),
            ]
        },
    }
    return kubelet


def sample(fleet: FakeNvml, proc_root: Path, kubelet: Kubelet) -> tuple[GpuEnvelope, NvmlSource]:
    pods = PodResources(kubelet.socket)
    src = NvmlSource("gpu-node-01", nvml=pynvml, proc=ProcInfo(proc_root, PAGE), pods=pods)
    with src:
        env, _ = src.sample()
    assert not pods.enabled, "closing the source closes the kubelet client"
    return env, src


def gpu(env: GpuEnvelope, uuid: str, mig: str | None = None) -> GpuSample:
    (g,) = [g for g in env.gpus if g.uuid == uuid and g.mig == mig]
    return g


def labels(s: GpuSample | ProcessSample) -> tuple[str | None, ...]:
    return s.namespace, s.pod, s.container


def test_a_gpu_held_by_one_container_labels_it_and_its_pod_process_not_the_host_one(
    fleet: FakeNvml, proc_root: Path, allocations: Kubelet
) -> None:
    env, _ = sample(fleet, proc_root, allocations)
    g0 = gpu(env, "GPU-0000")
    assert labels(g0) == ("rag", "retriever-0", "server")
    pod_proc, host_proc = g0.procs
    assert labels(pod_proc) == ("rag", "retriever-0", "server")  # container: the k8s name
    assert (host_proc.name, labels(host_proc)) == ("python3", (None, None, None))
    assert codec.decode(codec.encode(env)) == env


def test_mig_instances_are_labelled_by_their_own_holder(
    fleet: FakeNvml, proc_root: Path, allocations: Kubelet
) -> None:
    env, src = sample(fleet, proc_root, allocations)
    assert labels(gpu(env, "GPU-1111")) == (None, None, None)  # the parent: not allocated
    a = gpu(env, "GPU-1111", "MIG-aaaa")
    assert labels(a) == ("rag", "llm-0", "vllm")
    assert [(p.pid, labels(p)) for p in a.procs] == [(400, ("rag", "llm-0", "vllm"))]
    b = gpu(env, "GPU-1111", "MIG-bbbb")  # allocated to no one; a pod process runs on it
    assert labels(b) == (None, None, None)
    (rogue,) = b.procs
    assert labels(rogue) == (None, None, CID[:12])  # the runtime's id, as without a kubelet
    assert src.stats.pod_unresolved == 2  # the rogue, and the notebook (below)


def test_a_time_sliced_gpu_is_unlabelled_and_its_processes_told_apart_where_sound(
    fleet: FakeNvml, proc_root: Path, allocations: Kubelet
) -> None:
    env, src = sample(fleet, proc_root, allocations)
    shared = gpu(env, "GPU-2222")
    assert labels(shared) == (None, None, None)  # two containers hold it
    assert labels(gpu(env, "GPU-3333")) == ("team", "train", "trainer")
    trainer, jupyter = shared.procs
    # the trainer's pod also runs alone on GPU-3333, which it holds alone: bound
    assert labels(trainer) == ("team", "train", "trainer")
    # the notebook's pod holds no GPU of its own: which holder it is cannot be told
    assert labels(jupyter) == (None, None, CID[:12])
    assert src.stats.pod_unresolved == 2  # the notebook, the rogue on MIG-bbbb


def test_without_a_kubelet_nothing_is_labelled_or_counted(
    fleet: FakeNvml, proc_root: Path, tmp_path: Path
) -> None:
    pods = PodResources(tmp_path / "absent.sock")
    src = NvmlSource("gpu-node-01", nvml=pynvml, proc=ProcInfo(proc_root, PAGE), pods=pods)
    with src:
        env, _ = src.sample()
    assert all(labels(g) == (None, None, None) for g in env.gpus)
    assert gpu(env, "GPU-0000").procs[0].container == CID[:12]
    assert src.stats.pod_unresolved == 0


def test_the_agent_command_labels_what_it_prints(
    fleet: FakeNvml,
    proc_root: Path,
    allocations: Kubelet,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["agent", "--source", "nvml", "--once", "--json", "--host", "gpu-node-01"]
    argv += ["--proc-root", str(proc_root), "--pod-resources-socket", str(allocations.socket)]
    assert main(argv, environ={}) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if '"gpus"' in x]
    g0 = json.loads(line)["gpus"][0]
    assert (g0["namespace"], g0["pod"], g0["container"]) == ("rag", "retriever-0", "server")
    assert g0["procs"][0]["pod"] == "retriever-0" and g0["procs"][1]["pod"] is None


def test_the_agent_command_can_leave_the_kubelet_alone(
    fleet: FakeNvml, proc_root: Path, allocations: Kubelet, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["agent", "--source", "nvml", "--once", "--json", "--no-pod-resources"]
    assert main([*argv, "--proc-root", str(proc_root)], environ={}) == 0
    assert allocations.calls == 0
    assert '"pod":"retriever-0"' not in capsys.readouterr().out.replace(" ", "")


def test_an_explicit_socket_that_is_absent_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["agent", "--source", "nvml", "--once", "--json"]
    code = main([*argv, "--pod-resources-socket", str(tmp_path / "none.sock")], environ={})
    assert code == 2
    assert "--pod-resources-socket" in capsys.readouterr().err


# ---------------------------------------------------------------- the rules alone

A, B = ContainerRef("ns", "a", "main"), ContainerRef("ns", "b", "main")
B2 = ContainerRef("ns", "b", "sidecar")


def dev(uuid: str, *pids: int) -> GpuSample:
    procs = tuple(ProcessSample(pid, f"p{pid}", 1) for pid in pids)
    return GpuSample(0, uuid, "H100", 1, 2, procs=procs)


def test_one_uid_on_devices_of_two_pods_is_bound_to_neither() -> None:
    uids = {1: "x", 2: "x"}
    out, unresolved = attribute([dev("G1", 1), dev("G2", 2)], {"G1": (A,), "G2": (B,)}, uids.get)
    assert [labels(g) for g in out] == [("ns", "a", "main"), ("ns", "b", "main")]
    assert [labels(g.procs[0]) for g in out] == [(None, None, None)] * 2 and unresolved == 2


def test_two_uids_on_devices_of_one_pod_are_bound_to_it_neither() -> None:
    uids = {1: "x", 2: "y"}
    out, unresolved = attribute([dev("G1", 1), dev("G2", 2)], {"G1": (A,), "G2": (A,)}, uids.get)
    assert unresolved == 2 and all(g.procs[0].pod is None for g in out)


def test_two_pods_on_a_device_one_holds_are_told_apart_by_their_other_devices() -> None:
    uids = {1: "x", 2: "y", 3: "x"}
    gpus = [dev("G1", 1, 2), dev("G2", 3)]  # y: another pod that sees G1 without holding it
    out, unresolved = attribute(gpus, {"G1": (A,), "G2": (A,)}, uids.get)
    assert [p.pod for p in out[0].procs] == ["a", None] and unresolved == 1


def test_a_pod_with_two_containers_on_a_shared_device_is_not_guessed() -> None:
    uids = {1: "y", 2: "y"}
    gpus = [dev("G1", 1), dev("G2", 2)]
    out, unresolved = attribute(gpus, {"G1": (A, B, B2), "G2": (B,)}, uids.get)
    assert out[0].procs[0].pod is None and out[1].procs[0].pod == "b" and unresolved == 1


def test_a_leak_in_a_pod_pages_with_its_namespace_pod_and_container(
    fleet: FakeNvml, proc_root: Path, allocations: Kubelet
) -> None:
    """End to end but for Kafka: the kubelet peer, the NVML source, the wire, the worker's
    GPU pipeline; the retriever pod's process leaks 1.2 GB/h and is paged once, by name."""
    from ragwatch.streams.alerting.rules import load_rules
    from ragwatch.streams.pipelines.gpu import GpuPipeline

    t0, step = 1_767_225_600.0, 30.0
    now = [t0]
    src = NvmlSource(
        "gpu-node-01",
        nvml=pynvml,
        proc=ProcInfo(proc_root, PAGE),
        pods=PodResources(allocations.socket),
        clock=lambda: now[0],
    )
    pipe, pages = GpuPipeline(load_rules()), []
    leaky = fleet.gpus[0]
    with src:
        for i in range(int(3 * 3600 / step)):
            now[0] = t0 + i * step
            grown = int(max(0.0, now[0] - t0 - 1800) / 3600 * 1.2e9)  # leaks from 30 min on
            leaky.procs = [(100, 6 * GIB + grown), (300, 1 * GIB)]
            leaky.used = 10 * GIB + grown
            env, _ = src.sample()
            wire = codec.decode_gpu_wire(codec.encode(env))
            pages += [t.alert for t in pipe.process_wire(wire) if t.notify]
    (page,) = pages  # 1.2 GB/h with ~70 GB free: OOM in ~2.5 days, the warning rule
    assert (page.rule, page.status, page.labels["pid"]) == ("GpuMemoryLeakSlow", "firing", "100")
    pod = {k: page.labels[k] for k in ("namespace", "pod", "container")}
    assert pod == {"namespace": "rag", "pod": "retriever-0", "container": "server"}
