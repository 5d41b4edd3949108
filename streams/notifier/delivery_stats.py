"""What the notifier counts per receiver, for ``/metrics``: outcomes and delivery latency.

Counters since the notifier started (Prometheus handles their reset at a restart):
``delivered``, ``retried`` (an attempt that will be tried again) and ``failed`` (given
up: dead-lettered), and a histogram of the seconds from a notification's entering the
outbox to its delivery (what an on-call engineer waits beyond the alert itself: receiver
outages, rate limits, retries). ``ragwatch serve`` exports them as
``ragwatch_notifier_notifications_total{receiver, outcome}`` and
``ragwatch_notifier_delivery_latency_seconds{receiver}``.

>>> stats = ReceiverStats()
>>> stats.delivered_after(0.3); stats.delivered_after(42.0)
>>> stats.delivered, stats.latency_count, stats.latency_buckets[:3]
(2, 2, [1, 1, 1])
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ragwatch.catalog import DELIVERY_LATENCY_BUCKETS_S as LATENCY_BUCKETS_S


@dataclass
class ReceiverStats:
    """One receiver's outcomes and cumulative latency buckets (``latency_buckets[i]``
    counts deliveries within ``LATENCY_BUCKETS_S[i]``, as Prometheus' ``le``)."""

    delivered: int = 0
    retried: int = 0
    failed: int = 0
    latency_sum: float = 0.0
    latency_count: int = 0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))

    def delivered_after(self, seconds: float) -> None:
        """One delivery, ``seconds`` after the notification was queued."""
        seconds = max(0.0, seconds)
        self.delivered += 1
        self.latency_sum += seconds
        self.latency_count += 1
        for i in range(bisect.bisect_left(LATENCY_BUCKETS_S, seconds), len(LATENCY_BUCKETS_S)):
            self.latency_buckets[i] += 1
