"""The NVML source of ``ragwatch agent --source nvml``: real GPUs, one envelope per tick.

:class:`NvmlSource` reads every GPU of this host through NVML (the ``pynvml`` module of
``nvidia-ml-py``, injectable for tests) and returns one :class:`GpuEnvelope` per
:meth:`NvmlSource.sample`, plus the events seen since the previous tick:

- ``xid``: an XID critical error from the NVML event set, emitted once when it happens
  (not a gauge that keeps its last value);
- ``device_event``: another critical NVML event (double-bit ECC, GPU unavailable,
  recovery action, fatal poison, row-remap failure, MIG reconfiguration);
- ``process_exit``: a pid listed on a GPU (or MIG instance) at the previous tick is gone.

What is read, and how gaps are reported:

- Static data (handles, names, UUIDs, MIG layout) is read at :meth:`open` and cached;
  the MIG layout is re-read every ``MIG_REFRESH_TICKS`` ticks and on a MIG change event.
- ``fb_used``/``fb_reserved`` follow ``nvmlMemory_v2`` (``used`` excludes the driver's
  reserved memory, as ``nvidia-smi`` shows it). Where v2 is unavailable the v1 ``used``
  (which includes the reserved memory) is reported with ``fb_reserved=None``.
- A field whose NVML call raises (``NotSupported``, or any other ``NVMLError``) is
  ``None``; ``NotSupported`` is remembered and the call not repeated. An error reading a
  GPU's memory skips that GPU for the tick (one warning per failure spell, ``errors``
  counted every time) while the other GPUs are still sampled.
- Processes: ``usedGpuMemory`` unknown to NVML (``None``) is reported as ``0`` and
  counted in ``stats.unknown_gpu_mem``. A pid absent from ``/proc`` is reported with
  ``dead=True`` (memory still held by a process that is gone).

MIG: a GPU in MIG mode yields its parent sample (``mig=None``: whole-GPU memory,
temperature and power, ``procs=()``) *and* one sample per MIG device (same ``index``
and ``uuid``; ``mig`` = the MIG device UUID, or ``GI<gi>/CI<ci>`` if that cannot be
read; ``name`` from the MIG handle, which names the profile; memory from the MIG handle;
utilisation, temperature and power ``None``; processes from the MIG handle). Processes
are listed only on instances, so none is counted twice.

NVML reports host pids: run the agent in the host PID namespace (``--pid=host``,
``hostPID: true``) with the host's ``/proc`` visible, or every process looks ``dead``.

Kubernetes: given ``pods`` (a kubelet PodResources client,
:class:`~ragwatch.agents.podresources.PodResources`), GPU, MIG and process samples get
``namespace``/``pod``/``container`` by the rules of :mod:`ragwatch.agents.podmap`; pod
processes that cannot be told apart are counted in ``stats.pod_unresolved``.

>>> cuda_version_string(12040)
'12.4'
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragwatch.agents import podmap
from ragwatch.agents.procinfo import ProcessTable, ProcInfo
from ragwatch.errors import ConfigError
from ragwatch.schema import EventEnvelope, GpuEnvelope, GpuSample, ProcessSample

log = logging.getLogger(__name__)

MIG_REFRESH_TICKS = 60
MAX_EVENTS_PER_TICK = 256
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of an event not tied to a MIG instance
EVENTS = {  # pynvml constant -> event name (xid, or device_event's "event" attribute)
    "nvmlEventTypeXidCriticalError": "xid",
    "nvmlEventTypeDoubleBitEccError": "double_bit_ecc",
    "nvmlEventTypeGpuUnavailableError": "gpu_unavailable",
    "nvmlEventTypeGpuRecoveryAction": "gpu_recovery_action",
    "nvmlEventTypeFatalPoisonError": "fatal_poison",
    "nvmlEventTypeDramRetirementFailure": "dram_retirement_failure",
    "nvmlEventMigConfigChange": "mig_config_change",
}
_WHY = {  # pynvml error class -> (reason, way out) for NvmlUnavailable
    "NVMLError_LibraryNotFound": ("libnvidia-ml.so.1 not found", "install the NVIDIA driver"),
    "NVMLError_DriverNotLoaded": ("NVIDIA driver not loaded", "run on a GPU host"),
    "NVMLError_NoPermission": ("no permission to open the GPUs", "grant /dev/nvidia* access"),
}


_NO_GPU_FIX = "run on a GPU host, or use --source sim"


class NvmlUnavailable(ConfigError):
    """NVML cannot be used on this host; the message says why and what to do instead."""


def cuda_version_string(version: int) -> str:
    """NVML's CUDA driver version integer (``1000 * major + 10 * minor``) as ``"12.4"``."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _address(handle: Any) -> int | None:
    """The pointer value of an NVML handle, to recognise it in event data."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


@dataclass
class NvmlStats:
    """Counters of one source: ticks sampled, NVML errors, events, unknown process memory,
    pod processes left without pod labels."""

    ticks: int = 0
    errors: int = 0
    events: int = 0
    unknown_gpu_mem: int = 0
    pod_unresolved: int = 0


@dataclass
class _Device:
    """One NVML handle (a GPU or a MIG device) and what it turned out not to support."""

    handle: Any
    unsupported: set[str] = field(default_factory=set)
    mem_v2: bool = True


@dataclass
class _Mig:
    dev: _Device
    mig: str
    name: str
    gi: int | None
    ci: int | None


@dataclass
class _Gpu:
    index: int
    dev: _Device | None = None  # None until NVML gave a handle
    uuid: str = ""
    name: str = ""
    migs: list[_Mig] = field(default_factory=list)
    mig_stale: bool = False


class NvmlSource:
    """Samples every GPU of one host through NVML. ``open()`` first, ``close()`` last."""

    def __init__(
        self,
        host: str,
        nvml: Any = None,
        proc: ProcInfo | None = None,
        clock: Callable[[], float] = time.time,
        pods: podmap.HolderSource | None = None,
    ) -> None:
        if not host:
            raise ValueError("host must not be empty")
        self.host = host
        self._nvml = nvml
        self._table = ProcessTable(proc or ProcInfo(), self._process_name)
        self._pods = pods
        self._clock = clock
        self.stats = NvmlStats()
        self.versions: dict[str, str | None] = {}
        self._gpus: list[_Gpu] = []
        self._by_address: dict[int, _Gpu] = {}
        self._evset: Any = None
        self._event_names: dict[int, str] = {}  # NVML event bit -> name
        self._registered = 0
        self._temp_v = False
        self._open = False
        self._warned: set[tuple[int, str | None]] = set()

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Initialise NVML, read static data, register for critical events."""
        if self._open:
            return
        nvml = self._nvml = self._nvml or _import_pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise _unavailable(exc) from None
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._shutdown()
            raise _unavailable(exc) from None
        if count == 0:
            self._shutdown()
            raise NvmlUnavailable("NVML unavailable (no NVIDIA GPU found): " + _NO_GPU_FIX)
        self._open = True
        self._temp_v = hasattr(nvml, "nvmlDeviceGetTemperatureV")
        self._read_versions()
        self._create_event_set()
        self._gpus = [_Gpu(i) for i in range(count)]
        for gpu in self._gpus:
            self._load(gpu)
        if self._pods is not None:
            self._pods.open()

    def close(self) -> None:
        """Free the event set and shut NVML down; safe to call twice."""
        if not self._open:
            return
        self._open = False
        if self._pods is not None:
            self._pods.close()
        if self._evset is not None:
            try:
                self._nvml.nvmlEventSetFree(self._evset)
            except self._nvml.NVMLError as exc:
                log.debug("host=%s: freeing the NVML event set failed: %s", self.host, exc)
            self._evset = None
        self._shutdown()

    def __enter__(self) -> NvmlSource:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("host=%s: nvmlShutdown failed: %s", self.host, exc)

    def _read_versions(self) -> None:
        nvml = self._nvml
        cuda = self._call(nvml.nvmlSystemGetCudaDriverVersion)
        self.versions = {
            "driver_version": self._call(nvml.nvmlSystemGetDriverVersion, text=True),
            "cuda_version": None if cuda is None else cuda_version_string(int(cuda)),
            "nvml_version": self._call(nvml.nvmlSystemGetNVMLVersion, text=True),
        }

    def _call(self, fn: Callable[..., Any], *args: Any, text: bool = False) -> Any:
        """``fn(*args)`` (decoded to ``str`` if ``text``), or ``None`` if NVML raises."""
        try:
            value = fn(*args)
        except self._nvml.NVMLError as exc:
            log.debug("host=%s: %s failed: %s", self.host, getattr(fn, "__name__", fn), exc)
            return None
        return _text(value) if text else value

    def start_event(self) -> EventEnvelope:
        """``agent_start``: NVML, driver and CUDA versions, the GPUs, the events watched."""
        gpus = [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "mig": [m.mig for m in g.migs]}
            for g in self._gpus
        ]
        watched = [name for bit, name in self._event_names.items() if self._registered & bit]
        attrs = {"source": "nvml", **self.versions, "gpu_count": len(gpus), "gpus": gpus}
        return EventEnvelope(self.host, self._clock(), "agent_start", {**attrs, "events": watched})

    # ------------------------------------------------------------ static data

    def _load(self, gpu: _Gpu) -> bool:
        """Get the handle, UUID, name and MIG layout of one GPU; False if NVML refused."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            gpu.uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as exc:
            self._failed(gpu.index, None, exc)
            return False
        gpu.name = self._call(nvml.nvmlDeviceGetName, handle, text=True) or ""
        gpu.dev = _Device(handle)
        address = _address(handle)
        if address is not None:
            self._by_address[address] = gpu
        self._load_migs(gpu, gpu.dev)
        self._register(gpu)
        return True

    def _load_migs(self, gpu: _Gpu, dev: _Device) -> None:
        """(Re)read the MIG devices of a GPU; none when MIG is off or not supported."""
        nvml = self._nvml
        try:
            enabled = nvml.nvmlDeviceGetMigMode(dev.handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError_NotSupported:
            enabled = False
        except nvml.NVMLError as exc:  # keep the layout we know; ask again next tick
            log.debug("host=%s gpu=%d: MIG mode unreadable: %s", self.host, gpu.index, exc)
            gpu.mig_stale = True
            return
        gpu.migs, gpu.mig_stale = [], False
        if not enabled:
            return
        for slot in range(self._call(nvml.nvmlDeviceGetMaxMigDeviceCount, dev.handle) or 0):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, slot)
            except nvml.NVMLError:
                continue  # an empty slot answers NotFound
            gpu.migs.append(self._mig(gpu, handle))

    def _mig(self, gpu: _Gpu, handle: Any) -> _Mig:
        nvml = self._nvml
        gi = self._call(nvml.nvmlDeviceGetGpuInstanceId, handle)
        ci = self._call(nvml.nvmlDeviceGetComputeInstanceId, handle)
        uuid = self._call(nvml.nvmlDeviceGetUUID, handle, text=True)
        name = self._call(nvml.nvmlDeviceGetName, handle, text=True) or gpu.name
        return _Mig(_Device(handle), uuid or f"GI{gi}/CI{ci}", name, gi, ci)

    # ------------------------------------------------------------ events

    def _create_event_set(self) -> None:
        nvml = self._nvml
        try:
            self._evset = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("host=%s: no NVML event set (%s); XID events are not reported", self.host, exc)
            return
        self._event_names = {getattr(nvml, k): v for k, v in EVENTS.items() if hasattr(nvml, k)}

    def _register(self, gpu: _Gpu) -> None:
        """Register the GPU for the critical events it supports; skip what it does not."""
        nvml = self._nvml
        if self._evset is None or gpu.dev is None:
            return
        wanted = sum(self._event_names)
        supported = self._call(nvml.nvmlDeviceGetSupportedEventTypes, gpu.dev.handle)
        if supported is not None:
            wanted &= int(supported)
        try:
            nvml.nvmlDeviceRegisterEvents(gpu.dev.handle, wanted, self._evset)
        except nvml.NVMLError as exc:
            log.info("host=%s gpu=%d: NVML events not registered: %s", self.host, gpu.index, exc)
            return
        self._registered |= wanted

    def _drain(self, ts: float) -> list[EventEnvelope]:
        """Every event waiting in the event set, without blocking."""
        nvml, out = self._nvml, list[EventEnvelope]()
        if self._evset is None:
            return out
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                data = nvml.nvmlEventSetWait(self._evset, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as exc:
                self.stats.errors += 1
                log.warning("host=%s: reading NVML events failed: %s", self.host, exc)
                break
            out.append(self._event(data, ts))
        return out

    def _event_gpu(self, device: Any) -> _Gpu | None:
        gpu = self._by_address.get(_address(device) or 0)
        if gpu is None:
            index = self._call(self._nvml.nvmlDeviceGetIndex, device)
            gpu = next((g for g in self._gpus if g.index == index), None)
        return gpu

    def _event(self, data: Any, ts: float) -> EventEnvelope:
        gpu = self._event_gpu(data.device)
        attrs: dict[str, Any] = {"gpu": None if gpu is None else gpu.index}
        if gpu is not None:
            attrs["uuid"] = gpu.uuid
            attrs.update(_instance(gpu, data.gpuInstanceId, data.computeInstanceId))
        name = self._event_names.get(int(data.eventType), hex(data.eventType))
        if name == "xid":
            return EventEnvelope(self.host, ts, "xid", {**attrs, "xid": int(data.eventData)})
        if name == "mig_config_change" and gpu is not None:
            gpu.mig_stale = True
        attrs.update(event=name, data=int(data.eventData))
        return EventEnvelope(self.host, ts, "device_event", attrs)

    # ------------------------------------------------------------ sampling

    def sample(self) -> tuple[GpuEnvelope, list[EventEnvelope]]:
        """One envelope with every GPU (and MIG device) that answered, and new events."""
        if not self._open:
            raise RuntimeError("NvmlSource.sample() before open()")
        ts = self._clock()
        self.stats.ticks += 1
        events = self._drain(ts)
        samples: list[GpuSample] = []
        for gpu in self._gpus:
            samples += self._sample_gpu(gpu, ts, events)
        holders = {} if self._pods is None else self._pods.holders()
        if holders:
            samples, unresolved = podmap.attribute(samples, holders, self._table.pod_uid)
            self.stats.pod_unresolved += unresolved
        self.stats.events += len(events)
        return GpuEnvelope(self.host, ts, tuple(samples)), events

    def _sample_gpu(self, gpu: _Gpu, ts: float, events: list[EventEnvelope]) -> list[GpuSample]:
        if gpu.dev is None and not self._load(gpu):
            return []
        dev = gpu.dev
        assert dev is not None
        if gpu.mig_stale or self.stats.ticks % MIG_REFRESH_TICKS == 0:
            self._load_migs(gpu, dev)
        try:
            out = [self._device(gpu, dev, None, ts, events)]
        except self._nvml.NVMLError as exc:
            self._failed(gpu.index, None, exc)
            return []
        self._recovered(gpu.index, None)
        for m in gpu.migs:
            try:
                out.append(self._device(gpu, m.dev, m, ts, events))
            except self._nvml.NVMLError as exc:
                self._failed(gpu.index, m.mig, exc)
                gpu.mig_stale = True
                continue
            self._recovered(gpu.index, m.mig)
        return out

    def _device(
        self, gpu: _Gpu, dev: _Device, mig: _Mig | None, ts: float, events: list[EventEnvelope]
    ) -> GpuSample:
        """One GpuSample; raises NVMLError if the memory (required) cannot be read."""
        used, total, reserved = self._memory(dev)
        whole = mig is None
        util = self._optional(dev, "util", self._nvml.nvmlDeviceGetUtilizationRates, whole)
        temp = self._optional(dev, "temp", self._temperature, whole)
        power_mw = self._optional(dev, "power", self._nvml.nvmlDeviceGetPowerUsage, whole)
        procs = () if whole and gpu.migs else self._processes(gpu, dev, mig, ts, events)
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name if mig is None else mig.name,
            mig=None if mig is None else mig.mig,
            fb_used=min(used, total),
            fb_total=total,
            fb_reserved=reserved,
            gpu_util=None if util is None else float(util.gpu),
            mem_copy_util=None if util is None else float(util.memory),
            temp_c=None if temp is None else float(temp),
            power_w=None if power_mw is None else power_mw / 1000.0,
            procs=procs,
        )

    def _memory(self, dev: _Device) -> tuple[int, int, int | None]:
        """(used, total, reserved) bytes; memory v2 when the driver has it, else v1."""
        nvml = self._nvml
        if dev.mem_v2 and hasattr(nvml, "nvmlMemory_v2"):
            try:
                m = nvml.nvmlDeviceGetMemoryInfo(dev.handle, version=nvml.nvmlMemory_v2)
                return int(m.used), int(m.total), int(m.reserved)
            except (
                nvml.NVMLError_NotSupported,
                nvml.NVMLError_FunctionNotFound,
                nvml.NVMLError_ArgumentVersionMismatch,
            ):
                dev.mem_v2 = False
        m = nvml.nvmlDeviceGetMemoryInfo(dev.handle)
        return int(m.used), int(m.total), None

    def _temperature(self, handle: Any) -> Any:
        nvml = self._nvml
        if self._temp_v:
            try:
                return nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU)
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_ArgumentVersionMismatch):
                self._temp_v = False  # an older driver: use the legacy call from now on
        return nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)

    def _optional(self, dev: _Device, name: str, fn: Callable[[Any], Any], wanted: bool) -> Any:
        """``fn(handle)``, or ``None`` if not wanted, not supported or failing."""
        if not wanted or name in dev.unsupported:
            return None
        nvml = self._nvml
        try:
            return fn(dev.handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            dev.unsupported.add(name)
        except nvml.NVMLError as exc:
            self.stats.errors += 1
            log.debug("host=%s: reading %s failed: %s", self.host, name, exc)
        return None

    # ------------------------------------------------------------ processes

    def _processes(
        self, gpu: _Gpu, dev: _Device, mig: _Mig | None, ts: float, events: list[EventEnvelope]
    ) -> tuple[ProcessSample, ...]:
        infos = self._optional(dev, "procs", self._nvml.nvmlDeviceGetComputeRunningProcesses, True)
        if infos is None:
            return ()  # unknown: keep the previous pid list, report no exits
        procs = tuple(self._table.sample(int(p.pid), self._gpu_mem(p)) for p in infos)
        key = (gpu.index, None if mig is None else mig.mig)
        for pid, name in self._table.exits(key, {p.pid: p.name for p in procs}):
            attrs = {"gpu": gpu.index, "pid": pid, "process": name}
            attrs.update({} if mig is None else {"mig": mig.mig})
            events.append(EventEnvelope(self.host, ts, "process_exit", attrs))
        return procs

    def _gpu_mem(self, info: Any) -> int:
        """``usedGpuMemory``; NVML gives ``None`` when it cannot tell (counted, reported 0)."""
        if info.usedGpuMemory is None:
            self.stats.unknown_gpu_mem += 1
            return 0
        return int(info.usedGpuMemory)

    def _process_name(self, pid: int) -> str | None:
        name = self._call(self._nvml.nvmlSystemGetProcessName, pid, text=True)
        return os.path.basename(name) if name else None

    # ------------------------------------------------------------ failures

    def _failed(self, index: int, mig: str | None, exc: Exception) -> None:
        self.stats.errors += 1
        if (index, mig) not in self._warned:
            self._warned.add((index, mig))
            where = f"gpu={index}" + (f" mig={mig}" if mig else "")
            log.warning("host=%s %s: skipped, NVML error: %s", self.host, where, exc)

    def _recovered(self, index: int, mig: str | None) -> None:
        if (index, mig) in self._warned:
            self._warned.discard((index, mig))
            log.info("host=%s gpu=%d mig=%s: sampled again", self.host, index, mig)


def _instance(gpu: _Gpu, gi: int, ci: int) -> dict[str, Any]:
    """The ``mig`` attribute of an event raised on a MIG instance, if it was one."""
    if not gpu.migs or gi == _NO_INSTANCE:
        return {}
    for m in gpu.migs:
        if m.gi == gi and (ci == _NO_INSTANCE or m.ci == ci):
            return {"mig": m.mig}
    return {"mig": f"GI{gi}/CI{ci}"}


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(
            "NVML unavailable (the nvidia-ml-py package is not installed): "
            "pip install 'ragwatch[agent]', or use --source sim"
        ) from None
    return pynvml


def _unavailable(exc: Exception) -> NvmlUnavailable:
    """One line: NVML, the reason, the way out."""
    reason, fix = _WHY.get(type(exc).__name__, (f"NVML error: {exc}", "check the NVIDIA driver"))
    reason = " ".join(reason.split())
    return NvmlUnavailable(f"NVML unavailable ({reason}): {fix}, or use --source sim")
