"""Request shapes for the independent scenarios: a RAG service's traffic and latency, modelled
apart from ragwatch's simulators (``ragwatch.agents.sim_requests`` is not used).

The model, per service instance and per minute of event time:

- **demand**: a non-homogeneous Poisson process, or the real trace (below). The rate is the
  weekday peak times a daily rhythm (log-sinusoidal: ``peak/trough`` = ``daily_ratio``,
  highest at ``peak_hour`` UTC), a weekly one (Saturdays and Sundays at ``weekend``), and
  quiet days (holidays) at ``holiday``; each minute's rate is multiplied by a lognormal
  burst factor shared by the service's instances (clients come in waves across the load
  balancer);
- **request shapes**: context and output tokens, lognormal (long tails, clipped to the
  model's window) or resampled as pairs from the real trace;
- **latency** (ms): a queue wait before the request is served, exponential with mean
  ``queue_ms * rho / (1 - rho)`` where ``rho`` is the minute's true arrivals over the
  instance's capacity (capped at 0.95: bursts slow requests for minutes); the retriever,
  lognormal (median ``retriever_ms``), a share ``stall_p`` of calls stalling 90-200 ms;
  the reranker, lognormal; the LLM: prefill (``prefill_ms`` + ``ms_per_context_token`` per
  context token, which yields the first token) then ``output_tokens - 1`` x the per-token
  decode time (``tpot_ms``, x ``(1 + load_slowdown * rho)``: batching more requests slows
  each one's decode, x ``(1 + slowdown_per_4k_context * context / 4096)``: attention over
  a longer KV cache), each with per-request noise (decode: lognormal sigma 0.15, the
  batch a request shares) and a fixed per-instance offset (hosts differ by a few per cent).
  ``ttft_ms`` runs from the request's arrival to its first token (queue + retriever +
  reranker + prefill, as the SDK measures it); ``e2e_ms`` = queue + stages + ~3 ms;
  the decode time of a request is ``e2e_ms - ttft_ms`` less that overhead;
- **errors**: ``error_p`` of requests fail early (a retriever timeout: no tokens);
- **recording**: a ``sample_rate`` fraction of requests is recorded (head sampling); one
  RequestsEnvelope a minute per instance, with its host; a minute without a recorded
  request sends an empty envelope (the SDK's heartbeat).

Faults (:class:`Effect`) change one instance from a start to an end, optionally ramped in.

The real trace: ``tests/data/traces/azure-llm-code-2023.csv.gz`` (a copy of
``../shared/traces``), one hour (18:17-19:14 UTC, 8,818 requests) of a production LLM code-
completion service from the Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY
4.0; Patel, Choukse, Zhang, Shah, Goiri, Maleki, Bianchini, "Splitwise: Efficient generative
LLM inference using phase splitting", ISCA 2024). It is extended to days by a **block
bootstrap**: every 5 minutes of event time replays one of the hour's 11 full 5-minute blocks
drawn at random (arrivals at their offsets within the block, with their token counts), and
the daily and weekly rhythms are applied by **thinning** (each request kept with probability
``level(t)``: the trace's hour is taken as the weekday peak). Kept requests go to an
instance at random (a load balancer)."""

from __future__ import annotations

import csv
import gzip
import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache
from pathlib import Path

import numpy as np
from shape_kit import DAY, HOUR, MINUTE, MONDAY, Expect, Shape

from ragwatch.schema import (
    Envelope,
    RequestRecord,
    RequestsEnvelope,
)

# a copy of ../shared/traces (CC-BY 4.0, its README and license beside it) in the
# repository, so a clean clone anywhere has it
TRACE = (
    Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "azure-llm-code-2023.csv.gz"
)
TRACE_CREDIT = (
    "Azure LLM inference trace 2023 (code), Azure/AzurePublicDataset, CC-BY 4.0: Patel et al., "
    "Splitwise, ISCA 2024"
)
BLOCK_S = 300.0  # the bootstrap's block: long enough to keep a burst whole, short to mix
MAX_CONTEXT = 8192  # the model's window (the trace's longest context is 7,437)
THURSDAY = MONDAY + 3 * DAY


