"""Why RetrievalSlowdown has no far-tail CUSUM: its false pages on a stall rate that moves.

A second CUSUM over the retrievals more than 2.5x past the baseline P99 (whose usual
share ``v`` is near 0 on a clean tail) against an alternative share of
``max(1 %, 2.5 v)`` would page the seed's 3 % of stalls in about 4 minutes, where the
share-above-P99 CUSUM takes 11. Each far request weighs log(alt / v) nats, 2.3 at
``v`` = 0.1 %: a few of them cross any threshold. Simulated here: ``per`` requests a
minute (one close each), the CUSUM stepped once a close (far requests last: the worst
order), at most 4 nats a close, a page when it crosses ``h`` (again once it fell under
h / 2). Printed: pages per series-day where the true far share equals the learnt one,
and where it is twice it (a stall rate with a daily rhythm, learnt as the day's mean).

Run: ``python bench/far_cusum.py`` (about a minute).
"""

from __future__ import annotations

import math

import numpy as np


def pages_per_day(p_true: float, v: float, per: int, h: float, closes: int = 30_000,
                  series: int = 400, most: float = 4.0, seed: int = 2) -> float:  # fmt: skip
    rng = np.random.default_rng(seed)
    alt = max(0.01, 2.5 * v)
    up, down = math.log(alt / v), math.log1p(-alt) - math.log1p(-v)
    s, fired, pages = np.zeros(series), np.zeros(series, dtype=bool), 0
    for _ in range(closes):
        k = rng.binomial(per, p_true, series)
        stepped = np.maximum(0.0, s + (per - k) * down) + k * up
        s = np.minimum(np.minimum(stepped, s + most), h + 2.0)
        pages += int(np.count_nonzero((s > h) & ~fired))
        fired = (fired | (s > h)) & (s > h / 2)
    return pages / (closes * series / 1440)


def main() -> None:
    print("requests/min  learnt v  true share  pages/series-day at h = 14, 16, 18 nats")
    for per in (20, 80, 300):
        for v, p in ((0.001, 0.001), (0.001, 0.002), (0.003, 0.006)):
            got = [round(pages_per_day(p, v, per, h), 4) for h in (14.0, 16.0, 18.0)]
            print(f"{per:12d}  {v:8.3%}  {p:10.3%}  {got}", flush=True)


if __name__ == "__main__":
    main()
