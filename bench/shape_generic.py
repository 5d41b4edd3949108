"""Faults no specific rule names (issue 34), for the generic detector and its default rules.

Each shape plays several days of healthy telemetry with daily and weekly rhythms (so the
detector has learnt what normal looks like, weekend included), then one fault on one
series from Thursday 10:00 for four hours, and the rest of that day:

- ``generic-gpu-hang``: a GPU hangs without an XID: utilisation, copy utilisation and
  power collapse to idle while its memory stays allocated (the process is stuck in a
  kernel or a collective that never completes);
- ``generic-gpu-power-cap``: a GPU's power is capped (a power brake, a misconfigured
  ``nvidia-smi -pl``, a PSU fault) and its clocks halve: power falls to ~45 %, the same
  work keeps it twice as busy, its temperature drops;
- ``generic-gpu-hot``: one replica's GPU (the six GPUs run one Deployment's pods) runs
  15 C hotter at the same load (a failed fan or a blocked air path) and draws a little
  more power (leakage grows with heat): a single signal, judged against its like GPUs;
- ``generic-slow-reranker``: a service instance's reranker slows 5x (a model swapped
  for a larger one, a cache gone cold, a CPU fallback);
- ``generic-kv-cache-filling``: a scraped vLLM engine's KV cache fills (a client sending
  ever longer contexts): usage climbs to 99 %, requests wait, queue time and TTFT grow,
  preemptions start;
- ``generic-slow-embedder``: a scraped embedding server (Text Embeddings Inference's
  metrics: requests, failures, queue size, request and queue durations; no tokens
  generated) computes each batch 2.5x slower at the usual demand (a model swapped, a GPU
  shared with another job): its requests wait longer and queue up.

But for the hot replica no GPU here is held by a pod, so the like-GPU rules
(streams/pipelines/gpu_peers.py) compare nothing: what pages is the generic family
(``GpuAnomaly``, ``ServiceAnomaly``, ``EngineAnomaly``, ``GpuRunningHot``), or a specific
rule where one exists and fits (the end-to-end latency rule may see the reranker through
the end-to-end P95, the preemption rule a full KV cache: allowed, each rule once).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import replace

from shape_kit import DAY, HOUR, MINUTE, MONDAY, Expect, Shape
from shape_traffic import Effect, _seed_service, _world

from ragwatch.schema import Envelope, GpuEnvelope, GpuSample, MetricSample, MetricsEnvelope

GB = 1 << 30
MODEL = "NVIDIA H100 80GB HBM3"
FAULT_AT = MONDAY + 3 * DAY + 10 * HOUR  # Thursday 10:00 UTC
FAULT_S = 4 * HOUR
END = MONDAY + 4 * DAY
HOSTS, GPUS = 3, 2
STEP_S = 30.0


def load(ts: float) -> float:
    """GPU load in percent: a daily rhythm peaking at 15:00, weekends at 60 %."""
    hour = (ts % DAY) / HOUR
    weekday = int((ts - MONDAY) // DAY) % 7
    level = 45.0 + 35.0 * math.cos(2 * math.pi * (hour - 15.0) / 24)
    return level * (0.6 if weekday >= 5 else 1.0)


def gpu_envelopes(
    fault: str, t0: float, t1: float, seed: int = 7, demand: Callable[[float], float] = load
) -> Iterator[GpuEnvelope]:
    """Every GPU of the fleet every ``STEP_S`` under ``demand`` (percent at a time);
    ``fault`` on node-01's GPU 1 during the fault window."""
    rng = random.Random(seed)
    temp = {(h, g): 40.0 for h in range(HOSTS) for g in range(GPUS)}
    used = {(h, g): rng.uniform(30, 60) * GB for h in range(HOSTS) for g in range(GPUS)}
    ts = t0
    while ts < t1:
        samples: dict[int, list[GpuSample]] = {}
        level = demand(ts)
        for h in range(HOSTS):
            for g in range(GPUS):
                faulty = (h, g) == (1, 1) and FAULT_AT <= ts < FAULT_AT + FAULT_S
                kind = fault if faulty else ""
                samples.setdefault(h, []).append(
                    _gpu(rng, h, g, level, kind, temp, used, fault == "hot")
                )
        for h in range(HOSTS):
            yield GpuEnvelope(f"node-{h:02d}", ts, tuple(samples[h]))
        ts += STEP_S


