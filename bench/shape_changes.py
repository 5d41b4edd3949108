"""Healthy changes a real service goes through, for the independent scenarios (issue 34).

None of them is a fault, and none should page. Each moves several of an instance's signals
at once, which is what the generic rule (``ServiceAnomaly``: two groups of signals out of
their bands for 25 minutes) pages on, so each tests that the rule knows demand from damage:

- **flash crowd**: the arrivals on both instances double for three hours on a weekday
  morning (a launch, a newsletter), ramped in over 30 min, then a 1.3x surge at the daily
  peak of another day (utilisation 0.6 -> 0.78: the queue wait grows with it);
- **daylight saving time**: the users' clocks move an hour ahead on the seventh day, so in
  UTC the whole daily rhythm comes an hour earlier, and the profiles learnt by UTC time of
  day are an hour off on every edge of the day;
- **a prompt template change**: from the fourth day on, requests carry 1.6x the context
  (more retrieved chunks), for good: prefill and time to first token grow with it, a new
  normal that is not a fault;
- **a batch client**: beside the chat traffic, a client sends 15 requests a minute to each
  instance with 6,000-token contexts and 350-token answers (a nightly summarisation job)
  between 01:00 and 03:00 UTC, where the chat traffic is at its trough: at those hours it
  is most of the traffic, and the answers, the end-to-end latency, the first token and
  each request's decode (attention over a longer context) all move. Three forms: every
  night from the first; every night from the fourth (a new job); Sundays 02:00-05:00 only,
  for two weeks (a weekly report: news to the daily profile every time);
- **a scale-in**: three instances, one removed on the fourth day at 11:00 (an autoscaler,
  a zone drained); its traffic goes to the other two, 1.5x (or 1.3x) their load on the
  same capacity, for good: utilisation 0.9 (0.78) at the daily peak instead of 0.6, and
  the queue wait grows as ``rho / (1 - rho)``, 6x (2.4x) at the peak;
- **pods of new names**: a Deployment's two pods replaced by two new ones every weekday at
  14:00 (a rolling update, 5 minutes apart; instances of new names with no history, near
  the peak), and a third pod of a new name each weekday 10:00-19:00 (an autoscaler at the
  peak) taking a third of the load;
- **restarts under the same names** (a StatefulSet's rolling update), both instances in
  turn every weekday at 14:00: a third of a minute's requests fail, none for 2 minutes
  (the other instance takes them), then a cold start, the retriever 4x slower for a
  minute (lazy initialisation) and 1.5x for 4 more (caches warming); the envelopes say
  when their process started, as the SDK's do (``restart-slow``: the same, and a fault
  from Thursday's first restart on, the retriever 4x slower for 2 hours);
- **a vector store's nightly compaction**: every lookup of both instances 4x slower for
  20 minutes at 03:00 every night;
- **a retriever's blips**: four a day at random minutes on either instance, every lookup
  4x slower for a minute or 3x for two (a GC pause, a segment merge, a network blip).

Two instances of the chat-like service (answers of ~180 tokens, contexts of ~2,500). The
flash crowd reaches the GPUs and the serving engines too, each with its own shape:

- **GPUs** (the fleet of ``bench/shape_generic.py``, 3 hosts x 2 GPUs): the load doubles
  for three hours on a weekday morning: busier, more power, hotter, together
  (``GpuAnomaly`` pages on a GPU whose signals decouple: a hang, a power cap); and a
  quiet holiday, a weekday at a quarter of the load: idler and cooler all day;
- **vLLM engines** (two, scraped every 15 s, their load following demand: utilisation 0.6
  at the usual peak, the wait of a queue as ``rho / (1 - rho)``, the requests running by
  Little's law, the KV cache filling with them): the same doubling;
- **an embedding server** (Text Embeddings Inference's metrics: no tokens generated, so
  its requests/s are the witness of its load): the same doubling.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import pairwise

import shape_generic as generic
import shape_traffic as traffic
from shape_kit import DAY, HOUR, MINUTE, MONDAY, Expect, Shape
from shape_traffic import Effect, Rhythm

from ragwatch.schema import Envelope

INSTANCES = ("rag-api-0", "rag-api-1")
RHYTHM = Rhythm(daily_ratio=5.0, weekend=0.4)


def _chat(seed: int, **kw: object) -> traffic.Service:
    return traffic._chat("rag-api", 2, traffic.HOSTS4[:2], seed, peak_rpm=40.0, **kw)


def _healthy_chat(
    name: str,
    days: int,
    seed: int,
    note: str,
    rhythm: Rhythm = RHYTHM,
    effects: tuple[Effect, ...] = (),
) -> Shape:
    """A healthy shape of the two chat instances from Monday on: ``days`` of ``rhythm``
    with ``effects``, no fault."""
    t0, t1 = MONDAY, MONDAY + days * DAY
    s = _chat(seed, rhythm=rhythm, effects=effects)
    return Shape(
        name,
        lambda: traffic._world((s,), t0, t1),
        faults=(),
        series_days=traffic._healthy_days(2, t0, t1),
        note=note,
    )


def flash_crowd() -> Shape:
    morning = MONDAY + 3 * DAY + 8 * HOUR  # Thursday 08:00 UTC
    peak = MONDAY + 4 * DAY + 14 * HOUR  # Friday 14:00, an hour before the daily peak
    effects = (
        Effect("demand", INSTANCES, morning, morning + 3 * HOUR, size=2.0, ramp_s=1800.0),
        Effect("demand", INSTANCES, peak, peak + 2 * HOUR, size=1.3, ramp_s=900.0),
    )
    note = (
        "Arrivals x2 for 3 h on a weekday morning, x1.3 for 2 h at another day's peak: "
        "demand, not damage."
    )
    return _healthy_chat("flash-crowd", 7, 91, note, effects=effects)


@dataclass(frozen=True)
class ShiftedRhythm(Rhythm):
    """A rhythm whose local clock moves ``shift_s`` ahead at ``switch_ts`` (daylight saving
    time): the same hour of local time comes ``shift_s`` earlier in UTC."""

    switch_ts: float = 0.0
    shift_s: float = HOUR

    def level(self, ts: float) -> float:
        return super().level(ts + (self.shift_s if ts >= self.switch_ts else 0.0))


def daylight_saving() -> Shape:
    rhythm = ShiftedRhythm(daily_ratio=8.0, weekend=0.4, switch_ts=MONDAY + 6 * DAY + 2 * HOUR)
    note = (
        "Ten days of an 8x daily rhythm whose users' clocks go an hour ahead on Sunday "
        "02:00 of the first week: every edge of the day an hour earlier in UTC."
    )
    return _healthy_chat("daylight-saving", 10, 92, note, rhythm=rhythm)


def prompt_template() -> Shape:
    t0, t1 = MONDAY, MONDAY + 7 * DAY
    switch = t0 + 3 * DAY + 10 * HOUR
    before = _chat(93, rhythm=RHYTHM)
    after = replace(before, mix=replace(before.mix, context_median=2500 * 1.6), seed=94)
    return Shape(
        "prompt-template",
        lambda: traffic.merged(
            traffic.envelopes(before, t0, switch), traffic.envelopes(after, switch, t1)
        ),
        faults=(),
        series_days=traffic._healthy_days(2, t0, t1),
        note="From Thursday 10:00 on, requests carry 1.6x the context (a template with more "
        "retrieved chunks): longer prefill and first token for good, a new normal.",
    )


@dataclass(frozen=True)
class Hours(Rhythm):
    """A batch client's rhythm: 1 from ``start_h`` to ``end_h`` UTC (on ``weekday`` only,
    0 = Monday, if set) from ``from_ts`` on, else 0."""

    start_h: float = 1.0
    end_h: float = 3.0
    weekday: int | None = None
    from_ts: float = 0.0

    def level(self, ts: float) -> float:
        hour, day = (ts % DAY) / HOUR, int((ts - MONDAY) // DAY) % 7
        on = ts >= self.from_ts and self.start_h <= hour < self.end_h
        return 1.0 if on and self.weekday in (None, day) else 0.0


def batch_client(name: str, days: int, hours: Hours, note: str) -> Shape:
    """The chat service of two instances, and a batch client's stream to the same instances
    at ``hours``. Each stream's queue wait and decode slowdown follow its own load (the
    harness has no capacity shared by two streams): the batch's requests queue as at a
    peak (utilisation 0.6), the chat's as at their trough."""
    t0, t1 = MONDAY, MONDAY + days * DAY
    chat = _chat(95, rhythm=RHYTHM)
    mix = traffic.Mix(context_median=6000, context_sigma=0.25, output_median=350,
                      output_sigma=0.4)  # fmt: skip
    batch = replace(chat, rhythm=hours, peak_rpm=15.0, burst_sigma=0.05, mix=mix, seed=96)
    return Shape(
        name,
        lambda: traffic.merged(traffic.envelopes(chat, t0, t1), traffic.envelopes(batch, t0, t1)),
        faults=(),
        series_days=traffic._healthy_days(2, t0, t1),
        note=note,
    )


