"""The NVML source against the real ``pynvml`` module with its functions patched.

No GPU is needed: :class:`FakeNvml` holds a small GPU fleet and replaces the ``nvml*``
functions of the real module (monkeypatch), answering with pynvml's own ctypes structs
and raising pynvml's own ``NVMLError`` subclasses, as the C library would.
"""

from __future__ import annotations

import ctypes
import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from ragwatch import codec
from ragwatch.agents.nvml import NvmlSource, NvmlUnavailable
from ragwatch.agents.procinfo import ProcInfo
from ragwatch.errors import ConfigError
from ragwatch.schema import EventEnvelope, GpuEnvelope, GpuSample

GIB = 1024**3
MIB = 1024**2
PAGE = 4096
NO_INSTANCE = 0xFFFFFFFF
CRI = "c0ffee" + "0" * 58
DOCKER = "d0c4e1" + "1" * 58


@dataclass
class FakeMig:
    slot: int
    gi: int
    ci: int
    uuid: str
    name: str
    total: int
    used: int
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GIB
    used: int = 10 * GIB
    reserved: int = 512 * MIB
    util: tuple[int, int] = (55, 21)
    temp: int = 47
    power_mw: int = 312_500
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    migs: list[FakeMig] | None = None
    errors: dict[str, int] = field(default_factory=dict)
    supported_events: int = pynvml.nvmlEventTypeAll


class FakeNvml:
    """A GPU fleet behind the ``nvml*`` functions of the real pynvml module."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.events: deque[Any] = deque()
        self.init_error: int | None = None
        self.names: dict[int, str] = {}
        self.calls: Counter[str] = Counter()
        self.registered: dict[int, int] = {}
        self.freed = self.shut_down = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                assert hasattr(pynvml, name), name
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    # handles are real c_nvmlDevice_t pointers with distinct addresses
    def handle(self, index: int, slot: int | None = None) -> Any:
        address = 0x1000 * (index + 1) + (0 if slot is None else 0x10 * (slot + 1))
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)

    def _dev(self, handle: Any, fn: str) -> FakeGpu | FakeMig:
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        gpu = self.gpus[address // 0x1000 - 1]
        slot = (address % 0x1000) // 0x10 - 1
        dev: FakeGpu | FakeMig = gpu
        if slot >= 0:
            assert gpu.migs is not None
            dev = next(m for m in gpu.migs if m.slot == slot)
        self.calls[fn] += 1
        if fn in dev.errors:
            raise pynvml.NVMLError(dev.errors[fn])
        return dev

    def _whole(self, handle: Any, fn: str) -> FakeGpu:
        dev = self._dev(handle, fn)
        if isinstance(dev, FakeMig):  # NVML has no utilisation, power or temp per MIG device
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev

    def xid(self, index: int, xid: int, gi: int = NO_INSTANCE, ci: int = NO_INSTANCE) -> None:
        self.event(index, pynvml.nvmlEventTypeXidCriticalError, xid, gi, ci)

    def event(self, index: int, kind: int, data: int, gi: int = NO_INSTANCE, ci: int = 0) -> None:
        self.events.append(
            pynvml.c_nvmlEventData_t(
                device=self.handle(index),
                eventType=kind,
                eventData=data,
                gpuInstanceId=gi,
                computeInstanceId=ci if gi != NO_INSTANCE else NO_INSTANCE,
            )
        )

    # ------------------------------------------------------------ system
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid not in self.names:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self.names[pid]

    # ------------------------------------------------------------ devices
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._dev(self.handle(index), "nvmlDeviceGetHandleByIndex")
        return self.handle(index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self.gpus.index(self._whole(handle, "nvmlDeviceGetIndex"))

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        dev = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        reserved = dev.reserved if isinstance(dev, FakeGpu) else 0
        free = dev.total - dev.used - reserved
        if version:
            return pynvml.c_nvmlMemory_v2_t(version, dev.total, reserved, free, dev.used)
        return pynvml.c_nvmlMemory_t(dev.total, free, dev.used + reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._whole(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(*gpu.util)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._whole(handle, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        return self._whole(handle, "nvmlDeviceGetTemperatureV").temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._whole(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        dev = self._dev(handle, "nvmlDeviceGetComputeRunningProcesses")
        if isinstance(dev, FakeGpu) and dev.migs:  # aggregate view needs privileges
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        gi, ci = (dev.gi, dev.ci) if isinstance(dev, FakeMig) else (NO_INSTANCE, NO_INSTANCE)
        out = []
        for pid, used in dev.procs:  # as pynvml builds them from the C array
            mem = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            obj = pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_t(pid, mem, gi, ci))
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    # ------------------------------------------------------------ MIG
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._whole(handle, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.migs else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._whole(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:
        gpu = self._whole(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not any(m.slot == slot for m in gpu.migs or ()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self.handle(self.gpus.index(gpu), slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        dev = self._dev(handle, "nvmlDeviceGetGpuInstanceId")
        assert isinstance(dev, FakeMig)
        return dev.gi

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        dev = self._dev(handle, "nvmlDeviceGetComputeInstanceId")
        assert isinstance(dev, FakeMig)
        return dev.ci

    # ------------------------------------------------------------ events
    def nvmlEventSetCreate(self) -> Any:
        return pynvml.c_nvmlEventSet_t()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._whole(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        gpu = self._whole(handle, "nvmlDeviceRegisterEvents")
        if types & ~gpu.supported_events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered[self.gpus.index(gpu)] = types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the agent must never block on events"
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed += 1


def write_proc(root: Path, pid: int, comm: str, rss_pages: int, cgroup: str) -> None:
    """One process of a fake proc tree: the files ProcInfo reads."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "statm").write_text(f"{rss_pages * 3} {rss_pages} 100 10 0 {rss_pages} 0\n")
    (d / "status").write_text(f"Name:\t{comm}\nVmRSS:\t{rss_pages * PAGE // 1024} kB\n")
    (d / "cgroup").write_text(cgroup)


