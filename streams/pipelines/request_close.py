"""Closing buckets of many request series at once: counts, windows, baselines, signals.

A *round* is one bucket close for each of a set of distinct rows of
:class:`~ragwatch.streams.pipelines.service_rows.ServiceRows`. Everything a close computes
is an array over the round's rows (NaN where the object version had None): the bucket's
counts enter the count rings, the rate window is chosen by what the baselines expected,
the traffic signals and their tests against the baselines are computed, the baselines held
or taught, then the tail quantiles (per row: a window's length follows its traffic) and
the latency baselines, then the outlier signals.

Exactly the arithmetic of the object version (``tests/reference/requests_objects.py``, one
:class:`ServiceSeries` at a time), in the same order: numpy's ``+ - * /``, square root and
comparisons round as Python's floats do, but its ``exp``, ``log`` and ``**`` do not always
(SIMD implementations), so those go element by element through :mod:`math`
(``_each``). ``tests/unit/test_requests_columnar.py`` holds every signal of every close to
the object version's, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.seasonal_bank import SeasonalBank
from ragwatch.streams.pipelines.buckets import Bucket
from ragwatch.streams.pipelines.count_bank import CountWindows
from ragwatch.streams.pipelines.evidence import tail_signals
from ragwatch.streams.pipelines.service_clusters import ServiceClusters
from ragwatch.streams.pipelines.service_rows import SIGNAL_AT, ServiceRows

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
Signals = dict[str, F64]
NAN = math.nan
RATE_PRECISION = 0.08  # the relative excess noise a rate window averages bursts down to
PRECISION2 = RATE_PRECISION**2
NOVEL_DECAY = 0.9  # per bucket: which instance's records a new cluster is made of


@dataclass(frozen=True, slots=True)
class CloseParams:
    """The request pipeline's parameters that a close reads."""

    bucket_s: float
    rate_target: float
    rate_min: float
    rate_max_s: float
    observation_requests: float
    observation_max_s: float
    hold_band: float
    hold_z: float
    new_cluster_size: int


def _each(fn: Callable[[float], float], a: F64) -> F64:
    """``fn`` (a :mod:`math` function) of every value that is not NaN; NaN stays NaN."""
    return np.array([fn(v) if v == v else NAN for v in a.tolist()], dtype=np.float64)


def _div(a: F64, b: F64) -> F64:
    """``a / b`` where ``b`` is not zero, else NaN (``x / y if y else None``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1.0), NAN)


def _max0(a: F64) -> F64:
    """Python's ``max(0.0, a)``: 0.0 for NaN and -0.0 too."""
    return np.where(a > 0.0, a, 0.0)


def count_z(observed: F64, expected: F64, size: F64 | float, rel_var: F64) -> F64:
    """:func:`~ragwatch.streams.pipelines.evidence.count_z` of arrays."""
    var = expected * size + expected * expected * rel_var
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (observed - expected) / np.sqrt(np.where(var > 0, var, 1.0))
    edge = np.where(observed == expected, 0.0, np.copysign(np.inf, observed - expected))
    return np.where(var > 0, z, edge)


def _drop_score(d: F64, z: F64, z_min: float) -> F64:
    """[0, 1]: how far below its forecast (0.5 at -25 %), if significantly so."""
    return np.where((z > -z_min) | (d >= 0), 0.0, np.minimum(1.0, -d / 0.5))


def _window_var(mean: F64, var: F64, noise: F64, steps: F64) -> F64:
    """A baseline's relative variance over a window of ``steps`` buckets (0 without one)."""
    return np.where(np.isnan(mean), 0.0, var + noise / np.maximum(1.0, steps))


@dataclass
class _Round:
    """One round's rows and what their buckets counted (arrays over the rows)."""

    rows: Rows
    end: F64
    n: F64
    errors: F64
    tokens: F64
    tokens_sq: F64
    context: F64
    clustered: F64
    outliers: F64
    novel: F64


def _counted(rows: Rows, ends: F64, buckets: Sequence[Bucket]) -> _Round:
    cols = np.array(
        [
            (k.n, k.errors, float(k.output_tokens), k.output_sq, float(k.context_tokens),
             k.clustered, k.outliers, k.novel)
            for k in buckets
        ],
        dtype=np.float64,
    ).reshape(len(buckets), 8)  # fmt: skip
    return _Round(rows, ends, *cols.T)