def scale_in(name: str, factor: float) -> Shape:
    """Three instances until Thursday 11:00, then two, each with ``factor`` times the load
    on the same capacity (the capacity is ``peak_rpm / utilisation``)."""
    t0, t1 = MONDAY, MONDAY + 7 * DAY
    switch = t0 + 3 * DAY + 11 * HOUR
    three = traffic._chat("rag-api", 3, traffic.HOSTS4[:3], 97, peak_rpm=40.0, rhythm=RHYTHM,
                          offsets=(1.0, 1.03, 0.97))  # fmt: skip
    two = replace(three, instances=three.instances[:2], hosts=three.hosts[:2], seed=98,
                  peak_rpm=three.peak_rpm * factor, utilisation=three.utilisation * factor,
                  offsets=three.offsets[:2])  # fmt: skip
    return Shape(
        name,
        lambda: traffic.merged(
            traffic.envelopes(three, t0, switch), traffic.envelopes(two, switch, t1)
        ),
        faults=(),
        series_days=round(traffic._healthy_days(2, t0, t1) + (switch - t0) / DAY, 3),
        note=f"Three instances, one removed on Thursday 11:00: the other two take {factor}x "
        f"their load on the same capacity, for good (utilisation {two.utilisation:.2f} at the "
        "peak).",
    )