def _gpu(
    rng: random.Random,
    h: int,
    g: int,
    level: float,
    fault: str,
    temp: dict[tuple[int, int], float],
    used: dict[tuple[int, int], float],
    hot_fleet: bool = False,
) -> GpuSample:
    util = min(100.0, max(0.0, level * (0.9 + 0.1 * g) + rng.gauss(0, 5)))
    copy = min(100.0, max(0.0, 0.35 * util + rng.gauss(0, 3)))
    power = 70.0 + 5.4 * util + rng.gauss(0, 12)
    target = 32.0 + 0.42 * util + 2.0 * h
    if fault == "hang":
        util, copy, power, target = 0.0, 0.0, 72.0 + rng.gauss(0, 2), 33.0 + 2.0 * h
    elif fault == "power-cap":  # clocks halved: the same work keeps it twice as busy
        util, power = min(100.0, util * 2.0), power * 0.45
        target = 32.0 + 0.2 * util + 2.0 * h
    elif fault == "hot":
        target += 15.0
        power *= 1.04
    key = (h, g)
    temp[key] += (target - temp[key]) * 0.3 + rng.gauss(0, 0.4)
    if rng.random() < 0.01:  # the caching allocator takes a block more, or frees one
        used[key] = min(70 * GB, max(25 * GB, used[key] + rng.choice((2, -2)) * GB))
    safe = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' alphabet of generated names
    suffix = "".join(safe[(7 * h + 3 * g + 5 * i) % len(safe)] for i in range(5))
    pod = {"namespace": "prod", "pod": f"vllm-7d9f8c6b5-{suffix}", "container": "server"}
    return GpuSample(
        g, f"GPU-{h}-{g}", MODEL, int(used[key]), 80 * GB, gpu_util=util,
        mem_copy_util=copy, temp_c=temp[key], power_w=max(60.0, power),
        **(pod if fault == "hot" or hot_fleet else {}),
    )  # fmt: skip


def _gpu_shape(name: str, fault: str, note: str) -> Shape:
    target = {"host": "node-01", "gpu": "1"}
    # one replica running hot: a single signal, judged against its like GPUs (the GPUs
    # of one Deployment's pods: streams/pipelines/gpu_peers.py), for 2 h
    hot = ("GpuRunningHot", "ReplicaGpuTempOutlier")
    rules = hot if fault == "hot" else ("GpuAnomaly",)
    delay = 45 * MINUTE
    exp = Expect(f"gpu-{fault}", rules, target, FAULT_AT, FAULT_AT + FAULT_S, max_delay_s=delay)
    series = HOSTS * GPUS
    days = series * (END - MONDAY) / DAY - (FAULT_S + HOUR) / DAY
    return Shape(name, lambda: gpu_envelopes(fault, MONDAY, END), (exp,), round(days, 3), note)


def gpu_hang() -> Shape:
    return _gpu_shape("generic-gpu-hang", "hang", "a GPU hung without an XID")


def gpu_power_cap() -> Shape:
    return _gpu_shape("generic-gpu-power-cap", "power-cap", "a power-capped GPU, clocks halved")


def gpu_hot() -> Shape:
    return _gpu_shape(
        "generic-gpu-hot", "hot", "one replica's GPU 15 C hotter at the same load (pods)"
    )


def slow_reranker() -> Shape:
    s = _seed_service(peak_rpm=60.0)
    effect = Effect("reranker", (s.instances[0],), FAULT_AT, FAULT_AT + FAULT_S, size=5.0)
    s = replace(s, effects=(effect,))
    target = {"service": s.name, "instance": s.instances[0]}
    rules = ("ServiceAnomaly", "E2eLatencyDeviation")
    exp = Expect("reranker", rules, target, FAULT_AT, FAULT_AT + FAULT_S, max_delay_s=45 * MINUTE)
    days = len(s.instances) * (END - MONDAY) / DAY - (FAULT_S + HOUR) / DAY
    return Shape(
        "generic-slow-reranker", lambda: _world([s], MONDAY, END), (exp,), round(days, 3),
        "an instance's reranker 5x slower (requests modelled as in shape_traffic)",
    )  # fmt: skip


def engine_envelopes(t0: float, t1: float, seed: int = 5) -> Iterator[Envelope]:
    """Two vLLM engines scraped every 15 s (counters cumulative, gauges as read); the
    first one's KV cache fills during the fault window."""
    rng = random.Random(seed)
    # requests, generated and prompt tokens, preemptions, queue seconds' sum and count
    totals = {e: [0.0] * 6 for e in range(2)}
    ts = t0
    while ts < t1:
        for e in range(2):
            rps = max(0.0, load(ts) / 10.0 * math.exp(rng.gauss(0, 0.15)))
            fill = 0.0
            if e == 0 and FAULT_AT <= ts < FAULT_AT + FAULT_S:
                fill = min(1.0, (ts - FAULT_AT) / HOUR)
            usage = min(0.995, 0.15 + 0.5 * load(ts) / 80.0 + rng.gauss(0, 0.03) + 0.6 * fill)
            waiting = max(0.0, rng.gauss(0.3, 0.5)) + 25.0 * fill * (1 + rng.random())
            queue_s = 0.02 + 0.01 * rng.random() + 3.0 * fill
            t = totals[e]
            t[0] += rps * 15
            t[1] += rps * 15 * 180 * math.exp(rng.gauss(0, 0.1))
            t[2] += rps * 15 * 2500
            t[3] += 15 * 0.2 * fill * (1 + rng.random())
            t[4] += rps * 15 * queue_s
            t[5] += rps * 15
            yield vllm_scrape(e, ts, t, waiting, rps * 4.0, max(0.0, usage))
        ts += 15.0


