"""Which chart shows an alert: read from its rule, recorded by the recorder, found in the
series index for the alert's labels."""

from __future__ import annotations

import functools
from typing import Any

from ragwatch.agents.scenario import build
from ragwatch.chart_ids import alert_series
from ragwatch.schema import Alert
from ragwatch.streams.alerting.rules import Rule, load_rules, parse_rule
from ragwatch.streams.pipelines.charts import SeriesRecorder, charts_for
from ragwatch.streams.pipelines.fleet import Pipelines

# rule -> (kind, suffix, value, reference) of the chart that shows its alerts
DEFAULT_CHARTS: dict[str, list[tuple[str, str, str, str | None]]] = {
    "GpuMemoryLeak": [("process", "gpu_mem", "gpu_mem_bytes", None)],
    "GpuMemoryLeakSlow": [("process", "gpu_mem", "gpu_mem_bytes", None)],
    "GpuMemoryHigh": [("gpu", "fb_used", "fb_used_bytes", None)],
    "GpuMemoryLeakUnattributed": [("gpu", "fb_used", "fb_used_bytes", None)],
    "GpuMemoryLeakUnattributedSlow": [("gpu", "fb_used", "fb_used_bytes", None)],
    "GpuOomKill": [
        ("process", "gpu_mem", "gpu_mem_bytes", None),
        ("gpu", "fb_used", "fb_used_bytes", None),
    ],
    "GpuXidCritical": [
        ("process", "gpu_mem", "gpu_mem_bytes", None),
        ("gpu", "fb_used", "fb_used_bytes", None),
    ],
    "TokensPerRequestDrop": [("service", "tokens_per_req", "tokens_per_request", "tpr_forecast")],
    "ThroughputDrop": [("service", "tokens_per_s", "output_tokens_per_s", "tps_forecast")],
    "DecodeSpeedDrop": [("service", "decode_tps", "decode_tps", "decode_baseline_tps")],
    "ErrorRateHigh": [("service", "errors", "errors_ratio", "errors_baseline")],
    "QueueWaitHigh": [("service", "queue_p95", "queue_recent_p95_ms", "queue_p95_baseline_ms")],
    "TtftDeviation": [("service", "ttft_net_p95", "ttft_net_p95_ms", "ttft_net_p95_baseline_ms")],
    "RetrievalSlowdown": [
        ("service", "retriever_p99", "retriever_p99_ms", "retriever_p99_baseline_ms")
    ],
    "E2eLatencyDeviation": [("service", "e2e_p95", "e2e_p95_ms", "e2e_p95_baseline_ms")],
    "RequestOutlierCluster": [("service", "outliers", "outliers", None)],
    "EngineThroughputDrop": [("engine", "tokens_per_s", "generation_tokens_per_s", "tps_forecast")],
    "EnginePreemptions": [("engine", "tokens_per_s", "generation_tokens_per_s", "tps_forecast")],
}


@functools.cache
def recorded(
    scenario: str, hours: float, drop: tuple[str, ...] = (), add: tuple[str, ...] = ()
) -> tuple[Any, ...]:
    """A scenario through the pipelines and the recorder, with the default rules less
    ``drop`` plus the CUSTOM rules ``add``: (first alert per rule, index, points)."""
    rules = [r for r in load_rules() if r.name not in drop] + [CUSTOM[n] for n in add]
    pipes = Pipelines(rules)
    rec = SeriesRecorder(rules)
    alerts: dict[str, Alert] = {}
    index: dict[str, dict[str, Any]] = {}
    points: dict[str, list[list[float | None]]] = {}
    for env in build(scenario, hosts=1, gpus=1, services=1, interval_s=60.0).envelopes(hours=hours):
        for t in pipes.process(env):
            alerts.setdefault(t.alert.rule, t.alert)
        for p in pipes.pipelines:
            rec.observe(p, [("rag-api" if p.domain == "service" else "gpu-node-01", env.ts)])
        for sid, (meta, taken) in rec.take().items():
            index[sid] = meta
            points.setdefault(sid, []).extend(taken)
    return alerts, index, points


CUSTOM: dict[str, Rule] = {
    "LlmSlow": parse_rule({"name": "LlmSlow", "series": "service", "expr": "llm_p99_ms > 1"}),
    "Throughput": parse_rule(
        {"name": "Throughput", "series": "service", "expr": "tps_score > 0.9"}
    ),
    # E2eLatencyDeviation's signal at a threshold the scenario's latency step crosses
    # (the shipped rule waits for a doubled P95, which no scenario of 2 hours makes)
    "E2eSlow": parse_rule(
        {
            "name": "E2eSlow",
            "series": "service",
            "expr": "e2e_p95_ratio > 1.3",
            "value": "e2e_p95_ms",
            "expected": "e2e_p95_baseline_ms",
        }
    ),
}


def shape(rule: Rule) -> list[tuple[str, str, str, str | None]]:
    return [(c.kind, c.suffix, c.value, c.reference) for c in charts_for(rule)]


def test_each_default_rule_is_charted_by_the_signal_it_is_about() -> None:
    rules = {r.name: r for r in load_rules()}
    assert {name: shape(rules[name]) for name in DEFAULT_CHARTS} == DEFAULT_CHARTS
    assert all(charts_for(r) for r in rules.values())  # rules added since too