def two_migs() -> list[FakeMig]:
    return [
        FakeMig(0, 1, 0, "MIG-aaaa", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GIB, 9 * GIB),
        FakeMig(3, 5, 0, "MIG-bbbb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * GIB, 2 * GIB),
    ]


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    v2 = f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CRI}.scope\n"
    write_proc(root, 100, "vllm-serve", 1000, v2)
    write_proc(root, 200, "rag-worker", 500, f"12:memory:/docker/{DOCKER}\n1:name=systemd:/\n")
    write_proc(root, 300, "python3", 200, "0::/user.slice/user-1000.slice/session-3.scope\n")
    write_proc(root, 400, "mig-a", 10, "0::/\n")
    write_proc(root, 500, "mig-b", 10, "0::/\n")
    return root


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(
        [
            FakeGpu("GPU-0000", procs=[(100, 60 * GIB), (200, 6 * GIB)]),
            FakeGpu("GPU-1111", procs=[(300, 1 * GIB)]),
            FakeGpu("GPU-2222", name="NVIDIA H100 80GB HBM3", procs=[]),
        ]
    )
    fake.install(monkeypatch)
    return fake


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def source(fleet: FakeNvml, proc_root: Path) -> NvmlSource:
    src = NvmlSource("gpu-node-01", nvml=pynvml, proc=ProcInfo(proc_root, PAGE), clock=Clock())
    src.open()
    return src


def gpu(env: GpuEnvelope, index: int, mig: str | None = None) -> GpuSample:
    (g,) = [g for g in env.gpus if g.index == index and g.mig == mig]
    return g


# ---------------------------------------------------------------- sampling


def test_samples_every_gpu_with_memory_utilisation_temperature_power(
    fleet: FakeNvml, proc_root: Path
) -> None:
    env, events = source(fleet, proc_root).sample()
    assert env.host == "gpu-node-01" and events == []
    assert [(g.index, g.uuid, g.mig) for g in env.gpus] == [
        (0, "GPU-0000", None),
        (1, "GPU-1111", None),
        (2, "GPU-2222", None),
    ]
    g0 = gpu(env, 0)
    assert (g0.name, g0.fb_used, g0.fb_total, g0.fb_reserved) == (
        "NVIDIA H100 80GB HBM3",
        10 * GIB,
        80 * GIB,
        512 * MIB,
    )
    assert (g0.gpu_util, g0.mem_copy_util, g0.temp_c, g0.power_w) == (55.0, 21.0, 47.0, 312.5)


