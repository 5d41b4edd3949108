"""Every signal scored (streams/pipelines/scoring.py): the score blocks, and the pipelines'
scores as rules, status, snapshots and hints read them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragwatch.catalog import DEMAND, SCORE_FIELDS, SCORED, SERIES_SIGNALS
from ragwatch.detectors.generic import GenericBank
from ragwatch.schema import GpuEnvelope, GpuSample
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.gpu import GpuPipeline
from ragwatch.streams.pipelines.scoring import HELD, SUSTAIN_S, ScoreBlock, score_names

T0 = 1_767_571_200.0  # a Monday, 00:00 UTC
GB = 1 << 30


def fed(block: ScoreBlock, rows: list[int], n: int, step_s: float = 60.0) -> None:
    rng = np.random.default_rng(1)
    for i in range(n):
        values = 50.0 + rng.normal(0, 2.0, size=(len(rows), block.k))
        block.update(np.array(rows), np.full(len(rows), T0 + step_s * i), values)


def test_slots_are_taken_when_first_scored_and_reused_afresh_after_release() -> None:
    block = ScoreBlock(("a", "b", "c"))
    block.grow(10)
    fed(block, [2, 7], 5)
    assert block.slots == 2 and block.slot[[2, 7]].tolist() == [0, 1]
    block.release(np.array([2]))
    assert block.slots == 1 and block.scored(2) == {}
    fed(block, [4], 1)  # takes slot 0 again, afresh: one observation only
    assert block.slot[4] == 0
    fresh = GenericBank(block.bank.params, capacity=3)
    first = 50.0 + np.random.default_rng(1).normal(0, 2.0, size=3)  # what fed() gave it
    fresh.update(np.arange(3), np.full(3, T0), first)
    assert block.bank.dump(np.arange(0, 3)) == fresh.dump(np.arange(3))


def test_the_matrix_has_each_score_then_their_highest_and_how_many_are_anomalous() -> None:
    block = ScoreBlock(("a", "b"))
    block.grow(4)
    fed(block, [1], 1)
    block.last[[0, 1], 0] = [0.95, 0.5]  # row 1's slot (0): signals a, b
    m = block.matrix(np.array([0, 1]))
    assert np.isnan(m[0]).all()  # never scored
    assert m[1].tolist() == [pytest.approx(0.95), 0.5, pytest.approx(0.95), 0.0]
    block.last[[0, 1], HELD] = [0.95, 0.0]  # a held out of its band 5 min already
    assert block.matrix(np.array([1]))[0, -1] == 1.0
    assert list(block.scores(np.array([1]))) == list(score_names(("a", "b")))


def test_status_fields_peaks_and_facts() -> None:
    block = ScoreBlock(("util",))
    block.grow(2)
    fed(block, [0], 3)
    (fields,) = block.scored(0).values()
    assert len(fields) == len(SCORE_FIELDS) and fields[-1] == T0 + 120.0
    block.last[0, SCORE_FIELDS.index("peak")] = 0.97
    (fact,) = block.anomalous([0], ["GPU 0"])
    assert (fact.where, fact.signal, fact.score) == ("GPU 0", "util", pytest.approx(0.97))
    assert block.anomalous([1], ["GPU 1"]) == []


def test_a_dump_restores_the_same_scores_and_a_foreign_one_is_refused() -> None:
    a, b = ScoreBlock(("x", "y")), ScoreBlock(("x", "y"))
    for block in (a, b):
        block.grow(3)
    fed(a, [1], 300)
    b.adopt(2, b.check(a.dump(1)))
    x = np.array([[50.0, 90.0]])
    got_a = a.update(np.array([1]), np.array([T0 + 60 * 300]), x)
    got_b = b.update(np.array([2]), np.array([T0 + 60 * 300]), x)
    assert np.allclose(got_a, got_b, equal_nan=True)
    assert a.scored(1) == b.scored(2)
    # another build's scores (other signals, another version of the detector's state)
    # start afresh, counted; the rest of a snapshot (a leak's evidence) is kept
    other = ScoreBlock(("x",))
    assert other.check(a.dump(1)) is None and other.afresh == 1
    old = a.dump(1) or {}
    assert b.check({**old, "bank": {**old["bank"], "version": 1}}) is None and b.afresh == 1
    broken = {**(a.dump(1) or {}), "last": [[1.0]]}
    with pytest.raises(ValueError):
        b.check(broken)
    assert b.check(None) is None


def test_a_series_is_scored_once_a_minute_on_its_first_sample_of_the_minute() -> None:
    """Samples every 10 s: the detector learns one value a minute, the first sample of
    each new minute (as a 1-minute scrape would see it); the others are not looked at;
    a clock jump back scores at once (a new span)."""
    block, bank = ScoreBlock(("x",)), GenericBank(ScoreBlock(("x",)).bank.params, capacity=1)
    block.grow(1)
    rng = np.random.default_rng(3)
    x = 50 + rng.normal(0, 2, 6 * 300)
    row = np.array([0])
    for i, v in enumerate(x):
        t = T0 + 10.0 * i
        assert bool(block.due(row, np.array([t]))[0]) == (i % 6 == 0)
        block.update(row, np.array([t]), np.array([[v]]))
        if i % 6 == 0:  # T0 is a whole minute: this sample opens a new one
            got = bank.update(np.array([0]), np.array([t]), np.array([v]))
    assert block.learnt(0) == 300 == int(bank.n[0])
    assert math.isclose(block.matrix(row)[0, 0], float(got.score[0]), abs_tol=1e-6)
    assert math.isclose(block.scored(0)["x"][1] or 0.0, float(got.yhat[0]), rel_tol=1e-6)
    other = ScoreBlock(("x",))
    other.grow(1)
    other.adopt(0, other.check(block.dump(0)))
    assert other.dump(0) == block.dump(0)
    block.update(row, np.array([T0 + 10.0 * len(x) - 5]), np.array([[50.0]]))  # same minute
    assert block.learnt(0) == 300 and block.bank.late == 0
    block.update(row, np.array([T0]), np.array([[50.0]]))  # the clock jumped back: a new
    assert block.learnt(0) == 300 and block.bank.late == 1  # span, late for the detector


def test_a_signal_without_values_does_not_make_its_series_due_at_every_sample() -> None:
    """A GPU without copy utilisation (NaN at every sample): the series is still scored
    once a minute, not at each of its 10 s samples (the bank is called 6x less)."""
    block = ScoreBlock(("x", "never"))
    block.grow(1)
    calls = []
    update = block.bank.update
    block.bank.update = lambda *a: calls.append(1) or update(*a)  # type: ignore[method-assign]
    for i in range(600):
        block.update(np.array([0]), np.array([T0 + 10.0 * i]), np.array([[50.0, np.nan]]))
    assert len(calls) == 100 and block.learnt(0) == 100


def test_a_signal_counts_as_anomalous_once_held_out_of_its_band_for_a_while() -> None:
    block = ScoreBlock(("a", "b"))
    block.grow(1)
    fed(block, [0], 400)  # noise around 50
    row = np.array([0])
    counts = []
    for i in range(12):  # both jump far out of their band, and stay
        t = T0 + 60.0 * (400 + i)
        counts.append(block.update(row, np.array([t]), np.array([[500.0, 500.0]]))[0, -1])
    sustained = int(SUSTAIN_S // 60)
    assert counts[:sustained] == [0.0] * sustained and counts[-1] == 2.0, counts
    back = block.update(row, np.array([T0 + 60.0 * 412]), np.array([[50.0, 50.0]]))
    assert back[0, -1] == 0.0


def test_memory_per_scored_signal_is_within_a_kibibyte() -> None:
    block = ScoreBlock(SCORED["service"])
    block.grow(1000)
    fed(block, list(range(1000)), 2)
    # a scored signal's row: of the bank, and of what the block keeps beside it (the
    # arrays' spare capacity, up to half of them after a doubling, is not a signal's)
    beside = (block.last, block.peak_ts, block.held_since)
    per_signal = block.bank.nbytes() / block.bank.capacity + sum(a[0].nbytes for a in beside)
    assert per_signal <= 1024, per_signal
    assert block.nbytes() - block.slot.nbytes >= per_signal * block.slots * block.k


def gpu_env(ts: float, util: float, power: float) -> GpuEnvelope:
    return GpuEnvelope("h1", ts, (GpuSample(
        0, "GPU-0", "H100", 40 * GB, 80 * GB, gpu_util=util, mem_copy_util=util / 3,
        temp_c=40 + util / 3, power_w=power),))  # fmt: skip


def test_a_gpu_hang_scores_its_signals_and_rules_and_facts_read_them() -> None:
    pipe = GpuPipeline(load_rules())
    rng = np.random.default_rng(3)
    ts = T0
    for _ in range(3 * 1440):  # three days a minute, a daily rhythm
        util = 50 + 30 * math.sin(2 * math.pi * (ts % 86400) / 86400) + rng.normal(0, 3)
        pipe.process(gpu_env(ts, util, 80 + 5 * util + rng.normal(0, 8)))
        ts += 60.0
    healthy = pipe.signal_dicts(np.array([0]))[0]
    assert healthy["gpu_util_score"] is not None and healthy["gpu_util_score"] < 0.9
    for _ in range(40):  # hung: no work, idle power
        pipe.process(gpu_env(ts, 0.0, 72.0 + rng.normal(0, 1)))
        ts += 60.0
    sig = pipe.signal_dicts(np.array([0]))[0]
    assert set(score_names(SCORED["gpu"])) <= set(sig) <= set(SERIES_SIGNALS["gpu"])
    assert sig["gpu_util_score"] >= 0.9 and sig["power_w_score"] >= 0.9
    assert sig["anomalous_signals"] >= 2
    (gpu,) = pipe.status(["h1"])["h1"]["gpus"]
    score, yhat, lower, upper, value = gpu["scores"]["power_w"][:5]
    assert value < lower <= yhat <= upper and score >= 0.9
    said = {(f.where, f.signal) for f in pipe.facts("h1").anomalous}
    assert {("GPU 0", "gpu_util"), ("GPU 0", "power_w")} <= said


def _service_held_none() -> tuple[ScoreBlock, dict[str, int]]:
    """An instance's scores, one row, fed once, no signal held: the block and where each
    signal is."""
    block = ScoreBlock(SCORED["service"])
    block.grow(1)
    fed(block, [0], 1)
    block.last[:, HELD] = 0.0
    return block, dict(block.index)


def test_one_quantity_seen_several_ways_counts_once() -> None:
    """One long answer moves the end-to-end and the LLM P99 together: one group."""
    block, at = _service_held_none()
    block.last[[at["e2e_p99_ms"], at["llm_p99_ms"], at["llm_p95_ms"]], HELD] = 1.0
    assert block.matrix(np.array([0]))[0, -1] == 1.0
    block.last[at["reranker_p95_ms"], HELD] = 1.0  # the reranker too: two groups
    assert block.matrix(np.array([0]))[0, -1] == 2.0
    block.last[at["reranker_p99_ms"], HELD] = 1.0  # its tail, seen twice: still two
    assert block.matrix(np.array([0]))[0, -1] == 2.0
    block.last[at["reranker_p50_ms"], HELD] = 1.0  # its median as well: slower as a whole
    assert block.matrix(np.array([0]))[0, -1] == 3.0
    # a queue that builds at a busy hour: its wait is part of the time to first token
    block.last[[at["queue_p95_ms"], at["ttft_p95_ms"]], HELD] = 1.0
    assert block.matrix(np.array([0]))[0, -1] == 4.0


def test_a_few_failed_requests_are_no_evidence_however_far_out_of_the_band() -> None:
    """An error ratio learnt on hours of 0 %: a quiet hour's one failed request in twenty
    (5 %, for the minutes the window holds it) is far out of its band, scored, but counts
    only with its test's evidence: 5 failed requests at least, a binomial z of 3."""

    def count(window_errors: float, errors_z: float) -> tuple[float, float]:
        block = ScoreBlock(("errors_ratio", "e2e_p95_ms"))
        block.grow(1)
        row = np.array([0])
        for i in range(400):
            block.update(row, np.array([T0 + 60.0 * i]), np.array([[0.0, 800.0 + (i % 7)]]))
        test = {"window_errors": np.array([window_errors]), "errors_z": np.array([errors_z])}
        evidence = block.evidence(test, 1)
        assert evidence is not None and evidence[0, 1]  # no test of its own: may count
        for i in range(400, 412):
            got = block.update(row, np.array([T0 + 60.0 * i]), np.array([[0.05, 800.0]]), evidence)
        return float(got[0, 0]), float(got[0, -1])

    assert count(1.0, 40.0) == (1.0, 0.0)  # one unlucky request: scored, not counted
    assert count(8.0, 1.5) == (1.0, 0.0)  # eight, but usual for its share: the same
    assert count(math.nan, math.nan) == (1.0, 0.0)  # too few requests for a test
    assert count(8.0, 6.0) == (1.0, 1.0)  # eight, far above its share: it counts