def close_round(
    st: ServiceRows,
    prm: CloseParams,
    rows: Rows,
    b: Sequence[int],
    buckets: Sequence[Bucket],
    services: Sequence[ServiceClusters],
) -> F64:
    """Close bucket ``b[i]`` of row ``rows[i]`` (rows distinct; ``buckets[i]`` what it
    gathered, ``services[i]`` its service): the signals go to ``st.signals``. Returns the
    buckets' ends (the event time their rules are evaluated at)."""
    ends = np.array([(k + 1) * prm.bucket_s for k in b], dtype=np.float64)
    c = _counted(rows, ends, buckets)
    col = st.col
    col["requests_total"][rows] += (c.n + c.clustered).astype(np.int64)
    col["errors_total"][rows] += c.errors.astype(np.int64)
    col["output_tokens_total"][rows] += c.tokens
    mean, _, _ = st.rps.forecast(rows, c.end - prm.bucket_s / 2)  # before it is learnt
    expected = _each(math.exp, mean) * prm.bucket_s
    ones = np.ones(len(rows), dtype=np.bool_)
    st.counts.push(rows, c.end, c.n, c.errors, c.tokens, c.tokens_sq, c.context, ones,
                   expected, c.clustered)  # fmt: skip
    for i, row in enumerate(rows.tolist()):
        values = {name: r.values for name, r in buckets[i].latencies.items()}
        st.tails[row].push(float(c.end[i]), values)
    sig: Signals = {
        "requests_total": col["requests_total"][rows].astype(np.float64),
        "errors_total": col["errors_total"][rows].astype(np.float64),
        "output_tokens_total": col["output_tokens_total"][rows].copy(),
    }
    _traffic(st, prm, c, expected, sig)
    _tails(st, c, sig)
    _latency(st, c, sig)
    _outliers(st, prm, c, b, buckets, services, sig)
    at = np.array([SIGNAL_AT[name] for name in sig], dtype=np.intp)
    st.signals[np.ix_(rows, at)] = np.column_stack([sig[name] for name in sig])
    col["bucket_end"][rows] = c.end
    return ends


# ---------------------------------------------------------------------- traffic


def _window_min_s(st: ServiceRows, prm: CloseParams, rows: Rows, end: F64) -> F64:
    """Bursty traffic needs a longer window: long enough that the baselines' excess noise
    per bucket, averaged over it, is within ``RATE_PRECISION``."""
    noise = np.zeros(len(rows))
    for bank in (st.rps, st.tpr):
        mean, _, nz = bank.forecast(rows, end)
        noise = noise + np.where(np.isnan(mean), 0.0, nz)
    buckets = np.ceil(noise / PRECISION2)
    return np.minimum(prm.rate_max_s, np.maximum(1.0, buckets) * prm.bucket_s)


def _traffic(st: ServiceRows, prm: CloseParams, c: _Round, expected: F64, sig: Signals) -> None:
    rows, end = c.rows, c.end
    w = st.counts.window(
        rows, target=prm.rate_target, max_s=prm.rate_max_s,
        min_s=_window_min_s(st, prm, rows, end),
    )  # fmt: skip
    span, n = w.span_s, w.n.astype(np.float64)
    sig["window_s"], sig["window_requests"] = span, n
    sig["rps"] = _div(n + w.clustered, span)  # all it served
    sig["clustered_requests"] = w.clustered.astype(np.float64)
    sig["output_tokens_per_s"] = _div(w.tokens, span)
    sig["errors_ratio"] = _div(w.errors.astype(np.float64), n)
    _errors(st, prm, rows, w, sig)
    sig["tokens_per_request"] = _div(w.tokens, n)
    sig["context_tokens_per_request"] = _div(w.context, n)
    mid = (w.start + end) / 2
    rate = _rate_deviation(st, prm, rows, w, mid, w.unexpected == 0, sig)
    mean = _mean_deviation(st, prm, rows, w, mid, sig)
    _tps(st, prm, rows, w, rate, mean, sig)
    _hold(st, prm, rows, end, w, sig)
    _learn(st, prm, c, np.where(np.isnan(expected), c.n, expected))
    for family in ("rps", "tpr", "tps"):
        sig[f"{family}_relearned_at"] = st.col[f"{family}_relearned_at"][rows].copy()
        sig[f"{family}_relearned_from"] = st.col[f"{family}_relearned_from"][rows].copy()
    rps_held, tpr_held = st.rps.held_s(rows, end), st.tpr.held_s(rows, end)
    sig["rps_held_s"], sig["tpr_held_s"] = rps_held, tpr_held
    sig["tps_held_s"] = np.where(tpr_held > rps_held, tpr_held, rps_held)  # max(rps, tpr)


