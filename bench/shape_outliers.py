"""A new kind of request on real traffic: the real-trace world (``shape_traffic``: the Azure
LLM inference trace 2023, code service, block-bootstrapped to 30 h on two instances, a chat
service beside them) with, on its second day, one client sending whole repositories to
``code-assist-1``: 6 requests a minute for 30 minutes with contexts ~20x the trace's median
(29,400 +- 40 tokens: one repository, a few files changed between calls) and 4-16 output
tokens. A burst of known shapes is not news (``real-trace``); this is, within minutes,
once, on the instance it came to.

Its requests' latency: the instance's own model, scaled (prefill ~0.05 ms a context token
on top of a typical request's stages, decode ~25 ms a token), so only their shape is odd.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
from shape_kit import HOUR, MINUTE, Expect, Shape
from shape_traffic import TRACE_HOURS, TRACE_T0, _healthy_days, _target, _trace_world, _world

from ragwatch.schema import Envelope, RequestRecord, RequestsEnvelope

START = TRACE_T0 + 26 * HOUR  # the second day at 02:00 UTC, after a full day of history
MINUTES, PER_MIN = 30, 6.0
CONTEXT, CONTEXT_SD, OUTPUT = 29400.0, 40.0, (4, 16)


def _odd(rng: np.random.Generator, t0: float, t1: float) -> list[RequestRecord]:
    """The new kind's requests arriving in ``[t0, t1)`` (a Poisson process)."""
    n = int(rng.poisson(PER_MIN * (t1 - t0) / MINUTE))
    out = []
    for ts in np.sort(rng.uniform(t0, t1, n)).tolist():
        ctx = round(rng.normal(CONTEXT, CONTEXT_SD))
        tokens = int(rng.integers(*OUTPUT, endpoint=True))
        retr, llm = 40.0 * math.exp(0.2 * rng.standard_normal()), 0.05 * ctx + 25.0 * tokens
        e2e = retr + 20.0 + llm + 3.0
        stages = {"retriever": retr, "reranker": 20.0, "llm": llm}
        out.append(RequestRecord(ts, "ok", e2e, ctx, tokens, stages, 0.0, retr + 20 + 0.05 * ctx))
    return out


def _with_odd(envs: Iterator[Envelope], instance: str, seed: int) -> Iterator[Envelope]:
    """The world's envelopes, the target instance's carrying the new kind's requests too."""
    rng, last = np.random.default_rng(seed), None
    for env in envs:
        if isinstance(env, RequestsEnvelope) and env.instance == instance:
            lo = max(START, last if last is not None else env.ts - MINUTE)
            hi = min(START + MINUTES * MINUTE, env.ts)
            last = env.ts
            if lo < hi:
                recs = sorted((*env.records, *_odd(rng, lo, hi)), key=lambda r: r.ts)
                env = replace(env, records=tuple(recs))
        yield env


def real_trace_new_kind(hours: float = TRACE_HOURS) -> Shape:
    t0, t1 = TRACE_T0, TRACE_T0 + hours * HOUR
    world = _trace_world()
    target = _target(world[0], 1)
    exp = Expect("outliers", ("RequestOutlierCluster",), target, START,
                 START + MINUTES * MINUTE, max_delay_s=10 * MINUTE)  # fmt: skip
    return Shape(
        "real-trace-new-kind",
        lambda: _with_odd(_world(world, t0, t1), target["instance"], seed=61),
        faults=(exp,),
        series_days=_healthy_days(3, t0, t1, (exp,)),
        note="The real trace; on day 2 a new client sends 6 requests a minute of 20x the usual "
        "context (short outputs) to one instance for 30 min: news within 10 min, once.",
    )


SHAPES = [real_trace_new_kind()]