def test_a_queue_under_more_requests_than_expected_is_load_not_evidence() -> None:
    """A queue wait (and the time to first token with it) learnt at a quiet Sunday's load
    grows several times on the first busy weekday: out of its band, scored, but it counts
    only while the instance's requests are less than 50 % above their expectation."""

    def count(rps_deviation: float) -> tuple[float, float, float]:
        block = ScoreBlock(("queue_p95_ms", "ttft_p95_ms", "reranker_p99_ms"))
        block.grow(1)
        row = np.array([0])
        for i in range(400):
            block.update(row, np.array([T0 + 60.0 * i]), np.array([[20.0, 300.0, 30.0 + i % 3]]))
        evidence = block.evidence({"rps_deviation": np.array([rps_deviation])}, 1)
        assert evidence is not None and evidence[0, 2]  # a stage's tail: nothing explains it
        for i in range(400, 412):
            x = np.array([[100.0, 500.0, 60.0]])
            got = block.update(row, np.array([T0 + 60.0 * i]), x, evidence)
        return float(got[0, 0]), float(got[0, 1]), float(got[0, -1])

    assert count(0.8) == (1.0, 1.0, 1.0)  # busier than expected: only the reranker counts
    assert count(0.1) == (1.0, 1.0, 2.0)  # the usual load: the queue counts (with TTFT, once)
    assert count(math.nan) == (1.0, 1.0, 2.0)  # no expectation to explain it: it counts


