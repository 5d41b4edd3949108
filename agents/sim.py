"""A simulated GPU fleet that replays the known fault scenarios, deterministically.

``N`` hosts x ``G`` GPUs (80 GiB each). Every GPU runs a ``vllm-serve`` process
(preallocated KV cache: flat memory) and a ``rag-worker`` process (embedder, reranker,
FAISS index: a few GiB with a daily rhythm and noise). Utilisation, temperature and
power follow a daily sine. Everything is drawn from one seeded RNG, so the same
``SimConfig`` always yields the same telemetry.

Scenarios:

- ``healthy``: nothing goes wrong.
- ``leak``: from ``leak_start_s`` on, the ``rag-worker`` of one GPU (host
  ``leak_host``, GPU ``leak_gpu``, default the last) grows ``leak_gb_per_h`` (1.2 GB/h:
  a FAISS index never reset plus an unbounded tokenizer cache). When the GPU is full, the
  CUDA OOM killer takes it: an ``oom_kill`` event is emitted and the worker restarts with
  a new pid, and leaks again. With ``leak_stop_s``, the leaking process is restarted at
  that time with the fix (a new pid, its memory back to normal, no more growth).

>>> sim = FleetSimulator(SimConfig(hosts=2, gpus=1, start_ts=1_700_000_000.0))
>>> ts, envelopes, events = next(sim.ticks())
>>> [e.host for e in envelopes], len(envelopes[0].gpus[0].procs)
(['gpu-node-01', 'gpu-node-02'], 2)
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from ragwatch.schema import EventEnvelope, GpuEnvelope, GpuSample, ProcessSample

GIB = 1024**3
GB = 1e9
DAY = 86400.0
SCENARIOS = ("healthy", "leak")
FB_TOTAL = 80 * GIB
DRIVER_OVERHEAD = 512 * 1024**2


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Times are event-time seconds."""

    hosts: int = 4
    gpus: int = 2
    seed: int = 0
    scenario: str = "leak"
    interval_s: float = 10.0
    start_ts: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    leak_gb_per_h: float = 1.2
    leak_start_s: float = 1200.0
    leak_host: int = 0
    leak_gpu: int = -1
    leak_stop_s: float | None = None  # the leaking process is restarted here and is fixed

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.gpus < 1:
            raise ValueError("hosts and gpus must be >= 1")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; known: {', '.join(SCENARIOS)}")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError("interval_s must be finite and > 0")
        if not (math.isfinite(self.start_ts) and self.start_ts >= 0):
            raise ValueError("start_ts must be a finite epoch time >= 0")
        if not (math.isfinite(self.leak_gb_per_h) and self.leak_gb_per_h >= 0):
            raise ValueError("leak_gb_per_h must be finite and >= 0")
        if not 0 <= self.leak_host < self.hosts or not -self.gpus <= self.leak_gpu < self.gpus:
            raise ValueError("leak_host / leak_gpu out of range")
        stop = self.leak_stop_s
        if stop is not None and not (math.isfinite(stop) and stop > self.leak_start_s):
            raise ValueError("leak_stop_s must be finite and after leak_start_s")


@dataclass
class _Proc:
    pid: int
    name: str
    base_mem: float
    container: str
    rss: float
    leaking: bool = False
    leaked: float = 0.0


@dataclass
class _Gpu:
    index: int
    uuid: str
    procs: list[_Proc] = field(default_factory=list)