def _errors(st: ServiceRows, prm: CloseParams, rows: Rows, w: CountWindows, sig: Signals) -> None:
    """Failed requests against their usual share: a binomial z (a quarter of slack for
    the baseline itself), learnt slowly while not significant."""
    p0 = st.col["error_base"][rows].copy()
    n = w.n.astype(np.float64)
    sig["errors_baseline"] = p0
    enough = n >= prm.rate_min
    expected = n * p0
    var = expected * (1 - p0) + _each(lambda v: v**2, 0.25 * expected)
    errors = w.errors.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, (errors - expected) / np.sqrt(np.where(var > 0, var, 1.0)), 0.0)
    sig["errors_z"] = np.where(enough, z, NAN)
    learn = enough & (np.abs(z) < prm.hold_z)
    if learn.any():
        st.col["error_base"][rows[learn]] += 0.02 * (errors[learn] / n[learn] - p0[learn])


def _rate_deviation(
    st: ServiceRows, prm: CloseParams, rows: Rows, w: CountWindows, mid: F64,
    ready: npt.NDArray[np.bool_], sig: Signals,
) -> F64:  # fmt: skip
    """Requests against the baseline's expectation; returns the forecast's variance (NaN
    where there is no test)."""
    ok = ready & ~(w.expected < prm.rate_min) & (w.span_s != 0)
    mean, var, noise = st.rps.forecast(rows, mid)
    wvar = _window_var(mean, var, noise, w.span_s / prm.bucket_s)
    n = w.n.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast, deviation = w.expected / w.span_s, n / w.expected - 1
    sig["rps_forecast"] = np.where(ok, forecast, NAN)
    sig["rps_deviation"] = np.where(ok, deviation, NAN)
    with np.errstate(divide="ignore", invalid="ignore"):
        sig["rps_z"] = np.where(ok, count_z(n, w.expected, 1.0, wvar), NAN)
    return np.where(ok, wvar, NAN)


def _mean_deviation(
    st: ServiceRows, prm: CloseParams, rows: Rows, w: CountWindows, mid: F64, sig: Signals
) -> F64:
    """Tokens per request against its baseline; returns the forecast's variance (NaN
    without a forecast)."""
    mean_f, var_f, noise_f = st.tpr.forecast(rows, mid)
    has = ~np.isnan(mean_f)
    forecast = _each(math.exp, mean_f)
    sig["tpr_forecast"] = forecast
    wvar = _window_var(mean_f, var_f, noise_f, w.span_s / prm.bucket_s)
    n = w.n.astype(np.float64)
    test = has & (n >= prm.rate_min)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = w.tokens / n
        spread = _max0(w.tokens_sq / n - mean * mean)
        se2 = spread / n + forecast * forecast * wvar
        d = mean / forecast - 1
        z = np.where(se2 > 0, (mean - forecast) / np.sqrt(np.where(se2 > 0, se2, 1.0)), 0.0)
    sig["tpr_deviation"] = np.where(test, d, NAN)
    sig["tpr_z"] = np.where(test, z, NAN)
    sig["tpr_score"] = np.where(test, _drop_score(d, z, prm.hold_z), NAN)
    return np.where(has, wvar, NAN)


def _tps(
    st: ServiceRows, prm: CloseParams, rows: Rows, w: CountWindows, rate_var: F64,
    mean_var: F64, sig: Signals,
) -> None:  # fmt: skip
    """Output tokens per second against requests x tokens per request expected."""
    tpr = sig["tpr_forecast"]
    ok = ~np.isnan(rate_var) & ~np.isnan(mean_var) & ~np.isnan(tpr)
    expected = w.expected * tpr
    size = tpr * (1 + st.col["token_cv2"][rows])  # E[tokens^2] / E[tokens] of one request
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(expected > 0, w.tokens / expected - 1, 0.0)
        z = count_z(w.tokens, expected, size, rate_var + mean_var)
        forecast = expected / w.span_s
    sig["tps_forecast"] = np.where(ok, forecast, NAN)
    sig["tps_deviation"] = np.where(ok, d, NAN)
    sig["tps_z"] = np.where(ok, z, NAN)
    sig["tps_score"] = np.where(ok, _drop_score(d, z, prm.hold_z), NAN)


