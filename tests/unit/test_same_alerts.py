"""Same alerts (issue 17): the current code gives the transitions recorded from the code
before the GPU pipeline's series became arrays, through ``gpu_batch`` runs and one envelope
at a time (``bench/transitions.py``, plan ``ci``: small, a few seconds a mode).

The data comes from commit 2ca3ea7 (before the change) and only from there; to regenerate
it (say, after changing plan ``ci``):

    git worktree add /tmp/before 2ca3ea7
    python bench/transitions.py --code /tmp/before --plan ci \\
        --write tests/data/transitions/ci.json

(A change meant to change alerts records from its own code instead, updates ``BEFORE``
below and says so in its commit: issue 30 recorded from 2275ee5, its rules changed what pages,
then from 5b9000a, a leak given back by an OOM kill no longer leaves an unattributed
pending; issue 34 from f02e2cf, a minute's slow retrievals being one event to the tail's
CUSUM, the scenario ``all``'s RetrievalSlowdown pending a minute later, its firing and
resolution otherwise the same; the differences are listed in the commits.)

The full plan (the quality scenarios, 7 healthy days, the soak's telemetry) is
``python bench/transitions.py --check bench/results/transitions-before.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ragwatch.gpu_wire import GpuMessage
from ragwatch.streams.alerting.rules import load_rules
from tests.bench_modules import load

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "transitions" / "ci.json"
BEFORE = "f02e2cf"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load("transitions")


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


def test_the_data_comes_from_before_the_change_and_holds_alerts(recorded: dict[str, Any]) -> None:
    assert recorded["code"]["commit"].startswith(BEFORE) and not recorded["code"]["dirty"]
    assert recorded["plan"] == "ci"
    rows = [r for s in recorded["scenarios"].values() for r in s["transitions"]]
    seen = {(r["rule"], r["status"]) for r in rows}
    for rule in ("GpuMemoryLeak", "DecodeSpeedDrop"):  # a GPU rule and a request rule
        assert {(rule, "firing"), (rule, "resolved")} <= seen
    resolved_after_firing = {r["rule"] for r in rows if r["previous"] == "firing"}
    assert {"GpuMemoryLeak", "DecodeSpeedDrop", "GpuOomKill"} <= resolved_after_firing
    assert recorded["scenarios"]["healthy-day"]["transitions"] == []  # no false alert


@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["gpu_batch", "one_at_a_time"])
def test_the_current_code_gives_the_recorded_transitions(
    tool: ModuleType, recorded: dict[str, Any], one_at_a_time: bool
) -> None:
    failures = []
    for name, run in tool.recorded_runs(recorded).items():
        got = tool.play(name, run, one_at_a_time=one_at_a_time)
        diff = tool.compare(recorded["scenarios"][name]["transitions"], got["rows"])
        if not diff.same:
            failures += tool.report(name, diff, got["wall_s"])
    assert not failures, "\n".join(failures)


def test_gpu_envelopes_go_in_ordered_runs_of_at_most_256(tool: ModuleType) -> None:
    class Recording(tool.Pipelines):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__(load_rules())
            self.runs: list[list[float]] = []

        def gpu_batch(self, envs: list[GpuMessage]) -> list[Any]:
            self.runs.append([float(e.ts) for e in envs])
            out: list[Any] = super().gpu_batch(envs)
            return out

    run = tool.Run("healthy", 5.0, hosts=1, gpus=1, services=0, interval_s=60.0)
    pipes = Recording()
    list(tool.feed(pipes, tool.envelopes(run)))
    assert [len(r) for r in pipes.runs] == [256, 44]  # 300 samples of one host, in order
    assert [ts for r in pipes.runs for ts in r] == sorted(ts for r in pipes.runs for ts in r)

    mixed = Recording()  # requests between the GPU envelopes: a run per tick
    small = tool.Run("all", 0.5, hosts=2, gpus=1, services=1, interval_s=60.0)
    list(tool.feed(mixed, tool.envelopes(small)))
    assert [len(r) for r in mixed.runs] == [2] * 30


def test_the_runs_are_those_of_bench_quality(tool: ModuleType) -> None:
    quality = load("quality")
    assert tool.FAULT_HOURS == quality.FAULT_HOURS
    assert tool.HEALTHY_DAYS == quality.HEALTHY_DAYS
    job = quality.Job("leak", 3.0)
    run = tool.plan("full")["leak"]
    for f in ("hosts", "gpus", "services", "interval_s", "seed"):
        assert getattr(run, f) == getattr(job, f)


def test_a_changed_transition_is_found_and_a_changed_value_only_warned(tool: ModuleType) -> None:
    a: dict[str, Any] = {"rule": "R", "status": "firing", "previous": "pending"}
    a |= {"labels": {"host": "h"}}
    a |= {"starts_at": 1.0, "ends_at": None, "at": 2.0, "resolution": None, "value": 1.5}
    b = a | {"status": "resolved", "previous": "firing", "ends_at": 3.0, "at": 3.0}
    assert tool.compare([a, b], [b, a]).same and tool.compare([a, b], [b, a]).order_at == 0
    changed = tool.compare([a, b], [a, b | {"value": 2.0}])
    assert changed.same and len(changed.value_changes) == 1
    late = tool.compare([a, b], [a | {"starts_at": 1.5}, b])
    assert not late.same and late.missing == [a] and late.extra[0]["starts_at"] == 1.5