def _container_id(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def host_name(i: int) -> str:
    return f"gpu-node-{i + 1:02d}"


class FleetSimulator:
    """Yields one :class:`GpuEnvelope` per host per tick, plus device events."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        leak_gpu = config.leak_gpu % config.gpus
        self._fleet: list[list[_Gpu]] = []
        for h in range(config.hosts):
            gpus = []
            for g in range(config.gpus):
                uuid = "GPU-" + _container_id(config.seed, h, g)[:8] + "-sim"
                vllm = _Proc(
                    2000 + 100 * h + 10 * g,
                    "vllm-serve",
                    60 * GIB,
                    _container_id("vllm", h, g),
                    9 * GIB,
                )
                rag = _Proc(
                    4000 + 100 * h + 10 * g + 1,
                    "rag-worker",
                    6 * GIB,
                    _container_id("rag", h, g),
                    3 * GIB,
                )
                rag.leaking = config.scenario == "leak" and (h, g) == (config.leak_host, leak_gpu)
                gpus.append(_Gpu(g, uuid, [vllm, rag]))
            self._fleet.append(gpus)

    @property
    def leak_target(self) -> tuple[str, int, int, str] | None:
        """(host, gpu index, pid, process name) of the leaking process, if any."""
        for h, gpus in enumerate(self._fleet):
            for gpu in gpus:
                for p in gpu.procs:
                    if p.leaking:
                        return host_name(h), gpu.index, p.pid, p.name
        return None

    def ticks(self) -> Iterator[tuple[float, list[GpuEnvelope], list[EventEnvelope]]]:
        """Endless ticks: ``(ts, one envelope per host, events raised at this tick)``."""
        cfg = self.config
        k = 0
        while True:
            ts = cfg.start_ts + k * cfg.interval_s
            envelopes: list[GpuEnvelope] = []
            events: list[EventEnvelope] = []
            for h, gpus in enumerate(self._fleet):
                samples = [self._sample(host_name(h), gpu, ts, events) for gpu in gpus]
                envelopes.append(GpuEnvelope(host=host_name(h), ts=ts, gpus=tuple(samples)))
            yield ts, envelopes, events
            k += 1

    def _sample(
        self, host: str, gpu: _Gpu, ts: float, events: list[EventEnvelope], grow: bool = True
    ) -> GpuSample:
        cfg, rng = self.config, self._rng
        phase = math.sin(2 * math.pi * ((ts - 6 * 3600) % DAY) / DAY)  # peak mid-afternoon
        elapsed = ts - cfg.start_ts
        procs = []
        for p in gpu.procs:
            if p.leaking and cfg.leak_stop_s is not None and elapsed >= cfg.leak_stop_s:
                p.pid, p.leaked, p.leaking = p.pid + 1, 0.0, False  # restarted with the fix
            if grow and p.leaking and elapsed >= cfg.leak_start_s:
                p.leaked += cfg.leak_gb_per_h * GB * cfg.interval_s / 3600
            if p.name == "vllm-serve":
                mem = p.base_mem + rng.gauss(0, 2 * 1024**2)
            else:
                mem = p.base_mem + 200e6 * phase + rng.gauss(0, 30e6) + p.leaked
            procs.append((p, max(0, int(mem))))
        used = DRIVER_OVERHEAD + sum(m for _, m in procs)
        if used > FB_TOTAL:
            victim = next(p for p, _ in procs if p.leaking)
            events.append(
                EventEnvelope(
                    host=host,
                    ts=ts,
                    type="oom_kill",
                    attrs={
                        "gpu": gpu.index,
                        "pid": victim.pid,
                        "process": victim.name,
                        "container": victim.container,
                        "gpu_mem": int(victim.base_mem + victim.leaked),
                    },
                )
            )
            victim.pid += 1  # restarted by its supervisor, and the leak starts over
            victim.leaked = 0.0
            return self._sample(host, gpu, ts, events, grow=False)
        util = min(100.0, max(0.0, 50 + 30 * phase + rng.gauss(0, 5)))
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            name="NVIDIA H100 80GB HBM3",
            mig=None,
            fb_used=used,
            fb_total=FB_TOTAL,
            gpu_util=round(util, 1),
            mem_copy_util=round(util * 0.4, 1),
            temp_c=round(40 + util * 0.3, 1),
            power_w=round(120 + util * 5, 1),
            procs=tuple(
                ProcessSample(
                    pid=p.pid,
                    name=p.name,
                    gpu_mem=m,
                    rss=int(p.rss + rng.gauss(0, 10e6)),
                    container=p.container,
                )
                for p, m in procs
            ),
        )
