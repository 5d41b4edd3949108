"""A simulated RAG request stream (the request side of the incident), deterministically.

``S`` services x ``I`` instances each serve ``base_qps`` requests per second (per
instance), with a daily rhythm (peak 15:00 UTC, trough 03:00, +-40 %). Every
``batch_s`` of event time each instance emits one :class:`RequestsEnvelope` with the
requests that finished in that interval. Each request goes through a retriever (~88 ms,
with a rare long tail), a reranker (~40 ms) and the LLM (prefill proportional to the
context, decode proportional to the output tokens); ``e2e_ms`` is the queue wait plus
the stages. Healthy medians: e2e ~800 ms, retriever P99 ~112 ms, 3000 context and 250
output tokens, 0.5 % errors.

Only a ``sample_rate`` fraction of requests is recorded (head sampling, as tracing
SDKs do): at 20 qps a full recording would be ~7 M records a day for 2 x 2 instances,
far too many to generate in pure Python. Rates and ratios are unaffected; a consumer
that wants absolute QPS divides by the sample rate.

Every scenario runs on the same healthy world, which has benign events: a deploy at
``deploy_at_s`` shifts all latencies +5 % for good, and a model reload at
``reload_at_s`` slows the LLM stage 1.5x for 2 minutes. From ``fault_start_s`` the
scenario's fault hits one instance (:attr:`RequestSimulator.fault_target`):

- ``healthy``: nothing goes wrong.
- ``throughput``: output tokens per request -36 %, QPS -37 %, decode 2.7x slower
  (P95 e2e ~930 -> ~1340 ms).
- ``retrieval``: 3 % of retrievals stall (~470 ms): retriever P99 ~112 -> ~489 ms.
- ``outliers``: ``outliers_per_min`` recorded requests with ~12000 context and ~20 output
  tokens, a new dense cluster far from the usual (3000, 250).
- ``leak``: the instance on the leaking GPU slows down: tokens/s and QPS -1 % per 10 min
  (compounded, floored at 50 %), tokens per request unchanged.
- ``oom``: the leak, and every ``oom_after_h`` hours the OOM kill: 90 s in which 80 % of
  requests fail with no output; then the worker restarts and the slowdown starts over.
- ``all``: throughput + retrieval + outliers + the leak slowdown.

Traffic shapes beyond the default (for the quality benchmark's scenario space, and to try
ragwatch on telemetry unlike its own): ``daily_ratio`` replaces the mild rhythm by a
log-sine one whose peak (at ``peak_hour`` UTC) is ``daily_ratio`` times its trough (1.2x to
20x; ``base_qps`` is then the daily geometric mean), ``weekly_ratio`` adds a weekly
log-sine (its peak ``weekly_peak_day`` days after a Monday 00:00 UTC), ``burst_sigma``
makes traffic bursty (a lognormal factor per instance and minute, mean 1) and
``token_cv`` sets the spread of output tokens per request. ``faults`` schedules any number
of :class:`Fault` (kind, start, duration, instance, severity) on top of ``scenario``'s.

Each instance draws from its own RNG (and faults from another), so the same config always
gives the same stream, other instances never see a fault, and the fault instance's stream
equals the healthy one until ``fault_start_s`` (and again from ``fault_end_s``, if set:
the request faults heal there; the GPU leak heals only with the OOM kill's restart).

>>> sim = RequestSimulator(RequestSimConfig(services=1, instances=2, start_ts=1_700_000_000.0))
>>> ts, envelopes = next(sim.ticks())
>>> ts, [e.instance for e in envelopes], all(ts - 10 <= r.ts < ts for r in envelopes[0].records)
(1700000010.0, ['rag-api-0', 'rag-api-1'], True)
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ragwatch.schema import RequestRecord, RequestsEnvelope, RequestStatus

DAY = 86400.0
SCENARIOS = ("healthy", "throughput", "retrieval", "outliers", "leak", "oom", "all")
SERVICE_NAMES = ("rag-api", "rag-search", "rag-chat", "rag-ingest")

# the healthy request, in ms and tokens
CONTEXT = (3000.0, 300.0)
OUTPUT = (250.0, 40.0)
RETRIEVER = (88.0, 10.0)
RETRIEVER_TAIL_P = 0.003  # rare slow lookups: + lognormal (median ~90 ms)
RERANKER = (40.0, 5.0)
LLM_OVERHEAD_MS = 30.0
PREFILL_MS_PER_TOKEN = 0.06
DECODE_MS_PER_TOKEN = 1.8
QUEUE_MS = 8.0  # mean queue wait at average load; grows with load squared

# the faults
THROUGHPUT = {"tokens": 0.64, "qps": 0.63, "decode": 2.7}
SLOW_RETRIEVAL_P, SLOW_RETRIEVAL = 0.03, (470.0, 40.0)
OUTLIER_CONTEXT, OUTLIER_OUTPUT = (12000.0, 40.0), (20.0, 2.0)
LEAK_PER_10MIN, LEAK_FLOOR = 0.01, 0.5
OOM_BURST_S, OOM_ERROR_P = 90.0, 0.8
DEPLOY_SLOWDOWN, RELOAD_SLOWDOWN, RELOAD_S = 1.05, 1.5, 120.0
FAULT_KINDS = ("throughput", "retrieval", "outliers", "slowdown", "drift")
DRIFT_RAMP_S = 4 * 3600.0  # a drift reaches its full size (3x at severity 1) in 4 hours
WEEK = 7 * DAY
MONDAY = 4 * DAY  # 1970-01-05T00:00:00Z, a Monday (day 0 was a Thursday)


@dataclass(frozen=True)
class Fault:
    """One scheduled request fault on instance ``instance`` of service ``service``.

    ``kind``: ``throughput`` (tokens/request and QPS down, decode slower), ``retrieval``
    (a share of retrievals stall), ``outliers`` (a cluster of unusual requests) or
    ``slowdown`` (tokens/s and QPS -1 % per 10 min, as under the GPU leak) or ``drift``
    (every retrieval slower by degrees, to 3x over ``DRIFT_RAMP_S``: a replica whose
    index grows unchecked, slowly enough that its own baseline follows). ``severity``
    scales the effect (1.0: the magnitudes of the module docstring). Times are event-time
    seconds after ``start_ts``; ``duration_s`` None lasts to the end.
    """

    kind: str
    start_s: float
    duration_s: float | None = None
    service: int = 0
    instance: int = -1
    severity: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")
        _check(self.start_s, "fault start_s", 0.0)
        if self.duration_s is not None:
            _check(self.duration_s, "fault duration_s", 0.0, strict=True)
        _check(self.severity, "fault severity", 0.0, strict=True)

    def active(self, el: float) -> bool:
        """Whether the fault is on ``el`` seconds after the start."""
        end = math.inf if self.duration_s is None else self.start_s + self.duration_s
        return self.start_s <= el < end


@dataclass(frozen=True)
class RequestSimConfig:
    """What to simulate. Times are event-time seconds; ``*_at_s`` are after ``start_ts``."""

    services: int = 2
    instances: int = 2
    seed: int = 0
    scenario: str = "healthy"
    start_ts: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z, as SimConfig
    batch_s: float = 10.0
    base_qps: float = 20.0  # per instance, daily mean
    sample_rate: float = 0.1  # fraction of requests recorded
    error_rate: float = 0.005
    fault_start_s: float = 1200.0  # as SimConfig.leak_start_s
    fault_end_s: float | None = None  # the request faults heal here (None: never)
    fault_service: int = 0
    fault_instance: int = -1
    outliers_per_min: float = 3.0  # recorded outlier requests, not sampled
    oom_after_h: float = 12.0  # ~when the 1.2 GB/h leak of SimConfig fills the GPU
    deploy_at_s: float | None = 30 * 3600.0
    reload_at_s: float | None = 54 * 3600.0
    # Where instances run (their envelopes' ``host``): round-robin over ``hosts``, except
    # the faulty instance, which runs on ``fault_host`` (the leaking GPU's host) if given.
    hosts: tuple[str, ...] = ()
    fault_host: str | None = None
    # Traffic shape (module docstring); the defaults keep the mild +-40 % rhythm.
    daily_ratio: float | None = None  # peak / trough of a log-sine daily rhythm
    peak_hour: float = 15.0  # UTC, with daily_ratio
    weekly_ratio: float = 1.0  # peak / trough of a weekly log-sine rhythm
    weekly_peak_day: float = 2.5  # days after Monday 00:00 UTC
    burst_sigma: float = 0.0  # lognormal sigma of a per-minute traffic factor
    token_cv: float = 0.16  # output tokens per request: standard deviation / mean
    faults: tuple[Fault, ...] = ()

    def __post_init__(self) -> None:
        if self.services < 1 or self.instances < 1:
            raise ValueError("services and instances must be >= 1")
        if self.daily_ratio is not None:
            _check(self.daily_ratio, "daily_ratio", 1.0)
        _check(self.weekly_ratio, "weekly_ratio", 1.0)
        for name in ("peak_hour", "weekly_peak_day", "burst_sigma", "token_cv"):
            _check(getattr(self, name), name, 0.0)
        for f in self.faults:
            if not (
                0 <= f.service < self.services and -self.instances <= f.instance < self.instances
            ):
                raise ValueError(f"fault {f.kind} at {f.start_s:g} s: instance out of range")
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; known: {', '.join(SCENARIOS)}")
        _check(self.start_ts, "start_ts", 0.0)
        _check(self.fault_start_s, "fault_start_s", 0.0)
        if self.fault_end_s is not None:
            _check(self.fault_end_s, "fault_end_s", self.fault_start_s, strict=True)
        _check(self.outliers_per_min, "outliers_per_min", 0.0)
        for name in ("batch_s", "base_qps", "oom_after_h"):
            _check(getattr(self, name), name, 0.0, strict=True)
        for name in ("deploy_at_s", "reload_at_s"):
            if getattr(self, name) is not None:
                _check(getattr(self, name), name, 0.0)
        if not 0 < self.sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        if not 0 <= self.error_rate < 1:
            raise ValueError("error_rate must be in [0, 1)")
        if not 0 <= self.fault_service < self.services:
            raise ValueError("fault_service out of range")
        if not -self.instances <= self.fault_instance < self.instances:
            raise ValueError("fault_instance out of range")


def _check(value: float, name: str, low: float, *, strict: bool = False) -> None:
    ok = math.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        raise ValueError(f"{name} must be finite and {'>' if strict else '>='} {low:g}")


class FaultTarget(NamedTuple):
    """Where the scenario's fault lands."""

    service: str
    instance: str
    scenario: str
    host: str | None = None


