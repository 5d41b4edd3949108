"""Replica signals of request series: each instance of a service against its peers.

A series compared only with its own past follows a slow drift (its baselines learn it);
the other instances of its service, behind the same load balancer, do not. With each
sweep of the request pipeline (once a bucket of event time), every service's instances
are compared with one another on a few signals of their newest closes
(:data:`COMPARED`), with :func:`ragwatch.detectors.replicas.judge`: the peers' median
(itself excluded), the ratio to it and whether it is *deviant* (at least 3 known
members, a robust z of 4 and 50 % away from the median, in the signal's direction; the
scale is at least 10 % of the median and an absolute floor in the signal's units, so a
tight group does not turn noise into a page). An instance counts while its newest close
is within ``2 x bucket`` of the service's newest (one that went quiet is not a peer).
Why with the sweep and not at each close: which peers have closed a bucket when an
instance closes it depends on how envelopes are batched; at a sweep, every close of the
envelopes before it is done, however they were batched, so the comparison is the same.

The signals are ``replica_<name>_peers`` (the median), ``replica_<name>_ratio`` and
``replica_<name>_deviant`` (1 or 0; NaN: not judged). They are stateless: how long an
instance stays deviant is the rules' ``for:`` (``Replica*Outlier`` in the default rules),
never this module's. The instances of a service are consumed by one worker (requests are
keyed by service), so their comparison needs nothing from another worker.

>>> import numpy as np
>>> from ragwatch.streams.pipelines.service_rows import SIGNAL_AT, SIGNALS
>>> signals = np.full((4, len(SIGNALS)), np.nan)  # four instances of one service
>>> signals[:, SIGNAL_AT["retriever_p99_ms"]] = [110.0, 330.0, 100.0, 105.0]
>>> compare(signals, SIGNAL_AT.__getitem__, np.full(4, 600.0), [0, 1, 2, 3], 60.0)
{0, 1, 2, 3}
>>> row = signals[1]
>>> [round(float(row[SIGNAL_AT[f"replica_retriever_{f}"]]), 2) for f in ("peers", "ratio",
...                                                                       "deviant")]
[105.0, 3.14, 1.0]
>>> float(signals[1, SIGNAL_AT["replica_decode_deviant"]])  # no decode speed: not judged
nan
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.replicas import ReplicaParams, judge
from ragwatch.streams.alerting.rules import Rule

# signal -> (its short name in the replica signals, when an instance is deviant)
COMPARED: dict[str, tuple[str, ReplicaParams]] = {
    "retriever_p99_ms": ("retriever", ReplicaParams("high", abs_floor=10.0)),
    "e2e_p95_ms": ("e2e", ReplicaParams("high", abs_floor=50.0)),
    "decode_tps": ("decode", ReplicaParams("low", abs_floor=2.0)),
    "tokens_per_request": ("tpr", ReplicaParams("both", abs_floor=10.0)),
    "errors_ratio": ("errors", ReplicaParams("high", abs_floor=0.02)),
}
REPLICA_SIGNALS: tuple[str, ...] = tuple(
    f"replica_{short}_{field}"
    for short, _ in COMPARED.values()
    for field in ("peers", "ratio", "deviant")
)
FRESH_BUCKETS = 2  # a peer's newest close within this many buckets of the instance's


def compare(
    signals: npt.NDArray[np.float64],
    at: Callable[[str], int],
    ends: npt.NDArray[np.float64],
    rows: Sequence[int],
    bucket_s: float,
) -> set[int]:
    """Write the replica signals of ``rows`` (one service's instances) into ``signals``
    (a row per series, a column per signal; ``at``: a signal's column): each against the
    others whose newest bucket ends (``ends``) within :data:`FRESH_BUCKETS` of the newest
    of them; those further behind get none (NaN). The rows compared."""
    known = [r for r in rows if np.isfinite(ends[r])]
    newest = max((float(ends[r]) for r in known), default=math.nan)
    fresh = [r for r in known if ends[r] >= newest - FRESH_BUCKETS * bucket_s]
    for r in set(rows) - set(fresh):
        for name in REPLICA_SIGNALS:
            signals[r, at(name)] = np.nan
    for signal, (short, params) in COMPARED.items():
        med, ratio, _z, dev = judge(signals[fresh, at(signal)].astype(np.float64), params)
        known_med = np.isfinite(med)
        signals[fresh, at(f"replica_{short}_peers")] = med
        signals[fresh, at(f"replica_{short}_ratio")] = ratio
        signals[fresh, at(f"replica_{short}_deviant")] = np.where(known_med, dev, np.nan)
    return set(fresh)


def reads_peers(rule: Rule) -> bool:
    """Whether ``rule`` reads a replica signal (it is evaluated with the comparison)."""
    return any(name.startswith("replica_") for name in rule.reads)