def test_a_gpu_busier_hotter_and_drawing_more_power_together_is_load_not_a_fault() -> None:
    """A flash crowd makes a GPU busier than its profile, copying more, drawing more power,
    hotter: all out of their bands, scored, none counted. A power cap (busier, less power)
    and a hang (idle: moves down) decouple them, and count."""

    def count(values: list[float]) -> float:
        block = ScoreBlock(("gpu_util", "mem_copy_util", "temp_c", "power_w"))
        block.grow(1)
        row, rng = np.array([0]), np.random.default_rng(5)
        for i in range(400):
            x = np.array([[36.0, 12.0, 47.0, 264.0]]) * (1 + rng.normal(0, 0.02, size=(1, 4)))
            block.update(row, np.array([T0 + 60.0 * i]), x)
        for i in range(400, 412):
            got = block.update(row, np.array([T0 + 60.0 * i]), np.array([values]))
        assert got[0, 0] == 1.0  # the utilisation far out of its band each time
        return float(got[0, -1])

    assert count([72.0, 25.0, 62.0, 459.0]) == 0.0  # twice the load: one load, no fault
    assert count([72.0, 25.0, 47.0, 120.0]) == 2.0  # power-capped: busier on less power
    assert count([0.0, 0.0, 35.0, 72.0]) == 3.0  # hung: idle, cooler (moves down count)


