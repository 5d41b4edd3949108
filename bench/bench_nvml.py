"""CPU cost of one ``NvmlSource.sample()`` tick, without a GPU.

The real ``pynvml`` module gets its ``nvml*`` functions replaced by a fake fleet
(``--gpus`` GPUs x ``--procs`` compute processes each) that answers with pynvml's own
ctypes structs, built afresh on every call as the C bindings do; the processes live in
a fake proc tree of real files (``statm``, ``comm``, ``cgroup``), so every tick pays
the ``/proc`` reads. One XID event is queued every 10 ticks.

Reports CPU milliseconds per tick (best of ``--repeat`` runs), ticks per second, and
the share spent inside the fake NVML calls themselves, so ``agent_ms`` is what
ragwatch adds. Target: under 2 ms per tick for 8 GPUs x 20 processes.

Run: ``python bench/bench_nvml.py`` (the fake lives here, not in the tests, so the
bench imports nothing from ``tests/``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml

from ragwatch.agents.nvml import NvmlSource
from ragwatch.agents.procinfo import ProcInfo

GIB = 1024**3
NA = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


class FakeFleet:
    """``gpus`` GPUs with ``procs`` processes each, behind pynvml's function names."""

    def __init__(self, gpus: int, procs: int) -> None:
        self.handles = [
            ctypes.cast(ctypes.c_void_p(0x1000 * (i + 1)), pynvml.c_nvmlDevice_t)
            for i in range(gpus)
        ]
        self.pids = [[10_000 + 100 * g + p for p in range(procs)] for g in range(gpus)]
        self.events: list[Any] = []
        self.fake_s = 0.0  # CPU time spent inside the fake calls

    def functions(self) -> dict[str, Callable[..., Any]]:
        """The pynvml functions this fleet replaces, each timed."""
        plain = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlSystemGetCudaDriverVersion": lambda: 12040,
            "nvmlSystemGetNVMLVersion": lambda: "12.550.54.15",
            "nvmlSystemGetProcessName": lambda pid: f"proc{pid}",
            "nvmlDeviceGetCount": lambda: len(self.handles),
            "nvmlDeviceGetHandleByIndex": lambda i: self.handles[i],
            "nvmlDeviceGetUUID": lambda h: f"GPU-{self._index(h):08d}",
            "nvmlDeviceGetName": lambda h: "NVIDIA H100 80GB HBM3",
            "nvmlDeviceGetIndex": self._index,
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetUtilizationRates": lambda h: pynvml.c_nvmlUtilization_t(55, 21),
            "nvmlDeviceGetTemperatureV": lambda h, sensor: 47,
            "nvmlDeviceGetTemperature": lambda h, sensor: 47,
            "nvmlDeviceGetPowerUsage": lambda h: 312_500,
            "nvmlDeviceGetComputeRunningProcesses": self._processes,
            "nvmlDeviceGetMigMode": lambda h: [0, 0],
            "nvmlEventSetCreate": lambda: pynvml.c_nvmlEventSet_t(),
            "nvmlDeviceGetSupportedEventTypes": lambda h: pynvml.nvmlEventTypeAll,
            "nvmlDeviceRegisterEvents": lambda h, types, event_set: None,
            "nvmlEventSetWait": self._wait,
            "nvmlEventSetFree": lambda event_set: None,
        }
        return {name: self._timed(fn) for name, fn in plain.items()}

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.fake_s += time.process_time() - t0

        return call

    def _index(self, handle: Any) -> int:
        return (ctypes.cast(handle, ctypes.c_void_p).value or 0) // 0x1000 - 1

    def _memory(self, handle: Any, version: int | None = None) -> Any:
        if version:
            return pynvml.c_nvmlMemory_v2_t(version, 80 * GIB, GIB // 2, 40 * GIB, 39 * GIB)
        return pynvml.c_nvmlMemory_t(80 * GIB, 40 * GIB, 40 * GIB)

    def _processes(self, handle: Any) -> list[Any]:
        out = []
        for pid in self.pids[self._index(handle)]:  # as pynvml turns the C array into objects
            info = pynvml.c_nvmlProcessInfo_t(pid, (pid % 50) * GIB // 10, 0xFFFFFFFF, 0xFFFFFFFF)
            obj = pynvml.nvmlStructToFriendlyObject(info)
            if obj.usedGpuMemory == NA:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def _wait(self, event_set: Any, timeout_ms: int) -> Any:
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop()

    def xid(self, index: int, xid: int) -> None:
        self.events.append(
            pynvml.c_nvmlEventData_t(
                self.handles[index], pynvml.nvmlEventTypeXidCriticalError, xid, 0xFFFFFFFF
            )
        )


@contextlib.contextmanager
def patched(fleet: FakeFleet) -> Iterator[None]:
    """Replace pynvml's functions by the fleet's for the duration of the block."""
    saved = {name: getattr(pynvml, name) for name in fleet.functions()}
    for name, fn in fleet.functions().items():
        setattr(pynvml, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(pynvml, name, fn)


def proc_tree(root: Path, fleet: FakeFleet) -> None:
    """A /proc entry (comm, statm, status, cgroup) for every pid of the fleet."""
    for pids in fleet.pids:
        for pid in pids:
            d = root / str(pid)
            d.mkdir(parents=True)
            (d / "comm").write_text(f"worker-{pid}\n")
            (d / "statm").write_text("500000 250000 2000 100 0 300000 0\n")
            (d / "status").write_text("VmRSS:\t1000000 kB\n")
            cid = f"{pid:064x}"
            (d / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")


def run(gpus: int = 8, procs: int = 20, ticks: int = 500, repeat: int = 3) -> dict[str, Any]:
    """Measure ``sample()``; return ms/tick (total and agent-only), ticks/s, and the setup."""
    fleet = FakeFleet(gpus, procs)
    best: tuple[float, float] | None = None
    with tempfile.TemporaryDirectory() as tmp, patched(fleet):
        proc_tree(Path(tmp), fleet)
        source = NvmlSource("bench-host", nvml=pynvml, proc=ProcInfo(Path(tmp)))
        source.open()
        try:
            source.sample()  # warm the per-pid caches, as a running agent has them
            for _ in range(repeat):
                fleet.fake_s = 0.0
                t0 = time.process_time()
                for k in range(ticks):
                    if k % 10 == 0:
                        fleet.xid(k % gpus, 79)
                    env, _ = source.sample()
                total = time.process_time() - t0
                if best is None or total < best[0]:
                    best = (total, fleet.fake_s)
        finally:
            source.close()
    assert best is not None and len(env.gpus) == gpus
    total_ms, fake_ms = 1000 * best[0] / ticks, 1000 * best[1] / ticks
    return {
        "gpus": gpus,
        "procs_per_gpu": procs,
        "ticks": ticks,
        "ms_per_tick": round(total_ms, 3),
        "ticks_per_s": round(1000 / total_ms, 1) if total_ms else None,
        "fake_nvml_ms_per_tick": round(fake_ms, 3),
        "agent_ms_per_tick": round(total_ms - fake_ms, 3),
        "target_ms": 2.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = run(args.gpus, args.procs, args.ticks, args.repeat)
    print(
        f"NvmlSource.sample(): {result['gpus']} GPUs x {result['procs_per_gpu']} procs: "
        f"{result['ms_per_tick']:.3f} ms/tick CPU ({result['ticks_per_s']} ticks/s), "
        f"of which fake NVML {result['fake_nvml_ms_per_tick']:.3f} ms, "
        f"ragwatch {result['agent_ms_per_tick']:.3f} ms (target < {result['target_ms']} ms)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