COUNTERS = (  # the counters of vllm_scrape's ``totals``, in order
    "ragwatch_requests_succeeded_total", "ragwatch_generation_tokens_total",
    "ragwatch_prompt_tokens_total", "ragwatch_preemptions_total",
    "ragwatch_queue_seconds_sum", "ragwatch_queue_seconds_count",
)  # fmt: skip


def vllm_scrape(
    engine: int, ts: float, totals: list[float], waiting: float, running: float, usage: float
) -> MetricsEnvelope:
    """One scrape of engine ``engine`` (on ``node-<engine>``): the cumulative ``totals``
    of :data:`COUNTERS`, and the gauges as read."""
    counters = tuple(MetricSample(n, {}, v) for n, v in zip(COUNTERS, totals, strict=True))
    return MetricsEnvelope(f"node-{engine:02d}", "http://vllm:8000/metrics", ts, (
        *counters,
        MetricSample("ragwatch_requests_waiting", {}, waiting),
        MetricSample("ragwatch_requests_running", {}, running),
        MetricSample("ragwatch_kv_cache_usage_ratio", {}, usage),
    ))  # fmt: skip


def kv_cache_filling() -> Shape:
    target = {"host": "node-00", "target": "http://vllm:8000/metrics"}
    rules = ("EngineAnomaly", "EnginePreemptions")
    exp = Expect("kv-cache", rules, target, FAULT_AT, FAULT_AT + FAULT_S, max_delay_s=45 * MINUTE)
    days = 2 * (END - MONDAY) / DAY - (FAULT_S + HOUR) / DAY
    return Shape(
        "generic-kv-cache-filling", lambda: engine_envelopes(MONDAY, END), (exp,), round(days, 3),
        "a vLLM engine's KV cache fills: usage 99 %, requests wait, preemptions",
    )  # fmt: skip


EMBEDDER = "http://tei:8080/metrics"


def embedder_envelopes(
    t0: float, t1: float, seed: int = 4, demand: Callable[[float], float] = load, slow: float = 1.0
) -> Iterator[Envelope]:
    """An embedding server (TEI's metrics, as its agent renames them) scraped every 15 s:
    requests as demand (40/s at the usual weekday peak), each batch's compute 20 ms (``slow``
    times that in the fault window) at a utilisation of 0.5 at that peak, a queue's wait as
    rho / (1 - rho), a few failures."""
    rng, totals, ts = random.Random(seed), [0.0] * 6, t0
    while ts < t1:
        factor = slow if FAULT_AT <= ts < FAULT_AT + FAULT_S else 1.0
        rps = 40.0 * demand(ts) / 80.0 * math.exp(rng.gauss(0, 0.1))
        compute = 0.02 * factor * math.exp(rng.gauss(0, 0.05))
        rho = min(0.97, rps * compute / 1.6)  # 0.5 at the usual peak
        wait = compute * rho / (1 - rho) * math.exp(rng.gauss(0, 0.2))
        failed = rps * 15 * 0.001 * rng.random()
        for k, v in enumerate((rps * 15, failed, rps * 15 * (wait + compute + 0.002),
                               rps * 15, rps * 15 * wait, rps * 15)):  # fmt: skip
            totals[k] += v
        waiting = max(0.0, rps * wait + rng.gauss(0, 0.5))
        yield MetricsEnvelope("node-05", EMBEDDER, ts, (
            MetricSample("ragwatch_requests_total", {"method": "batch"}, totals[0]),
            MetricSample("ragwatch_requests_failed_total", {"err": "overloaded"}, totals[1]),
            MetricSample("ragwatch_e2e_seconds_sum", {}, totals[2]),
            MetricSample("ragwatch_e2e_seconds_count", {}, totals[3]),
            MetricSample("ragwatch_queue_seconds_sum", {}, totals[4]),
            MetricSample("ragwatch_queue_seconds_count", {}, totals[5]),
            MetricSample("ragwatch_requests_waiting", {}, waiting),
        ))  # fmt: skip
        ts += 15.0


def slow_embedder() -> Shape:
    target = {"host": "node-05", "target": EMBEDDER}
    exp = Expect("embedder", ("EngineAnomaly",), target, FAULT_AT, FAULT_AT + FAULT_S,
                 max_delay_s=45 * MINUTE)  # fmt: skip
    days = (END - MONDAY) / DAY - (FAULT_S + HOUR) / DAY
    return Shape(
        "generic-slow-embedder",
        lambda: embedder_envelopes(MONDAY, END, slow=2.5), (exp,), round(days, 3),
        "a scraped embedding server computes 2.5x slower at the usual demand: waits, queues",
    )  # fmt: skip


def shapes() -> list[Shape]:
    return [
        gpu_hang(), gpu_power_cap(), gpu_hot(), slow_reranker(), kv_cache_filling(),
        slow_embedder(),
    ]  # fmt: skip


SHAPES = shapes