def test_processes_carry_name_rss_and_container_from_proc(fleet: FakeNvml, proc_root: Path) -> None:
    env, _ = source(fleet, proc_root).sample()
    vllm, rag = gpu(env, 0).procs
    assert (vllm.pid, vllm.name, vllm.gpu_mem, vllm.rss) == (
        100,
        "vllm-serve",
        60 * GIB,
        1000 * PAGE,
    )
    assert vllm.container == CRI[:12]  # cgroup v2, containerd under Kubernetes
    assert (rag.name, rag.container, rag.dead) == ("rag-worker", DOCKER[:12], False)  # v1
    (host_proc,) = gpu(env, 1).procs
    assert (host_proc.name, host_proc.container) == ("python3", None)


def test_static_data_is_read_once(fleet: FakeNvml, proc_root: Path) -> None:
    src = source(fleet, proc_root)
    for _ in range(5):
        src.sample()
    assert fleet.calls["nvmlDeviceGetHandleByIndex"] == 3
    assert fleet.calls["nvmlDeviceGetUUID"] == 3
    assert fleet.calls["nvmlDeviceGetName"] == 3
    assert fleet.calls["nvmlDeviceGetMemoryInfo"] == 15


def test_mig_gpu_yields_its_parent_and_one_sample_per_instance(
    fleet: FakeNvml, proc_root: Path
) -> None:
    migs = two_migs()
    migs[0].procs, migs[1].procs = [(400, 8 * GIB)], [(500, 1 * GIB)]
    fleet.gpus[1] = FakeGpu("GPU-1111", used=11 * GIB, migs=migs)
    env, _ = source(fleet, proc_root).sample()
    assert [(g.index, g.mig) for g in env.gpus] == [
        (0, None),
        (1, None),
        (1, "MIG-aaaa"),
        (1, "MIG-bbbb"),
        (2, None),
    ]
    parent = gpu(env, 1)
    assert (parent.fb_used, parent.temp_c, parent.power_w, parent.procs) == (
        11 * GIB,
        47.0,
        312.5,
        (),
    )
    a, b = gpu(env, 1, "MIG-aaaa"), gpu(env, 1, "MIG-bbbb")
    assert (a.uuid, a.name, a.fb_used, a.fb_total) == (
        "GPU-1111",
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        9 * GIB,
        40 * GIB,
    )
    assert (a.gpu_util, a.mem_copy_util, a.temp_c, a.power_w) == (None, None, None, None)
    assert [(p.pid, p.name, p.gpu_mem) for p in a.procs] == [(400, "mig-a", 8 * GIB)]
    assert [(p.pid, p.gpu_mem) for p in b.procs] == [(500, 1 * GIB)]
    assert b.fb_total == 10 * GIB


