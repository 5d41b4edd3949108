"""How often a retrieval fault of a few per cent of stalls looks healthy for long enough to
resolve RetrievalSlowdown, and how long a healthy retriever takes to: a model of the
rule's P99 path (not the pipeline), for choosing its resolve condition.

Each request of the window of 200 is above the baseline P99 with the usual 1 %, or is a
stall (``--stall``, 3 %: the simulator's fault); the rule is evaluated once a minute
(``--rpm`` requests). ``z < 2`` is the count at most 4 of 200 and at most 2 stalls (the
P99 under 1.5x); ``z < 0`` at most 1. A resolution needs the condition to hold over
``keep`` new requests::

    python bench/stall_dips.py            # ~30 s
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

WINDOW = 200
Cond = Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.bool_]]
CONDS: dict[str, Cond] = {
    "z < 2": lambda stalls, above: (stalls <= 2) & (above <= 4),
    "z < 0": lambda stalls, above: above <= 1,
}


def resolves_at(rng: np.random.Generator, n: int, stall: float, keep: int, rpm: int,
                cond: Cond) -> int | None:  # fmt: skip
    """The request at which the condition has held over ``keep`` new requests, or None."""
    s = rng.random(n) < stall
    a = s | (rng.random(n) < 0.01)
    cs, ca = np.concatenate([[0], np.cumsum(s)]), np.concatenate([[0], np.cumsum(a)])
    at = np.arange(WINDOW, n + 1, rpm)
    ok = cond(cs[at] - cs[at - WINDOW], ca[at] - ca[at - WINDOW])
    held = 0
    for i, o in zip(at.tolist(), ok.tolist(), strict=True):
        held = held + rpm if o else 0
        if held > keep:
            return i
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--stall", type=float, default=0.03)
    ap.add_argument("--hours", type=float, default=10.0)
    ap.add_argument("--rpm", type=int, default=13)
    ap.add_argument("--trials", type=int, default=200)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    n = int(args.hours * 60 * args.rpm)
    for keep in (60, 120, 200):
        for name, cond in CONDS.items():
            inside = [resolves_at(rng, n, args.stall, keep, args.rpm, cond) is not None
                      for _ in range(args.trials)]  # fmt: skip
            after = [resolves_at(rng, 5000, 0.0, keep, args.rpm, cond) or 5000
                     for _ in range(args.trials // 2)]  # fmt: skip
            med, p90 = np.median(after), np.percentile(after, 90)
            share = float(np.mean(inside))
            print(f"keep {keep:3d}, {name}: resolved inside {share:5.1%} of {args.hours:g} h "
                  f"faults; healthy, after {med:.0f} requests (p90 {p90:.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
