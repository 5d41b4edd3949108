"""Chart series: one point per series per step of event time, with forecast and score."""

from __future__ import annotations

import itertools
from typing import Any

from ragwatch.agents.scenario import build
from ragwatch.chart_ids import owner_prefixes, series_prefix
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.charts import SeriesRecorder
from ragwatch.streams.pipelines.fleet import Pipelines


def recorded(
    rec: SeriesRecorder, pipes: Pipelines, hosts: set[str], services: set[str], ts: float
) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """What the recorder takes of ``hosts`` and ``services`` whose state moved on to ``ts``
    (every one of them, as after a wave that held them all)."""
    for p in pipes.of("host"):
        rec.observe(p, [(h, ts) for h in hosts])
    rec.observe(pipes.requests, [(s, ts) for s in services])
    return rec.take()


def test_points_every_step_with_forecasts_for_services() -> None:
    pipes = Pipelines(load_rules())
    rec = SeriesRecorder(pipes.rules, step_s=300.0)
    got: dict[str, list[list[float | None]]] = {}
    for env in build("throughput", hosts=1, gpus=1, services=1, interval_s=60.0).envelopes(hours=2):
        pipes.process(env)
        for sid, (meta, points) in recorded(
            rec, pipes, {"gpu-node-01"}, {"rag-api"}, env.ts
        ).items():
            got.setdefault(sid, []).extend(points)
            assert meta["unit"] and meta["kind"] == sid.split(":")[0]
    fb = got["gpu:gpu-node-01:0:fb_used"]
    assert all(b[0] - a[0] >= 300.0 for a, b in itertools.pairwise(fb))  # type: ignore[operator]
    assert 20 <= len(fb) <= 25  # two hours in 5-minute steps
    tps = got["service:rag-api:rag-api-1:tokens_per_s"]
    late = [p for p in tps if p[2] is not None]
    assert late and all(p[3] is not None and 0.0 <= p[3] <= 1.0 for p in late)  # type: ignore[operator]
    assert max(p[3] for p in late) >= 0.5  # type: ignore[type-var]  # the drop scores
    assert {sid.split(":")[0] for sid in got} == {"gpu", "process", "service"}


def test_the_recorder_tracks_a_bounded_number_of_series_and_never_refuses_one() -> None:
    """It refused every series beyond max_tracked until a restart; now it forgets the one
    written least recently (whose next point is then written again)."""
    pipes = Pipelines(load_rules())
    for env in build("healthy", hosts=3, gpus=2, services=0, interval_s=60.0).envelopes(hours=0.1):
        pipes.process(env)
    rec = SeriesRecorder(pipes.rules, max_tracked=4)
    hosts = {"gpu-node-01", "gpu-node-02", "gpu-node-03"}
    everything = recorded(SeriesRecorder(pipes.rules), pipes, hosts, set(), env.ts)
    assert len(everything) > 4
    assert recorded(rec, pipes, hosts, set(), env.ts).keys() == everything.keys()
    assert rec.tracked == 4
    full = SeriesRecorder(pipes.rules)
    recorded(full, pipes, hosts, set(), env.ts)
    gone = full.forget(owner_prefixes(["gpu-node-03"], []))
    assert gone and all(":gpu-node-03:" in sid for sid in gone)
    assert full.tracked == len(everything) - len(gone)


def test_names_holding_colons_make_distinct_series_ids() -> None:
    """Ids joined names with ':': service a:b / instance c and service a / instance b:c
    shared one Redis list."""
    one = series_prefix("service", {"service": "a:b", "instance": "c"})
    other = series_prefix("service", {"service": "a", "instance": "b:c"})
    assert one != other and one.count(":") == other.count(":") == 3
    assert series_prefix("gpu", {"host": "h%3A", "gpu": "0"}) != series_prefix(
        "gpu", {"host": "h:", "gpu": "0"}
    )


def test_the_quiet_gate_skips_only_series_with_no_chart_due() -> None:
    """A series none of whose charts is due is skipped with one look (the least of their
    last points + step), and so is a host or service none of whose series is: the points
    are those of checking every chart every time, also for charts whose signal has no
    value yet (a forecast, a leak slope)."""
    pipes = Pipelines(load_rules())
    gated, every = (SeriesRecorder(pipes.rules, step_s=300.0) for _ in range(2))
    scenario = build("leak", hosts=2, gpus=2, services=1, interval_s=60.0)
    got: list[dict[str, object]] = []
    want: list[dict[str, object]] = []
    skipped = 0
    for env in scenario.envelopes(hours=3):
        pipes.process(env)
        hosts, services = {"gpu-node-01", "gpu-node-02"}, {"rag-api"}
        skipped += len(gated._quiet)
        got.append(recorded(gated, pipes, hosts, services, env.ts))
        every._quiet.clear()  # never gated: every chart of every series checked
        every._key_quiet.clear()
        want.append(recorded(every, pipes, hosts, services, env.ts))
    assert got == want
    assert skipped > 0 and sum(map(len, got)) > 100
