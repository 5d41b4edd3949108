"""A service's long memory of request shapes, and new-cluster news judged against it.

The memory against its brute-force specification (tests/reference/request_shapes.py), its
lag, decay, bounds and snapshots; then a day and more of real traffic through a service's
clusters: the Azure LLM inference trace 2023, code service (one hour, 8,818 requests;
Azure/AzurePublicDataset, CC-BY 4.0, Patel et al., "Splitwise", ISCA 2024), in
``../shared/traces``. A burst or a mix shift of shapes the service served before is not
news after its first day; a new kind of request still is, within minutes.

How the hour becomes days: a block bootstrap. Every 5 minutes of event time replays one
5-minute block of the hour drawn at random (its arrivals at their offsets, so its bursts
stay whole), each token count times a lognormal factor (sigma 0.1: the same kinds of
request, never the same requests). To ask more than "has it seen these requests before",
day 1 draws from the hour's first half and the day after from its second half.
"""

from __future__ import annotations

import csv
import gzip
import math
import random
from datetime import datetime
from functools import cache
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import pytest

from ragwatch.detectors.request_outliers import RequestOutliers
from ragwatch.detectors.request_shapes import (
    HALF_LIFE_S,
    LAG_S,
    MIN_MASS,
    SLOT_S,
    ShapeMemory,
)
from ragwatch.detectors.service_clusters import ScoredRun, ServiceClusters
from ragwatch.schema import RequestRecord, RequestsEnvelope
from ragwatch.streams.pipelines.requests import RequestPipeline
from tests.reference.request_shapes import BruteShapeMemory, cell

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure-llm-code-2023.csv.gz"
DAY, HOUR, BLOCK_S, BUCKET_S = 86400.0, 3600.0, 300.0, 60.0
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
F64 = npt.NDArray[np.float64]


# ---------------------------------------------------------------------- the memory


def _stream(rng: random.Random, n: int) -> list[tuple[float, list[tuple[float, float]]]]:
    """Minutes of long-tailed requests from a few kinds, with a stray one now and then."""
    kinds = [(1500.0, 14.0), (6000.0, 40.0), (300.0, 200.0)]
    out = []
    for k in range(n):
        pts = []
        for _ in range(rng.randrange(0, 40)):
            c, o = rng.choice(kinds)
            pts.append((c * rng.lognormvariate(0, 0.4), o * rng.lognormvariate(0, 0.4)))
        if rng.random() < 0.05:
            pts.append((rng.uniform(0, 1e6), rng.uniform(0, 1e4)))
        out.append((k * BUCKET_S, pts))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_memory_says_what_its_specification_says(seed: int) -> None:
    rng = random.Random(seed)
    mem, ref = ShapeMemory(half_life_s=6 * HOUR), BruteShapeMemory(half_life_s=6 * HOUR)
    for t, pts in _stream(rng, 600):
        mem.add(pts, t)
        ref.add(pts, t)
    mem.age(600 * BUCKET_S)
    ref.age(600 * BUCKET_S)
    assert mem.mass == pytest.approx(ref.mass, rel=1e-6)
    queries = [(rng.uniform(0, 2e4), rng.uniform(0, 600)) for _ in range(400)]
    queries += [p for _, pts in _stream(rng, 5) for p in pts]
    got, want = mem.familiar(queries).tolist(), ref.familiar(queries)
    weights, edge = ref.weights(), ref.edge()
    for q, g, w in zip(queries, got, want, strict=True):
        near_edge = math.isclose(ref.smoothed(cell(q[0]), cell(q[1]), weights), edge, rel_tol=1e-6)
        assert g == w or near_edge, q
    assert any(want) and not all(want)


def test_requests_settle_after_the_lag_and_weigh_half_a_half_life_later() -> None:
    mem = ShapeMemory()
    pts = [(1000.0 + i, 10.0 + i % 7) for i in range(int(MIN_MASS))]
    mem.add(pts, 0.0)
    mem.age(SLOT_S + LAG_S - 1.0)
    assert mem.mass == 0.0 and not mem.trusted and not mem.familiar(pts[:1]).any()
    mem.age(SLOT_S + LAG_S)
    assert mem.mass == len(pts) and mem.trusted and mem.familiar(pts[:1]).all()
    mem.age(SLOT_S + LAG_S + HALF_LIFE_S)
    assert mem.mass == pytest.approx(len(pts) / 2)
    mem.age(0.0)  # the clock never goes back
    assert mem.mass == pytest.approx(len(pts) / 2)


def test_a_shape_far_from_what_was_served_is_not_familiar_and_the_rare_tail_neither() -> None:
    mem = ShapeMemory()
    rng = np.random.default_rng(0)
    usual = np.column_stack(
        [1500 * rng.lognormal(0, 0.5, 20000), 14 * rng.lognormal(0, 0.4, 20000)]
    )
    mem.add(usual, 0.0)
    mem.age(SLOT_S + LAG_S)
    assert mem.familiar(np.array([[1500.0, 14.0], [1800.0, 20.0]])).all()
    assert not mem.familiar(np.array([[30000.0, 10.0], [1500.0, 2000.0]])).any()
    assert mem.familiar(usual).mean() > 0.99  # the region holds 99.9 % of the mass