def _pod(chat: traffic.Service, name: str, host: int, seed: int, **kw: object) -> traffic.Service:
    """One pod of ``chat``: an instance of its own name on ``chat``'s ``host``-th host."""
    return replace(chat, instances=(name,), hosts=(chat.hosts[host],), offsets=(), seed=seed,
                   **kw)  # type: ignore[arg-type]  # fmt: skip


def _weekdays(days: int, hour: float) -> list[float]:
    """``hour`` UTC of each weekday of the ``days`` from MONDAY."""
    return [MONDAY + d * DAY + hour * HOUR for d in range(days) if d % 7 < 5]


def rolling_deploys(days: int = 7) -> Shape:
    """Two pods of a Deployment, replaced by two new ones (new names) every weekday at
    14:00 UTC, the second 5 minutes after the first."""
    t0, t1 = MONDAY, MONDAY + days * DAY
    chat = _chat(101, rhythm=RHYTHM)
    deploys = _weekdays(days, 14.0)
    pods = []  # (pod, from, to)
    for i in range(2):
        cuts = [t0, *(t + i * 5 * MINUTE for t in deploys), t1]
        for g, (a, b) in enumerate(pairwise(cuts)):
            pod = _pod(chat, f"rag-api-{0x5F3A + g:04x}-{'xq'[i]}", i, 110 + 2 * g + i)
            pods.append((pod, a, b))
    return Shape(
        "rolling-deploys",
        lambda: traffic.merged(*(traffic.envelopes(*p) for p in pods)),
        faults=(),
        series_days=traffic._healthy_days(2, t0, t1),
        note="Two pods replaced by two new ones every weekday at 14:00 (a rolling update, 5 "
        "minutes apart): instances of new names, with no history, at an hour near the peak.",
    )


