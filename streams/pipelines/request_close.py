"""Closing buckets of many request series at once: counts, windows, baselines, signals.

A *round* is one bucket close for each of a set of distinct rows of
:class:`~ragwatch.streams.pipelines.service_rows.ServiceRows`. Everything a close computes
is an array over the round's rows (NaN where the object version had None): the bucket's
counts enter the count rings, the rate window is chosen by what the baselines expected,
the traffic signals and their tests against the baselines are computed, the baselines held
or taught, then the tail quantiles (per row: a window's length follows its traffic), the
latency baselines and what the service controls (:mod:`~.serving`). The outlier signals
are the one part done at once, per close, in the order of the envelopes
(:func:`close_outliers`: the service's cluster detector is shared by its instances and
changed by the next envelope's records); every other part of
a close reads and writes its own row only, so the closes of a batch wait for their rounds
whatever the services of its envelopes.

Exactly the arithmetic of the object version it replaced (one series at a time, issue 17;
kept as a test twin until issue 31), in the same order: the count and latency banks are
still held bit for bit to their one-series references, and the signals added since
(:mod:`~.serving`'s, ``window_errors`` and the latency baselines' ``*_z``) to brute-force
references with a tolerance (``tests/unit/test_requests_serving.py``). Numpy's ``+ - *
/``, square root and comparisons round as Python's floats do, but its ``exp``, ``log``
and ``**`` do not always (SIMD implementations), so those go element by element through
:mod:`math` (``_each``).
``tests/unit/test_requests_columnar.py`` holds every signal of every close to the object
version's, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.counts import CountWindows
from ragwatch.detectors.recurrence import HoldMemory, recurring
from ragwatch.detectors.service_clusters import ServiceClusters
from ragwatch.detectors.tails import tail_signals
from ragwatch.streams.pipelines.buckets import Bucket
from ragwatch.streams.pipelines.service_rows import SCORE_AT, SCORED_AT, SIGNAL_AT, ServiceRows
from ragwatch.streams.pipelines.serving import serving_signals

F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
EVIDENT_NATS = 10.0  # a retriever P99 hold counts its height from this CUSUM: its rule's, tested
Bools = npt.NDArray[np.bool_]
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
    """:func:`~ragwatch.detectors.tails.count_z` of arrays."""
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


def _counted(rows: Rows, ends: F64, buckets: Sequence[Bucket]) -> _Round:
    cols = np.array(
        [
            (k.n, k.errors, float(k.output_tokens), k.output_sq, float(k.context_tokens),
             k.clustered)
            for k in buckets
        ],
        dtype=np.float64,
    ).reshape(len(buckets), 6)  # fmt: skip
    return _Round(rows, ends, *cols.T)


def close_round(
    st: ServiceRows,
    prm: CloseParams,
    rows: Rows,
    b: Sequence[int],
    buckets: Sequence[Bucket],
    outliers: F64,
    warm: npt.NDArray[np.bool_],
) -> F64:
    """Close bucket ``b[i]`` of row ``rows[i]`` (rows distinct; ``buckets[i]`` what it
    gathered; ``outliers[i]`` its outlier signals, from :func:`close_outliers`; ``warm[i]``:
    it is a restarted process's warm-up, whose latencies are not evidence:
    :mod:`~.warmup`): the signals go to ``st.signals``. Returns the buckets' ends (the
    event time their rules are evaluated at)."""
    ends = np.array([(k + 1) * prm.bucket_s for k in b], dtype=np.float64)
    c = _counted(rows, ends, buckets)
    col = st.col
    col["requests_total"][rows] += (c.n + c.clustered).astype(np.int64)
    col["errors_total"][rows] += c.errors.astype(np.int64)
    col["output_tokens_total"][rows] += c.tokens
    # the requests expected in the bucket (before it is learnt) and, for the window, both
    # baselines' excess noise at its end: one forecast of the traffic bank for the three
    k, rps, tpr = len(rows), 2 * rows, 2 * rows + 1
    mean, _, noise = st.traffic.forecast(
        np.concatenate([rps, rps, tpr]), np.concatenate([c.end - prm.bucket_s / 2, c.end, c.end])
    )
    expected = _each(math.exp, mean[:k]) * prm.bucket_s
    min_s = _window_min_s(prm, mean[k:], noise[k:])
    ones = np.ones(len(rows), dtype=np.bool_)
    st.counts.push(rows, c.end, c.n, c.errors, c.tokens, c.tokens_sq, c.context, ones,
                   expected, c.clustered)  # fmt: skip
    for i, row in enumerate(rows.tolist()):
        values = {} if warm[i] else {name: r.values for name, r in buckets[i].latencies.items()}
        st.tails[row].push(float(c.end[i]), values)
    sig: Signals = {
        "requests_total": col["requests_total"][rows].astype(np.float64),
        "errors_total": col["errors_total"][rows].astype(np.float64),
        "output_tokens_total": col["output_tokens_total"][rows].copy(),
    }
    _traffic(st, prm, c, expected, min_s, sig)
    _tails(st, c, sig)
    _latency(st, c, sig)
    serving_signals(st, c.rows, c.end, sig)
    _retriever_rhythm(st, c, sig)
    for j, name in enumerate(OUTLIER_SIGNALS):
        sig[name] = outliers[:, j]
    at = np.array([SIGNAL_AT[name] for name in sig], dtype=np.intp)
    columns = np.array([sig[name] for name in sig]).T  # np.column_stack's, 4x faster
    st.signals[np.ix_(rows, at)] = columns
    # every scored signal through the generic detector, its scores signals too (.scoring)
    scored = st.signals[np.ix_(rows, SCORED_AT)]
    evidence = st.scores.evidence(sig, len(rows))  # errors count where errors_z says so
    st.signals[np.ix_(rows, SCORE_AT)] = st.scores.update(rows, c.end, scored, evidence)
    col["bucket_end"][rows] = c.end
    return ends


# ---------------------------------------------------------------------- traffic


def _window_min_s(prm: CloseParams, mean: F64, nz: F64) -> F64:
    """Bursty traffic needs a longer window: long enough that the baselines' excess noise
    per bucket, averaged over it, is within ``RATE_PRECISION``. ``mean``, ``nz``: the
    forecasts of the requests baselines, then of the tokens baselines, at the bucket's
    end (NaN: none yet)."""
    k = len(mean) // 2
    noise = np.zeros(k)
    for part in (slice(0, k), slice(k, 2 * k)):
        noise = noise + np.where(np.isnan(mean[part]), 0.0, nz[part])
    buckets = np.ceil(noise / PRECISION2)
    return np.minimum(prm.rate_max_s, np.maximum(1.0, buckets) * prm.bucket_s)


def _traffic(
    st: ServiceRows, prm: CloseParams, c: _Round, expected: F64, min_s: F64, sig: Signals
) -> None:
    rows, end = c.rows, c.end
    w = st.counts.window(rows, target=prm.rate_target, max_s=prm.rate_max_s, min_s=min_s)
    span, n = w.span_s, w.n.astype(np.float64)
    sig["window_s"], sig["window_requests"] = span, n
    sig["rps"] = _div(n + w.clustered, span)  # all it served
    sig["clustered_requests"] = w.clustered.astype(np.float64)
    sig["output_tokens_per_s"] = _div(w.tokens, span)
    sig["errors_ratio"] = _div(w.errors.astype(np.float64), n)
    sig["window_errors"] = w.errors.astype(np.float64)
    _errors(st, prm, rows, w, sig)
    sig["tokens_per_request"] = _div(w.tokens, n)
    sig["context_tokens_per_request"] = _div(w.context, n)
    mid = (w.start + end) / 2
    k = len(rows)
    f_mean, f_var, f_noise = st.traffic.forecast(st.both(rows), np.concatenate([mid, mid]))
    rps_f, tpr_f = slice(0, k), slice(k, 2 * k)
    rate = _rate_deviation(prm, w, (f_mean[rps_f], f_var[rps_f], f_noise[rps_f]),
                           w.unexpected == 0, sig)  # fmt: skip
    mean = _mean_deviation(prm, w, (f_mean[tpr_f], f_var[tpr_f], f_noise[tpr_f]), sig)
    _tps(st, prm, rows, w, rate, mean, sig)
    _hold(st, prm, rows, end, w, sig)
    _learn(st, prm, c, np.where(np.isnan(expected), c.n, expected))
    for family in ("rps", "tpr", "tps"):
        sig[f"{family}_relearned_at"] = st.col[f"{family}_relearned_at"][rows].copy()
        sig[f"{family}_relearned_from"] = st.col[f"{family}_relearned_from"][rows].copy()
    held = st.traffic.held_s(st.both(rows), np.concatenate([end, end]))
    rps_held, tpr_held = held[:k], held[k:]
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


Forecasts = tuple[F64, F64, F64]  # a baseline's mean, var and noise (NaN: none yet)


def _rate_deviation(
    prm: CloseParams, w: CountWindows, f: Forecasts, ready: npt.NDArray[np.bool_], sig: Signals
) -> F64:
    """Requests against the baseline's expectation (``f``: its forecasts at the window's
    middle); returns the forecast's variance (NaN where there is no test)."""
    ok = ready & ~(w.expected < prm.rate_min) & (w.span_s != 0)
    mean, var, noise = f
    wvar = _window_var(mean, var, noise, w.span_s / prm.bucket_s)
    n = w.n.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast, deviation = w.expected / w.span_s, n / w.expected - 1
    sig["rps_forecast"] = np.where(ok, forecast, NAN)
    sig["rps_deviation"] = np.where(ok, deviation, NAN)
    with np.errstate(divide="ignore", invalid="ignore"):
        sig["rps_z"] = np.where(ok, count_z(n, w.expected, 1.0, wvar), NAN)
    return np.where(ok, wvar, NAN)