def _hold(
    st: ServiceRows, prm: CloseParams, rows: Rows, end: F64, w: CountWindows, sig: Signals
) -> None:
    """Hold each baseline whose window deviates significantly; maybe accept a new level
    (and remember when, and from what, for the alerts' resolutions)."""
    tps_before = sig["tps_forecast"]
    n = w.n.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(w.span_s != 0, (n + 0.5) / w.span_s, NAN)
        per = np.where(n != 0, w.tokens / n, NAN)
    observed = {
        "rps": _each(math.log, rate),
        "tpr": _each(math.log, np.where(per < 0.5, 0.5, per)),  # max(tokens / n, 0.5)
    }
    banks: dict[str, SeasonalBank] = {"rps": st.rps, "tpr": st.tpr}
    col = st.col
    for family, bank in banks.items():
        d, z = sig[f"{family}_deviation"], sig[f"{family}_z"]
        # enter the hold on a significant deviation; stay in it while the deviation is
        # larger than the band (noisy traffic makes z waver during a real fault)
        with np.errstate(invalid="ignore"):
            deviating = (
                ~np.isnan(d)
                & ~np.isnan(z)
                & (np.abs(d) > prm.hold_band)
                & (bank.holding(rows) | (np.abs(z) > prm.hold_z))
            )
        before = sig[f"{family}_forecast"]
        accepted = bank.hold(rows, end, deviating, observed[family]) & ~np.isnan(before)
        r = rows[accepted]
        col[f"{family}_relearned_at"][r] = end[accepted]
        col[f"{family}_relearned_from"][r] = before[accepted]
        tps = accepted & ~np.isnan(tps_before)
        col["tps_relearned_at"][rows[tps]] = end[tps]
        col["tps_relearned_from"][rows[tps]] = tps_before[tps]


def _pending(st: ServiceRows, family: str, rows: Rows) -> dict[str, F64]:
    return {
        k: st.col[f"{family}_pending_{k}"][rows].astype(np.float64)
        for k in ("start", "end", "n", "tokens", "tokens_sq", "expected")
    }


def _store(st: ServiceRows, family: str, rows: Rows, p: dict[str, Any]) -> None:
    for k, v in p.items():
        target = st.col[f"{family}_pending_{k}"]
        target[rows] = v.astype(target.dtype) if isinstance(v, np.ndarray) else v


def _gather(
    st: ServiceRows, prm: CloseParams, family: str, c: _Round, expected: F64
) -> dict[str, F64]:
    """Add the bucket to the observation pending for ``family``'s baseline (a held
    bucket is never learnt: a held baseline's pending observation starts over)."""
    bank = st.rps if family == "rps" else st.tpr
    p = _pending(st, family, c.rows)
    held = bank.holding(c.rows)
    start = np.where(np.isnan(p["start"]), c.end - prm.bucket_s, p["start"])
    fresh = {"start": NAN, "end": 0.0, "n": 0.0, "tokens": 0.0, "tokens_sq": 0.0, "expected": 0.0}
    added = {
        "start": start, "end": c.end, "n": p["n"] + c.n, "tokens": p["tokens"] + c.tokens,
        "tokens_sq": p["tokens_sq"] + c.tokens_sq, "expected": p["expected"] + expected,
    }  # fmt: skip
    return {k: np.where(held, fresh[k], added[k]) for k in added}


def _learn(st: ServiceRows, prm: CloseParams, c: _Round, expected: F64) -> None:
    """Gather buckets into observations that hold enough requests, then learn them."""
    want, max_s, bs = prm.observation_requests, prm.observation_max_s, prm.bucket_s
    p = _gather(st, prm, "rps", c, expected)
    span = np.where(np.isnan(p["start"]), 0.0, p["end"] - p["start"])
    due = ~np.isnan(p["start"]) & ((p["expected"] >= want) | (span >= max_s))
    if due.any():
        n, s = p["n"][due], span[due]
        z = _each(math.log, (n + 0.5) / s)
        mid = (p["start"][due] + p["end"][due]) / 2
        st.rps.learn(c.rows[due], mid, z, 1 / (n + 0.5), s / bs)
        p = {k: np.where(due, NAN if k == "start" else 0.0, v) for k, v in p.items()}
    _store(st, "rps", c.rows, p)
    p = _gather(st, prm, "tpr", c, expected)
    span = np.where(np.isnan(p["start"]), 0.0, p["end"] - p["start"])
    due = ~np.isnan(p["start"]) & ((p["n"] >= want) | (span >= max_s))
    learn = due & (p["n"] != 0)
    if learn.any():
        _learn_tpr(st, c.rows[learn], {k: v[learn] for k, v in p.items()}, span[learn], bs)
    if due.any():
        p = {k: np.where(due, NAN if k == "start" else 0.0, v) for k, v in p.items()}
    _store(st, "tpr", c.rows, p)