def autoscaled_pod(days: int = 7) -> Shape:
    """Two pods for good, and a third (a new name each time) from 10:00 to 19:00 UTC on
    weekdays, taking a third of the load on the same capacity a pod."""
    t0, t1 = MONDAY, MONDAY + days * DAY
    spans = [(t, t + 9 * HOUR) for t in _weekdays(days, 10.0)]
    effects = tuple(Effect("demand", INSTANCES, a, b, size=2 / 3) for a, b in spans)
    chat = _chat(102, rhythm=RHYTHM, effects=effects)
    extra = [
        _pod(chat, f"rag-api-{0x7C10 + d:04x}-z", 0, 120 + d, effects=(),
             peak_rpm=chat.peak_rpm * 2 / 3, utilisation=chat.utilisation * 2 / 3)
        for d in range(len(spans))
    ]  # fmt: skip
    return Shape(
        "autoscaled-pod",
        lambda: traffic.merged(
            traffic.envelopes(chat, t0, t1),
            *(traffic.envelopes(pod, a, b) for pod, (a, b) in zip(extra, spans, strict=True)),
        ),
        faults=(),
        series_days=round(traffic._healthy_days(2, t0, t1) + 9 * HOUR * len(spans) / DAY, 3),
        note="Two pods, and a third of a new name on weekdays 10:00-19:00 (an autoscaler at the "
        "daily peak): the new pod has no history and takes a third of the load.",
    )


# a cold start: (slowdown of the retriever, from minute, to minute) after the restart
COLD = ((4.0, 3, 4), (1.5, 4, 8))


def _restart(
    inst: str, other: str, at: float, cold: tuple[tuple[float, int, int], ...]
) -> tuple[Effect, ...]:
    """A pod restarted at ``at`` under its own name: the requests it had in flight fail
    (a third of its minute's), it takes none for 2 minutes (``other`` takes them), then
    its retriever is ``cold`` (:data:`COLD`: its first minute 4x slower, lazy
    initialisation of the embedder's kernels and the tokenizer; the next 4 minutes 1.5x,
    caches warming)."""
    m = MINUTE
    return (
        Effect("errors", (inst,), at, at + m, size=0.33),
        Effect("start", (inst,), at + m),  # the new process, its envelopes say so
        Effect("demand", (inst,), at + m, at + 3 * m, size=0.0),
        Effect("demand", (other,), at + m, at + 3 * m, size=2.0),
        *(Effect("retrieval", (inst,), at + a * m, at + b * m, size=x) for x, a, b in cold),
    )


def _restarted(days: int, cold: tuple[tuple[float, int, int], ...]) -> tuple[Effect, ...]:
    """Both instances restarted in turn, 10 minutes apart, every weekday at 14:00 UTC (a
    StatefulSet's rolling update: the same names); their envelopes say when their process
    started (as the SDK's do)."""
    a, b = INSTANCES
    at = _weekdays(days, 14.0)
    turns = (
        e for t in at for e in (*_restart(a, b, t, cold), *_restart(b, a, t + 10 * MINUTE, cold))
    )
    return (Effect("start", INSTANCES, MONDAY - DAY), *turns)


def restarts(
    days: int = 7, cold: tuple[tuple[float, int, int], ...] = COLD, name: str = "restarts"
) -> Shape:
    """The restarts of :func:`_restarted`, each with its cold start."""
    slower = ", then ".join(f"{x:g}x slower for {b - a} min" for x, a, b in cold)
    note = (
        "Both instances restarted in turn every weekday at 14:00: a third of a minute's "
        "requests fail, none for 2 minutes (the other instance takes them), then a cold "
        f"start: the retriever {slower or 'as before'}."
    )
    return _healthy_chat(name, days, 103, note, effects=_restarted(days, cold))


