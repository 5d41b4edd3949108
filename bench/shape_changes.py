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
  normal that is not a fault.

Two instances of the chat-like service (answers of ~180 tokens, contexts of ~2,500).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import shape_traffic as traffic
from shape_kit import DAY, HOUR, MONDAY, Shape
from shape_traffic import Effect, Rhythm

INSTANCES = ("rag-api-0", "rag-api-1")
RHYTHM = Rhythm(daily_ratio=5.0, weekend=0.4)


def _chat(seed: int, **kw: object) -> traffic.Service:
    return traffic._chat("rag-api", 2, traffic.HOSTS4[:2], seed, peak_rpm=40.0, **kw)


def flash_crowd() -> Shape:
    t0, t1 = MONDAY, MONDAY + 7 * DAY
    morning = t0 + 3 * DAY + 8 * HOUR  # Thursday 08:00 UTC
    peak = t0 + 4 * DAY + 14 * HOUR  # Friday 14:00, an hour before the daily peak
    effects = (
        Effect("demand", INSTANCES, morning, morning + 3 * HOUR, size=2.0, ramp_s=1800.0),
        Effect("demand", INSTANCES, peak, peak + 2 * HOUR, size=1.3, ramp_s=900.0),
    )
    s = _chat(91, rhythm=RHYTHM, effects=effects)
    return Shape(
        "flash-crowd",
        lambda: traffic._world((s,), t0, t1),
        faults=(),
        series_days=traffic._healthy_days(2, t0, t1),
        note="Arrivals x2 for 3 h on a weekday morning, x1.3 for 2 h at another day's peak: "
        "demand, not damage.",
    )


@dataclass(frozen=True)
class ShiftedRhythm(Rhythm):
    """A rhythm whose local clock moves ``shift_s`` ahead at ``switch_ts`` (daylight saving
    time): the same hour of local time comes ``shift_s`` earlier in UTC."""

    switch_ts: float = 0.0
    shift_s: float = HOUR

    def level(self, ts: float) -> float:
        return super().level(ts + (self.shift_s if ts >= self.switch_ts else 0.0))


def daylight_saving() -> Shape:
    t0, t1 = MONDAY, MONDAY + 10 * DAY
    rhythm = ShiftedRhythm(daily_ratio=8.0, weekend=0.4, switch_ts=t0 + 6 * DAY + 2 * HOUR)
    s = _chat(92, rhythm=rhythm)
    return Shape(
        "daylight-saving",
        lambda: traffic._world((s,), t0, t1),
        faults=(),
        series_days=traffic._healthy_days(2, t0, t1),
        note="Ten days of an 8x daily rhythm whose users' clocks go an hour ahead on Sunday "
        "02:00 of the first week: every edge of the day an hour earlier in UTC.",
    )


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


SHAPES = [flash_crowd(), daylight_saving(), prompt_template()]