def _learn_tpr(st: ServiceRows, rows: Rows, p: dict[str, F64], span: F64, bs: float) -> None:
    n = p["n"]
    mean = p["tokens"] / n
    with np.errstate(divide="ignore", invalid="ignore"):
        cv2 = np.where(mean > 0, _max0(p["tokens_sq"] / n / (mean * mean) - 1), 0.0)
    cv = st.col["token_cv2"]
    much = n >= 10
    cv[rows[much]] += 0.1 * (cv2[much] - cv[rows[much]])
    z = _each(math.log, np.where(mean < 0.5, 0.5, mean))  # max(mean, 0.5)
    var = np.where(cv2 < 1e-4, 1e-4, cv2) / n  # max(cv2, 1e-4) / n
    st.tpr.learn(rows, (p["start"] + p["end"]) / 2, z, var, span / bs)


# ---------------------------------------------------------------------- latency


def _tails(st: ServiceRows, c: _Round, sig: Signals) -> None:
    """The tail window's quantiles and stage shares, per row (a window's values are as
    many as its traffic brought)."""
    got: list[dict[str, float | None]] = []
    for i, row in enumerate(c.rows.tolist()):
        out: dict[str, float | None] = {}
        tail_signals(st.tails[row], float(c.end[i]), out)
        got.append(out)
    for name in got[0]:
        sig[name] = np.array([NAN if (v := g[name]) is None else v for g in got], np.float64)


def _latency(st: ServiceRows, c: _Round, sig: Signals) -> None:
    rows, end = c.rows, c.end
    for name, stage, bank in (
        ("retriever_p99", "retriever", st.retriever_p99),
        ("e2e_p95", "e2e", st.e2e_p95),
    ):
        value = sig[f"{name}_ms"]
        seen = np.array([st.tails[r].seen.get(stage, 0) for r in rows.tolist()], np.int64)
        base = bank.update(rows, end, value, seen)
        sig[f"{name}_baseline_ms"] = base
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = ~np.isnan(value) & ~np.isnan(base) & (base != 0)
            sig[f"{name}_ratio"] = np.where(ok, value / np.where(ok, base, 1.0), NAN)
        sig[f"{name}_held_s"] = bank.held_s(rows, end)
        sig[f"{name}_relearned_at"] = bank.relearned_at[rows].copy()
        sig[f"{name}_relearned_from"] = bank.relearned_before[rows].copy()


# ---------------------------------------------------------------------- outliers


def _outliers(
    st: ServiceRows, prm: CloseParams, c: _Round, b: Sequence[int],
    buckets: Sequence[Bucket], services: Sequence[ServiceClusters], sig: Signals,
) -> None:  # fmt: skip
    """The bucket's outliers, the recent ones, and news of a new cluster (per service:
    the cluster detector is the service's; the news goes to the instance whose records
    landed away from the known clusters most)."""
    rows = c.rows
    served = c.n + c.clustered
    sig["outliers"] = c.outliers
    sig["outlier_ratio"] = _div(c.outliers, served)
    recent = st.recent[rows]
    recent = np.concatenate([recent[:, 1:], c.outliers.astype(np.int64)[:, None]], axis=1)
    st.recent[rows] = recent
    total = recent.sum(axis=1)
    sig["recent_outliers"] = total.astype(np.float64)
    col = st.col
    col["novel_score"][rows] = col["novel_score"][rows] * NOVEL_DECAY + c.novel
    raised, active, size = (np.zeros(len(rows)) for _ in range(3))
    for i, row in enumerate(rows.tolist()):
        svc, inst = services[i], st.index.key(row)[1]
        new = svc.new_cluster(b[i], prm.new_cluster_size, _novel_of(st, svc.name))
        mine = svc.active is not None and svc.active_instance == inst
        raised[i] = new if mine else 0.0
        if raised[i]:
            col["cluster_size"][row] = svc.size
        size[i], active[i] = col["cluster_size"][row], 1.0 if mine else 0.0
        labels = buckets[i].labels
        if mine and svc.active_label:  # the cluster's own description
            st.label[row] = svc.active_label
        elif labels:
            st.label[row] = labels.most_common(1)[0][0]
        elif not total[i]:
            st.label[row] = None
    sig["new_outlier_cluster"], sig["outlier_cluster_size"] = raised, size
    sig["outlier_cluster_active"] = active


def _novel_of(st: ServiceRows, service: str) -> Callable[[str], float]:
    def novel(instance: str) -> float:
        row = st.index.get((service, instance))
        return -math.inf if row is None else float(st.col["novel_score"][row])

    return novel
