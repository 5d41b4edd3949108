"""The seasonal baseline on a week it has to learn: per-minute request counts with a
daily rhythm and weekends, judged as the engine pipeline judges tokens/s.

The series (independent of ragwatch's simulators): weekdays peak at 14:00 UTC at 240 a
minute and bottom out at 04:00 at 40 (6x); Saturdays run at 25 % and Sundays at 45 % of
a weekday, with a flatter rhythm peaking two hours later (people sleep in); Poisson
counts; a holiday at 50 % on the second Monday; the first day a Thursday. Optional
faults: a real 36 % drop for 4 h on the second Tuesday or Saturday.

The caller is :class:`~ragwatch.streams.pipelines.metrics.MetricsPipeline`'s: every minute
the last 5 minutes' count against the forecast (its deviation, and its z with the count's
Poisson noise and the forecast's variance), held while it deviates by > 10 % at |z| > 3,
one observation learnt per closed 5-minute bucket. A "page-like" minute is one a drop rule
would fire on: deviation < -0.25 and z < -4.

``weekly_sd=0`` is the baseline without the weekly profile (as before issue 30).

    python bench/weekly.py            # the table, before / after
    python bench/weekly.py --json bench/results/weekly.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field

import numpy as np

from ragwatch.detectors.counts import count_z
from ragwatch.detectors.seasonal import SeasonalBaseline

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC, a Thursday
DAY, MIN = 86400.0, 60.0
NAMES = ("Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed")
WINDOW, BUCKET = 5, 5  # minutes
HOLIDAY = 11  # the second Monday
WEEKEND = {2: 0.25, 3: 0.45}  # weekday (0 = Thursday) -> share of a weekday's traffic


def rate(minute: int, holiday: int | None) -> float:
    """Expected requests in minute ``minute`` after T0."""
    day, hour = divmod(minute / 60.0, 24.0)
    wd = int(day) % 7
    share = WEEKEND.get(wd, 1.0)
    peak = 14.0 + (2.0 if wd in WEEKEND else 0.0)
    depth = 0.8 if wd in WEEKEND else 0.9  # log amplitude: 6x weekdays, 5x weekends
    rhythm = math.exp(depth * math.cos(2 * math.pi * (hour - peak) / 24.0))
    share *= 0.5 if holiday is not None and int(day) == holiday else 1.0
    return 240.0 / math.exp(0.9) * rhythm * share


@dataclass
class DayStats:
    errors: list[float] = field(default_factory=list)  # |log(observed / forecast)|
    pages: int = 0  # page-like minutes
    held: int = 0  # minutes the baseline was held
    first_page: float | None = None  # minutes into the day


def run(
    days: int, weekly_sd: float, seed: int, holiday: int | None, drop: tuple[float, float] | None
) -> list[DayStats]:
    """One series through the caller's loop; per day what it saw."""
    rng = np.random.default_rng(seed)
    n = int(days * 1440)
    expected = np.array([rate(m, holiday) for m in range(n)])
    if drop is not None:
        a, b = int(drop[0] * 1440), int(drop[1] * 1440)
        expected[a:b] *= 0.64
    counts = rng.poisson(expected)
    base = SeasonalBaseline(step_s=BUCKET * MIN, weekly_sd=weekly_sd)
    out = [DayStats() for _ in range(days)]
    for m in range(WINDOW, n):
        t = T0 + (m + 1) * MIN
        if m % BUCKET == 0:  # the bucket [m - 5, m) closed: its mean rate per minute
            c = counts[m - BUCKET : m].sum()
            mid = T0 + (m - BUCKET / 2) * MIN
            base.learn(mid, math.log(c / BUCKET + 1e-9), 1.0 / max(c, 1))
        judge(base, t, counts[m - WINDOW + 1 : m + 1].sum(), out[m // 1440], m % 1440)
    return out


def judge(base: SeasonalBaseline, t: float, observed: int, day: DayStats, minute: int) -> None:
    f = base.forecast(t)
    if f is None:
        return
    expected = math.exp(f.mean) * WINDOW
    d = observed / expected - 1
    z = count_z(observed, expected, 1.0, f.var + f.noise)
    day.errors.append(abs(math.log((observed + 0.5) / expected)))
    if d < -0.25 and z < -4:
        day.pages += 1
        day.first_page = minute if day.first_page is None else day.first_page
    deviating = abs(d) > 0.1 and (base.holding or abs(z) > 3)
    base.hold(t, deviating, math.log(observed / WINDOW + 1e-9))
    day.held += base.holding


def table(days: int, seed: int) -> dict[str, list[dict[str, float | int | str | None]]]:
    """Per day, before and after: median |error|, page-like and held minutes."""
    out: dict[str, list[dict[str, float | int | str | None]]] = {}
    for label, sd in (("before", 0.0), ("after", SeasonalBaseline().weekly_sd)):
        stats = run(days, sd, seed, HOLIDAY, None)
        out[label] = [
            {
                "day": d,
                "weekday": NAMES[d % 7] + (" (holiday)" if d == HOLIDAY else ""),
                "median_abs_err": round(float(np.median(s.errors)), 4) if s.errors else None,
                "page_minutes": s.pages,
                "held_minutes": s.held,
            }
            for d, s in enumerate(stats)
        ]
    return out


def drops(seed: int) -> list[dict[str, float | int | str | None]]:
    """A real 36 % drop, 10:00-14:00, on the second Tuesday and the second Saturday."""
    out: list[dict[str, float | int | str | None]] = []
    for day in (12, 9):
        for label, sd in (("before", 0.0), ("after", SeasonalBaseline().weekly_sd)):
            start = day + 10 / 24
            s = run(day + 1, sd, seed, HOLIDAY, (start, day + 14 / 24))[day]
            delay = None if s.first_page is None else s.first_page - 600
            out.append({"day": day, "weekday": NAMES[day % 7], "baseline": label,
                        "page_minutes": s.pages, "first_page_after_min": delay})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    res = {"table": table(args.days, args.seed), "drops": drops(args.seed)}
    before, after = res["table"]["before"], res["table"]["after"]
    print("day weekday         | before: |err| pages held | after: |err| pages held")
    for b, a in zip(before, after, strict=True):
        print(
            f"{b['day']:>3} {b['weekday']:<15} | {b['median_abs_err']!s:>12} {b['page_minutes']:>5}"
            f" {b['held_minutes']:>4} | {a['median_abs_err']!s:>11} {a['page_minutes']:>5}"
            f" {a['held_minutes']:>4}"
        )
    for d in res["drops"]:
        head = f"36 % drop, day {d['day']} {d['weekday']}, {d['baseline']}"
        first = d["first_page_after_min"]
        print(f"{head}: {d['page_minutes']} page-like minutes, first after {first} min")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
