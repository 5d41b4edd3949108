"""A stateful fuzz target: sequences of valid envelopes of every kind, with hostile numbers
(counters near the float maximum, records reaching back or ahead, bursts, a handful of
hosts and services that come and go), through one worker's :class:`Pipelines`, with
snapshot round trips in between. Nothing may raise, and no signal may become NaN or inf.

It runs for a bounded number of examples in ``make test``; ``make bench`` runs it longer
(``RAGWATCH_FUZZ_EXAMPLES``). The probes that found the hardening issue's defects are
regression tests of their own (test_metrics_pipeline, test_requests_pipeline,
test_events_pipeline, test_schema); this one looks for the next.
"""

from __future__ import annotations

import math
import os
from typing import Any

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ragwatch import codec
from ragwatch.errors import SchemaError
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker.snapshot import dump_host, dump_service, load_host, load_service

T0 = 1_767_225_600.0
HOSTS = ("h1", "h2", "h:3")
SERVICES = ("rag", "rag:b")
RULES = load_rules()
HUGE = (0.0, 1.0, 1e15, 1.79e308, 2.0**63 - 1)

numbers = st.one_of(
    st.sampled_from(HUGE), st.floats(min_value=0.0, max_value=1e12, allow_nan=False)
)
steps = st.floats(min_value=-600.0, max_value=7200.0, allow_nan=False)


class PipelinesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pipes = Pipelines(RULES, max_series=60)
        self.t = T0

    def _feed(self, d: dict[str, Any]) -> None:
        try:
            env = codec.decode(orjson.dumps(d))  # what the worker would get, or nothing
        except SchemaError:
            return
        self.pipes.process(env)

    @rule(dt=steps, host=st.sampled_from(HOSTS), used=numbers, procs=st.integers(0, 3))
    def gpu(self, dt: float, host: str, used: float, procs: int) -> None:
        self.t = max(0.0, self.t + dt)
        total = 80 * 2**30
        fb = min(int(used), total)
        gpu = {"index": 0, "uuid": "GPU-0", "name": "H200", "fb_used": fb, "fb_total": total}
        gpu["procs"] = [{"pid": 4000 + i, "name": "w", "gpu_mem": fb // 4} for i in range(procs)]
        self._feed({"v": 1, "kind": "gpu", "host": host, "ts": self.t, "gpus": [gpu]})

    @rule(
        dt=steps,
        service=st.sampled_from(SERVICES),
        instance=st.sampled_from(("a", "b")),
        n=st.integers(0, 300),
        spread=st.floats(min_value=0.0, max_value=86400.0, allow_nan=False),
        latency=numbers,
        tokens=st.integers(0, 2**40),
    )
    def requests(
        self, dt: float, service: str, instance: str, n: int, spread: float, latency: float,
        tokens: int,
    ) -> None:  # fmt: skip
        self.t = max(0.0, self.t + dt)
        records = [
            {
                "ts": max(0.0, self.t - spread * i / max(n, 1)),
                "status": "ok" if i % 7 else "error",
                "e2e_ms": latency if i % 3 == 0 else 800.0,
                "context_tokens": tokens if i % 5 == 0 else 3000,
                "output_tokens": 1 + (tokens if i % 11 == 0 else 250),
                "stages": {"retriever": min(latency, 1e300)},
            }
            for i in range(n)
        ]
        env = {"v": 1, "kind": "requests", "service": service, "instance": instance}
        self._feed({**env, "ts": self.t, "records": records})

    @rule(dt=steps, host=st.sampled_from(HOSTS), value=numbers, engine=st.integers(0, 2))
    def metrics(self, dt: float, host: str, value: float, engine: int) -> None:
        self.t = max(0.0, self.t + dt)
        samples = [
            {"name": "ragwatch_generation_tokens_total", "labels": {}, "value": value},
            {"name": "ragwatch_requests_total", "labels": {}, "value": value / 3},
            {"name": "ragwatch_requests_waiting", "labels": {}, "value": value},
        ]
        env = {"v": 1, "kind": "metrics", "host": host, "target": f"http://e{engine}/metrics"}
        self._feed({**env, "ts": self.t, "samples": samples})

    @rule(host=st.sampled_from(HOSTS), pid=st.integers(1, 10**6), kind=st.sampled_from(
        ("oom_kill", "xid")))  # fmt: skip
    def event(self, host: str, pid: int, kind: str) -> None:
        attrs = {"pid": pid, "gpu": 0, "xid": 79} if kind == "xid" else {"pid": pid, "gpu": 0}
        self._feed({"v": 1, "kind": "event", "host": host, "ts": self.t, "type": kind, **attrs})

    @rule()
    def snapshot_round_trip(self) -> None:
        """A restart: every host and service through its snapshot into a new worker."""
        fresh = Pipelines(RULES, max_series=60)
        for host in HOSTS:
            load_host(fresh, host, dump_host(self.pipes, host))
        for service in SERVICES:
            load_service(fresh, service, dump_service(self.pipes, service))
        self.pipes = fresh

    @invariant()
    def signals_are_finite_or_unknown(self) -> None:
        p = self.pipes
        for s in list(p.requests.series.values()) + list(p.metrics.series.values()):
            bad = {k: v for k, v in s.signals.items() if v is not None and not math.isfinite(v)}
            assert not bad, bad
        assert p.budget.room() >= 0


PipelinesMachine.TestCase.settings = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=int(os.environ.get("RAGWATCH_FUZZ_EXAMPLES", "40")),
    stateful_step_count=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_pipelines_never_raise_and_keep_signals_finite = PipelinesMachine.TestCase