def test_memory_is_bounded_whatever_the_stream() -> None:
    mem, rng = ShapeMemory(), np.random.default_rng(1)
    for k in range(2000):
        mem.add(rng.uniform(0, 1e9, size=(50, 2)), k * BUCKET_S)
    assert mem.counts.shape == (96, 96)
    assert len(mem.waiting) <= LAG_S / SLOT_S + 2
    assert all(len(c) <= 96 * 96 for c, _ in mem.waiting.values())


def test_a_dumped_memory_loads_the_same_and_bad_data_raises() -> None:
    mem = ShapeMemory()
    for t, pts in _stream(random.Random(3), 200):
        mem.add(pts, t)
    mem.age(200 * BUCKET_S)
    back = ShapeMemory.load(mem.dump())
    probe = [p for _, pts in _stream(random.Random(4), 20) for p in pts]
    assert back.mass == mem.mass and back.waiting.keys() == mem.waiting.keys()
    assert back.familiar(probe).tolist() == mem.familiar(probe).tolist()
    later = 300 * BUCKET_S
    mem.age(later)
    back.age(later)
    assert back.mass == pytest.approx(mem.mass)
    assert ShapeMemory.load(None).mass == 0.0
    dumped = mem.dump()
    for bad in (
        {"format": "x"},
        {**dumped, "cells": b"\xff\xff\xff\x7f"},  # a cell beyond the grid
        {**dumped, "counts": dumped["counts"][:-8]},  # a count short
        {k: v for k, v in dumped.items() if k != "waiting"},
        {**dumped, "t": float("nan")},
        {**dumped, "half_life_s": None},
    ):
        with pytest.raises(ValueError):
            ShapeMemory.load(bad)


# ---------------------------------------------------------------------- the service


@cache
def trace() -> tuple[F64, F64, F64]:
    """The trace's arrival offsets (s), context and output tokens."""
    with gzip.open(TRACE, "rt") as f:
        rows = list(csv.DictReader(f))
    t = np.array([datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows])
    c = np.array([float(r["ContextTokens"]) for r in rows])
    o = np.array([float(r["GeneratedTokens"]) for r in rows])
    return t - t[0], c, o


def bootstrap(hours: float, blocks: range, seed: int, t0: float = 0.0) -> list[F64]:
    """``hours`` of the trace's ``blocks`` drawn at random, as (t, context, output) rows."""
    t, c, o = trace()
    rng = np.random.default_rng(seed)
    out = []
    for k in range(int(hours * HOUR / BLOCK_S)):
        j = blocks[rng.integers(len(blocks))]
        m = (t >= j * BLOCK_S) & (t < (j + 1) * BLOCK_S)
        jitter = np.exp(0.1 * rng.standard_normal((2, int(m.sum()))))
        rows = np.column_stack(
            [t[m] - j * BLOCK_S + t0 + k * BLOCK_S, np.round(c[m] * jitter[0]),
             np.maximum(1.0, np.round(o[m] * jitter[1]))]
        )  # fmt: skip
        out.append(rows)
    return out


def replay(rows: F64, svc: ServiceClusters | None = None) -> list[tuple[float, float]]:
    """Requests (t, context, output, sorted by t) through a service's clusters, a bucket at a
    time, as the request pipeline feeds them: when news of a new cluster came, and its size."""
    svc = svc or ServiceClusters(RequestOutliers(), "code", {"code-0"})
    b = np.floor(rows[:, 0] / BUCKET_S).astype(np.int64)
    edges = np.searchsorted(b, np.arange(b[0], b[-1] + 2))
    news = []
    for i, k in enumerate(range(b[0], b[-1] + 1)):
        part = rows[edges[i] : edges[i + 1], 1:]
        if len(part):
            svc.score([(float(x), float(y)) for x, y in part], ScoredRun())
        if svc.new_cluster(int(k), 10, lambda _: 1.0, at=(k + 1) * BUCKET_S):
            news.append(((k + 1) * BUCKET_S, svc.size))
    return news


def new_kind(start: float, minutes: float, per_min: float, seed: int) -> F64:
    """A kind of request the service never served: contexts 20x the trace's median (one
    client sending whole repositories), short outputs."""
    rng = np.random.default_rng(seed)
    n = int(minutes * per_min)
    t = np.sort(start + rng.uniform(0, minutes * 60, n))
    return np.column_stack([t, np.round(rng.normal(29400, 40, n)), rng.integers(4, 16, n)])


def merged(*parts: F64) -> F64:
    rows = np.concatenate(parts)
    return rows[np.argsort(rows[:, 0], kind="stable")]


@pytest.fixture(scope="module")
def two_days() -> tuple[list[tuple[float, float]], float]:
    """A day of the hour's first half, then two hours of its second half with a new kind of
    request from 25 h: what news came, and when the new kind started."""
    start = 25 * HOUR
    rows = merged(
        *bootstrap(24, range(0, 6), seed=1),
        *bootstrap(2, range(6, 12), seed=2, t0=DAY),
        new_kind(start, 30, 6.0, seed=3),
    )
    return replay(rows), start