def _mean_deviation(prm: CloseParams, w: CountWindows, f: Forecasts, sig: Signals) -> F64:
    """Tokens per request against its baseline (``f``: its forecasts at the window's
    middle); returns the forecast's variance (NaN without a forecast)."""
    mean_f, var_f, noise_f = f
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
    (and remember when, and from what, for the alerts' resolutions). Both families' in
    one call of the traffic bank (their rows are apart)."""
    tps_before = sig["tps_forecast"]
    n = w.n.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(w.span_s != 0, (n + 0.5) / w.span_s, NAN)
        per = np.where(n != 0, w.tokens / n, NAN)
    observed = np.concatenate(
        [_each(math.log, rate), _each(math.log, np.where(per < 0.5, 0.5, per))]
    )  # log(max(tokens / n, 0.5)) for the tokens per request
    both, k = st.both(rows), len(rows)
    holding = st.traffic.holding(both)
    d = np.concatenate([sig["rps_deviation"], sig["tpr_deviation"]])
    z = np.concatenate([sig["rps_z"], sig["tpr_z"]])
    # enter the hold on a significant deviation; stay in it while the deviation is larger
    # than the band (noisy traffic makes z waver during a real fault)
    with np.errstate(invalid="ignore"):
        deviating = (
            ~np.isnan(d)
            & ~np.isnan(z)
            & (np.abs(d) > prm.hold_band)
            & (holding | (np.abs(z) > prm.hold_z))
        )
    accepted = st.traffic.hold(both, np.concatenate([end, end]), deviating, observed)
    col = st.col
    for family, part in (("rps", slice(0, k)), ("tpr", slice(k, 2 * k))):
        before = sig[f"{family}_forecast"]
        took = accepted[part] & ~np.isnan(before)
        col[f"{family}_relearned_at"][rows[took]] = end[took]
        col[f"{family}_relearned_from"][rows[took]] = before[took]
        tps = took & ~np.isnan(tps_before)
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
    st: ServiceRows, prm: CloseParams, family: str, c: _Round, expected: F64, held: Bools
) -> dict[str, F64]:
    """Add the bucket to the observation pending for ``family``'s baseline (a held
    bucket is never learnt: a held baseline's pending observation starts over)."""
    p = _pending(st, family, c.rows)
    start = np.where(np.isnan(p["start"]), c.end - prm.bucket_s, p["start"])
    fresh = {"start": NAN, "end": 0.0, "n": 0.0, "tokens": 0.0, "tokens_sq": 0.0, "expected": 0.0}
    added = {
        "start": start, "end": c.end, "n": p["n"] + c.n, "tokens": p["tokens"] + c.tokens,
        "tokens_sq": p["tokens_sq"] + c.tokens_sq, "expected": p["expected"] + expected,
    }  # fmt: skip
    return {k: np.where(held, fresh[k], added[k]) for k in added}


def _learn(st: ServiceRows, prm: CloseParams, c: _Round, expected: F64) -> None:
    """Gather buckets into observations that hold enough requests, then learn them (both
    families in one call of the traffic bank)."""
    want, max_s, bs = prm.observation_requests, prm.observation_max_s, prm.bucket_s
    k = len(c.rows)
    held = st.traffic.holding(st.both(c.rows))
    p = _gather(st, prm, "rps", c, expected, held[:k])
    span = np.where(np.isnan(p["start"]), 0.0, p["end"] - p["start"])
    due = ~np.isnan(p["start"]) & ((p["expected"] >= want) | (span >= max_s))
    n, s = p["n"][due], span[due]
    rps = _Learn(2 * c.rows[due], (p["start"][due] + p["end"][due]) / 2,
                 _each(math.log, (n + 0.5) / s), 1 / (n + 0.5), s / bs)  # fmt: skip
    if due.any():
        p = {key: np.where(due, NAN if key == "start" else 0.0, v) for key, v in p.items()}
    _store(st, "rps", c.rows, p)
    p = _gather(st, prm, "tpr", c, expected, held[k:])
    span = np.where(np.isnan(p["start"]), 0.0, p["end"] - p["start"])
    due = ~np.isnan(p["start"]) & ((p["n"] >= want) | (span >= max_s))
    learn = due & (p["n"] != 0)
    tpr = _tpr_learnt(st, c.rows[learn], {key: v[learn] for key, v in p.items()}, span[learn], bs)
    if due.any():
        p = {key: np.where(due, NAN if key == "start" else 0.0, v) for key, v in p.items()}
    _store(st, "tpr", c.rows, p)
    if len(rps.rows) or len(tpr.rows):
        st.traffic.learn(*(np.concatenate([a, b]) for a, b in zip(rps, tpr, strict=True)))


class _Learn(NamedTuple):
    """Observations for rows of the traffic bank: rows, times, z, variances, steps."""

    rows: Rows
    t: F64
    z: F64
    var: F64
    steps: F64


def _tpr_learnt(st: ServiceRows, rows: Rows, p: dict[str, F64], span: F64, bs: float) -> _Learn:
    """The tokens-per-request observations of ``rows`` (their spread learnt on the way)."""
    n = p["n"]
    mean = p["tokens"] / n
    with np.errstate(divide="ignore", invalid="ignore"):
        cv2 = np.where(mean > 0, _max0(p["tokens_sq"] / n / (mean * mean) - 1), 0.0)
    cv = st.col["token_cv2"]
    much = n >= 10
    cv[rows[much]] += 0.1 * (cv2[much] - cv[rows[much]])
    z = _each(math.log, np.where(mean < 0.5, 0.5, mean))  # max(mean, 0.5)
    var = np.where(cv2 < 1e-4, 1e-4, cv2) / n  # max(cv2, 1e-4) / n
    return _Learn(2 * rows + 1, (p["start"] + p["end"]) / 2, z, var, span / bs)


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
    """The latency baselines (retriever P99 and end-to-end P95: a row each of the latency
    bank) judge the window's quantiles, then maybe learn them: one call for both."""
    rows, end, k = c.rows, c.end, len(c.rows)
    seen = [
        [st.tails[r].seen.get(stage, 0) for r in rows.tolist()] for stage in ("retriever", "e2e")
    ]
    value = np.concatenate([sig["retriever_p99_ms"], sig["e2e_p95_ms"]])
    both, ends = st.both(rows), np.concatenate([end, end])
    base = st.latency.update(both, ends, value, np.array(seen, dtype=np.int64).ravel())
    held = st.latency.held_s(both, ends)
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = ~np.isnan(value) & ~np.isnan(base) & (base != 0)
        ratio = np.where(ok, value / np.where(ok, base, 1.0), NAN)
    at, before = st.latency.relearned_at[both], st.latency.relearned_before[both]
    z = _latency_z(ratio, st.latency.log_var(both, ends))
    for name, part in (("retriever_p99", slice(0, k)), ("e2e_p95", slice(k, 2 * k))):
        sig[f"{name}_baseline_ms"], sig[f"{name}_ratio"] = base[part], ratio[part]
        sig[f"{name}_held_s"], sig[f"{name}_z"] = held[part], z[part]
        sig[f"{name}_relearned_at"], sig[f"{name}_relearned_from"] = at[part], before[part]


def _retriever_rhythm(st: ServiceRows, c: _Round, sig: Signals) -> None:
    """``retriever_p99_recurring``: a retriever slower at the same hour every night (a
    vector store's compaction) is its rhythm from the next night, as the serving
    baselines' are (:mod:`~ragwatch.detectors.recurrence`). The P99's hold counts its
    height only at closes whose tail CUSUM has the evidence ``RetrievalSlowdown`` asks
    (:data:`EVIDENT_NATS`): a healthy retriever's stalls hold a quiet window's P99 up for
    an hour now and then, at any hour (2 requests a minute, 1 % stalls: 10 such holds in
    4 days), and remembered they would mute a real fault at that hour the next day."""
    with np.errstate(invalid="ignore"):
        evident = sig["retriever_tail_cusum"] > EVIDENT_NATS
    height = np.where(evident, sig["retriever_p99_ratio"], 0.0)
    memory = HoldMemory.of(st.col, "retriever_p99")
    held = sig["retriever_p99_held_s"]
    sig["retriever_p99_recurring"] = recurring(memory, c.rows, c.end, held, height)


def _latency_z(ratio: F64, log_var: F64) -> F64:
    """``retriever_p99_z`` and ``e2e_p95_z``: the log of the window's quantile over its
    baseline (``ratio``), in standard deviations of the baseline's own uncertainty
    (:meth:`~ragwatch.detectors.latency.LatencyBank.log_var`: the level's, grown with the
    steps a hold has lasted, and the entries' scatter around it, which holds the window
    quantile's own sampling noise). A baseline that has seen a day knows a night's P95
    within ~10-20 % and a doubling is 3.5 to 12 of them; on its first night it has seen no
    night, and after holding for hours it has watched the level drift: a doubling there was
    1.2 to 1.7 (bench/space_real.py seed 4, whose first trusted night paged
    E2eLatencyDeviation)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(ratio) / np.sqrt(log_var)
    return np.where(log_var > 0, z, NAN)


# ---------------------------------------------------------------------- outliers

OUTLIER_SIGNALS = (
    "outliers", "outlier_ratio", "recent_outliers",
    "new_outlier_cluster", "outlier_cluster_size", "outlier_cluster_active",
)  # fmt: skip


def close_outliers(
    st: ServiceRows, prm: CloseParams, row: int, b: int, bucket: Bucket, svc: ServiceClusters
) -> tuple[float, ...]:
    """The outlier part of closing bucket ``b`` of ``row``, done at once, in the order of
    the envelopes (the rest of the close waits for its round): the bucket's outliers, the
    recent ones, and news of a new cluster. That news is the service's (its instances
    share the detector, and the next envelope's records change it) and goes to the
    instance whose records landed away from the known clusters most. The signals, in
    :data:`OUTLIER_SIGNALS`' order (NaN for None)."""
    served = bucket.n + bucket.clustered
    recent = st.recent[row]
    recent[:-1] = recent[1:].copy()
    recent[-1] = bucket.outliers
    total = int(recent.sum())
    col = st.col
    col["novel_score"][row] = float(col["novel_score"][row]) * NOVEL_DECAY + bucket.novel
    new = svc.new_cluster(
        b, prm.new_cluster_size, _novel_of(st, svc.name), at=(b + 1) * prm.bucket_s
    )
    mine = svc.active is not None and svc.active_instance == st.index.key(row)[1]
    raised = new if mine else 0.0
    if raised:
        col["cluster_size"][row] = svc.size
    if mine and svc.active_label:  # the cluster's own description
        st.label[row] = svc.active_label
    elif bucket.labels:
        st.label[row] = bucket.labels.most_common(1)[0][0]
    elif not total:
        st.label[row] = None
    return (
        float(bucket.outliers),
        bucket.outliers / served if served else NAN,
        float(total),
        raised,
        float(col["cluster_size"][row]),
        1.0 if mine else 0.0,
    )


def _novel_of(st: ServiceRows, service: str) -> Callable[[str], float]:
    def novel(instance: str) -> float:
        row = st.index.get((service, instance))
        return -math.inf if row is None else float(st.col["novel_score"][row])

    return novel
