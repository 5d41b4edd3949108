"""/proc readers against a fake proc tree of real files (no mocks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragwatch.agents.procinfo import (
    ProcessTable,
    ProcInfo,
    container_id_from_cgroup,
    pod_uid_from_cgroup,
)

ID = "3f2a9c" + "ab" * 29
PAGE = 4096


def write(root: Path, pid: int, **files: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


@pytest.fixture
def info(tmp_path: Path) -> ProcInfo:
    return ProcInfo(tmp_path, page_size=PAGE)


CGROUPS = {
    "docker cgroup v1": (
        f"12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n"
    ),
    "docker cgroup v2 (systemd driver)": f"0::/system.slice/docker-{ID}.scope\n",
    "docker cgroup v2 (cgroupfs driver)": f"0::/docker/{ID}\n",
    "containerd under kubernetes, cgroup v2": (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7a8b"
        f"_9c0d_1e2f3a4b5c6d.slice/cri-containerd-{ID}.scope\n"
    ),
    "kubernetes cgroupfs, cgroup v1": (
        f"4:memory:/kubepods/burstable/pod1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d/{ID}\n"
    ),
    "cri-o, cgroup v2": f"0::/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope\n",
    "podman, cgroup v2": f"0::/machine.slice/libpod-{ID}.scope/container\n",
    "podman, cgroup v1": f"10:memory:/machine.slice/libpod-{ID}.scope\n",
}


@pytest.mark.parametrize("text", CGROUPS.values(), ids=CGROUPS.keys())
def test_container_id_is_the_short_id(info: ProcInfo, tmp_path: Path, text: str) -> None:
    write(tmp_path, 7, cgroup=text)
    assert info.container_id(7) == ID[:12]


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-2.scope\n",
        "12:memory:/\n1:name=systemd:/init.scope\n",
        "0::/\n",  # private cgroup namespace: the id is not visible
        f"0::/machine.slice/libpod-conmon-{ID}.scope\n",  # podman's monitor, not the container
        "0::/kubepods.slice/kubepods-pod1.slice\n",
        "",
    ],
)
def test_no_container_outside_containers(info: ProcInfo, tmp_path: Path, text: str) -> None:
    write(tmp_path, 8, cgroup=text)
    assert info.container_id(8) is None


def test_rss_from_statm_then_status(info: ProcInfo, tmp_path: Path) -> None:
    write(tmp_path, 10, statm="5000 1234 100 1 0 2000 0\n", status="VmRSS:\t1 kB\n")
    write(tmp_path, 11, status="Name:\tx\nVmRSS:\t  2048 kB\nVmSwap:\t0 kB\n")
    write(tmp_path, 12, statm="garbage\n", status="Name:\tkthreadd\n")
    assert info.rss_bytes(10) == 1234 * PAGE
    assert info.rss_bytes(11) == 2048 * 1024
    assert info.rss_bytes(12) is None
    assert info.rss_bytes(99) is None


def test_name_and_existence(info: ProcInfo, tmp_path: Path) -> None:
    write(tmp_path, 20, comm="vllm-serve\n")
    write(tmp_path, 21, comm="\n")
    assert info.process_name(20) == "vllm-serve"
    assert info.process_name(21) is None
    assert info.process_name(22) is None
    assert info.exists(20) and not info.exists(22)
    assert info.container_id(22) is None


def test_the_real_proc_knows_this_process() -> None:
    real = ProcInfo()
    assert real.exists(os.getpid())
    assert (real.rss_bytes(os.getpid()) or 0) > 1024 * 1024
    assert real.process_name(os.getpid())


def test_container_id_from_cgroup_takes_the_deepest_match() -> None:
    outer, inner = "a" * 64, "b" * 64
    assert container_id_from_cgroup(f"0::/docker/{outer}/docker/{inner}\n") == "b" * 12


# ---------------------------------------------------------------- Kubernetes pod UIDs

UID = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
SYSTEMD_UID = UID.replace("-", "_")
STATIC_UID = "6e2ba2c1c1f0e1f4a5e6b4e3c2d1a0f9"  # a static pod's: a hash of its manifest
POD_CGROUPS = {
    "cgroupfs v1, burstable": (f"11:memory:/kubepods/burstable/pod{UID}/{ID}\n", UID),
    "cgroupfs v1, guaranteed": (f"4:pids:/kubepods/pod{UID}/{ID}\n1:name=systemd:/\n", UID),
    "cgroupfs v2, besteffort": (f"0::/kubepods/besteffort/pod{UID}/{ID}\n", UID),
    "systemd v2, burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}"
        f".slice/cri-containerd-{ID}.scope\n",
        UID,
    ),
    "systemd v2, guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        UID,
    ),
    "systemd v1, cri-o": (
        f"7:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{SYSTEMD_UID}.slice/crio-{ID}.scope\n",
        UID,
    ),
    "kind, nested under kubelet.slice": (
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        UID,
    ),
    "seen from a private cgroup namespace (cgroupfs)": (f"0::/../../pod{UID}/{ID}\n", UID),
    "seen from a private cgroup namespace (systemd)": (
        f"0::/../../kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        UID,
    ),
    "static pod": (
        f"0::/kubepods.slice/kubepods-pod{STATIC_UID}.slice/crio-{ID}.scope\n",
        STATIC_UID,
    ),
    "host process": ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
    "docker container": (f"0::/system.slice/docker-{ID}.scope\n", None),
    "not a pod uid": ("0::/kubepods.slice/kubepods-pod1.slice\n", None),
    "pod-like name outside kubepods": (f"0::/system.slice/pod{UID}/x\n", None),
    "private cgroup namespace, own cgroup": ("0::/\n", None),
}


@pytest.mark.parametrize(("text", "uid"), POD_CGROUPS.values(), ids=POD_CGROUPS.keys())
def test_pod_uid_from_cgroup(text: str, uid: str | None) -> None:
    assert pod_uid_from_cgroup(text) == uid


def test_cgroup_ids_read_the_container_and_the_pod_at_once(info: ProcInfo, tmp_path: Path) -> None:
    write(tmp_path, 40, cgroup=POD_CGROUPS["systemd v2, burstable"][0])
    write(tmp_path, 41, cgroup=f"0::/docker/{ID}\n")
    assert info.cgroup_ids(40) == (ID[:12], UID)
    assert info.cgroup_ids(41) == (ID[:12], None)
    assert info.cgroup_ids(42) == (None, None)


# ---------------------------------------------------------------- ProcessTable


def test_process_table_caches_identity_and_reads_rss_every_time(tmp_path: Path) -> None:
    write(tmp_path, 30, comm="rag-worker\n", statm="9 100 0\n", cgroup=f"0::/docker/{ID}\n")
    table = ProcessTable(ProcInfo(tmp_path, page_size=PAGE))
    first = table.sample(30, 5)
    (tmp_path / "30" / "comm").write_text("renamed\n")
    (tmp_path / "30" / "statm").write_text("9 200 0\n")
    second = table.sample(30, 6)
    assert (first.name, first.container, first.rss) == ("rag-worker", ID[:12], 100 * PAGE)
    assert (second.name, second.container, second.rss, second.gpu_mem) == (
        "rag-worker",
        ID[:12],
        200 * PAGE,
        6,
    )


def test_process_table_marks_missing_pids_dead(tmp_path: Path) -> None:
    table = ProcessTable(ProcInfo(tmp_path), fallback_name=lambda pid: f"p{pid}")
    s = table.sample(77, 1 << 30)
    assert (s.dead, s.name, s.rss, s.container, s.gpu_mem) == (True, "p77", None, None, 1 << 30)


def test_process_table_reports_exits_per_key_once(tmp_path: Path) -> None:
    table = ProcessTable(ProcInfo(tmp_path))
    assert table.exits((0, None), {1: "a", 2: "b"}) == []
    assert table.exits((1, None), {3: "c"}) == []
    assert table.exits((0, None), {2: "b"}) == [(1, "a")]
    assert table.exits((0, None), {2: "b"}) == []
    assert table.exits((1, None), {}) == [(3, "c")]


def test_process_table_knows_the_pod_of_a_pid(tmp_path: Path) -> None:
    write(
        tmp_path,
        50,
        comm="vllm\n",
        statm="9 100 0\n",
        cgroup=POD_CGROUPS["cgroupfs v1, burstable"][0],
    )
    write(tmp_path, 51, comm="python3\n", statm="9 100 0\n", cgroup="0::/user.slice\n")
    table = ProcessTable(ProcInfo(tmp_path, page_size=PAGE))
    table.sample(50, 1)
    assert table.pod_uid(50) == UID
    assert table.pod_uid(51) is None  # read on demand: a host process
    assert table.pod_uid(52) is None  # no such pid
