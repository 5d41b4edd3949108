"""The anomaly advisor (ragwatch.advisor): gathering a host's and a service's scored
signals from status entries, ranking, and the words of hints and ``ragwatch explain``."""

from __future__ import annotations

from typing import Any

import pytest

from ragwatch.advisor import explain, fact_moves, gather, rank, summary
from ragwatch.schema import AnomalyFact


def sig(peak: float, value: float, yhat: float, now: float | None = None) -> list[Any]:
    """A scored signal as status holds it (SCORE_FIELDS): newest first, then the peak."""
    now = peak if now is None else now
    return [now, yhat, yhat * 0.8, yhat * 1.2, value, peak, value, yhat, 1e9 + 60]


STATUS: dict[str, Any] = {
    "hosts": [
        {"host": "h1", "gpus": [
            {"index": 2, "mig": None, "scores": {
                "power_w": sig(1.0, 60.0, 300.0), "gpu_util": sig(0.98, 0.0, 85.0),
                "temp_c": sig(0.3, 60.0, 62.0)},
             "procs": [{"pid": 4011, "name": "python", "scores": {
                 "rss_bytes": sig(0.95, 9e9, 3e9)}}]},
            {"index": 3, "mig": "1g.10gb", "scores": {"fb_used_ratio": sig(0.92, 0.97, 0.5)}}],
         "engines": [{"target": "vllm", "scores": {"kv_cache_usage_ratio": sig(0.91, 0.99, 0.4)}}]},
        {"host": "h2", "gpus": [{"index": 0, "scores": {"gpu_util": sig(1.0, 0.0, 80.0)}}]},
    ],
    "services": [
        {"service": "rag", "instances": [
            {"instance": "rag-1", "host": "h1", "scores": {
                "reranker_p95_ms": sig(0.99, 160.0, 40.0), "rps": sig(0.2, 1.0, 1.0)}},
            {"instance": "rag-2", "host": "h2", "scores": {"decode_tps": sig(0.93, 20.0, 40.0)}}]},
        {"service": "other", "instances": [{"instance": "o-1", "host": "h3", "scores": {}}]},
    ],
    "alerts": [{"fingerprint": "abc", "rule": "RetrievalSlowdown", "status": "firing",
                "labels": {"service": "rag", "instance": "rag-1"}}],
}  # fmt: skip


def test_a_host_gathers_its_gpus_processes_engines_and_the_instances_on_it() -> None:
    wheres = {(m.where, m.signal) for m in gather(STATUS, host="h1")}
    assert ("GPU 2", "power_w") in wheres and ("pid 4011 (python)", "rss_bytes") in wheres
    assert ("GPU 3/1g.10gb", "fb_used_ratio") in wheres
    assert ("engine vllm", "kv_cache_usage_ratio") in wheres
    assert ("rag-1", "reranker_p95_ms") in wheres
    assert not any(w in ("rag-2", "GPU 0") for w, _ in wheres)  # h2's


def test_a_service_gathers_its_instances_and_the_hosts_they_run_on() -> None:
    wheres = {m.where for m in gather(STATUS, service="rag")}
    assert {"rag-1", "rag-2", "GPU 2", "GPU 0"} <= wheres


def test_rank_keeps_peaks_over_the_bar_highest_first_and_says_them_briefly() -> None:
    moves = rank(gather(STATUS, host="h1"))
    assert [m.score for m in moves] == sorted((m.score for m in moves), reverse=True)
    assert all(m.score >= 0.9 for m in moves) and len(moves) == 6
    assert moves[0].words() == "GPU 2 power -80 %"
    said = summary(moves)
    first = "GPU 2 power -80 %, utilisation 0 % (expected 85 %); rag-1 reranker P95 4.0x"
    assert said.startswith(first), said


@pytest.mark.parametrize(
    ("signal", "value", "yhat", "words"),
    [
        ("gpu_util", 0.0, 85.0, "X utilisation 0 % (expected 85 %)"),
        ("errors_ratio", 0.12, 0.01, "X errors 12 % (expected 1 %)"),
        ("temp_c", 88.0, 70.0, "X temperature 88 C (+18 C)"),
        ("decode_tps", 20.0, 40.0, "X decode speed -50 %"),
        ("llm_p99_ms", 900.0, 300.0, "X llm P99 3.0x"),
        ("something_new", 2.0, 1.0, "X something_new 2.0x"),
        ("rps", 5.0, 0.0, "X requests/s 5"),
    ],
)
def test_each_kind_of_signal_is_said_as_people_read_it(
    signal: str, value: float, yhat: float, words: str
) -> None:
    (move,) = fact_moves([AnomalyFact("X", signal, 1.0, value, yhat, 0.0)])
    assert move.words() == words


def test_explain_an_alert_reads_its_host_through_its_instance_and_ranks() -> None:
    found = explain(STATUS, fingerprint="abc")
    assert found["alert"]["rule"] == "RetrievalSlowdown"
    assert found["service"] == "rag" and found["host"] is None
    signals = [(m["series"], m["signal"]) for m in found["moves"]]
    assert ("rag-1", "reranker_p95_ms") in signals and ("GPU 2", "power_w") in signals
    assert found["moves"][0]["score"] == 1.0
    assert found["summary"] != "nothing anomalous"
    lowered = explain(STATUS, host="h2", min_score=0.5)
    assert [m["series"] for m in lowered["moves"]] == ["GPU 0", "rag-2"]


def test_explain_says_what_it_cannot_find() -> None:
    with pytest.raises(LookupError, match="fingerprint nope"):
        explain(STATUS, fingerprint="nope")
    with pytest.raises(LookupError, match="no host h9"):
        explain(STATUS, host="h9")
    with pytest.raises(LookupError, match="name an alert"):
        explain(STATUS)
    assert explain(STATUS, service="other")["summary"] == "nothing anomalous"


def test_malformed_entries_are_skipped_not_raised() -> None:
    status = {"hosts": [{"host": "h", "gpus": [
        {"index": 0, "scores": {"a": [1, 2], "b": "x", "c": [None] * 9}}, "junk"]}]}  # fmt: skip
    assert gather(status, host="h") == []


def test_a_hint_ends_with_what_else_is_anomalous_around_the_alert() -> None:
    from ragwatch.schema import Alert, HostFacts
    from ragwatch.streams.alerting.engine import AlertEngine
    from ragwatch.streams.pipelines.hints import Correlator

    at = 1e9
    facts = (
        AnomalyFact("GPU 2", "power_w", 1.0, 60.0, 300.0, at - 600),
        AnomalyFact("GPU 2", "gpu_util", 0.99, 0.0, 85.0, at - 600),
        AnomalyFact("GPU 3", "temp_c", 0.95, 80.0, 60.0, at - 86400),  # a day before: not
    )

    class Summary:
        def host(self, host: str) -> HostFacts:
            return HostFacts(host, at, anomalous=facts)

        def instance(self, service: str, instance: str) -> None:
            return None

        def instances_on(self, host: str) -> list[Any]:
            return []

    def alert(labels: dict[str, str]) -> Alert:
        return Alert(rule="GpuAnomaly", severity="warning", status="firing", labels=labels,
                     annotations={}, value=2.0, expected=None, starts_at=at, ends_at=None,
                     fingerprint="f", at=at)  # fmt: skip

    hint = Correlator([], AlertEngine()).hint(alert({"host": "h", "gpu": "0"}), Summary())
    assert hint.endswith("; also anomalous: GPU 2 power -80 %, utilisation 0 % (expected 85 %)")
    assert "GPU 3" not in hint