def test_mig_instance_without_a_readable_uuid_is_named_by_gpu_and_compute_instance(
    fleet: FakeNvml, proc_root: Path
) -> None:
    migs = two_migs()
    migs[1].errors["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_UNKNOWN
    fleet.gpus[0] = FakeGpu("GPU-0000", migs=migs)
    env, _ = source(fleet, proc_root).sample()
    assert [g.mig for g in env.gpus if g.index == 0] == [None, "MIG-aaaa", "GI5/CI0"]


def test_not_supported_fields_are_none_and_not_asked_again(
    fleet: FakeNvml, proc_root: Path
) -> None:
    not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
    for fn in ("Temperature", "TemperatureV", "PowerUsage", "UtilizationRates"):
        fleet.gpus[2].errors[f"nvmlDeviceGet{fn}"] = not_supported
    src = source(fleet, proc_root)
    for _ in range(3):
        env, _ = src.sample()
    g2 = gpu(env, 2)
    assert (g2.gpu_util, g2.mem_copy_util, g2.temp_c, g2.power_w) == (None, None, None, None)
    assert gpu(env, 0).temp_c == 47.0
    assert fleet.calls["nvmlDeviceGetPowerUsage"] == 2 * 3 + 1
    assert src.stats.errors == 0
    assert codec.decode(codec.encode(env)) == env


def test_other_field_errors_are_none_and_counted(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    src = source(fleet, proc_root)
    env, _ = src.sample()
    assert gpu(env, 0).power_w is None and gpu(env, 0).temp_c == 47.0
    assert src.stats.errors == 1


def test_memory_v1_fallback_reports_used_with_reserved_and_no_reserved(
    fleet: FakeNvml, proc_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1_only = fleet.nvmlDeviceGetMemoryInfo

    def old_driver(handle: Any, version: int | None = None) -> Any:
        if version:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return v1_only(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", old_driver)
    src = source(fleet, proc_root)
    src.sample()
    env, _ = src.sample()
    g0 = gpu(env, 0)
    assert (g0.fb_used, g0.fb_reserved) == (10 * GIB + 512 * MIB, None)
    assert fleet.calls["nvmlDeviceGetMemoryInfo"] == 6  # v2 not retried after it failed


def test_legacy_temperature_call_when_the_driver_lacks_temperature_v(
    fleet: FakeNvml, proc_root: Path
) -> None:
    for g in fleet.gpus:
        g.errors["nvmlDeviceGetTemperatureV"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    src = source(fleet, proc_root)
    src.sample()
    env, _ = src.sample()
    assert [g.temp_c for g in env.gpus] == [47.0, 47.0, 47.0]
    assert fleet.calls["nvmlDeviceGetTemperatureV"] == 1


# ---------------------------------------------------------------- failures


def test_a_lost_gpu_is_skipped_while_the_others_are_sampled(
    fleet: FakeNvml, proc_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = source(fleet, proc_root)
    fleet.gpus[1].errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with caplog.at_level(logging.INFO, logger="ragwatch.agents.nvml"):
        for _ in range(3):
            env, _ = src.sample()
            assert [g.index for g in env.gpus] == [0, 2]
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "gpu=1" in warnings[0].getMessage()
        assert "GPU is lost" in warnings[0].getMessage()
        assert src.stats.errors == 3
        del fleet.gpus[1].errors["nvmlDeviceGetMemoryInfo"]
        env, _ = src.sample()
    assert [g.index for g in env.gpus] == [0, 1, 2]
    assert any("sampled again" in r.getMessage() for r in caplog.records)


def test_a_gpu_without_a_handle_at_open_is_retried(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[2].errors["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_GPU_IS_LOST
    src = source(fleet, proc_root)
    env, _ = src.sample()
    assert [g.index for g in env.gpus] == [0, 1]
    assert src.stats.errors == 2  # at open and at the tick
    del fleet.gpus[2].errors["nvmlDeviceGetHandleByIndex"]
    env, _ = src.sample()
    assert [g.index for g in env.gpus] == [0, 1, 2]
    assert 2 in fleet.registered


def test_a_failing_mig_instance_is_skipped_and_its_siblings_kept(
    fleet: FakeNvml, proc_root: Path
) -> None:
    migs = two_migs()
    migs[0].errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_UNKNOWN
    fleet.gpus[0] = FakeGpu("GPU-0000", migs=migs)
    src = source(fleet, proc_root)
    env, _ = src.sample()
    assert [g.mig for g in env.gpus if g.index == 0] == [None, "MIG-bbbb"]
    assert src.stats.errors == 1


# ---------------------------------------------------------------- processes


def test_a_pid_gone_from_proc_is_dead_and_named_by_nvml(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[1].procs.append((4242, 3 * GIB))
    fleet.names[4242] = "/usr/bin/python3.11"
    env, _ = source(fleet, proc_root).sample()
    dead = gpu(env, 1).procs[-1]
    assert (dead.pid, dead.name, dead.gpu_mem, dead.dead) == (4242, "python3.11", 3 * GIB, True)
    assert (dead.rss, dead.container) == (None, None)
    assert not gpu(env, 1).procs[0].dead


def test_unknown_process_memory_is_zero_and_counted(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[1].procs = [(300, None)]
    src = source(fleet, proc_root)
    env, _ = src.sample()
    assert gpu(env, 1).procs[0].gpu_mem == 0
    assert src.stats.unknown_gpu_mem == 1


def test_process_exit_is_reported_once(fleet: FakeNvml, proc_root: Path) -> None:
    src = source(fleet, proc_root)
    src.sample()
    fleet.gpus[0].procs = [(100, 60 * GIB)]  # rag-worker (pid 200) left GPU 0
    env, events = src.sample()
    assert [(e.type, e.attrs) for e in events] == [
        ("process_exit", {"gpu": 0, "pid": 200, "process": "rag-worker"})
    ]
    assert events[0].ts == env.ts
    assert src.sample()[1] == []


def test_no_exit_is_reported_when_the_process_list_cannot_be_read(
    fleet: FakeNvml, proc_root: Path
) -> None:
    src = source(fleet, proc_root)
    src.sample()
    fleet.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_UNKNOWN
    env, events = src.sample()
    assert gpu(env, 0).procs == () and events == []
    del fleet.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"]
    assert src.sample()[1] == []


def test_process_exit_on_a_mig_instance_names_it(fleet: FakeNvml, proc_root: Path) -> None:
    migs = two_migs()
    migs[1].procs = [(500, GIB)]
    fleet.gpus[0] = FakeGpu("GPU-0000", migs=migs)
    src = source(fleet, proc_root)
    src.sample()
    migs[1].procs = []
    _, events = src.sample()
    assert [e.attrs for e in events] == [
        {"gpu": 0, "pid": 500, "process": "mig-b", "mig": "MIG-bbbb"}
    ]


# ---------------------------------------------------------------- events


def test_xid_is_an_event_drained_once_not_a_sticky_gauge(fleet: FakeNvml, proc_root: Path) -> None:
    src = source(fleet, proc_root)
    fleet.xid(1, 79)
    env, events = src.sample()
    assert [(e.type, e.attrs) for e in events] == [
        ("xid", {"gpu": 1, "uuid": "GPU-1111", "xid": 79})
    ]
    assert events[0].ts == env.ts and events[0].host == "gpu-node-01"
    assert src.sample()[1] == []
    assert src.stats.events == 1


def test_several_events_in_one_tick_and_device_events(fleet: FakeNvml, proc_root: Path) -> None:
    src = source(fleet, proc_root)
    fleet.xid(0, 48)
    fleet.event(2, pynvml.nvmlEventTypeDoubleBitEccError, 1)
    fleet.xid(0, 63)
    _, events = src.sample()
    assert [(e.type, e.attrs.get("xid"), e.attrs.get("event"), e.attrs["gpu"]) for e in events] == [
        ("xid", 48, None, 0),
        ("device_event", None, "double_bit_ecc", 2),
        ("xid", 63, None, 0),
    ]
    for e in events:
        assert codec.decode(codec.encode(e)) == e


def test_an_xid_on_a_mig_instance_names_the_instance(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[0] = FakeGpu("GPU-0000", migs=two_migs())
    src = source(fleet, proc_root)
    fleet.xid(0, 43, gi=5, ci=0)
    (event,) = src.sample()[1]
    assert event.attrs == {"gpu": 0, "uuid": "GPU-0000", "mig": "MIG-bbbb", "xid": 43}


def test_mig_change_event_rereads_the_mig_layout(fleet: FakeNvml, proc_root: Path) -> None:
    migs = two_migs()
    fleet.gpus[0] = FakeGpu("GPU-0000", migs=migs)
    src = source(fleet, proc_root)
    del migs[1]
    fleet.event(0, pynvml.nvmlEventMigConfigChange, 0)
    env, events = src.sample()
    assert events[0].attrs["event"] == "mig_config_change"
    assert [g.mig for g in env.gpus if g.index == 0] == [None, "MIG-aaaa"]


def test_an_unreadable_mig_mode_keeps_the_known_instances(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[0] = FakeGpu("GPU-0000", procs=[(100, GIB)], migs=two_migs())
    src = source(fleet, proc_root)
    fleet.gpus[0].errors["nvmlDeviceGetMigMode"] = pynvml.NVML_ERROR_UNKNOWN
    fleet.event(0, pynvml.nvmlEventMigConfigChange, 0)
    for _ in range(2):
        env, _ = src.sample()
        assert [g.mig for g in env.gpus if g.index == 0] == [None, "MIG-aaaa", "MIG-bbbb"]
    del fleet.gpus[0].errors["nvmlDeviceGetMigMode"]
    fleet.gpus[0].migs = None  # MIG turned off
    env, _ = src.sample()
    assert [g.mig for g in env.gpus if g.index == 0] == [None]
    assert [p.pid for p in gpu(env, 0).procs] == [100]


def test_events_are_registered_only_where_supported(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[1].supported_events = pynvml.nvmlEventTypeXidCriticalError
    fleet.gpus[2].errors["nvmlDeviceRegisterEvents"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    src = source(fleet, proc_root)
    assert fleet.registered[1] == pynvml.nvmlEventTypeXidCriticalError
    assert fleet.registered[0] & pynvml.nvmlEventTypeDoubleBitEccError
    assert fleet.registered[0] & pynvml.nvmlEventTypeGpuUnavailableError
    assert 2 not in fleet.registered
    env, _ = src.sample()
    assert [g.index for g in env.gpus] == [0, 1, 2]


# ---------------------------------------------------------------- lifecycle


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_no_driver_is_a_one_line_config_error(
    fleet: FakeNvml, proc_root: Path, code: int, reason: str
) -> None:
    fleet.init_error = code
    with pytest.raises(NvmlUnavailable) as info:
        source(fleet, proc_root)
    message = str(info.value)
    assert isinstance(info.value, ConfigError)
    assert "\n" not in message and "NVML" in message and "--source sim" in message
    assert reason in message
    assert fleet.shut_down == 0


def test_a_host_without_gpus_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, proc_root: Path
) -> None:
    empty = FakeNvml([])
    empty.install(monkeypatch)
    with pytest.raises(NvmlUnavailable, match=r"no NVIDIA GPU found.*--source sim"):
        source(empty, proc_root)
    assert empty.shut_down == 1


def test_start_event_names_versions_and_gpus(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[1] = FakeGpu("GPU-1111", migs=two_migs())
    event = source(fleet, proc_root).start_event()
    assert isinstance(event, EventEnvelope) and event.type == "agent_start"
    a = event.attrs
    assert (a["source"], a["driver_version"], a["cuda_version"], a["nvml_version"]) == (
        "nvml",
        "550.54.15",
        "12.4",
        "12.550.54.15",
    )
    assert a["gpu_count"] == 3
    assert [(g["index"], g["uuid"], g["name"]) for g in a["gpus"]] == [
        (0, "GPU-0000", "NVIDIA H100 80GB HBM3"),
        (1, "GPU-1111", "NVIDIA H100 80GB HBM3"),
        (2, "GPU-2222", "NVIDIA H100 80GB HBM3"),
    ]
    assert a["gpus"][1]["mig"] == ["MIG-aaaa", "MIG-bbbb"]
    assert "xid" in a["events"] and "double_bit_ecc" in a["events"]
    assert codec.decode(codec.encode(event)) == event


def test_envelope_round_trips_through_the_codec(fleet: FakeNvml, proc_root: Path) -> None:
    fleet.gpus[1] = FakeGpu("GPU-1111", migs=two_migs())
    fleet.gpus[0].procs.append((4242, None))
    env, _ = source(fleet, proc_root).sample()
    assert codec.decode(codec.encode(env)) == env


def test_close_frees_the_event_set_and_shuts_nvml_down_once(
    fleet: FakeNvml, proc_root: Path
) -> None:
    src = source(fleet, proc_root)
    src.close()
    src.close()
    assert (fleet.freed, fleet.shut_down) == (1, 1)
    with pytest.raises(RuntimeError):
        src.sample()


def test_pynvml_is_imported_lazily_and_used_as_a_context_manager(
    fleet: FakeNvml, proc_root: Path
) -> None:
    with NvmlSource("h1", proc=ProcInfo(proc_root, PAGE)) as src:
        env, _ = src.sample()
    assert len(env.gpus) == 3 and fleet.shut_down == 1


def test_host_must_not_be_empty() -> None:
    with pytest.raises(ValueError):
        NvmlSource("", nvml=pynvml)