def test_a_rule_on_a_signal_no_chart_holds() -> None:
    # a score of a chart: that chart
    assert shape(CUSTOM["Throughput"]) == DEFAULT_CHARTS["ThroughputDrop"]
    # a service signal of its own: a chart of that signal, in its unit
    (chart,) = charts_for(CUSTOM["LlmSlow"])
    assert (chart.suffix, chart.value, chart.unit) == ("llm_p99_ms", "llm_p99_ms", "ms")
    assert not chart.main  # recorded only because the rule wants it
    gpu = parse_rule({"name": "Hot", "series": "gpu", "expr": "temp_c > 90"})
    assert shape(gpu) == DEFAULT_CHARTS["GpuMemoryHigh"]  # a GPU's alerts: its memory


def test_alerts_get_the_series_of_their_rules_signal() -> None:
    alerts, index, points = recorded("all", 2.0, (), ("E2eSlow",))
    charted_as = {"RetrievalSlowdown": "RetrievalSlowdown", "DecodeSpeedDrop": "DecodeSpeedDrop",
                  "TokensPerRequestDrop": "TokensPerRequestDrop", "GpuMemoryLeak": "GpuMemoryLeak",
                  "RequestOutlierCluster": "RequestOutlierCluster",
                  "E2eSlow": "E2eLatencyDeviation"}  # fmt: skip
    assert set(charted_as) <= set(alerts)
    for rule, default in charted_as.items():
        a = alerts[rule]
        ids = alert_series(rule, a.labels, index)
        ((kind, suffix, value, reference),) = DEFAULT_CHARTS[default]
        assert ids[0].startswith(f"{kind}:") and ids[0].endswith(f":{suffix}"), (rule, ids)
        assert rule in index[ids[0]]["rules"] and index[ids[0]]["signal"] == value
        drawn_beside = any(p[2] is not None for p in points[ids[0]])  # forecast or baseline
        assert drawn_beside == (reference is not None), rule
        for other in ids[1:]:  # the other charts of the same instance or process
            assert rule not in index[other]["rules"], (rule, other)
    # The retrieval slowdown's chart: the retriever P99 far above its baseline.
    sid = alert_series("RetrievalSlowdown", alerts["RetrievalSlowdown"].labels, index)[0]
    slow = [p for p in points[sid] if p[2] is not None and p[1] > 3 * p[2]]  # type: ignore[operator]
    assert len(slow) >= 2, points[sid][-10:]


def test_a_device_event_shows_the_processs_memory_then_its_gpus() -> None:
    _, index, _ = recorded("leak", 0.5)
    (process,) = (sid for sid in index if sid.endswith(":4001:gpu_mem"))
    labels = {k: index[process]["labels"][k] for k in ("host", "gpu", "mig", "pid")}
    gpu = f"gpu:{labels['host']}:{labels['gpu']}:fb_used"
    found = alert_series("GpuOomKill", {**labels, "type": "oom_kill"}, index)
    assert found[:2] == [process, gpu]  # then the GPU's other charts (utilisation, power)
    assert {sid.rsplit(":", 1)[1] for sid in found[2:]} == {"gpu_util", "power_w"}
    no_pid = {k: v for k, v in labels.items() if k != "pid"}
    assert alert_series("GpuXidCritical", no_pid, index)[0] == gpu
    assert alert_series("GpuOomKill", {**labels, "host": "elsewhere"}, index) == []
    # a MIG instance is another GPU
    mig = {"kind": "gpu", "labels": {**no_pid, "mig": "1g.10gb"}, "rules": ["GpuXidCritical"]}
    with_mig = {**index, f"gpu:{labels['host']}:{labels['gpu']}:1g.10gb:fb_used": mig}
    assert alert_series("GpuXidCritical", no_pid, with_mig) == alert_series(
        "GpuXidCritical", no_pid, index
    )


def test_charts_only_for_the_rules_that_want_them() -> None:
    _, index, _ = recorded("outliers", 1.0, ("RequestOutlierCluster",), ("LlmSlow",))
    suffixes = {sid.rsplit(":", 1)[1] for sid in index if sid.startswith("service:")}
    # without RequestOutlierCluster no outliers chart; LlmSlow's own signal charted
    main = {"tokens_per_s", "tokens_per_req", "decode_tps", "retriever_p99", "e2e_p95"}
    main |= {"retriever_p95", "reranker_p95", "llm_p95"}  # the band charts (multiples)
    wanted = {"errors", "queue_p95", "ttft_net_p95"}  # by the default rules on them
    assert suffixes == main | wanted | {"llm_p99_ms"}
    llm = next(m for sid, m in index.items() if sid.endswith(":llm_p99_ms"))
    assert (llm["signal"], llm["unit"], llm["rules"]) == ("llm_p99_ms", "ms", ["LlmSlow"])
    _, default, _ = recorded("outliers", 1.0)
    charted = {sid.rsplit(":", 1)[1] for sid in default if sid.startswith("service:")}
    assert charted == main | wanted | {"outliers"}
    drop = ("RequestOutlierCluster", "ErrorRateHigh", "QueueWaitHigh", "TtftDeviation",
            "ReplicaErrorsOutlier")  # fmt: skip
    _, bare, _ = recorded("outliers", 1.0, drop)
    assert {sid.rsplit(":", 1)[1] for sid in bare if sid.startswith("service:")} == main