def restart_slow(days: int = 5) -> Shape:
    """The restarts, but Thursday's first brings back a retriever 4x slower for 2 hours (a
    new index that does not fit its cache): a fault the warm-up must not hide."""
    t0, t1 = MONDAY, MONDAY + days * DAY
    start = MONDAY + 3 * DAY + 14 * HOUR + MINUTE  # the new process
    slow = Effect("retrieval", (INSTANCES[0],), start, start + 2 * HOUR, size=4.0)
    s = _chat(107, rhythm=RHYTHM, effects=(*_restarted(days, COLD), slow))
    exp = Expect("retrieval", ("RetrievalSlowdown",), traffic._target(s, 0), start,
                 start + 2 * HOUR, max_delay_s=20 * MINUTE)  # fmt: skip
    return Shape(
        "restart-slow",
        lambda: traffic._world((s,), t0, t1),
        faults=(exp,),
        series_days=traffic._healthy_days(2, t0, t1, (exp,)),
        note="The restarts, but Thursday's first brings back a retriever 4x slower for 2 h, "
        "past its 10-minute warm-up.",
    )


def retrieval_nightly(days: int = 7) -> Shape:
    """A vector store compacting its segments every night at 03:00 UTC: for 20 minutes
    every lookup of both instances is 4x slower."""
    nights = [MONDAY + d * DAY + 3 * HOUR for d in range(days)]
    effects = tuple(Effect("retrieval", INSTANCES, t, t + 20 * MINUTE, size=4.0) for t in nights)
    note = (
        "A vector store's nightly compaction: every lookup 4x slower for 20 minutes at "
        "03:00 every night, on both instances."
    )
    return _healthy_chat("retrieval-nightly", days, 111, note, effects=effects)


def _blips(
    name: str, kind: str, sizes: tuple[tuple[float, int], ...], seed: int, note: str,
    days: int, per_day: int,
) -> Shape:  # fmt: skip
    """``per_day`` blips a day of ``kind`` at random minutes, each on one instance, the
    i-th of a day ``sizes[i % 2]`` (size, minutes), then as before."""
    rng = random.Random(seed)
    effects = []
    for d in range(days):
        for i in range(per_day):
            at = MONDAY + d * DAY + rng.randrange(24 * 60) * MINUTE
            size, minutes = sizes[i % 2]
            inst = (rng.choice(INSTANCES),)
            effects.append(Effect(kind, inst, at, at + minutes * MINUTE, size=size))
    return _healthy_chat(name, days, seed, note, effects=tuple(effects))


def retrieval_blips(days: int = 5, per_day: int = 4) -> Shape:
    """A retriever's blips (a GC pause, a segment merge, a network blip): ``per_day`` a day
    at random minutes, each on one instance, every lookup 4x slower for a minute or 3x
    for two, then as before."""
    note = (
        f"A retriever's blips, {per_day} a day at random minutes on either instance: every "
        "lookup 4x slower for a minute or 3x for two (a GC pause, a segment merge)."
    )
    return _blips("retrieval-blips", "retrieval", ((3.0, 2), (4.0, 1)), 121, note, days, per_day)


def queue_blips(days: int = 5, per_day: int = 4) -> Shape:
    """A queue's blips (a burst of long prompts, an engine's pause) at the same demand:
    ``per_day`` a day at random minutes, each on one instance, every request waiting 2 s
    more for two minutes or 3 s for one, then as before."""
    note = (
        f"A queue's blips, {per_day} a day at random minutes on either instance: every "
        "request waits 2 s more for two minutes or 3 s for one (a burst of long prompts, "
        "an engine's pause), at the same demand."
    )
    return _blips("queue-blips", "queue", ((2000.0, 2), (3000.0, 1)), 131, note, days, per_day)


CROWD_AT = MONDAY + 3 * DAY + 8 * HOUR  # Thursday 08:00 UTC


def crowd(ts: float, size: float = 2.0, hours: float = 3.0) -> float:
    """The flash crowd's factor on demand at ``ts``: ``size`` for ``hours`` from CROWD_AT,
    ramped in over 30 minutes."""
    if not CROWD_AT <= ts < CROWD_AT + hours * HOUR:
        return 1.0
    return 1.0 + (size - 1.0) * min(1.0, (ts - CROWD_AT) / 1800.0)