def test_a_gpu_cooler_than_usual_scores_nothing_but_its_move_still_counts() -> None:
    """A GPU's temperature scores above its expected value only: cooler than usual (a
    quiet holiday) it is no candidate for running hot; with its load and power collapsed
    (a hang) its move down still counts beside theirs."""

    def scored(values: list[float]) -> list[float]:
        block = ScoreBlock(("gpu_util", "temp_c", "power_w"))
        block.grow(1)
        row, rng = np.array([0]), np.random.default_rng(6)
        for i in range(400):
            x = np.array([[50.0, 55.0, 340.0]]) * (1 + rng.normal(0, 0.01, size=(1, 3)))
            block.update(row, np.array([T0 + 60.0 * i]), x)
        for i in range(400, 412):
            got = block.update(row, np.array([T0 + 60.0 * i]), np.array([values]))
        return [*got[0, :3].tolist(), float(got[0, -1])]

    # hung: utilisation and power score, the cooler GPU not; all three moves count
    assert scored([0.0, 38.0, 72.0]) == [1.0, 0.0, 1.0, 3.0]
    assert scored([50.0, 75.0, 340.0]) == [0.0, 1.0, 0.0, 1.0]  # hotter than usual: scored


def test_a_move_of_a_few_percent_is_no_anomaly_however_narrow_the_band() -> None:
    """A very steady signal's band is narrow: 8 % up is far out of it, held, scored 1,
    but not counted; 40 % up is."""
    block = ScoreBlock(("a", "b"))
    block.grow(1)
    rng = np.random.default_rng(2)
    row = np.array([0])
    for i in range(400):  # 100 +- 0.2
        block.update(row, np.array([T0 + 60.0 * i]), 100.0 + rng.normal(0, 0.2, size=(1, 2)))
    for i in range(12):
        got = block.update(row, np.array([T0 + 60.0 * (400 + i)]), np.array([[108.0, 140.0]]))
    assert got[0, 0] == 1.0 and got[0, 1] == 1.0  # both far out of their bands
    assert got[0, -1] == 1.0  # only b's move counts


