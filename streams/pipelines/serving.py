"""What the service controls, against its own baselines; the retriever's tail by evidence.

Demand (how many users, what they ask, how long the answers are) is not the service's to
control; how fast it answers is. A close of a request series (:mod:`~.request_close`)
computes here, over its tail window (the last 200 requests or 2 minutes, whichever holds
more):

- ``decode_tps``: the median of the requests' own decode speeds (output tokens per second
  after the first token: :func:`~.buckets.decode_ms_per_token`) over the last
  :data:`DECODE_REQUESTS` requests or 2 minutes, whichever holds more, robust to the few very
  short or very long answers of any mix; ``decode_baseline_tps`` (a seasonal baseline of
  the median's log, :class:`~ragwatch.detectors.latency.LatencyBank`), ``decode_deviation`` (-0.36:
  36 % slower) and ``decode_z``: the deviation of the log median in standard deviations
  of its sampling noise (the spread of the requests' log speeds, as a MAD, times
  sqrt(pi / 2) over sqrt(n): a median's standard error) plus the baseline's own
  uncertainty; unknown below :data:`MIN_DECODE` requests with a speed;
- ``ttft_net_p95_ms``: the P95 of the time to first token less the queue wait (the time
  the engine took itself), with a baseline, ``_ratio`` and ``_excess_ms``;
- ``queue_recent_p95_ms``, the P95 of the queue wait of the last :data:`DECODE_REQUESTS`
  requests or 2 minutes (a queue that builds shows within minutes, where the tail window
  of 200 requests lags by a quarter of an hour on a quiet instance), and its
  ``queue_p95_baseline_ms``, ``_ratio`` and ``_excess_ms``; a queue wait under
  :data:`QUEUE_FLOOR_MS` is no queue to a person, so the baseline and the ratio see at
  least that; ``queue_p95_excess_ms`` is 0 where the records report no
  queue wait at all (none to exceed);
- ``tpr_recent``: the mean output tokens of the last :data:`DECODE_REQUESTS` successful
  requests or 2 minutes', with ``tpr_recent_deviation`` and ``tpr_recent_z`` against the
  tokens-per-request baseline (the rate window's ``tpr_*`` hold ~150 requests: a quarter
  of an hour on a quiet instance): of that mean's test, or of the last
  :data:`LOG_REQUESTS` answers' log lengths (their middle half's mean) where that test is
  the stronger (a heavy-tailed mix's mean hides a drop in its noise:
  :func:`_recent_tokens`);
- ``retriever_tail_ratio`` and ``retriever_tail_z``: how many of the tail window's
  retrievals (the P99's own: the last 200 or 2 minutes') took longer than the baseline P99,
  against the 1 % a P99 leaves above it (a binomial z with a quarter of slack for the
  baseline itself). A few stalls of a healthy
  retriever move a window's P99 a lot and this count hardly at all; a tail that really
  changed puts many requests above the old P99.
- ``e2e_tail_ratio`` and ``e2e_tail_z``: the same test of the requests' end-to-end times
  against the baseline P95 (5 % above it): a few long answers of a heavy-tailed mix on a
  quiet instance double a window's P95, not the count above the baseline's.
- ``retriever_tail_recovered`` and ``e2e_tail_recovered``: the evidence, in nats, that
  the window's newest requests are back at the usual share after an older stretch above
  it (:func:`tail_recovered`): a window of 200 holds a fault's requests for an hour at
  night after it ended, the newest few say it ended.
- ``retriever_tail_cusum`` and ``e2e_tail_cusum``: the same count's evidence request by
  request since the series began (:func:`tail_cusum`, in nats): a window of 200 cannot
  tell a 3 % stall fault from a healthy instance's unlucky hour, the requests since can.
- ``queue_tail_ratio``, ``_z``, ``_recovered`` and ``_cusum``: the same of the queue
  waits over the queue's baseline P95 plus :data:`QUEUED_MS` (the requests that were
  queued, to a person): a minute or two of queueing (a burst of long prompts, an engine's
  pause) stays in the newest 60 requests' P95 for minutes after it cleared (a quarter
  of an hour at night), and its evidence rises by at most :data:`CUSUM_RISE` nats a
  minute.

The baselines judge (and the tests are known) once the window has taken
:data:`~ragwatch.detectors.latency.TRUST_VALUES` values of theirs: a baseline of the first
hours of a series (a level, or a trend fitted to a quiet start) cannot tell a fault from its own
error. Each baseline also has ``<family>_held_s``, ``_relearned_at`` and ``_relearned_from``
(families ``decode``, ``ttft_net_p95``, ``queue_p95``; ``decode_relearned_from`` in
tokens per second, as its baseline), and ``<family>_recurring``: 1 while it holds a
deviation that came back at the same hour as one of the day or two before, no higher
(:mod:`~ragwatch.detectors.recurrence`: the service's daily rhythm, which a hold keeps
from learning).

>>> from ragwatch.streams.pipelines.service_rows import ServiceRows
>>> st = ServiceRows(bucket_s=60.0, rate_max_s=600.0, tail=(200, 120.0, 3600.0),
...                  min_baseline=3, hold_max_s=86400.0)
>>> row = st.add(("rag", "a"), at=0.0)
>>> rows = np.array([row])
>>> for minute in range(1, 9):   # 50 tokens/s, then 32 from minute 7
...     ms = 20.0 if minute < 7 else 31.25
...     st.tails[row].push(60.0 * minute, {"tpot": [ms] * 300})
...     sig = {name: np.array([np.nan])   # what the close computed before: unknown here
...            for name in ("retriever_p99_baseline_ms", "queue_p95_ms", "e2e_p95_ms",
...                         "e2e_p95_baseline_ms")}
...     serving_signals(st, rows, np.array([60.0 * minute]), sig)
>>> [round(float(sig[name][0]), 2) for name in ("decode_tps", "decode_baseline_tps",
...                                             "decode_deviation")]
[32.0, 50.0, -0.36]
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.latency import TRUST_VALUES
from ragwatch.detectors.recurrence import HoldMemory, recurring
from ragwatch.detectors.tails import MIN_VALUES, TailWindow
from ragwatch.streams.pipelines.service_rows import SERVING, ServiceRows

F64 = npt.NDArray[np.float64]
L = TypeVar("L", float, F64)  # a row's learnt value, or rows'
Rows = npt.NDArray[np.intp]
Signals = dict[str, F64]
NAN = math.nan

MIN_DECODE = MIN_VALUES["p95"]  # requests with a speed: as few as a P95 is taken from
# A median needs fewer requests than a tail, and a window of them follows a change sooner:
# the last 60 requests or the window's 2 minutes, whichever holds more. At 60 requests a
# median's standard error is ~0.16 of the requests' spread (a 36 % drop is ~10 of them
# on a spread of 30 %), and a quiet instance's median turns within ~30 requests.
DECODE_REQUESTS = 60
MEDIAN_SE = math.sqrt(math.pi / 2)  # a sample median's standard error / (sd / sqrt(n))
MAD_SD = 1.4826  # a normal sample's sd / its median absolute deviation
QUEUE_FLOOR_MS = 50.0  # a queue wait shorter than this is no wait to a person
# a request that waited this much longer than the queue's baseline P95 was queued, to a
# person (QueueWaitHigh's queue_p95_excess_ms): what the queue's CUSUM counts. Not the
# baseline alone: a busy hour's waits pass a baseline P95 of tens of milliseconds often
# enough to hold that CUSUM at its cap by day (bench/shapes.py --only queue-blips)
QUEUED_MS = 1000.0
# the least share of requests the queue's CUSUM takes as usually queued: a healthy
# instance's is about 0, and a usual share set higher than the real one is taken for
# dispersion (a P95's 5 % held the CUSUM at a seventh of its evidence)
QUEUED_SHARE = 0.01
# the share of requests queued that the queue's CUSUM weighs against the usual one: a
# queue is shared, so when it is the fault many requests wait. Each request queued is
# then log(0.2 / usual) nats (3.0 at 1 %), not a retriever's log(2.5) (0.9): at night a
# quiet instance takes a request a minute, and 2.5 gave ~0.46 nats a queued request (at
# its usual dispersion of 2): a queue stuck at night pended 23 minutes in, now 5 (the
# night test of tests/unit/test_requests_serving.py). A request not queued takes back
# ~0.2 nats (a blip's evidence is gone within ~60 requests, and blips a few minutes
# apart still add up): the sum gains while more than ~7 % of requests are queued
QUEUED_ALT_SHARE = 0.2
TAIL_P = 0.01  # the share of requests a P99 leaves above it
E2E_TAIL_P = 0.05  # ... and a P95
TAIL_SLACK = 0.25  # relative uncertainty of that share (a baseline P99 is an estimate)
# A window's count above the baseline quantile that is no evidence of a change (z under
# this) is what the row's usual share and dispersion learn, over the last day of closes
LEARN_Z = 3.0
TAIL_LEARN = 1440
TAIL_PRIOR = 360  # windows' worth of belief in the prior (the quantile's own share, 1)
# The recent answers' log test (_log_test) learns its offset and dispersion over the first
# LOG_LEARN closes (half a day at a close a minute), then with that weight, and judges
# from its LOG_TRUST th close (an hour's)
LOG_LEARN = 720
LOG_TRUST = 60
# ... over the newest 120 requests (or 2 minutes'): answers a third shorter (a log gap of
# 0.4) on a real mix's log spread of 0.9 are a z of -3.5 over 60, -4.9 over 120
LOG_REQUESTS = 120
RECOVERED = 7.0  # nats of evidence that a tail came back (odds of ~1000 to 1)
# A tail_cusum weighs a share above the quantile of 2.5 times the usual one against the
# usual: the most sensitive to what a stall fault does to a retriever whose usual share is
# over 1 % (3 % of stalls on 1.6 %), at the cost of ~20 % more requests for bigger changes
CUSUM_ALT = 2.5
# nats a tail_cusum holds at most: just over the rule's 10, so a long fault's sum falls
# under it ~130 clean requests after the fault ends (a rule resolved then does not fire
# again on the old fault's sum)
CUSUM_CAP = 12.0
# nats a tail_cusum rises by at most in a minute of requests: slow requests of one minute
# are one event (a GC pause, a merge, a network blip stalls every call in flight), not
# many independent ones, so 10 nats take four minutes of evidence; a minute 4x slower
# took the sum to its cap at once and paged 7 times in 20 such blips (docs/detection.md,
# known limits); a stall fault's rise (~0.3 nats a minute) is not capped
CUSUM_RISE = 3.0
# The count above the P99 is taken over the window the P99 itself is (the last 200
# requests or 2 minutes, whichever holds more): a stall rate of 4 % over 100 requests is
# 4 against 1 expected, no evidence (z 2.2); over 200 it is 8 against 2 (z 3.0), which
# a healthy instance's windows also reach: tail_cusum weighs the requests since.


def serving_signals(st: ServiceRows, rows: Rows, end: F64, sig: Signals) -> None:
    """The signals of the module docstring for a round's ``rows`` (closing at ``end``),
    into ``sig``; the serving baselines judge, then maybe learn, in one call."""
    at = list(zip(rows.tolist(), end.tolist(), strict=True))
    decode = [_decode(st.tails[r], t) for r, t in at]
    tpot, se2, count = (np.array(col, dtype=np.float64) for col in zip(*decode, strict=True))
    ttft = np.array([_p95(st.tails[r], "ttft_net", t) for r, t in at], dtype=np.float64)
    queue = np.array([_p95(st.tails[r], "queue", t, DECODE_REQUESTS) for r, t in at])
    floored = np.where(np.isnan(queue), NAN, np.maximum(queue, QUEUE_FLOOR_MS))
    base, var = _judge(st, rows, end, np.concatenate([tpot, ttft, floored]), sig)
    base = np.where(_trusted(st, rows, ("tpot", "ttft_net", "queue")), base, NAN)
    k = len(rows)
    _decode_signals(tpot, se2, count, base[:k], var[:k], sig)
    sig["ttft_net_p95_ms"], sig["queue_recent_p95_ms"] = ttft, queue
    for i, (name, value, judged) in enumerate(
        (("ttft_net_p95", ttft, ttft), ("queue_p95", queue, floored)), start=1
    ):
        b = base[i * k : (i + 1) * k]
        sig[f"{name}_baseline_ms"] = b
        sig[f"{name}_ratio"] = _ratio(judged, b)
        sig[f"{name}_excess_ms"] = value - b
    # records that report no queue wait have none to exceed (so a rule may ask that the
    # queue does not explain a latency: E2eLatencyDeviation)
    none = np.isnan(sig["queue_p95_ms"]) & ~np.isnan(sig["e2e_p95_ms"])
    sig["queue_p95_excess_ms"] = np.where(none, 0.0, sig["queue_p95_excess_ms"])
    _tail(st, rows, end, sig, "retriever", "retriever_p99_baseline_ms", TAIL_P, "p99")
    _tail(st, rows, end, sig, "e2e", "e2e_p95_baseline_ms", E2E_TAIL_P, "p95")
    _tail(st, rows, end, sig, "queue", "queue_p95_baseline_ms", QUEUED_SHARE, "p95",
          margin=QUEUED_MS, alt_share=QUEUED_ALT_SHARE)  # fmt: skip
    _recent_tokens(st, rows, end, sig)


def _trusted(st: ServiceRows, rows: Rows, names: tuple[str, ...]) -> npt.NDArray[np.bool_]:
    """Whether each baseline's window has taken
    :data:`~ragwatch.detectors.latency.TRUST_VALUES` values (a block of ``rows`` per
    name): a baseline learnt from fewer (the first hours of a series, a trend fitted to a
    quiet start) judges nothing yet, and its tests are unknown."""
    seen = [[st.tails[r].seen.get(n, 0) for r in rows.tolist()] for n in names]
    return np.array(seen, dtype=np.int64).ravel() >= TRUST_VALUES


def _judge(st: ServiceRows, rows: Rows, end: F64, values: F64, sig: Signals) -> tuple[F64, F64]:
    """The serving baselines (:data:`SERVING`, a block of ``rows`` each in ``values``)
    judge the values, then maybe learn them; their held and re-learnt signals go to
    ``sig``. Returns the baselines judged against and their log variances."""
    names = ("tpot", "ttft_net", "queue")  # the values behind each baseline
    seen = [[st.tails[r].seen.get(n, 0) for r in rows.tolist()] for n in names]
    three, ends = st.three(rows), np.tile(end, len(SERVING))
    base = st.serving.update(three, ends, values, np.array(seen, dtype=np.int64).ravel())
    held = st.serving.held_s(three, ends)
    at, before = st.serving.relearned_at[three], st.serving.relearned_before[three]
    k = len(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = values / base
    for i, name in enumerate(SERVING):
        part = slice(i * k, (i + 1) * k)
        sig[f"{name}_held_s"], sig[f"{name}_relearned_at"] = held[part], at[part]
        sig[f"{name}_relearned_from"] = before[part]
        memory = HoldMemory.of(st.col, name)
        sig[f"{name}_recurring"] = recurring(memory, rows, end, held[part], ratio[part])
    sig["decode_relearned_from"] = _per_s(before[:k])  # in tokens/s, as its baseline
    return base, st.serving.log_var(three, ends)


def _recent_tokens(st: ServiceRows, rows: Rows, end: F64, sig: Signals) -> None:
    """The output tokens of the newest :data:`DECODE_REQUESTS` successful requests (or 2
    minutes'), against the tokens-per-request baseline: a truncation shows within minutes
    at any traffic, where the rate window of ~150 requests takes a quarter of an hour on a
    quiet instance. Two tests, the stronger (larger ``|z|``) gives ``tpr_recent_deviation``
    and ``tpr_recent_z``:

    - the mean: its sampling noise (the tokens' own spread over sqrt(n)) plus the
      baseline's uncertainty over the window; a cut of the long answers (max_tokens) moves
      the mean most;
    - the logs of the last :data:`LOG_REQUESTS` (their middle half's mean, :func:`_log_test`): on a
      heavy-tailed mix (real traffic's answer lengths: a coefficient of variation of 2, a
      log spread of 0.85) a mean of 60 moves by 28 % by chance, and answers 40 % shorter
      are a z of -1.4; their logs move by 0.51 against a standard error of 0.08 over 120,
      a z of -6 (less the baseline's own uncertainty)."""
    got = [_tokens(st.tails[r], t) for r, t in zip(rows.tolist(), end.tolist(), strict=True)]
    mean, var, n, logs, log_var, log_n = np.array(got, dtype=np.float64).reshape(-1, 6).T
    # the tokens-per-request baseline (row 2r + 1 of the traffic bank) a minute back: the
    # middle of a window of about 2 minutes, whose excess noise averages over 2 buckets
    tpr, back = 2 * rows + 1, end - 60.0
    f_mean, f_var, f_noise = st.traffic.forecast(tpr, back)
    forecast = np.exp(f_mean)
    rel = f_var + f_noise / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        se2 = var / n + forecast * forecast * rel
        z = np.where(se2 > 0, (mean - forecast) / np.sqrt(se2), NAN)
        d = mean / forecast - 1
    # the logs' own spread is in their sampling noise; of the baseline's, only its level's
    # uncertainty as it was before any hold (its excess noise per bucket is the means'
    # scatter, on a heavy-tailed mix most of it; a hold's growth is for the tests of the
    # level itself): what else moves the gap, the row's dispersion learns. Nothing is
    # learnt while the baseline holds a deviation.
    level_var = f_var - st.traffic.held_var(tpr, back)
    held = st.traffic.holding(tpr)
    log_d, log_z = _log_test(st, rows, logs - f_mean, log_var / log_n + level_var, held)
    stronger = np.abs(log_z) > np.abs(np.where(np.isnan(z), 0.0, z))
    sig["tpr_recent"] = mean
    sig["tpr_recent_deviation"] = np.where(stronger, log_d, d)
    sig["tpr_recent_z"] = np.where(stronger, log_z, z)


def _log_test(
    st: ServiceRows, rows: Rows, gap: F64, se2: F64, held: npt.NDArray[np.bool_]
) -> tuple[F64, F64]:
    """The newest answers' log tokens against the baseline: ``gap``, their mean log (of
    the middle half) less the baseline's log, is some usual offset apart (the baseline is
    the log of a mean of tokens, above a mean log by half the logs' variance and more: a
    shape, which the row learns) give or take ``se2`` (the logs' spread over n, and the baseline's
    uncertainty) times the row's usual dispersion. Both learnt as the tail tests' are:
    over the first :data:`LOG_LEARN` closes, then with that weight, from the closes
    with no evidence of a change (``|z|`` under :data:`LEARN_Z`, the baseline not
    ``held``); the test judges (z, and the deviation, ``exp(gap - offset) - 1``) from
    the :data:`LOG_TRUST` th.
    Unknown (NaN, nothing learnt) where the window or the baseline is.

    >>> from ragwatch.streams.pipelines.service_rows import ServiceRows
    >>> st = ServiceRows(bucket_s=60.0, rate_max_s=600.0, tail=(200, 120.0, 3600.0),
    ...                  min_baseline=3, hold_max_s=86400.0)
    >>> rows = np.array([st.add(("rag", "a"), at=0.0)])
    >>> for _ in range(LOG_TRUST):  # mean logs 0.4 under the baseline's, +-0.1
    ...     _ = _log_test(st, rows, np.array([-0.4]), np.array([0.01]), np.array([False]))
    >>> got = _log_test(st, rows, np.array([-0.9]), np.array([0.01]), np.array([False]))
    >>> [round(float(x[0]), 2) for x in got]
    [-0.39, -5.0]
    """
    col = st.col
    offset, disp = col["tpr_log_offset"][rows], col["tpr_log_disp"][rows]
    learnt = col["tpr_log_learnt"][rows]
    ok = np.isfinite(gap) & np.isfinite(se2) & (se2 > 0)
    first = ok & np.isnan(offset)
    with np.errstate(invalid="ignore"):
        z = (gap - offset) / np.sqrt(se2 * np.maximum(1.0, disp))
        judged = ok & (learnt >= LOG_TRUST)
        learn = ok & ~first & ~held & (~judged | (np.abs(z) < LEARN_Z))
    a = np.maximum(1.0 / LOG_LEARN, 1.0 / (learnt + 1))
    seen = (gap[learn], ((gap - offset) ** 2 / se2)[learn])
    r = rows[learn]
    col["tpr_log_offset"][r], col["tpr_log_disp"][r] = _learnt(
        (offset[learn], disp[learn]), seen, a[learn]
    )
    col["tpr_log_offset"][rows[first]] = gap[first]
    col["tpr_log_learnt"][rows[learn | first]] += 1
    return np.where(judged, np.expm1(gap - offset), NAN), np.where(judged, z, NAN)


def _tokens(tail: TailWindow, now: float) -> tuple[float, ...]:
    """The newest output tokens' mean, variance and count (the last
    :data:`DECODE_REQUESTS`), and of the last :data:`LOG_REQUESTS` the interquartile mean of
    their logs (each token count at least 0.5, as the baseline's), its squared standard
    error times n and n; NaN below MIN_DECODE. The middle half of the logs: a truncation
    moves all of them, a new kind of request among the usual ones (a client whose answers
    are a few tokens, a tenth of the traffic) moves a mean log by a tenth of its distance
    and the middle half hardly at all."""
    v = np.frombuffer(tail.recent("out", now, DECODE_REQUESTS), dtype=np.float64)
    got = (float(v.mean()), float(v.var())) if len(v) >= MIN_DECODE else (NAN, NAN)
    logs = np.sort(np.log(np.maximum(np.frombuffer(tail.recent("out", now, LOG_REQUESTS)), 0.5)))
    n = len(logs)
    if n < MIN_DECODE:
        return (*got, float(len(v)), NAN, NAN, float(n))
    lo, hi = n // 4, n - n // 4
    # a trimmed mean's variance: the winsorized variance over (1 - 2 * 0.25) ** 2 * n
    wins = np.clip(logs, logs[lo], logs[hi - 1])
    return (*got, float(len(v)), float(logs[lo:hi].mean()), float(wins.var()) * 4, float(n))


def _decode(tail: TailWindow, now: float) -> tuple[float, float, float]:
    """The window's median decode time per token (ms), its log's squared standard error
    and how many requests it is of (NaN, NaN, n below :data:`MIN_DECODE`)."""
    v = np.frombuffer(tail.recent("tpot", now, DECODE_REQUESTS), dtype=np.float64)
    v = v[v > 0]
    n = len(v)
    if n < MIN_DECODE:
        return NAN, NAN, float(n)
    logs = np.log(v)
    mid = float(np.median(logs))
    sd = MAD_SD * float(np.median(np.abs(logs - mid)))
    return math.exp(mid), (MEDIAN_SE * sd) ** 2 / n, float(n)


def _decode_signals(tpot: F64, se2: F64, n: F64, base: F64, var: F64, sig: Signals) -> None:
    """Speeds in output tokens per second from times per token, and the test of the
    window's (log) median against the baseline's."""
    sig["decode_tps"], sig["decode_baseline_tps"] = _per_s(tpot), _per_s(base)
    sig["decode_requests"] = n
    with np.errstate(divide="ignore", invalid="ignore"):
        sig["decode_deviation"] = base / tpot - 1
        total = se2 + np.where(np.isnan(var), 0.0, var)
        z = (np.log(base) - np.log(tpot)) / np.sqrt(total)
    sig["decode_z"] = np.where(total > 0, z, NAN)


def _tail(
    st: ServiceRows, rows: Rows, end: F64, sig: Signals, name: str, baseline: str, p: float,
    least: str, margin: float = 0.0, alt_share: float = 0.0,
) -> None:  # fmt: skip
    """``<name>_tail_ratio`` and ``_z``: the count of the window's ``name`` values above
    the baseline quantile (plus ``margin``) against the share of them usually above it
    (at least ``p``: the share the quantile leaves; the queue's :data:`QUEUED_SHARE`, its
    margin being far above its P95): a binomial z, its variance times the count's
    usual dispersion, with :data:`TAIL_SLACK` for the baseline's own error; then the
    usual share and dispersion learn the count, unless it is evidence of a change
    (:func:`_learnt`); and ``<name>_tail_recovered`` (:func:`tail_recovered`).
    ``<name>_tail_cusum`` (:func:`tail_cusum`) weighs the share ``alt_share`` against
    the usual one, or :data:`CUSUM_ALT` times it if more."""
    base = np.where(_trusted(st, rows, (name,)), sig[baseline], NAN)
    ratio, z = np.full(len(rows), NAN), np.full(len(rows), NAN)
    recovered, cusum = np.full(len(rows), NAN), np.full(len(rows), NAN)
    share, disp = st.col[f"{name}_tail_share"], st.col[f"{name}_tail_disp"]
    learnt, sums = st.col[f"{name}_tail_learnt"], st.col[f"{name}_tail_cusum"]
    counted = st.col[f"{name}_tail_seen"]  # values the window had taken at the last close
    for i, (r, t, b) in enumerate(zip(rows.tolist(), end.tolist(), base.tolist(), strict=True)):
        if b != b:
            continue
        v = np.frombuffer(st.tails[r].window(name, t), np.float64)
        if len(v) < MIN_VALUES[least]:
            continue
        over = v > b + margin
        above, n = int(np.count_nonzero(over)), len(v)
        # what the row has learnt, or the prior (``p``, dispersion 1)
        known = (p if share[r] != share[r] else share[r], 1.0 if disp[r] != disp[r] else disp[r])
        usual = max(p, known[0])
        ratio[i], z[i] = whole = _count_test(above, n, usual, known[1])
        recovered[i], newer = tail_recovered(over, usual, known[1])
        total = st.tails[r].seen.get(name, 0)
        fresh = over[max(0, n - (total - counted[r])) :] if counted[r] >= 0 else over[:0]
        counted[r] = total
        rise = CUSUM_RISE * st.bucket_s / 60.0  # a minute's requests: one event
        alt = max(CUSUM_ALT, alt_share / usual)
        sums[r] = (
            0.0
            if recovered[i] >= RECOVERED
            else tail_cusum(sums[r], fresh, usual, known[1], rise, alt)
        )
        cusum[i] = sums[r]
        if recovered[i] >= RECOVERED:  # the test is of the requests since it came back,
            since = over[-newer:]  # unknown while they are fewer than a quantile needs
            ratio[i], z[i] = (
                _count_test(int(np.count_nonzero(since)), newer, usual, known[1])
                if newer >= MIN_VALUES[least]
                else (NAN, NAN)
            )
        if whole[1] < LEARN_Z:  # no evidence of a change (whatever came back since)
            learnt[r] += 1
            a = max(1.0 / TAIL_LEARN, 1.0 / (TAIL_PRIOR + learnt[r]))
            seen = (above / n, (above - n * usual) ** 2 / (n * usual))
            share[r], disp[r] = _learnt(known, seen, a)
    sig[f"{name}_tail_ratio"], sig[f"{name}_tail_z"] = ratio, z
    sig[f"{name}_tail_recovered"], sig[f"{name}_tail_cusum"] = recovered, cusum


def tail_cusum(
    before: float, over: npt.NDArray[np.bool_], usual: float, disp: float = 1.0,
    rise: float = math.inf, alt: float = CUSUM_ALT,
) -> float:  # fmt: skip
    """A CUSUM, in nats, of the evidence that the share of requests above the baseline
    quantile rose from ``usual`` to ``alt`` times it (:data:`CUSUM_ALT`; the queue's
    :data:`QUEUED_ALT_SHARE`), taken on from ``before`` over the newest requests ``over``
    (oldest first): each request above adds ``log(alt)``, each other one
    ``log((1 - alt u) / (1 - u))`` (about ``-1.5 u`` at 2.5), never below 0, divided by
    the count's usual dispersion; held under :data:`CUSUM_CAP` after each step of
    requests, and at most ``rise`` above ``before`` (:data:`CUSUM_RISE`).

    A window tests what it holds; this is what the requests since the series began say
    together. A 3 % stall fault on a retriever whose usual share is 1.6 % is 2.5 times the
    usual count, 8 of a window of 200 where 3.2 are usual: odds of 1 in 60, which a
    healthy instance's windows reach every day. Here it adds 0.013 nats a request: 10
    nats in ~650 requests (at a usual 1 %: 0.022 a request, 10 nats in ~450), which an
    instance at its usual share reaches about once in 4 million requests (simulated: 34
    to 59 of 4,000 series in 40,000 requests each, shares of 1 and 1.6 %); the rule also
    asks a window's P99 2.5 times the baseline, which a healthy instance's rare stalls
    give a window now and then at night and hardly ever by day.

    >>> round(tail_cusum(0.0, np.array([True] * 3 + [False] * 10), 0.01), 2)
    2.6
    >>> tail_cusum(1.0, np.array([False] * 100), 0.01)
    0.0
    >>> round(tail_cusum(0.0, np.array([True, True, False]), 0.01, alt=20.0), 2)
    5.78
    """
    if not len(over):
        return before
    u = min(usual, 0.5 / alt)
    up, down = math.log(alt), math.log1p(-alt * u) - math.log1p(-u)
    # S_k = max(0, S_k-1 + x_k) is C_k less the lowest C_j under 0, C the running sum
    c = before + np.cumsum(np.where(over, up, down)) / max(1.0, disp)
    return float(min(c[-1] - min(0.0, float(c.min())), CUSUM_CAP, before + rise))


def _count_test(above: int, n: int, usual: float, disp: float) -> tuple[float, float]:
    """(ratio, z) of ``above`` of ``n`` requests above the baseline quantile against the
    ``usual`` share: the signed root of the binomial deviance (the likelihood-ratio z),
    divided by the count's usual dispersion and by :data:`TAIL_SLACK`'s share of the
    variance (the baseline's own error), as a normal z's variance would be.

    Not ``(above - expected) / sd``: a count of 2 expected is skewed, and the normal z
    calls 9 of 200 "4.7" where the binomial's tail is 1 in 4,700 (z 3.5): the deviance's
    root is within 0.06 of the exact (mid-p) tail's z at such counts (here 3.4 with the
    slack), and the normal z near the expected count at any size.

    >>> [round(z, 1) for _, z in (_count_test(x, 200, 0.01, 1.0) for x in (0, 2, 9, 30))]
    [-1.9, 0.0, 3.4, 9.9]
    """
    expected = n * usual
    binomial = expected * (1.0 - usual)
    var = binomial * max(1.0, disp) + (TAIL_SLACK * expected) ** 2
    x, rest = float(above), float(n - above)
    dev = 2.0 * (_xlog(x, expected) + _xlog(rest, n - expected))
    return above / expected, math.copysign(math.sqrt(max(dev, 0.0) * binomial / var), x - expected)


def _xlog(x: float, mean: float) -> float:
    """``x * log(x / mean)``, 0 at ``x`` = 0: a term of the binomial deviance."""
    return x * math.log(x / mean) if x > 0 else 0.0


def tail_recovered(
    over: npt.NDArray[np.bool_], usual: float, disp: float = 1.0
) -> tuple[float, int]:  # fmt: skip
    """The evidence, in nats, that a window's newest requests are back at the ``usual``
    share above the baseline quantile after an older stretch above it, taken at the
    window's best split into an older and a newer part: the lesser of the older part's
    evidence of a share above ``usual`` (its log-likelihood ratio at its own share) and
    the newer part's of being at ``usual`` rather than still at the older part's share;
    that share is shrunk toward ``usual`` by one request above in ``1 / usual``, so a
    short or mild stretch takes many clean requests to be over. Both divided by the
    count's usual dispersion (slow requests that come in runs are less evidence); 0
    where no older part was above ``usual``. :data:`RECOVERED` nats are odds of ~1000 to 1.
    Returns the evidence and how many of the newest requests are after the split.

    ``over``: whether each request of the window, oldest first, was above the baseline.
    A fault that made every request slow is over after a few clean ones; a retriever that
    still stalls 3 % of its calls never is (a clean request is evidence of 0.02 nats):

    >>> evidence, newer = tail_recovered(np.array([True] * 150 + [False] * 8), 0.01)
    >>> round(evidence, 1), newer
    (7.3, 8)
    >>> tail_recovered(np.array([True] * 150 + [False] * 7), 0.01)[0] < RECOVERED
    True
    >>> tail_recovered(np.array([False] * 200), 0.01)
    (0.0, 0)
    """
    u = min(usual, 0.5)
    n = len(over)
    newer = np.cumsum(over[::-1], dtype=np.float64)[:-1]  # above, in the newest k
    k = np.arange(1, n, dtype=np.float64)
    old, m = float(np.count_nonzero(over)) - newer, n - k  # above, of the m before them
    lu, l1u = math.log(u), math.log1p(-u)
    own = np.clip(old / m, 1e-12, 1.0 - 1e-12)
    e_old = old * (np.log(own) - lu) + (m - old) * (np.log1p(-own) - l1u)
    q = (old + 1.0) / (m + 1.0 / u)
    e_new = newer * (lu - np.log(q)) + (k - newer) * (l1u - np.log1p(-q))
    r = np.where(q > u, np.minimum(e_old, e_new), 0.0)
    best = int(np.argmax(r)) if len(r) else -1
    if best < 0 or r[best] <= 0.0:
        return 0.0, 0
    return float(r[best]) / max(1.0, disp), best + 1


def _learnt(known: tuple[L, L], seen: tuple[L, L], a: L) -> tuple[L, L]:
    """A usual level and dispersion moved by one window that was no evidence of a change,
    at rate ``a`` (:func:`_tail`'s; :func:`_log_test`'s, for rows at once).

    The tail tests': the usual share of a window above its baseline quantile, and the
    count's usual variance over its mean (1 for independent requests; more where slow
    requests come in runs: a burst of long answers, a retriever's stalls in a GC pause):
    a mean over the row's windows since the baseline judged, the last :data:`TAIL_LEARN`
    of them (a day of minutes), after a prior of :data:`TAIL_PRIOR` windows at the
    quantile's own share and 1. The prior keeps a fault of a series' first hour from
    teaching it its own share."""
    return known[0] + a * (seen[0] - known[0]), known[1] + a * (seen[1] - known[1])


def _p95(tail: TailWindow, name: str, now: float, newest: int | None = None) -> float:
    """The P95 of ``name`` over the tail window, or over its ``newest`` requests (or 2
    minutes'); NaN below the values a P95 is taken from."""
    got = tail.window(name, now) if newest is None else tail.recent(name, now, newest)
    v = np.frombuffer(got, dtype=np.float64)
    return float(np.quantile(v, 0.95)) if len(v) >= MIN_VALUES["p95"] else NAN


def _per_s(ms_per_token: F64) -> F64:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ms_per_token > 0, 1000.0 / ms_per_token, NAN)


def _ratio(value: F64, base: F64) -> F64:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(~np.isnan(base) & (base > 0), value / base, NAN)