def service_name(i: int) -> str:
    return SERVICE_NAMES[i] if i < len(SERVICE_NAMES) else f"rag-svc-{i}"


@dataclass(frozen=True, slots=True)
class _State:
    """The conditions of one instance during one batch."""

    qps: float
    output_mean: float
    decode_ms: float
    slowdown: float  # all stages (deploy)
    llm_slowdown: float  # the LLM stage (model reload)
    retriever_factor: float  # the retriever stage (a drift)
    queue_ms: float
    error_p: float
    oom: bool
    slow_retrieval_p: float
    outliers_per_s: float


@dataclass
class _Instance:
    service: str
    name: str
    rng: random.Random
    fault_rng: random.Random
    faulty: bool
    host: str | None = None
    faults: tuple[Fault, ...] = ()  # scheduled on this instance
    burst_minute: int | None = None  # the minute ``burst`` was drawn for
    burst: float = 1.0


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


def _poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw: Knuth's product method, a rounded normal for large ``lam``."""
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


class RequestSimulator:
    """Yields one :class:`RequestsEnvelope` per (service, instance) per batch."""

    def __init__(self, config: RequestSimConfig) -> None:
        self.config = config
        fault_i = config.fault_instance % config.instances
        self._instances = [
            _Instance(
                service=service_name(s),
                name=f"{service_name(s)}-{i}",
                rng=random.Random(_seed(config.seed, s, i)),
                fault_rng=random.Random(_seed(config.seed, s, i, "fault")),
                faulty=config.scenario != "healthy" and (s, i) == (config.fault_service, fault_i),
            )
            for s in range(config.services)
            for i in range(config.instances)
        ]
        for k, inst in enumerate(self._instances):
            s, i = divmod(k, config.instances)
            inst.faults = tuple(
                f for f in config.faults if (f.service, f.instance % config.instances) == (s, i)
            )
            if config.hosts:
                inst.host = config.hosts[k % len(config.hosts)]
            if inst.faulty and config.fault_host is not None:
                inst.host = config.fault_host

    @property
    def fault_target(self) -> FaultTarget | None:
        """(service, instance, scenario, host) hit by the fault; None for ``healthy``."""
        for inst in self._instances:
            if inst.faulty:
                return FaultTarget(inst.service, inst.name, self.config.scenario, inst.host)
        return None

    def target_of(self, fault: Fault) -> FaultTarget:
        """(service, instance, fault kind, host) hit by a scheduled fault."""
        i = fault.instance % self.config.instances
        inst = self._instances[fault.service * self.config.instances + i]
        return FaultTarget(inst.service, inst.name, fault.kind, inst.host)

    def ticks(self) -> Iterator[tuple[float, list[RequestsEnvelope]]]:
        """Endless ticks: ``(ts, one envelope per instance)``, records in [ts - batch_s, ts)."""
        cfg = self.config
        k = 0
        while True:
            t0 = cfg.start_ts + k * cfg.batch_s
            yield t0 + cfg.batch_s, [self._batch(inst, t0) for inst in self._instances]
            k += 1

    # ------------------------------------------------------------ conditions

    def _load(self, inst: _Instance, t0: float) -> float:
        """Traffic relative to the daily mean (the default rhythm) or geometric mean."""
        cfg = self.config
        if cfg.daily_ratio is None:
            load = 1.0 + 0.4 * math.sin(2 * math.pi * ((t0 - 9 * 3600) % DAY) / DAY)
        else:
            phase = (t0 - (cfg.peak_hour - 6) * 3600) % DAY / DAY
            load = cfg.daily_ratio ** (0.5 * math.sin(2 * math.pi * phase))
        if cfg.weekly_ratio != 1.0:
            phase = (t0 - MONDAY - (cfg.weekly_peak_day - 1.75) * DAY) % WEEK / WEEK
            load *= cfg.weekly_ratio ** (0.5 * math.sin(2 * math.pi * phase))
        if cfg.burst_sigma:
            minute = math.floor(t0 / 60)
            if inst.burst_minute != minute:
                rng = random.Random(_seed(cfg.seed, inst.name, "burst", minute))
                z = rng.gauss(0.0, cfg.burst_sigma)
                inst.burst_minute, inst.burst = minute, math.exp(z - cfg.burst_sigma**2 / 2)
            load *= inst.burst
        return load

    def _state(self, inst: _Instance, t0: float) -> _State:
        cfg = self.config
        load = self._load(inst, t0)
        el = t0 - cfg.start_ts
        slowdown = DEPLOY_SLOWDOWN if cfg.deploy_at_s is not None and el >= cfg.deploy_at_s else 1
        reload = cfg.reload_at_s is not None and 0 <= el - cfg.reload_at_s < RELOAD_S
        qps, tokens, decode = cfg.base_qps * load, 1.0, 1.0
        error_p, oom, slow_p, outliers = cfg.error_rate, False, 0.0, 0.0
        fault = inst.faulty and el >= cfg.fault_start_s
        if cfg.fault_end_s is not None and el >= cfg.fault_end_s:
            fault = False  # healed
        scenario = cfg.scenario if fault else "healthy"
        if scenario in ("throughput", "all"):
            qps, tokens = qps * THROUGHPUT["qps"], THROUGHPUT["tokens"]
            decode = THROUGHPUT["decode"]
        if scenario in ("retrieval", "all"):
            slow_p = SLOW_RETRIEVAL_P
        if scenario in ("outliers", "all"):
            outliers = cfg.outliers_per_min / 60
        if scenario in ("leak", "oom", "all"):
            leak_s = el - cfg.fault_start_s
            if scenario == "oom":
                period = cfg.oom_after_h * 3600
                oom = leak_s >= period and leak_s % period < OOM_BURST_S
                leak_s %= period
            speed = max(LEAK_FLOOR, (1 - LEAK_PER_10MIN) ** (leak_s / 600))
            qps, decode = qps * speed, decode / speed
        drift = 1.0
        for f in inst.faults:
            if not f.active(el):
                continue
            sev = f.severity
            if f.kind == "throughput":
                qps *= max(0.05, 1 - (1 - THROUGHPUT["qps"]) * sev)
                tokens *= max(0.05, 1 - (1 - THROUGHPUT["tokens"]) * sev)
                decode *= 1 + (THROUGHPUT["decode"] - 1) * sev
            elif f.kind == "retrieval":
                slow_p = min(1.0, slow_p + SLOW_RETRIEVAL_P * sev)
            elif f.kind == "outliers":
                outliers += cfg.outliers_per_min * sev / 60
            elif f.kind == "drift":
                drift *= 1 + 2 * sev * min(1.0, (el - f.start_s) / DRIFT_RAMP_S)
            else:  # slowdown
                rate = min(0.5, LEAK_PER_10MIN * sev)
                speed = max(LEAK_FLOOR, (1 - rate) ** ((el - f.start_s) / 600))
                qps, decode = qps * speed, decode / speed
        return _State(
            qps=qps,
            output_mean=OUTPUT[0] * tokens,
            decode_ms=DECODE_MS_PER_TOKEN * decode,
            slowdown=slowdown,
            retriever_factor=drift,
            llm_slowdown=RELOAD_SLOWDOWN if reload else 1.0,
            queue_ms=QUEUE_MS * load * load,
            error_p=OOM_ERROR_P if oom else error_p,
            oom=oom,
            slow_retrieval_p=slow_p,
            outliers_per_s=outliers,
        )

    # ------------------------------------------------------------ requests

    def _batch(self, inst: _Instance, t0: float) -> RequestsEnvelope:
        cfg, st, rng = self.config, self._state(inst, t0), inst.rng
        n = _poisson(rng, st.qps * cfg.batch_s * cfg.sample_rate)
        records = [self._regular(inst, st, ts) for ts in self._times(rng, t0, n)]
        if st.outliers_per_s:
            frng = inst.fault_rng
            n_out = _poisson(frng, st.outliers_per_s * cfg.batch_s)
            for ts in self._times(frng, t0, n_out):
                ctx, out = int(frng.gauss(*OUTLIER_CONTEXT)), int(frng.gauss(*OUTLIER_OUTPUT))
                records.append(self._request(frng, frng, st, ts, ctx, max(1, out)))
            records.sort(key=lambda r: r.ts)
        return RequestsEnvelope(
            service=inst.service,
            instance=inst.name,
            ts=t0 + cfg.batch_s,
            records=tuple(records),
            host=inst.host,
        )

    def _times(self, rng: random.Random, t0: float, n: int) -> list[float]:
        b = self.config.batch_s
        return sorted(min(t0 + b * rng.random(), math.nextafter(t0 + b, t0)) for _ in range(n))

    def _regular(self, inst: _Instance, st: _State, ts: float) -> RequestRecord:
        rng = inst.rng
        ctx = max(1, int(rng.gauss(*CONTEXT)))
        out = max(1, int(rng.gauss(st.output_mean, st.output_mean * self.config.token_cv)))
        return self._request(rng, inst.fault_rng, st, ts, ctx, out)

    @staticmethod
    def _request(
        rng: random.Random, frng: random.Random, st: _State, ts: float, ctx: int, out: int
    ) -> RequestRecord:
        """One finished request; ``frng`` decides the fault-only draws (slow retrievals)."""
        g, s = rng.gauss, st.slowdown
        retriever = max(5.0, g(*RETRIEVER))
        if rng.random() < RETRIEVER_TAIL_P:
            retriever += rng.lognormvariate(4.5, 0.6)
        if st.slow_retrieval_p and frng.random() < st.slow_retrieval_p:
            retriever = frng.gauss(*SLOW_RETRIEVAL)
        reranker = max(2.0, g(*RERANKER))
        queue = rng.expovariate(1 / st.queue_ms)
        prefill = max(5.0, LLM_OVERHEAD_MS + PREFILL_MS_PER_TOKEN * ctx + g(0, 8))
        decode = st.decode_ms * max(0.5, 1 + g(0, 0.03))
        status: RequestStatus = "ok"
        if rng.random() < st.error_p:
            status = "error"
            out = 0 if st.oom else int(out * rng.random())
            if st.oom:  # the LLM backend is gone: the call fails fast
                prefill = 3.0
        llm = (prefill + decode * out) * s * st.llm_slowdown
        retriever, reranker = retriever * s * st.retriever_factor, reranker * s
        ttft = queue + retriever + reranker + (prefill + decode) * s * st.llm_slowdown
        ttft_ms = round(ttft, 1) if out else None
        return RequestRecord(
            ts=ts,
            status=status,
            e2e_ms=round(queue + retriever + reranker + llm, 1),
            context_tokens=ctx,
            output_tokens=out,
            stages={
                "retriever": round(retriever, 1),
                "reranker": round(reranker, 1),
                "llm": round(llm, 1),
            },
            queue_ms=round(queue, 1),
            ttft_ms=ttft_ms,
        )