# ---------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Rhythm:
    """Demand relative to the weekday peak (1.0)."""

    daily_ratio: float = 4.0  # peak / trough
    peak_hour: float = 15.0  # UTC
    weekend: float = 1.0  # Saturday and Sunday, relative to a weekday
    holidays: tuple[float, ...] = ()  # start ts of quiet days
    holiday: float = 0.5

    def level(self, ts: float) -> float:
        hour = (ts % DAY) / HOUR
        daily = self.daily_ratio ** ((math.cos(2 * math.pi * (hour - self.peak_hour) / 24) - 1) / 2)
        weekday = int((ts - MONDAY) // DAY) % 7
        weekly = self.weekend if weekday >= 5 else 1.0
        quiet = any(d <= ts < d + DAY for d in self.holidays)
        return float(daily * weekly * (self.holiday if quiet else 1.0))


@dataclass(frozen=True)
class Mix:
    """Request shapes: lognormal tokens, or (``trace``) (context, output) pairs drawn from
    the trace; a service on the trace's own arrivals (``Service.arrivals == "trace"``) keeps
    each arrival's own pair."""

    context_median: float = 1500.0
    context_sigma: float = 0.9
    output_median: float = 14.0
    output_sigma: float = 0.45
    trace: bool = False

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.trace:
            _, ctx, out = trace()
            i = rng.integers(len(ctx), size=n)
            return ctx[i], out[i]
        c = self.context_median * np.exp(self.context_sigma * rng.standard_normal(n))
        o = self.output_median * np.exp(self.output_sigma * rng.standard_normal(n))
        return np.clip(c, 16, MAX_CONTEXT).astype(int), np.clip(o, 1, 2048).astype(int)


@dataclass(frozen=True)
class Latency:
    """Healthy latency (ms); see the module docstring."""

    queue_ms: float = 12.0
    retriever_ms: float = 36.0
    retriever_sigma: float = 0.3
    stall_p: float = 0.0
    reranker_ms: float = 18.0
    prefill_ms: float = 25.0
    ms_per_context_token: float = 0.05
    tpot_ms: float = 23.5  # 42.6 tokens/s a request, the seed's healthy decode speed
    tpot_sigma: float = 0.15
    load_slowdown: float = 0.15
    slowdown_per_4k_context: float = 0.1
    error_p: float = 0.002


@dataclass(frozen=True)
class Effect:
    """A fault (or a deploy) on some instances from ``start_ts`` to ``end_ts``, at full size
    after ``ramp_s``. Kinds: ``decode`` / ``llm`` (per-token decode time, the whole LLM
    stage: x size), ``errors`` (a share failing after their tokens), ``queue`` (+size ms of
    wait), ``retrieval`` (retriever x size), ``reranker`` (reranker x size), ``tokens``
    (output tokens x size), ``demand`` (arrivals x size); ``start``: the instance's
    process started at ``start_ts`` (its envelopes say so from the next minute on:
    :func:`started`)."""

    kind: str
    instances: tuple[str, ...]
    start_ts: float
    end_ts: float = math.inf
    size: float = 1.0
    ramp_s: float = 0.0

    def weight(self, ts: float) -> float:
        if not self.start_ts <= ts < self.end_ts:
            return 0.0
        return 1.0 if self.ramp_s <= 0 else min(1.0, (ts - self.start_ts) / self.ramp_s)


@dataclass(frozen=True)
class Mods:
    """What the effects on one instance do in one minute."""

    decode: float = 1.0
    llm: float = 1.0
    fail_p: float = 0.0
    queue_ms: float = 0.0
    retrieval: float = 1.0
    reranker: float = 1.0
    tokens: float = 1.0
    demand: float = 1.0


def mods(effects: Sequence[Effect], instance: str, ts: float) -> Mods:
    m = Mods()
    for e in effects:
        w = e.weight(ts) if instance in e.instances and e.kind != "start" else 0.0
        if w <= 0:
            continue
        scale = 1.0 + (e.size - 1.0) * w  # multiplicative kinds, ramped in
        if e.kind == "errors":
            m = replace(m, fail_p=max(m.fail_p, e.size * w))
        elif e.kind == "queue":
            m = replace(m, queue_ms=m.queue_ms + e.size * w)
        else:
            m = replace(m, **{e.kind: getattr(m, e.kind) * scale})
    return m


def started(effects: Sequence[Effect], instance: str, ts: float) -> float | None:
    """When the instance's process started, as its envelope for the minute from ``ts``
    says (None: the effects do not say, and neither does the envelope)."""
    starts = [e.start_ts for e in effects if e.kind == "start" and instance in e.instances]
    return max((t for t in starts if t <= ts), default=None)


@dataclass(frozen=True)
class Service:
    name: str
    instances: tuple[str, ...]
    hosts: tuple[str, ...]  # the host of each instance
    peak_rpm: float  # true requests a minute per instance at the weekday peak
    sample_rate: float = 0.5
    rhythm: Rhythm = Rhythm()
    mix: Mix = Mix()
    latency: Latency = Latency()
    arrivals: str = "poisson"  # or "trace": the trace's arrivals (peak_rpm is then ignored)
    burst_sigma: float = 0.2
    utilisation: float = 0.6  # rho at the weekday peak (the capacity it was sized for)
    effects: tuple[Effect, ...] = ()
    seed: int = 0
    offsets: tuple[float, ...] = field(default=())  # per-instance speed (default: drawn)


def service(name: str, n: int, hosts: Sequence[str], **kw: object) -> Service:
    """``n`` instances ``<name>-0``... on ``hosts`` in turn."""
    inst = tuple(f"{name}-{i}" for i in range(n))
    return Service(name, inst, tuple(hosts[i % len(hosts)] for i in range(n)), **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- arrivals


@cache
def trace() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trace's arrivals (seconds from its first), context and output tokens."""
    with gzip.open(TRACE, "rt") as f:
        rows = list(csv.DictReader(f))
    ts = np.array([datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows])
    ctx = np.array([int(r["ContextTokens"]) for r in rows])
    out = np.array([int(r["GeneratedTokens"]) for r in rows])
    return ts - ts.min(), np.maximum(ctx, 1), np.maximum(out, 1)


# one minute of one instance: arrival ts, context and output tokens (recorded ones), and
# the minute's true arrivals (the load)
Minute = tuple[np.ndarray, np.ndarray, np.ndarray, float]


def poisson_minutes(
    s: Service, rng: np.random.Generator, t0: float, t1: float
) -> Iterator[tuple[float, list[Minute]]]:
    """Per minute: each instance's arrivals (a non-homogeneous Poisson process)."""
    for t in np.arange(t0, t1, MINUTE):
        burst = math.exp(s.burst_sigma * rng.standard_normal() - s.burst_sigma**2 / 2)
        minute = []
        for inst in s.instances:
            lam = s.peak_rpm * s.rhythm.level(t) * burst * mods(s.effects, inst, t).demand
            n = rng.poisson(lam)
            k = rng.binomial(n, s.sample_rate)
            ctx, out = s.mix.draw(rng, k)
            minute.append((np.sort(t + MINUTE * rng.random(k)), ctx, out, float(n)))
        yield float(t), minute


def trace_minutes(
    s: Service, rng: np.random.Generator, t0: float, t1: float
) -> Iterator[tuple[float, list[Minute]]]:
    """Per minute: the trace's arrivals, block-bootstrapped and thinned (module docstring),
    spread over the instances at random. ``peak_rpm`` is ignored: the trace sets the rate."""
    offs, ctx, out = trace()
    blocks = int(offs.max() // BLOCK_S)
    for slot in np.arange(t0, t1, BLOCK_S):
        b = rng.integers(blocks)
        pick = (offs >= b * BLOCK_S) & (offs < (b + 1) * BLOCK_S)
        ts = slot + offs[pick] - b * BLOCK_S
        keep = rng.random(len(ts)) < np.array([s.rhythm.level(x) for x in ts])
        ts, c, o = ts[keep], ctx[pick][keep], out[pick][keep]
        inst = rng.integers(len(s.instances), size=len(ts))
        for t in np.arange(slot, min(slot + BLOCK_S, t1), MINUTE):
            yield float(t), _split(s, rng, ts, c, o, inst, t)


def _split(
    s: Service,
    rng: np.random.Generator,
    ts: np.ndarray,
    c: np.ndarray,
    o: np.ndarray,
    inst: np.ndarray,
    t: float,
) -> list[Minute]:
    out = []
    for i, name in enumerate(s.instances):
        sel = (inst == i) & (ts >= t) & (ts < t + MINUTE)
        sel &= rng.random(len(ts)) < mods(s.effects, name, t).demand
        n = float(sel.sum())
        rec = sel & (rng.random(len(ts)) < s.sample_rate)
        out.append((ts[rec], c[rec], o[rec], n))
    return out


# ---------------------------------------------------------------------- records


def envelopes(s: Service, t0: float, t1: float) -> Iterator[RequestsEnvelope]:
    """The service's envelopes from ``t0`` to ``t1``: one a minute per instance, stamped at
    the minute's end, with the minute's recorded requests (none: a heartbeat)."""
    rng = np.random.default_rng(s.seed)
    offsets = s.offsets or tuple(np.exp(0.05 * rng.standard_normal(len(s.instances))))
    capacity = s.peak_rpm / s.utilisation
    minutes = trace_minutes if s.arrivals == "trace" else poisson_minutes
    if s.arrivals == "trace":  # the trace's hour at the peak, per instance
        capacity = len(trace()[0]) / (trace()[0].max() / MINUTE) / len(s.instances) / s.utilisation
    for t, per_instance in minutes(s, rng, t0, t1):
        for i, (ts, ctx, out, n) in enumerate(per_instance):
            m = mods(s.effects, s.instances[i], t)
            rho = min(0.95, n / capacity)
            recs = records(rng, s.latency, m, rho, offsets[i], ts, ctx, out)
            name = s.instances[i]
            yield RequestsEnvelope(
                s.name, name, t + MINUTE, recs, host=s.hosts[i], started=started(s.effects, name, t)
            )


def records(
    rng: np.random.Generator,
    lat: Latency,
    m: Mods,
    rho: float,
    speed: float,
    ts: np.ndarray,
    ctx: np.ndarray,
    out: np.ndarray,
) -> tuple[RequestRecord, ...]:
    """One minute's recorded requests of one instance (the model in the module docstring)."""
    n = len(ts)
    if n == 0:
        return ()
    out = np.maximum(1, np.round(out * m.tokens)).astype(int)
    queue = rng.exponential(lat.queue_ms * rho / (1 - rho), n) + m.queue_ms
    retr = lat.retriever_ms * speed * np.exp(lat.retriever_sigma * rng.standard_normal(n))
    stall = rng.random(n) < lat.stall_p
    retr = np.where(stall, rng.uniform(90, 200, n), retr) * m.retrieval
    rerank = lat.reranker_ms * np.exp(0.25 * rng.standard_normal(n)) * m.reranker
    prefill = (lat.prefill_ms + lat.ms_per_context_token * ctx) * np.exp(
        0.1 * rng.standard_normal(n)
    )
    # decode: slower as the batch fills (rho) and as the KV cache grows (context), and
    # uneven from request to request (who else is in the batch)
    slow = (1 + lat.load_slowdown * rho) * (1 + lat.slowdown_per_4k_context * ctx / 4096)
    tpot = lat.tpot_ms * slow * np.exp(lat.tpot_sigma * rng.standard_normal(n))
    decode = (out - 1) * tpot * speed * m.decode  # the first token comes with the prefill
    prefill, decode = prefill * speed * m.llm, decode * m.llm
    early = rng.random(n) < lat.error_p  # fails before the LLM: no tokens
    late = rng.random(n) < m.fail_p  # fails after its tokens
    ttft = queue + retr + rerank + prefill
    e2e = ttft + decode + 3.0
    return tuple(
        _record(
            ts[j], early[j], late[j], queue[j], retr[j], rerank[j], ttft[j], e2e[j], ctx[j], out[j]
        )
        for j in range(n)
    )


def _record(
    ts: float,
    early: bool,
    late: bool,
    queue: float,
    retr: float,
    rerank: float,
    ttft: float,
    e2e: float,
    ctx: int,
    out: int,
) -> RequestRecord:
    if early:
        return RequestRecord(
            ts=float(ts), status="error", e2e_ms=round(float(queue + retr) + 1.0, 1),
            context_tokens=int(ctx), output_tokens=0, stages={"retriever": round(float(retr), 1)},
            queue_ms=round(float(queue), 1),
        )  # fmt: skip
    return RequestRecord(
        ts=float(ts),
        status="error" if late else "ok",
        e2e_ms=round(float(e2e), 1),
        context_tokens=int(ctx),
        output_tokens=int(out),
        stages={
            "retriever": round(float(retr), 1),
            "reranker": round(float(rerank), 1),
            "llm": round(float(e2e - queue - retr - rerank - 3.0), 1),
        },
        queue_ms=round(float(queue), 1),
        ttft_ms=round(float(ttft), 1),
    )


def merged(*streams: Iterator[Envelope]) -> Iterator[Envelope]:
    """Envelopes of several streams in event-time order."""
    return heapq.merge(*streams, key=lambda e: float(getattr(e, "ts", 0.0)))


# ---------------------------------------------------------------------- shapes


def _world(
    services: Sequence[Service], t0: float, t1: float, gpu: Iterator[Envelope] | None = None
) -> Iterator[Envelope]:
    streams: list[Iterator[Envelope]] = [envelopes(s, t0, t1) for s in services]
    if gpu is not None:
        streams.append(gpu)
    return merged(*streams)


HOSTS4 = tuple(f"gpu-node-{i:02d}" for i in range(4))


def _target(s: Service, i: int) -> dict[str, str]:
    return {"service": s.name, "instance": s.instances[i]}


def _healthy_days(series: int, t0: float, t1: float, faults: Sequence[Expect] = ()) -> float:
    """Series-days outside the fault windows (each fault on one series, plus an hour)."""
    faulty = sum(min(t1, (f.end_ts or t1) + HOUR) - f.start_ts for f in faults)
    return round((series * (t1 - t0) - faulty) / DAY, 3)


def _chat(name: str, n: int, hosts: Sequence[str], seed: int, **kw: object) -> Service:
    """A RAG chat service: answers of a few hundred tokens, long contexts."""
    mix = Mix(context_median=2500, context_sigma=0.6, output_median=180, output_sigma=0.8)
    return service(name, n, hosts, mix=mix, seed=seed, **kw)


def _seed_service(peak_rpm: float = 60.0, **kw: object) -> Service:
    """The seed's service: short answers (healthy e2e P95 ~0.8 s), two instances, 30
    recorded requests a minute each at the weekday peak (``peak_rpm`` x 0.5)."""
    mix = Mix(output_median=12.0)
    return service("rag-api", 2, HOSTS4[:2], peak_rpm=peak_rpm, mix=mix, **kw)


def fleet_14d() -> Shape:
    """Two full weeks of two services x 3 instances on 4 hosts x 4 GPUs."""
    t0, t1 = MONDAY, MONDAY + 14 * DAY
    rhythm = Rhythm(daily_ratio=6.0, peak_hour=14.0, weekend=0.45, holidays=(MONDAY + 9 * DAY,))
    deploy = tuple(  # Friday 14:00, rolled out an instance every 10 minutes: +15 % latency
        Effect("llm", (f"rag-api-{i}",), t0 + 4 * DAY + 14 * HOUR + 600 * i, size=1.15)
        for i in range(3)
    )
    stalls = Latency(stall_p=0.003)  # the fleet: 0.3 % of retrievals stall
    api = service(
        "rag-api", 3, HOSTS4, peak_rpm=60.0, rhythm=rhythm, latency=stalls, effects=deploy, seed=11
    )
    code = service(
        "code-assist", 3, HOSTS4[1:], peak_rpm=80.0, rhythm=replace(rhythm, peak_hour=16.0),
        mix=Mix(trace=True), seed=12,
    )  # fmt: skip
    return Shape(
        "fleet-14d",
        lambda: _world((api, code), t0, t1, _fleet_gpus(t0, t1)),
        faults=(),
        series_days=_healthy_days(6 + 16 + 16, t0, t1),  # instances, GPUs, their processes
        note="A healthy fleet over two weeks: weekends at 45 %, a quiet holiday, a deploy "
        "adding 15 % latency, daily model reloads.",
    )


def _fleet_gpus(t0: float, t1: float) -> Iterator[Envelope]:
    """The fleet's GPUs from the GPU memory shapes (bench/shape_memory.py): caching
    allocators restarted daily, vLLM-style preallocation, reloads, batch jobs; 10 s samples."""
    from shape_memory import fleet_gpus  # a sibling bench module, imported when played

    return fleet_gpus(len(HOSTS4), 4, t0, (t1 - t0) / DAY, 13)


def weekly_10d() -> Shape:
    t0, t1 = THURSDAY, THURSDAY + 10 * DAY
    deploy = Effect("llm", ("rag-api-0", "rag-api-1"), t0 + 5 * DAY + 10 * HOUR, size=1.10)
    s = _seed_service(rhythm=Rhythm(daily_ratio=5.0, weekend=0.25), effects=(deploy,), seed=21)
    return Shape(
        "weekly-10d",
        lambda: _world((s,), t0, t1),
        faults=(),
        series_days=_healthy_days(2, t0, t1),
        note="Ten healthy days from a Thursday, weekends at a quarter of weekday traffic, a "
        "deploy making the LLM 10 % slower.",
    )


def night_fault(short: bool = False) -> Shape:
    """``short``: 26 h of history before the fault, 90 min after it (for ``make test``)."""
    t0, t1 = MONDAY + 1 * DAY, MONDAY + 4 * DAY
    start, end = t0 + DAY + 20 * HOUR, t0 + 2 * DAY + 6 * HOUR
    if short:
        t0, t1 = start - 26 * HOUR, end + 1.5 * HOUR
    fault = Effect("retrieval", ("rag-api-0",), start, end, size=4.0)
    # ~3 recorded requests a minute per instance at the 04:00 trough (30 at the peak / 10)
    rhythm = Rhythm(daily_ratio=10.0, peak_hour=16.0)
    s = _seed_service(rhythm=rhythm, effects=(fault,), seed=31)
    exp = Expect("retrieval", ("RetrievalSlowdown",), _target(s, 0), start, end,
                 max_delay_s=None, resolve_within_s=HOUR)  # fmt: skip
    return Shape(
        "night-fault",
        lambda: _world((s,), t0, t1),
        faults=(exp,),
        series_days=_healthy_days(2, t0, t1, (exp,)),
        note="A 10 h retrieval fault (every lookup 4x slower) across the night on one of two "
        "instances, ~3 recorded requests a minute at the trough.",
    )


def retriever_stalls(days: float = 4.0) -> Shape:
    t0, t1 = MONDAY, MONDAY + days * DAY
    s = _seed_service(latency=Latency(stall_p=0.003), seed=41)
    return Shape(
        "retriever-stalls",
        lambda: _world((s,), t0, t1),
        faults=(),
        series_days=_healthy_days(2, t0, t1),
        note="A healthy retriever whose 0.3 % of calls stall 90-200 ms on a 36 ms median.",
    )


def _trace_world(effects: tuple[Effect, ...] = ()) -> tuple[Service, Service]:
    rhythm = Rhythm(daily_ratio=4.0, peak_hour=18.75)  # the trace's hour is the daily peak
    code = service("code-assist", 2, HOSTS4[:2], peak_rpm=0.0, mix=Mix(trace=True),
                   arrivals="trace", rhythm=rhythm, effects=effects, seed=51)  # fmt: skip
    chat = _chat("rag-chat", 1, HOSTS4[2:], seed=52, peak_rpm=30.0)
    return code, chat


TRACE_T0 = MONDAY + DAY  # a Tuesday
TRACE_HOURS = 30.0


def real_trace(hours: float = TRACE_HOURS) -> Shape:
    t0, t1 = TRACE_T0, TRACE_T0 + hours * HOUR
    world = _trace_world()
    return Shape(
        "real-trace",
        lambda: _world(world, t0, t1),
        faults=(),
        series_days=_healthy_days(3, t0, t1),
        note=f"Real arrivals and token counts ({TRACE_CREDIT}) replayed for {hours:.0f} h as two "
        "instances, a chat service beside them; nothing wrong.",
    )


def real_trace_decode(hours: float = TRACE_HOURS) -> Shape:
    t0, t1 = TRACE_T0, TRACE_T0 + hours * HOUR
    start = t0 + 16 * HOUR  # 16 h of history; the fault spans the trace's peak hour
    fault = Effect("decode", ("code-assist-0",), start, start + 3 * HOUR, size=1 / 0.64)
    world = _trace_world((fault,))
    exp = Expect("decode", ("DecodeSpeedDrop",), _target(world[0], 0), start, start + 3 * HOUR,
                 max_delay_s=15 * MINUTE)  # fmt: skip
    return Shape(
        "real-trace-decode",
        lambda: _world(world, t0, t1),
        faults=(exp,),
        series_days=_healthy_days(3, t0, t1, (exp,)),
        note="The real trace, one instance decoding 36 % slower (per-token time / 0.64) for 3 h.",
    )


def _two_days(name: str, effect: Effect, exp: Expect, note: str, seed: int, short: bool) -> Shape:
    """Two days of the seed's service with one fault on the second afternoon; ``short``: the
    same fault after 26 h of history, ending 90 min after the fault (for ``make test``)."""
    t0, t1 = MONDAY, MONDAY + 2 * DAY
    if short:
        t0, t1 = exp.start_ts - 26 * HOUR, (exp.end_ts or t1) + 1.5 * HOUR
    s = _seed_service(effects=(effect,), seed=seed)
    return Shape(name, lambda: _world((s,), t0, t1), faults=(exp,),
                 series_days=_healthy_days(2, t0, t1, (exp,)), note=note)  # fmt: skip


API0 = {"service": "rag-api", "instance": "rag-api-0"}
FAULT_AT = MONDAY + DAY + 14 * HOUR  # the second day, near the daily peak


def error_burst(short: bool = False) -> Shape:
    start, end = FAULT_AT, FAULT_AT + 20 * MINUTE
    return _two_days(
        "error-burst",
        Effect("errors", ("rag-api-0",), start, end, size=0.30),
        Expect("errors", ("ErrorRateHigh",), API0, start, end, max_delay_s=10 * MINUTE),
        "30 % of one instance's requests fail for 20 min after generating their tokens.",
        seed=61,
        short=short,
    )


def queue_growth(short: bool = False) -> Shape:
    start, end = FAULT_AT, FAULT_AT + 2.5 * HOUR
    rules = ("QueueWaitHigh", "TtftDeviation", "E2eLatencyDeviation")
    return _two_days(
        "queue-growth",
        Effect("queue", ("rag-api-0",), start, end, size=10_000.0, ramp_s=2 * HOUR),
        Expect("queue", rules, API0, start, end, max_delay_s=20 * MINUTE),
        "The queue wait on one instance grows 0 -> 10 s over 2 h (a stuck worker slot).",
        seed=71,
        short=short,
    )


def retrieval_gradual(short: bool = False) -> Shape:
    start, end = FAULT_AT, FAULT_AT + 2 * HOUR
    return _two_days(
        "retrieval-gradual",
        Effect("retrieval", ("rag-api-0",), start, end, size=4.0, ramp_s=45 * MINUTE),
        Expect("retrieval", ("RetrievalSlowdown",), API0, start, end, max_delay_s=45 * MINUTE),
        "Every retrieval on one instance slows gradually to 4x over 45 min (an index outgrowing "
        "its cache), for 2 h.",
        seed=81,
        short=short,
    )


def seed_incident(short: bool = False) -> Shape:
    """The seed: decode -36 %, tokens/request -36 %, QPS -37 %, P95 820 -> ~1340 ms."""
    start, end = FAULT_AT, FAULT_AT + 2 * HOUR
    on = ("rag-api-0",)
    effects = (
        Effect("decode", on, start, end, size=1 / 0.64),
        Effect("tokens", on, start, end, size=0.64),
        Effect("demand", on, start, end, size=0.63),
        Effect("queue", on, start, end, size=520.0),
    )
    t0, t1 = (start - 26 * HOUR, end + 1.5 * HOUR) if short else (MONDAY, MONDAY + 2 * DAY)
    # the seed's traffic: ragwatch's seed recording had ~120 recorded requests a minute per
    # instance (20 requests/s, 10 % recorded); ~100 here at the fault's hour
    s = _seed_service(peak_rpm=200.0, effects=effects, seed=91)
    faults = (
        Expect("tokens", ("TokensPerRequestDrop", "ThroughputDrop"), API0, start, end,
               max_delay_s=6 * MINUTE),
        Expect("decode", ("DecodeSpeedDrop",), API0, start, end, max_delay_s=6 * MINUTE),
    )  # fmt: skip
    return Shape(
        "seed",
        lambda: _world((s,), t0, t1),
        faults=faults,
        series_days=_healthy_days(2, t0, t1, faults[:1]),
        note="The seed incident on one of two instances: decode speed and tokens per request "
        "-36 %, QPS -37 %, e2e P95 up ~1.6x.",
    )


SHAPES = [
    fleet_14d(),
    weekly_10d(),
    night_fault(),
    retriever_stalls(),
    real_trace(),
    real_trace_decode(),
    error_burst(),
    queue_growth(),
    retrieval_gradual(),
    seed_incident(),
]
# real-trace: no RequestOutlierCluster (info) after its first day either
INFO_FREE_AFTER = {"real-trace": TRACE_T0 + DAY}


# ---------------------------------------------------------------------- random worlds

EXPECTED = {  # the rules that count as finding each kind of fault
    "decode": ("DecodeSpeedDrop",),
    "errors": ("ErrorRateHigh",),
    "queue": ("QueueWaitHigh", "TtftDeviation", "E2eLatencyDeviation"),
    "retrieval": ("RetrievalSlowdown",),
    "tokens": ("TokensPerRequestDrop",),
}
SIZES = {  # (low, high) of each kind's size: the faults, give or take a third
    "decode": (1 / 0.75, 1 / 0.55),
    "errors": (0.15, 0.4),
    "queue": (3_000.0, 12_000.0),
    "retrieval": (3.0, 6.0),
    "tokens": (0.5, 0.7),
}


def random_world(seed: int) -> Shape:
    """:func:`random_traffic`'s world of ``seed``."""
    return random_traffic(seed)[0]


def random_traffic(seed: int, days: int | None = None) -> tuple[Shape, float, float]:
    """A traffic world drawn from ``seed`` for a scenario space (``bench/space_worlds.py``
    draws from it), with its start and end: a weekly rhythm (weekends at 25-100 %), a
    quiet holiday (a third of the draws), bursts (per-minute sigma 0-0.4), a request mix
    (the trace's, on its own arrivals or on Poisson ones, or chat-like, or short
    answers), a retriever stall rate (0-0.5 %), 2-20x daily, 3-9 days (or ``days``), and
    zero to two faults on one of two instances, of 20 min to 6 h, from the second day."""
    rng = np.random.default_rng(seed)
    drawn = int(rng.integers(3, 10))
    days = drawn if days is None else days
    t0 = MONDAY + int(rng.integers(7)) * DAY
    t1 = t0 + days * DAY
    holidays = (t0 + int(rng.integers(1, days)) * DAY,) if rng.random() < 1 / 3 else ()
    rhythm = Rhythm(
        daily_ratio=float(math.exp(rng.uniform(math.log(2), math.log(20)))),
        peak_hour=float(rng.uniform(10, 20)),
        weekend=float(rng.uniform(0.25, 1.0)),
        holidays=holidays,
    )
    mix = (Mix(trace=True), Mix(output_median=12.0), Mix(2500, 0.6, 180, 0.8))[rng.integers(3)]
    arrivals = "trace" if mix.trace and rng.random() < 0.5 else "poisson"
    faults = [_random_fault(rng, t0, t1) for _ in range(int(rng.choice([0, 1, 1, 2])))]
    effects = tuple(e for e, _ in faults)
    s = service(
        "rag-api", 2, HOSTS4[:2], peak_rpm=float(math.exp(rng.uniform(math.log(6), math.log(120)))),
        rhythm=rhythm, mix=mix, arrivals=arrivals, burst_sigma=float(rng.uniform(0, 0.4)),
        latency=Latency(stall_p=float(rng.uniform(0, 0.005))), effects=effects, seed=seed,
    )  # fmt: skip
    expects = tuple(x for _, x in faults)
    shape = Shape(
        f"random-{seed}",
        lambda: _world((s,), t0, t1),
        faults=expects,
        series_days=_healthy_days(2, t0, t1, expects),
        note=f"A drawn world (seed {seed}), {days} days, {len(expects)} faults.",
    )
    return shape, t0, t1


def _random_fault(rng: np.random.Generator, t0: float, t1: float) -> tuple[Effect, Expect]:
    kind = str(rng.choice(list(EXPECTED)))
    duration = float(math.exp(rng.uniform(math.log(20 * MINUTE), math.log(6 * HOUR))))
    start = t0 + DAY + round(rng.uniform(0, max(0.0, t1 - t0 - DAY - duration - HOUR)) / 60) * 60
    low, high = SIZES[kind]
    ramp = float(rng.uniform(0, duration / 2)) if kind in ("queue", "retrieval") else 0.0
    inst = f"rag-api-{rng.integers(2)}"
    effect = Effect(kind, (inst,), start, start + duration, float(rng.uniform(low, high)), ramp)
    target = {"service": "rag-api", "instance": inst}
    return effect, Expect(kind, EXPECTED[kind], target, start, start + duration)