def gpu_flash_crowd() -> Shape:
    end = MONDAY + 4 * DAY
    return Shape(
        "gpu-flash-crowd",
        lambda: generic.gpu_envelopes("", MONDAY, end, 8, lambda t: generic.load(t) * crowd(t)),
        faults=(),
        series_days=generic.HOSTS * generic.GPUS * 4.0,
        note="The generic shapes' 6 GPUs, their load doubled for 3 h on Thursday morning: "
        "busier, more power, hotter, together.",
    )


def gpu_holiday() -> Shape:
    end, holiday = MONDAY + 5 * DAY, MONDAY + 3 * DAY  # Thursday

    def quiet(t: float) -> float:
        return generic.load(t) * (0.25 if holiday <= t < holiday + DAY else 1.0)

    return Shape(
        "gpu-holiday",
        lambda: generic.gpu_envelopes("", MONDAY, end, 9, quiet),
        faults=(),
        series_days=generic.HOSTS * generic.GPUS * 5.0,
        note="The generic shapes' 6 GPUs on a quiet holiday: Thursday at a quarter of the load.",
    )


def engines_under_load(t0: float, t1: float, seed: int = 6) -> Iterator[Envelope]:
    """Two vLLM engines scraped every 15 s whose load follows demand (the generic shapes'
    daily rhythm, the flash crowd on Thursday morning)."""
    rng, totals = random.Random(seed), {e: [0.0] * 6 for e in range(2)}
    ts = t0
    while ts < t1:
        for e in range(2):
            demand = generic.load(ts) / 80.0 * crowd(ts)  # 1.0: the usual weekday peak
            rps = 8.0 * demand * math.exp(rng.gauss(0, 0.15))
            rho = min(0.97, 0.6 * demand)
            wait = 0.05 * rho / (1 - rho) * math.exp(rng.gauss(0, 0.2))
            t, waiting = totals[e], max(0.0, rps * wait + rng.gauss(0, 0.3))
            gen = rps * 180 * math.exp(rng.gauss(0, 0.1))
            for k, v in enumerate((rps, gen, rps * 2500, 0.0, rps * wait, rps)):
                t[k] += v * 15
            usage = min(0.995, max(0.0, 0.1 + 0.7 * rho + rng.gauss(0, 0.03)))
            yield generic.vllm_scrape(e, ts, t, waiting, rps * 4.0 * (1 + rho), usage)
        ts += 15.0


def engine_flash_crowd() -> Shape:
    end = MONDAY + 5 * DAY
    return Shape(
        "engine-flash-crowd",
        lambda: engines_under_load(MONDAY, end),
        faults=(),
        series_days=2 * 5.0,
        note="Two vLLM engines whose queue, running requests and KV cache follow demand, "
        "demand doubled for 3 h on Thursday morning.",
    )


def embedder_flash_crowd() -> Shape:
    end = MONDAY + 5 * DAY
    return Shape(
        "embedder-flash-crowd",
        lambda: generic.embedder_envelopes(MONDAY, end, 3, lambda t: generic.load(t) * crowd(t)),
        faults=(),
        series_days=5.0,
        note="An embedding server (no tokens generated: its requests/s are its load) whose "
        "queue and waits follow demand, demand doubled for 3 h on Thursday morning.",
    )


SHAPES = [
    flash_crowd(), daylight_saving(), prompt_template(), gpu_flash_crowd(), gpu_holiday(),
    engine_flash_crowd(), embedder_flash_crowd(),
    batch_client("batch-nightly", 7, Hours(),
                 "A batch client (6,000-token contexts, 350-token answers, 15 requests a "
                 "minute an instance) every night 01:00-03:00 UTC beside the chat traffic."),
    batch_client("batch-new-nightly", 7, Hours(from_ts=MONDAY + 3 * DAY),
                 "The same batch client, every night from Thursday on: a new job."),
    batch_client("batch-weekly", 14, Hours(2.0, 5.0, weekday=6),
                 "The same batch client on Sundays 02:00-05:00 only, two weeks."),
    scale_in("scale-in", 1.5), scale_in("scale-in-1.3", 1.3), rolling_deploys(), autoscaled_pod(),
    restarts(), restart_slow(), retrieval_nightly(), retrieval_blips(), queue_blips(),
]  # fmt: skip