def test_real_traffic_brings_no_news_after_its_first_day(
    two_days: tuple[list[tuple[float, float]], float],
) -> None:
    news, start = two_days
    assert [at for at, _ in news if DAY <= at < start] == []


def test_a_new_kind_of_request_on_day_two_is_news_within_minutes(
    two_days: tuple[list[tuple[float, float]], float],
) -> None:
    news, start = two_days
    after = [at for at, _ in news if at >= start]
    assert after and after[0] - start <= 10 * 60
    assert len(after) == 1  # one piece of news for it, however long it lasts


def test_without_the_memory_the_same_traffic_brings_news(
    two_days: tuple[list[tuple[float, float]], float],
) -> None:
    """The control: day 2's traffic on a service whose memory forgets at once (a one-second
    half-life: it never holds enough to judge) brings the news the memory keeps away."""
    rows = merged(*bootstrap(2, range(6, 12), seed=2, t0=DAY))
    amnesic = ServiceClusters(RequestOutliers(), "code", {"code-0"}, memory=ShapeMemory(1.0))
    assert [at for at, _ in replay(rows, amnesic) if at >= DAY + HOUR / 2]


def daily_batch(days: int, seed: int) -> F64:
    """A RAG service's interactive traffic (one request every 2 s, long-tailed lengths) and
    a nightly batch over long documents (10 requests a minute for 30 minutes at 02:00):
    the batch's requests are unlike the interactive ones, and alike each night."""
    rng = np.random.default_rng(seed)
    n = int(days * DAY / 2)
    chat = np.column_stack([np.sort(rng.uniform(0, days * DAY, n)),
                            np.round(3000 * rng.lognormal(0, 0.3, n)),
                            np.round(250 * rng.lognormal(0, 0.4, n))])  # fmt: skip
    nights = [np.column_stack([d * DAY + 2 * HOUR + np.sort(rng.uniform(0, 1800, 300)),
                               np.round(rng.normal(20000, 40, 300)),
                               np.round(rng.normal(500, 10, 300))])
              for d in range(days)]  # fmt: skip
    return merged(chat, *nights)


def test_a_nightly_batch_is_news_the_first_night_only_and_a_new_kind_still_is() -> None:
    start = DAY + 10 * HOUR
    rows = merged(daily_batch(2, seed=8), new_kind(start, 30, 6.0, seed=9))
    news = [at for at, _ in replay(rows)]
    first, second = 2 * HOUR, DAY + 2 * HOUR
    assert [at for at in news if first <= at <= first + HOUR]  # never served before
    assert [at for at in news if second <= at <= second + HOUR] == []
    late = [at - start for at in news if at >= start]
    assert late and late[0] <= 10 * 60  # within minutes


def test_the_memory_goes_through_its_plain_state() -> None:
    svc = ServiceClusters(RequestOutliers(), "code", {"code-0"})
    replay(merged(*bootstrap(2, range(12), seed=7)), svc)
    back = ServiceClusters(RequestOutliers(), "code")
    back.restore_memory(svc.memory_state())
    assert back.memory.mass == svc.memory.mass and back.fresh == svc.fresh
    probe = trace()[1][:500], trace()[2][:500]
    pts = np.column_stack(probe)
    assert back.memory.familiar(pts).tolist() == svc.memory.familiar(pts).tolist()
    with pytest.raises(ValueError):
        back.restore_memory({**svc.memory_state(), "fresh": b"\x00" * 8})
    back.restore_memory(None)
    assert back.memory.mass == 0.0


def test_a_service_snapshot_keeps_the_memory_and_an_older_one_starts_it_afresh() -> None:
    """Through the request pipeline's snapshot (plain data, as the worker writes it): a
    restarted worker still knows the service's shapes; a snapshot written before the
    memory existed (no "memory" key) gives a fresh one."""
    rows = merged(*bootstrap(2, range(12), seed=10, t0=T0))
    pipe = RequestPipeline([])
    for k in range(int(2 * HOUR / BUCKET_S)):
        part = rows[(rows[:, 0] >= T0 + k * BUCKET_S) & (rows[:, 0] < T0 + (k + 1) * BUCKET_S)]
        records = tuple(
            RequestRecord(float(t), "ok", 500.0, int(c), int(o)) for t, c, o in part.tolist()
        )
        pipe.process(RequestsEnvelope("code", "code-0", T0 + (k + 1) * BUCKET_S, records))
    _, svc = pipe.service_state("code")
    assert svc.memory.trusted
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(pipe.dump("code")))
    back = RequestPipeline([])
    assert back.adopt("code", state) == 1
    _, restored = back.service_state("code")
    assert restored.memory.mass == pytest.approx(svc.memory.mass)
    older = {**state, "shared": {k: v for k, v in state["shared"].items() if k != "memory"}}
    again = RequestPipeline([])
    assert again.adopt("code", older) == 1
    assert again.service_state("code")[1].memory.mass == 0.0