def test_only_a_move_in_the_direction_of_a_fault_counts() -> None:
    """A quiet weekend on a new install: fewer requests and fewer output tokens/s (demand:
    scored, never counted), a shorter queue (not counted: a queue shorter than usual is no
    fault). A longer queue counts; a decode speed counts only when slower."""
    names = ("rps", "queue_p95_ms", "output_tokens_per_s", "decode_tps")
    block = ScoreBlock(names)
    block.grow(1)
    rng = np.random.default_rng(4)
    row = np.array([0])
    for i in range(1500):  # a day of history: every slot of the daily profile seen
        noise = rng.normal(0, 0.01, size=(1, 4))
        block.update(
            row, np.array([T0 + 60.0 * i]), np.array([[10.0, 100.0, 1500.0, 40.0]]) + noise
        )

    def count(values: list[float], start: int) -> float:
        for i in range(12):
            got = block.update(row, np.array([T0 + 60.0 * (start + i)]), np.array([values]))
        return float(got[0, -1])

    assert count([2.5, 20.0, 375.0, 80.0], 1500) == 0.0  # all out of their bands, none counted
    assert block.matrix(row)[0, 0] == 1.0  # the requests' move is scored all the same
    assert count([10.0, 400.0, 1500.0, 10.0], 1600) == 2.0  # a long queue, a slow decode


def test_demand_is_scored_but_never_corroborates() -> None:
    """What clients send (requests/s, tokens per request, token rates) moves with them: a
    weekend, a new client, the day after an incident a young profile half-learnt. Each is
    scored and shown; together they count as nothing, beside a health signal as one."""
    block, at = _service_held_none()
    block.last[[at["rps"], at["tokens_per_request"], at["output_tokens_per_s"]], HELD] = 1.0
    assert block.matrix(np.array([0]))[0, -1] == 0.0
    block.last[at["errors_ratio"], HELD] = 1.0
    assert block.matrix(np.array([0]))[0, -1] == 1.0
    engine = ScoreBlock(SCORED["engine"])
    assert not engine.groups[[engine.names.index(n) for n in DEMAND if n in engine.names]].any()


def test_a_specific_alert_on_the_series_mutes_the_generic_one() -> None:
    from ragwatch.streams.notifier.inhibition import DEFAULT_INHIBIT_RULES

    generic = {"alertname": "ServiceAnomaly", "anomaly": "generic", "service": "s",
               "instance": "i0"}  # fmt: skip
    specific = {"alertname": "QueueWaitHigh", "service": "s", "instance": "i0"}
    other = {**specific, "instance": "i1"}
    gpu = {"alertname": "GpuAnomaly", "anomaly": "generic", "host": "h", "gpu": "0"}

    def muted(source: dict[str, str], target: dict[str, str]) -> bool:
        return any(r.inhibits(source, target) for r in DEFAULT_INHIBIT_RULES)

    assert muted(specific, generic) and not muted(other, generic)
    assert muted({"alertname": "GpuMemoryLeak", "host": "h", "gpu": "0", "pid": "1"}, gpu)
    assert not muted({"alertname": "ReplicaLatencyOutlier", "host": "h"}, gpu)  # no gpu label
    assert not muted(generic, gpu) and not muted(gpu, generic)
