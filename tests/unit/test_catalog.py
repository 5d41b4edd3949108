"""The signal catalog is true: the pipelines produce exactly the signals it declares for
each kind of series, every rule (the shipped ones included) names only signals a pipeline
produces for its series, and the charts, the hints and the exporter read catalogued ones.

The pipelines run the ``all`` scenario (GPU, processes, device events, RAG requests) and a
scraped engine; what the alert engine is handed to evaluate is recorded per series kind.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ragwatch.agents.scenario import build
from ragwatch.catalog import SERIES_SIGNALS
from ragwatch.console.exporter import ENGINE_GAUGES, GPU_GAUGES, SERVICE_GAUGES, SERVICE_SCORES
from ragwatch.schema import MetricSample, MetricsEnvelope
from ragwatch.streams.alerting.rules import Rule, load_rules, parse_rule
from ragwatch.streams.pipelines import hints
from ragwatch.streams.pipelines.charts import CHARTS
from ragwatch.streams.pipelines.fleet import Pipelines

T0 = 1_767_225_600.0


def _every_kind() -> list[Rule]:
    """One rule per kind that never fires, so every kind's signals reach the engine."""
    return [
        parse_rule({"name": f"Never{k.title()}", "series": k, "expr": f"{s[0]} > 1e300"})
        for k, s in SERIES_SIGNALS.items()
    ]


def _engine_scrapes(n: int) -> list[MetricsEnvelope]:
    """A vLLM-like engine scraped every 15 s, every metric the pipeline reads."""
    out = []
    for i in range(n):
        t = 15.0 * i
        samples = (
            ("ragwatch_generation_tokens_total", 100.0 * t),
            ("ragwatch_prompt_tokens_total", 900.0 * t),
            ("ragwatch_requests_succeeded_total", 2.0 * t),
            ("ragwatch_requests_failed_total", 0.01 * t),
            ("ragwatch_preemptions_total", 0.0),
            ("ragwatch_e2e_seconds_sum", 1.6 * t),
            ("ragwatch_e2e_seconds_count", 2.0 * t),
            ("ragwatch_ttft_seconds_sum", 0.2 * t),
            ("ragwatch_ttft_seconds_count", 2.0 * t),
            ("ragwatch_queue_seconds_sum", 0.02 * t),
            ("ragwatch_queue_seconds_count", 2.0 * t),
            ("ragwatch_tpot_seconds_sum", 0.01 * t),
            ("ragwatch_tpot_seconds_count", 200.0 * t),
            ("ragwatch_requests_waiting", 3.0),
            ("ragwatch_requests_running", 5.0),
            ("ragwatch_kv_cache_usage_ratio", 0.5),
        )
        env = tuple(MetricSample(name, {"model": "m"}, v) for name, v in samples)
        out.append(MetricsEnvelope("gpu-node-01", "http://vllm:8000/metrics", T0 + t, env))
    return out


@pytest.fixture(scope="module")
def produced() -> dict[str, set[str]]:
    """Series kind -> every signal name the pipelines handed the alert engine."""
    pipes = Pipelines([*load_rules(), *_every_kind()])
    seen: dict[str, set[str]] = {}
    evaluate, evaluate_key = pipes.engine.evaluate, pipes.engine.evaluate_key

    def record(rule: Rule, signals: Mapping[str, Any]) -> None:
        seen.setdefault(rule.series, set()).update(signals)

    def spy(rule: Rule, labels: Any, signals: Any, ts: float) -> Any:
        record(rule, signals)
        return evaluate(rule, labels, signals, ts)

    def spy_key(rule: Rule, labels: Any, fp: str, signals: Any, ts: float) -> Any:
        record(rule, signals)
        return evaluate_key(rule, labels, fp, signals, ts)

    pipes.engine.evaluate = spy  # type: ignore[method-assign]
    pipes.engine.evaluate_key = spy_key  # type: ignore[method-assign]
    world = build("oom", hosts=1, gpus=1, services=1, interval_s=60.0)
    for env in world.envelopes(hours=14):  # a leak to its OOM kill, the request faults
        pipes.process(env)
    for scrape in _engine_scrapes(2 * 240):  # two hours of an engine
        pipes.process(scrape)
    return seen


@pytest.mark.parametrize("kind", sorted(SERIES_SIGNALS))
def test_the_pipelines_produce_exactly_the_catalogued_signals(
    produced: dict[str, set[str]], kind: str
) -> None:
    assert kind in produced, f"no pipeline evaluated a {kind} series"
    missing = set(SERIES_SIGNALS[kind]) - produced[kind]
    extra = produced[kind] - set(SERIES_SIGNALS[kind])
    assert (missing, extra) == (set(), set())


def test_every_shipped_rule_names_only_signals_a_pipeline_produces(
    produced: dict[str, set[str]],
) -> None:
    for rule in load_rules():
        named = {c.signal for c in (*rule.conditions, *(c for a in rule.resolve for c in a))}
        named |= {s for s in (rule.value_signal, rule.expected) if isinstance(s, str)}
        assert named <= produced[rule.series], (rule.name, named - produced[rule.series])


def test_a_rule_naming_a_signal_no_pipeline_produces_is_refused() -> None:
    with pytest.raises(Exception, match="tpr_devation"):
        parse_rule({"name": "Typo", "series": "service", "expr": "tpr_devation < -0.25"})


def test_the_exporter_reads_catalogued_signals() -> None:
    assert {k for k, _, _ in GPU_GAUGES} <= set(SERIES_SIGNALS["gpu"])
    assert {k for k, _ in ENGINE_GAUGES} <= set(SERIES_SIGNALS["engine"])
    service = {k for k, _ in (*SERVICE_GAUGES, *SERVICE_SCORES)}
    assert service <= set(SERIES_SIGNALS["service"])


def test_every_chart_draws_catalogued_signals() -> None:
    for chart in CHARTS:
        drawn = {*chart.signals, *chart.about}
        assert drawn <= set(SERIES_SIGNALS[chart.kind]), (chart.suffix, drawn)


def test_the_hints_read_catalogued_signals() -> None:
    """Every signal the root-cause hints read (``sig.get("...")``, ``s.signals.get(...)``,
    the symptom tables) is one a pipeline produces."""
    source = Path(hints.__file__).read_text()
    read: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and (
                (isinstance(node.func.value, ast.Name) and node.func.value.id == "sig")
                or (
                    isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "signals"
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            read.add(node.args[0].value)
    read |= {signal for signal, _, _ in hints._SYMPTOMS}
    read |= set(hints._SIGNIFICANCE) | set(hints._SIGNIFICANCE.values())
    catalogued = set().union(*map(set, SERIES_SIGNALS.values()))
    assert len(read) >= 10 and read <= catalogued, read - catalogued
    # and the facts topic carries each of them (what it carries of an instance)
    assert read <= hints.HINT_SIGNALS, read - hints.HINT_SIGNALS
