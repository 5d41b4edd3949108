"""The Prometheus scrape source against a real HTTP server on loopback, serving the
exposition fixtures of vLLM, SGLang, llama.cpp, TEI, TGI, Triton (TensorRT-LLM
included) and dcgm-exporter (tests/fixtures/prom/).

No mocks of the network: every scrape goes through urllib to ``http.server`` in a
thread. Names, values and labels are asserted exactly, per engine.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ragwatch import codec
from ragwatch.agents import prom_map
from ragwatch.agents.prom import PromSource, ScrapeError, Target, fetch_text
from ragwatch.schema import (
    Envelope,
    EventEnvelope,
    GpuEnvelope,
    GpuSample,
    MetricSample,
    MetricsEnvelope,
)
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prom"
MIB = 1024 * 1024
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"
NODE = "gpu-node-07"
TS = 1_767_225_600.0


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


# ---------------------------------------------------------------- a real HTTP server


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    hang: bool = False  # hold the response until the test ends (a timeout)


@dataclass
class Exporter:
    """Serves ``routes`` on 127.0.0.1; remembers the headers of every request."""

    port: int = 0
    routes: dict[str, Route] = field(default_factory=dict)
    seen_headers: list[Mapping[str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, text: str, status: int = 200) -> str:
        self.routes[path] = Route(text.encode(), status)
        return self.url(path)


def _handler(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            exporter.seen_headers.append(dict(self.headers))
            route = exporter.routes.get(self.path, Route(b"not found", 404))
            if route.hang:
                exporter.release.wait(10)
            try:
                self.send_response(route.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                self.wfile.write(route.body)
            except OSError:
                pass  # the client gave up (the timeout test)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    exp = Exporter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(exp))
    server.daemon_threads = True
    exp.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield exp
    exp.release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


def source(urls: list[str], **kw: object) -> PromSource:
    return PromSource(urls, host="agent-host", clock=lambda: TS, **kw)  # type: ignore[arg-type]


def scrape_one(exporter: Exporter, text: str, **kw: object) -> list[Envelope]:
    return source([exporter.serve("/metrics", text)], **kw).sample()


def metrics_of(envs: list[Envelope]) -> MetricsEnvelope:
    found = [e for e in envs if isinstance(e, MetricsEnvelope)]
    assert len(found) == 1
    return found[0]


def find(env: MetricsEnvelope, name: str, **labels: str) -> list[MetricSample]:
    return [
        s
        for s in env.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(env: MetricsEnvelope, name: str, **labels: str) -> float:
    hits = find(env, name, **labels)
    assert len(hits) == 1, (name, labels, hits)
    return hits[0].value


# ---------------------------------------------------------------- vLLM


def test_vllm_is_renamed_with_engine_and_source_labels(exporter: Exporter) -> None:
    envs = scrape_one(exporter, fixture("vllm"))
    env = metrics_of(envs)
    assert len(envs) == 1
    assert (env.host, env.target, env.ts) == ("agent-host", exporter.url("/metrics"), TS)
    # vLLM V1 labels its samples engine="<index>": kept as exported_engine.
    waiting = find(env, "ragwatch_requests_waiting")
    assert waiting == [
        MetricSample(
            "ragwatch_requests_waiting",
            {
                "exported_engine": "0",
                "model_name": LLAMA,
                "engine": "vllm",
                "source_metric": "vllm:num_requests_waiting",
            },
            3.0,
        )
    ]
    assert value(env, "ragwatch_requests_running") == 12.0
    assert value(env, "ragwatch_kv_cache_usage_ratio") == 0.4375
    assert value(env, "ragwatch_prompt_tokens_total") == 1_843_021.0
    assert value(env, "ragwatch_generation_tokens_total") == 402_117.0
    assert value(env, "ragwatch_preemptions_total") == 0.0
    assert value(env, "ragwatch_prefix_cache_hits_total") == 1_102_336.0
    succeeded = {
        s.labels["finished_reason"]: s.value
        for s in find(env, "ragwatch_requests_succeeded_total", engine="vllm")
    }
    assert succeeded == {"stop": 1520.0, "length": 87.0, "abort": 3.0}


def test_vllm_histograms_keep_buckets_sum_and_count(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("vllm")))
    ttft = find(env, "ragwatch_ttft_seconds_bucket")
    assert [s.labels["le"] for s in ttft][-3:] == ["2.5", "5.0", "+Inf"]
    assert {s.labels["source_metric"] for s in ttft} == {"vllm:time_to_first_token_seconds_bucket"}
    assert value(env, "ragwatch_ttft_seconds_bucket", le="0.1") == 1254.0
    assert value(env, "ragwatch_ttft_seconds_bucket", le="+Inf") == 1610.0
    assert value(env, "ragwatch_ttft_seconds_count") == 1610.0
    assert value(env, "ragwatch_ttft_seconds_sum") == 131.82511305809021
    assert value(env, "ragwatch_itl_seconds_count") == 400_507.0
    assert value(env, "ragwatch_itl_seconds_bucket", le="0.025") == 371_044.0
    assert value(env, "ragwatch_e2e_seconds_sum") == 5012.44
    assert value(env, "ragwatch_queue_seconds_bucket", le="0.3") == 1580.0
    assert find(env, "ragwatch_ttft_seconds_sum")[0].labels == {
        "exported_engine": "0",
        "model_name": LLAMA,
        "engine": "vllm",
        "source_metric": "vllm:time_to_first_token_seconds_sum",
    }


def test_vllm_unknown_metrics_pass_through_unchanged(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("vllm")))
    assert {s.name for s in env.samples if s.name.startswith("vllm:")} == {"vllm:cache_config_info"}
    (info,) = find(env, "vllm:cache_config_info")
    assert info.labels["engine"] == "0" and "source_metric" not in info.labels
    assert value(env, "python_gc_objects_collected_total", generation="1") == 4410.0
    assert value(env, "process_resident_memory_bytes") == 3_987_660_800.0
    assert find(env, "http_requests_total", handler="/metrics")[0].labels == {
        "handler": "/metrics",
        "method": "GET",
        "status": "2xx",
    }


def test_vllm_deprecated_names_map_to_the_same_series(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("vllm_legacy")))
    (kv,) = find(env, "ragwatch_kv_cache_usage_ratio")
    assert kv.value == 0.0921
    assert kv.labels == {
        "model_name": MISTRAL,
        "engine": "vllm",
        "source_metric": "vllm:gpu_cache_usage_perc",
    }
    itl = find(env, "ragwatch_itl_seconds_bucket")
    assert [(s.labels["le"], s.value) for s in itl] == [
        ("0.01", 1045.0),
        ("0.025", 19870.0),
        ("0.05", 20144.0),
        ("+Inf", 20144.0),
    ]
    assert itl[0].labels["source_metric"] == "vllm:time_per_output_token_seconds_bucket"
    assert value(env, "ragwatch_itl_seconds_sum") == 342.5
    assert value(env, "vllm:num_requests_swapped") == 0.0  # removed in V1: passed through
    assert value(env, "vllm:cpu_cache_usage_perc") == 0.0


def test_vllm_exposing_both_names_keeps_the_new_one(exporter: Exporter) -> None:
    # During a deprecation window vLLM shows the old name next to the new one.
    old = (
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        f'vllm:gpu_cache_usage_perc{{engine="0",model_name="{LLAMA}"}} 0.5\n'
    )
    src = source([exporter.serve("/metrics", old + fixture("vllm"))])
    env = metrics_of(src.sample())
    (kv,) = find(env, "ragwatch_kv_cache_usage_ratio")
    assert (kv.value, kv.labels["source_metric"]) == (0.4375, "vllm:kv_cache_usage_perc")
    assert src.stats[exporter.url("/metrics")].duplicate_series == 1


# ---------------------------------------------------------------- SGLang

QWEN = "Qwen/Qwen2.5-7B-Instruct"
RANK0 = {"model_name": QWEN, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}


def test_sglang_is_renamed(exporter: Exporter) -> None:
    """SGLang's /metrics (``--enable-metrics``): the scheduler's gauges and queue time
    (labelled by rank), the tokenizer manager's counters and histograms."""
    env = metrics_of(scrape_one(exporter, fixture("sglang")))
    assert find(env, "ragwatch_requests_waiting") == [
        MetricSample(
            "ragwatch_requests_waiting",
            {**RANK0, "engine": "sglang", "source_metric": "sglang:num_queue_reqs"},
            6.0,
        )
    ]
    assert value(env, "ragwatch_requests_running") == 18.0
    assert value(env, "ragwatch_kv_cache_usage_ratio") == 0.71
    assert value(env, "ragwatch_prompt_tokens_total") == 9_874_211.0
    assert value(env, "ragwatch_generation_tokens_total") == 743_602.0
    assert value(env, "ragwatch_requests_total") == 3438.0
    assert value(env, "ragwatch_preemptions_total") == 4.0
    assert value(env, "ragwatch_prefix_cache_hits_total") == 5_120_443.0
    assert value(env, "ragwatch_ttft_seconds_bucket", le="0.4") == 2630.0
    assert value(env, "ragwatch_ttft_seconds_sum") == 1203.3
    assert value(env, "ragwatch_itl_seconds_count") == 740_164.0
    assert value(env, "ragwatch_e2e_seconds_count") == 3438.0
    assert value(env, "ragwatch_queue_seconds_sum", tp_rank="0") == 412.7
    assert value(env, "ragwatch_request_generation_tokens_bucket", le="256") == 3050.0
    assert find(env, "ragwatch_ttft_seconds_count")[0].labels == {
        "model_name": QWEN,
        "engine": "sglang",
        "source_metric": "sglang:time_to_first_token_seconds_count",
    }
    # aborts (client disconnects among them) are no failures; a last batch's hit rate and
    # a log interval's throughput are not the rates ragwatch computes: passed through
    assert value(env, "sglang:num_aborted_requests_total") == 11.0
    assert value(env, "sglang:cache_hit_rate") == 0.0
    assert find(env, "ragwatch_requests_failed_total") == []


def engine_signals(
    exporter: Exporter, name: str, later: Mapping[str, float], dt: float
) -> dict[str, float | None]:
    """The engine's signals after two scrapes of fixture ``name``, ``dt`` apart, through the
    pipelines: the second with each line that starts with a key of ``later`` at its value."""
    clock = {"t": TS}
    src = PromSource(
        [exporter.serve("/metrics", fixture(name))], host=NODE, clock=lambda: clock["t"]
    )
    pipes = Pipelines(load_rules())
    lines = []
    for line in fixture(name).splitlines():
        prefix = next((p for p in later if line.startswith(p)), None)
        lines.append(line if prefix is None else f"{line.rsplit(' ', 1)[0]} {later[prefix]}")
    for text in (None, "\n".join(lines) + "\n"):
        if text is not None:
            exporter.serve("/metrics", text)
            clock["t"] += dt
        for env in src.sample():
            pipes.process(env)
    ((engine,),) = [pipes.metrics.engine_snapshot(NODE)]
    assert engine["target"] == exporter.url("/metrics")
    return dict(engine["signals"])


def test_sglangs_scrapes_become_the_engines_signals(exporter: Exporter) -> None:
    """Two scrapes of an SGLang server 15 s apart, through the pipelines: the queue, the
    running requests and the KV cache as SGLang reports them, and rates and mean latencies
    from its counters and histograms."""
    later = {  # 15 s on: 30 requests more, each ~0.35 s to its first token
        "sglang:num_requests_total{": 3468.0,
        "sglang:generation_tokens_total{": 750_802.0,
        "sglang:prompt_tokens_total{": 9_960_211.0,
        "sglang:num_retracted_requests_total{": 7.0,
        "sglang:time_to_first_token_seconds_count{": 3468.0,
        "sglang:time_to_first_token_seconds_sum{": 1213.8,
        "sglang:queue_time_seconds_count{": 3468.0,
        "sglang:queue_time_seconds_sum{": 415.7,
        "sglang:num_queue_reqs{": 9.0,
        "sglang:token_usage{": 0.83,
    }
    sig = engine_signals(exporter, "sglang", later, 15.0)
    assert (sig["requests_waiting"], sig["kv_cache_usage_ratio"]) == (9.0, 0.83)
    assert sig["requests_running"] == 18.0
    assert sig["requests_per_s"] == pytest.approx(2.0)
    assert sig["generation_tokens_per_s"] == pytest.approx(480.0)
    assert sig["prompt_tokens_per_s"] == pytest.approx(5733.33, abs=0.01)
    assert sig["tokens_per_request"] == pytest.approx(240.0)
    assert sig["preemptions_per_s"] == pytest.approx(0.2)
    assert sig["ttft_mean_s"] == pytest.approx(0.35)
    assert sig["queue_mean_s"] == pytest.approx(0.1)
    assert sig["errors_ratio"] is None  # SGLang counts no failures


# ---------------------------------------------------------------- TEI, llama.cpp


def test_tei_is_renamed(exporter: Exporter) -> None:
    """Text Embeddings Inference (a RAG service's embedder or reranker): counters without
    ``_total`` and no HELP, as the metrics crate's exporter writes them."""
    env = metrics_of(scrape_one(exporter, fixture("tei")))
    assert find(env, "ragwatch_requests_total", method="batch") == [
        MetricSample(
            "ragwatch_requests_total",
            {"method": "batch", "engine": "tei", "source_metric": "te_request_count"},
            290.0,
        )
    ]
    assert value(env, "ragwatch_requests_succeeded_total", method="single") == 1702.0
    assert value(env, "ragwatch_requests_failed_total", err="overloaded") == 9.0
    assert value(env, "ragwatch_requests_waiting") == 14.0
    assert value(env, "ragwatch_e2e_seconds_count") == 1990.0
    assert value(env, "ragwatch_queue_seconds_sum") == 4.056679
    assert value(env, "ragwatch_inference_seconds_bucket", le="+Inf") == 1990.0
    assert value(env, "ragwatch_request_prompt_tokens_count") == 2630.0
    assert value(env, "te_embed_count") == 2630.0  # per input: passed through


def test_llamacpp_is_renamed(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("llamacpp")))
    assert find(env, "ragwatch_requests_waiting") == [
        MetricSample(
            "ragwatch_requests_waiting",
            {"engine": "llamacpp", "source_metric": "llamacpp:requests_deferred"},
            2.0,
        )
    ]
    assert value(env, "ragwatch_requests_running") == 4.0
    assert value(env, "ragwatch_prompt_tokens_total") == 5_129_934.0
    assert value(env, "ragwatch_generation_tokens_total") == 410_226.0
    assert value(env, "llamacpp:predicted_tokens_seconds") == 79.97  # passed through


def test_teis_scrapes_become_the_engines_signals(exporter: Exporter) -> None:
    """An embedder's requests, failures, queue and latency, as rates and means."""
    later = {  # 10 s on: 100 requests more, 2 of them refused as overloaded
        'te_request_count{method="single"}': 1810.0,
        'te_request_success{method="single"}': 1800.0,
        'te_request_failure{err="overloaded"}': 11.0,
        "te_request_duration_sum": 49.629135,
        "te_request_duration_count": 2088.0,
        "te_request_queue_duration_sum": 4.546679,
        "te_request_queue_duration_count": 2088.0,
    }
    sig = engine_signals(exporter, "tei", later, 10.0)
    assert sig["requests_per_s"] == pytest.approx(10.0)
    assert sig["errors_ratio"] == pytest.approx(0.02)
    assert sig["e2e_mean_s"] == pytest.approx(0.05)
    assert sig["queue_mean_s"] == pytest.approx(0.005)
    assert sig["requests_waiting"] == 14.0


# ---------------------------------------------------------------- TGI


def test_tgi_is_renamed(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("tgi")))
    assert find(env, "ragwatch_requests_total") == [
        MetricSample(
            "ragwatch_requests_total",
            {"engine": "tgi", "source_metric": "tgi_request_count"},
            1289.0,
        )
    ]
    assert value(env, "ragwatch_requests_succeeded_total") == 1270.0
    assert value(env, "ragwatch_requests_failed_total", err="validation") == 12.0
    assert value(env, "ragwatch_requests_failed_total", err="overloaded") == 7.0
    assert value(env, "ragwatch_requests_waiting") == 5.0
    assert value(env, "ragwatch_requests_running") == 24.0
    assert value(env, "ragwatch_e2e_seconds_bucket", le="1.122274146401882") == 301.0
    assert value(env, "ragwatch_e2e_seconds_count") == 1270.0
    assert value(env, "ragwatch_queue_seconds_sum") == 29.0417
    assert value(env, "ragwatch_tpot_seconds_count") == 1270.0
    assert value(env, "ragwatch_request_prompt_tokens_bucket", le="1024") == 977.0
    assert value(env, "ragwatch_request_generation_tokens_sum") == 61523.0
    assert find(env, "ragwatch_e2e_seconds_sum")[0].labels == {
        "engine": "tgi",
        "source_metric": "tgi_request_duration_sum",
    }


def test_tgi_unknown_metrics_keep_their_exposed_names(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("tgi")))
    # A counter exposed without _total keeps its name (prometheus_client's parser adds one).
    assert value(env, "tgi_batch_inference_count", method="decode") == 60233.0
    assert find(env, "tgi_batch_inference_count_total") == []
    assert value(env, "tgi_batch_current_max_tokens") == 31744.0
    assert value(env, "tgi_batch_forward_duration_bucket", le="+Inf") == 60233.0


# ---------------------------------------------------------------- Triton


def test_triton_counts_and_gauges(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("triton")))
    llama = {"model": "llama3_8b", "version": "1"}
    assert find(env, "ragwatch_requests_succeeded_total", model="llama3_8b") == [
        MetricSample(
            "ragwatch_requests_succeeded_total",
            {**llama, "engine": "triton", "source_metric": "nv_inference_request_success"},
            1523.0,
        )
    ]
    assert value(env, "ragwatch_requests_failed_total", model="llama3_8b", reason="BACKEND") == 1
    assert len(find(env, "ragwatch_requests_failed_total")) == 8
    assert value(env, "ragwatch_inferences_total", model="bge_reranker") == 269_120.0
    assert value(env, "ragwatch_batch_executions_total", model="bge_reranker") == 2102.0
    assert value(env, "ragwatch_requests_waiting", model="llama3_8b") == 6.0
    gpu = "GPU-3f7a1c2e-8b4d-4e6f-9a10-2b3c4d5e6f70"
    assert value(env, "ragwatch_gpu_utilization_ratio", gpu_uuid=gpu) == 0.87
    assert value(env, "ragwatch_gpu_memory_used_bytes", gpu_uuid=gpu) == 74210 * MIB
    assert value(env, "ragwatch_gpu_power_watts", gpu_uuid=gpu) == 512.337
    assert value(env, "ragwatch_gpu_energy_joules_total", gpu_uuid=gpu) == 1_843_022.511
    assert value(env, "nv_cpu_utilization") == 0.112  # not in the table: passed through


def test_triton_microsecond_counters_become_seconds_sum_and_count(exporter: Exporter) -> None:
    src = source([exporter.serve("/metrics", fixture("triton"))])
    env = metrics_of(src.sample())
    e2e_sum = find(env, "ragwatch_e2e_seconds_sum", model="llama3_8b")
    e2e_count = find(env, "ragwatch_e2e_seconds_count", model="llama3_8b")
    # The counters win over the summary's own _sum/_count (same values, listed later).
    assert len(e2e_sum) == len(e2e_count) == 1
    assert e2e_sum[0].value == 4571.234567
    assert e2e_sum[0].labels["source_metric"] == "nv_inference_request_duration_us"
    assert e2e_count[0].value == 1523.0
    assert e2e_count[0].labels == {
        "model": "llama3_8b",
        "version": "1",
        "engine": "triton",
        "source_metric": "nv_inference_request_success",
    }
    assert value(env, "ragwatch_e2e_seconds_sum", model="bge_reranker") == 151.38
    assert value(env, "ragwatch_e2e_seconds_count", model="bge_reranker") == 8410.0
    assert value(env, "ragwatch_queue_seconds_sum", model="llama3_8b") == 61.234567
    assert value(env, "ragwatch_queue_seconds_count", model="bge_reranker") == 8410.0
    assert value(env, "ragwatch_compute_infer_seconds_total", model="llama3_8b") == 4498.002111
    assert value(env, "ragwatch_compute_input_seconds_total", model="bge_reranker") == 2.522
    assert src.stats[exporter.url("/metrics")].duplicate_series == 4


def test_triton_summary_quantiles_are_seconds(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("triton")))
    quantiles = {
        s.labels["quantile"]: s.value for s in find(env, "ragwatch_e2e_seconds", model="llama3_8b")
    }
    assert quantiles == {
        "0.5": 2.811456,
        "0.9": 5.120733,
        "0.95": 6.003112,
        "0.99": 8.890004,
        "0.999": 9.921,
    }
    assert value(env, "ragwatch_queue_seconds", quantile="0.5") == 0.000035
    assert find(env, "ragwatch_queue_seconds", quantile="0.5")[0].labels["source_metric"] == (
        "nv_inference_queue_summary_us"
    )


def test_triton_millisecond_histogram_bounds_are_rescaled(exporter: Exporter) -> None:
    text = (
        "# HELP nv_inference_first_response_histogram_ms Duration from request to first "
        "response in milliseconds\n"
        "# TYPE nv_inference_first_response_histogram_ms histogram\n"
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="100"} 3\n'
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="500"} 9\n'
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="+Inf"} 10\n'
        'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 2345\n'
        'nv_inference_first_response_histogram_ms_count{model="m",version="1"} 10\n'
    )
    env = metrics_of(scrape_one(exporter, text))
    buckets = find(env, "ragwatch_ttft_seconds_bucket")
    assert [(s.labels["le"], s.value) for s in buckets] == [
        ("0.1", 3.0),
        ("0.5", 9.0),
        ("+Inf", 10.0),
    ]
    assert value(env, "ragwatch_ttft_seconds_sum") == 2.345
    assert value(env, "ragwatch_ttft_seconds_count") == 10.0


def test_tensorrt_llms_labelled_gauges_and_token_sums_are_renamed(exporter: Exporter) -> None:
    """TensorRT-LLM's backend for Triton: one gauge family whose label says what each
    series is (the requests waiting and scheduled, the KV cache's used fraction); the
    token histograms' sums count the tokens; the rest passes through."""
    env = metrics_of(scrape_one(exporter, fixture("trtllm")))
    waiting = find(env, "ragwatch_requests_waiting", source_metric="nv_trt_llm_request_metrics")
    assert waiting == [
        MetricSample(
            "ragwatch_requests_waiting",
            {"model": "tensorrt_llm", "request_type": "waiting", "version": "1",
             "engine": "triton", "source_metric": "nv_trt_llm_request_metrics"},
            3.0,
        )
    ]  # fmt: skip
    assert value(env, "ragwatch_requests_running") == 11.0  # scheduled, not active or max
    assert value(env, "ragwatch_kv_cache_usage_ratio") == 0.4875
    assert value(env, "ragwatch_generation_tokens_total") == 401_977.0
    assert value(env, "ragwatch_prompt_tokens_total") == 3_902_411.0
    assert value(env, "nv_trt_llm_request_metrics", request_type="active") == 14.0
    assert value(env, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") == 3041
    assert value(env, "nv_llm_output_token_len_count") == 2210.0


def test_older_tensorrt_llm_releases_get_waiting_and_kv_usage_computed(
    exporter: Exporter,
) -> None:
    """A release without the ``waiting`` and ``fraction`` series: active less scheduled
    requests, used over max KV cache blocks, as newer releases compute them; a release
    with them gets no second series."""
    older = "\n".join(
        line for line in fixture("trtllm").splitlines()
        if 'request_type="waiting"' not in line and 'kv_cache_block_type="fraction"' not in line
    ) + "\n"  # fmt: skip
    env = metrics_of(scrape_one(exporter, older))
    assert find(env, "ragwatch_requests_waiting", source_metric="nv_trt_llm_request_metrics") == [
        MetricSample(
            "ragwatch_requests_waiting",
            {"model": "tensorrt_llm", "request_type": "waiting", "version": "1",
             "engine": "triton", "source_metric": "nv_trt_llm_request_metrics"},
            3.0,  # 14 active, 11 scheduled
        )
    ]  # fmt: skip
    assert value(env, "ragwatch_kv_cache_usage_ratio") == pytest.approx(3041 / 6239)
    newer = metrics_of(scrape_one(exporter, fixture("trtllm")))
    assert len(find(newer, "ragwatch_kv_cache_usage_ratio")) == 1
    assert len(find(newer, "ragwatch_requests_waiting", request_type="waiting")) == 1


def test_tensorrt_llms_scrapes_become_the_engines_signals(exporter: Exporter) -> None:
    later = {  # 20 s on: 40 requests more, 7,200 tokens generated
        "nv_inference_request_success{": 2250.0,
        'nv_llm_output_token_len_sum{model="tensorrt_llm",': 409_177.0,
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting"': 5.0,
    }
    sig = engine_signals(exporter, "trtllm", later, 20.0)
    assert sig["requests_waiting"] == 5.0  # the backend's 5, Triton's own queue empty
    assert (sig["requests_running"], sig["kv_cache_usage_ratio"]) == (11.0, 0.4875)
    assert sig["requests_per_s"] == pytest.approx(2.0)
    assert sig["generation_tokens_per_s"] == pytest.approx(360.0)
    assert sig["tokens_per_request"] == pytest.approx(180.0)


# ---------------------------------------------------------------- dcgm-exporter


H100 = "NVIDIA H100 80GB HBM3"
EXPECTED_GPUS = (
    GpuSample(
        index=0,
        uuid="GPU-3f7a1c2e-8b4d-4e6f-9a10-2b3c4d5e6f70",
        name=H100,
        fb_used=74210 * MIB,
        fb_total=(74210 + 6820 + 529) * MIB,
        fb_reserved=529 * MIB,
        gpu_util=87.0,
        mem_copy_util=41.0,
        temp_c=61.0,
        power_w=512.337,
    ),
    GpuSample(
        index=1,
        uuid="GPU-9c1d4e7a-2f3b-4c5d-8e6f-7a8b9c0d1e2f",
        name=H100,
        fb_used=1024 * MIB,
        fb_total=(1024 + 80006 + 529) * MIB,
        fb_reserved=529 * MIB,
        gpu_util=0.0,
        mem_copy_util=0.0,
        temp_c=34.0,
        power_w=71.5,
    ),
    GpuSample(
        index=2,
        uuid="GPU-5e2b8f1c-6d7a-4b3e-9c2d-1f0e9d8c7b6a",
        name=f"{H100} MIG 3g.40gb",
        mig="GI1",
        fb_used=30211 * MIB,
        fb_total=(30211 + 9981) * MIB,
        temp_c=48.0,
        power_w=203.1,
    ),
)


def test_dcgm_becomes_a_gpu_envelope_in_bytes(exporter: Exporter) -> None:
    envs = scrape_one(exporter, fixture("dcgm"))
    gpu_envs = [e for e in envs if isinstance(e, GpuEnvelope)]
    assert gpu_envs == [GpuEnvelope(host=NODE, ts=TS, gpus=EXPECTED_GPUS)]
    assert envs[0] == gpu_envs[0]  # GPUs first, then the metrics


def test_dcgm_mig_instance_without_fb_goes_to_metrics(exporter: Exporter) -> None:
    src = source([exporter.serve("/metrics", fixture("dcgm"))])
    env = metrics_of(src.sample())
    (temp,) = find(env, "ragwatch_gpu_temperature_celsius")
    assert temp.value == 48.0
    assert temp.labels == {
        "gpu": "2",
        "UUID": "GPU-5e2b8f1c-6d7a-4b3e-9c2d-1f0e9d8c7b6a",
        "pci_bus_id": "00000000:3D:00.0",
        "device": "nvidia2",
        "modelName": H100,
        "GPU_I_PROFILE": "3g.40gb",
        "GPU_I_ID": "2",
        "Hostname": NODE,
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
        "engine": "dcgm",
        "source_metric": "DCGM_FI_DEV_GPU_TEMP",
    }
    assert value(env, "ragwatch_gpu_power_watts", GPU_I_ID="2") == 203.1
    # Fields folded into the GpuEnvelope are not sent twice.
    folded = set(prom_map.GPU_FIELDS)
    assert [s for s in env.samples if s.name in folded] == []
    assert len([s for s in env.samples if s.labels.get("engine") == "dcgm"]) == 2
    assert src.stats[exporter.url("/metrics")].incomplete_gpus == 1


def test_dcgm_other_fields_pass_through(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, fixture("dcgm")))
    assert value(env, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1980.0
    assert value(env, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", GPU_I_ID="2") == 0.120451
    # A counter exposed without _total keeps its exposed name.
    assert value(env, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="1") == 12_870_554_120.0
    assert len(find(env, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")) == 2


@pytest.mark.parametrize(
    ("edit", "host"),
    [
        (lambda t: t.replace(f'Hostname="{NODE}",', ""), "agent-host"),
        (lambda t: t.replace("Hostname=", "hostname="), NODE),
    ],
    ids=["no-hostname-label", "lowercase-hostname"],
)
def test_dcgm_host_comes_from_the_hostname_label_else_the_agent(
    exporter: Exporter, edit: Callable[[str], str], host: str
) -> None:
    envs = scrape_one(exporter, edit(fixture("dcgm")))
    (gpu_env,) = [e for e in envs if isinstance(e, GpuEnvelope)]
    assert gpu_env.host == host
    assert gpu_env.gpus == EXPECTED_GPUS
    # the exporter's other fields are the same host's: filed beside its GPUs, not under
    # the agent that scraped them
    assert metrics_of(envs).host == host


def test_a_target_named_on_the_command_line_files_everything_under_that_host(
    exporter: Exporter,
) -> None:
    """``--target gpu-node-09=URL``: the name wins over the exporter's Hostname label (in
    Kubernetes dcgm-exporter's Hostname is often its own pod's name)."""
    url = exporter.serve("/metrics", fixture("dcgm"))
    src = PromSource([Target(url, "gpu-node-09", pinned=True)], host="agent-host", clock=lambda: TS)
    envs = src.sample()
    assert {e.host for e in envs} == {"gpu-node-09"}
    assert [e.host for e in envs if isinstance(e, GpuEnvelope)] == ["gpu-node-09"]


def test_an_engine_target_is_filed_under_its_targets_host(exporter: Exporter) -> None:
    """A vLLM scraped from another machine: its metrics name that machine, as the SDK's
    records of the service on it do (the hint joins them by host)."""
    vllm = exporter.serve("/vllm", fixture("vllm"))
    dcgm = exporter.serve("/dcgm", fixture("dcgm"))
    src = PromSource(
        [Target(vllm, "gpu-node-03"), Target(dcgm)], host="agent-host", clock=lambda: TS
    )
    envs = src.sample()
    by_target = {e.target: e.host for e in envs if isinstance(e, MetricsEnvelope)}
    assert by_target == {vllm: "gpu-node-03", dcgm: NODE}
    assert src.host_of(vllm) == ("gpu-node-03", ("Hostname", "hostname"))


def test_host_labels_are_configurable(exporter: Exporter) -> None:
    text = fixture("vllm").replace('model_name="', 'node="gpu-node-05",model_name="')
    envs = scrape_one(exporter, text, host_labels=("node",))
    hosts = {e.host: e for e in envs if isinstance(e, MetricsEnvelope)}
    assert set(hosts) == {"gpu-node-05", "agent-host"}  # samples without the label: default
    assert value(hosts["gpu-node-05"], "ragwatch_requests_running") == 12.0


def _with_pods(text: str) -> str:
    """dcgm-exporter's Kubernetes mapping on the fixture: GPU 0 held by one container,
    GPU 1 labelled the old way (--kubernetes-use-old-namespace), MIG instance GI1 shared
    by two containers (the exporter repeats each of its series once per container)."""
    gpu0 = 'gpu="0",'
    gpu1 = 'gpu="1",'
    out = []
    for line in text.splitlines():
        if gpu0 in line:
            line = line.replace(
                gpu0, gpu0 + 'namespace="rag",pod="retriever-0",container="server",'
            )
        elif gpu1 in line:
            line = line.replace(
                gpu1, gpu1 + 'pod_namespace="ml",pod_name="train-7",container_name="torch",'
            )
        elif 'GPU_I_ID="1"' in line:
            for pod in ("notebook-a", "notebook-b"):
                out.append(
                    line.replace(
                        'GPU_I_ID="1"',
                        f'GPU_I_ID="1",namespace="lab",pod="{pod}",container="jupyter"',
                    )
                )
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def test_dcgm_kubernetes_labels_name_the_gpus_container(exporter: Exporter) -> None:
    envs = scrape_one(exporter, _with_pods(fixture("dcgm")))
    (gpu_env,) = [e for e in envs if isinstance(e, GpuEnvelope)]
    by_index = {(g.index, g.mig): g for g in gpu_env.gpus}
    pods = {k: (g.namespace, g.pod, g.container) for k, g in by_index.items()}
    assert pods == {
        (0, None): ("rag", "retriever-0", "server"),
        (1, None): ("ml", "train-7", "torch"),
        (2, "GI1"): (None, None, None),  # shared: no one container holds it
    }
    # everything else about the GPUs is as without the mapping
    bare = tuple(
        dataclasses.replace(g, namespace=None, pod=None, container=None) for g in gpu_env.gpus
    )
    assert bare == EXPECTED_GPUS
    assert codec.decode(codec.encode(gpu_env)) == gpu_env


# ---------------------------------------------------------------- caps and bad values


def _many_series(n: int) -> str:
    lines = ["# HELP app_things Some things.", "# TYPE app_things gauge"]
    lines += [f'app_things{{shard="{i}"}} {i}' for i in range(n)]
    return "\n".join(lines) + "\n"


def test_series_cap_keeps_renamed_series_first_and_warns_once(
    exporter: Exporter, caplog: pytest.LogCaptureFixture
) -> None:
    text = _many_series(30) + fixture("vllm_legacy")  # 30 unknown, then 27 vLLM series
    src = source([exporter.serve("/metrics", text)], series_cap=40)
    with caplog.at_level(logging.WARNING, logger="ragwatch.agents.prom"):
        first = metrics_of(src.sample())
        second = metrics_of(src.sample())
    assert len(first.samples) == len(second.samples) == 40
    renamed = [s for s in first.samples if "source_metric" in s.labels]
    assert first.samples[: len(renamed)] == tuple(renamed)  # renamed ones are all kept
    assert [s.labels["shard"] for s in first.samples[len(renamed) :]] == [
        str(i) for i in range(40 - len(renamed))
    ]
    st = src.stats[exporter.url("/metrics")]
    assert st.dropped_series == 2 * (30 + 27 - 40)
    assert len([r for r in caplog.records if "series_cap" in r.getMessage()]) == 1


def test_unknown_series_pass_through_up_to_the_cap(exporter: Exporter) -> None:
    env = metrics_of(scrape_one(exporter, _many_series(5), series_cap=5))
    assert [(s.name, s.labels, s.value) for s in env.samples] == [
        ("app_things", {"shard": str(i)}, float(i)) for i in range(5)
    ]


def test_non_finite_values_are_dropped_and_counted(exporter: Exporter) -> None:
    text = (
        "# TYPE app_ok gauge\napp_ok 1\n"
        "# TYPE app_nan gauge\napp_nan NaN\n"
        "# TYPE app_inf gauge\napp_inf +Inf\napp_ninf -Inf\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc NaN\n"
    )
    src = source([exporter.serve("/metrics", text)])
    env = metrics_of(src.sample())
    assert [s.name for s in env.samples] == ["app_ok"]
    assert src.stats[exporter.url("/metrics")].non_finite == 4


@pytest.mark.parametrize(
    "text", ["", "# TYPE app_nan gauge\napp_nan NaN\n", "# HELP nothing here\n"]
)
def test_no_envelope_without_samples(exporter: Exporter, text: str) -> None:
    src = source([exporter.serve("/metrics", text)])
    assert src.sample() == []
    assert src.stats[exporter.url("/metrics")].scrapes == 1


# ---------------------------------------------------------------- counters across scrapes


def test_counter_reset_is_shipped_as_scraped(exporter: Exporter) -> None:
    url = exporter.serve("/metrics", fixture("vllm"))
    times = iter([TS, TS + 10])
    src = PromSource([url], host="agent-host", clock=lambda: next(times))
    before = metrics_of(src.sample())
    # vLLM restarted: its counters start again from zero.
    exporter.serve("/metrics", fixture("vllm").replace("} 402117.0", "} 12.0"))
    after = metrics_of(src.sample())
    assert value(before, "ragwatch_generation_tokens_total") == 402_117.0
    assert value(after, "ragwatch_generation_tokens_total") == 12.0
    assert (before.ts, after.ts) == (TS, TS + 10)


# ---------------------------------------------------------------- failing targets


def test_failing_targets_are_counted_and_skipped(
    exporter: Exporter, caplog: pytest.LogCaptureFixture
) -> None:
    good = exporter.serve("/good", fixture("tgi"))
    broken = exporter.serve("/broken", "oops", status=500)
    malformed = exporter.serve("/malformed", 'tgi_queue_size{err="x} 1\n')
    exporter.routes["/slow"] = Route(fixture("tgi").encode(), hang=True)
    slow, down = exporter.url("/slow"), closed_port_url()
    src = source([down, broken, slow, malformed, good], timeout_s=0.5)
    with caplog.at_level(logging.INFO, logger="ragwatch.agents.prom"):
        envs = src.sample()
        envs += src.sample()
    assert [e.target for e in envs if isinstance(e, MetricsEnvelope)] == [good, good]
    st = src.stats
    assert (st[down].fetch_errors, st[broken].fetch_errors, st[slow].fetch_errors) == (2, 2, 2)
    assert (st[malformed].parse_errors, st[malformed].fetch_errors) == (2, 0)
    assert (st[good].scrapes, st[good].fetch_errors, st[good].parse_errors) == (2, 0, 0)
    assert "500" in (st[broken].last_error or "")
    assert "timed out" in (st[slow].last_error or "")
    assert "malformed exposition" in (st[malformed].last_error or "")
    assert [st[u].up for u in (down, broken, slow, malformed, good)] == [False] * 4 + [True]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4  # once per failing target, not once per scrape
    # The broken target recovers.
    exporter.serve("/broken", fixture("tgi"))
    with caplog.at_level(logging.INFO, logger="ragwatch.agents.prom"):
        src.sample()
    assert st[broken].up is True and st[broken].scrapes == 1
    assert any("is back" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "text",
    [
        'foo{a="b} 1\n',  # unterminated label value
        "foo abc\n",  # not a number
        'foo{le="0.1", ="y"} 1\n',  # empty label name (the parser's IndexError)
        "# TYPE\n",
        "\x00\x01\x02 binary\n",
    ],
)
def test_malformed_exposition_is_counted_not_raised(exporter: Exporter, text: str) -> None:
    url = exporter.serve("/metrics", fixture("tgi") + text)
    src = source([url])
    assert src.sample() == []
    assert src.stats[url].parse_errors == 1


def test_a_raising_fetch_is_contained() -> None:
    def refuse(url: str, timeout_s: float) -> str:
        raise ConnectionResetError("reset by peer")

    src = PromSource(["http://10.0.0.1:9400/metrics"], host="h", fetch=refuse)
    assert src.sample() == []
    assert src.stats["http://10.0.0.1:9400/metrics"].fetch_errors == 1


def test_fetch_asks_for_the_text_format_and_caps_the_size(exporter: Exporter) -> None:
    url = exporter.serve("/metrics", fixture("vllm"))
    assert fetch_text(url, 2.0) == fixture("vllm")
    assert "text/plain;version=0.0.4" in exporter.seen_headers[-1]["Accept"]
    with pytest.raises(ScrapeError, match="larger than 1000 bytes"):
        fetch_text(url, 2.0, max_bytes=1000)
    src = source([url], fetch=functools.partial(fetch_text, max_bytes=1000))
    assert src.sample() == []
    assert src.stats[url].fetch_errors == 1


@pytest.mark.parametrize(
    ("targets", "host"),
    [
        ([], "h"),
        (["http://a/m", "http://a/m"], "h"),
        (["a:9400/metrics"], "h"),
        (["http://a/m"], ""),
    ],
)
def test_bad_arguments_are_refused(targets: list[str], host: str) -> None:
    with pytest.raises(ValueError):
        PromSource(targets, host=host)


# ---------------------------------------------------------------- wire format and tables


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.txt")))
def test_every_envelope_round_trips_through_the_codec(exporter: Exporter, name: str) -> None:
    envs = scrape_one(exporter, fixture(name))
    assert envs
    for env in envs:
        assert codec.decode(codec.encode(env)) == env


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.txt")))
def test_fixtures_are_well_formed_expositions(name: str) -> None:
    for family in text_string_to_metric_families(fixture(name)):
        assert family.type != "unknown", family.name
        # TEI's exporter (the metrics crate's) writes no HELP: TEI registers none
        assert family.documentation or name == "tei", family.name
        if family.type != "histogram":
            continue
        buckets: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
        counts = {}
        for s in family.samples:
            key = frozenset((k, v) for k, v in s.labels.items() if k != "le")
            if s.name.endswith("_bucket"):
                buckets.setdefault(key, []).append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                counts[key] = s.value
        for key, series in buckets.items():
            assert series == sorted(series), family.name  # le and counts ascending
            assert series[-1] == (float("inf"), counts[key]), family.name


def test_the_table_names_an_engine_for_every_source() -> None:
    assert all(prom_map.engine_of(name) for name in prom_map.METRICS)
    assert set(prom_map.GPU_FIELDS) <= set(prom_map.METRICS)
    for sum_source, count_source in prom_map.TRITON_COUNTS.values():
        assert {sum_source, count_source} <= set(prom_map.METRICS)
    assert all(name.startswith("ragwatch_") for name, _ in prom_map.METRICS.values())


def test_values_beyond_range_after_scaling_are_dropped(exporter: Exporter) -> None:
    text = (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 1e305\n'
        "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1"} 1\n'
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 40\n'
    )
    src = source([exporter.serve("/metrics", text)])
    env = metrics_of(src.sample())  # no GpuEnvelope: the GPU cannot be stated in bytes
    assert [(s.name, s.value) for s in env.samples] == [
        ("ragwatch_gpu_memory_free_bytes", float(MIB)),
        ("ragwatch_gpu_temperature_celsius", 40.0),
    ]
    st = src.stats[exporter.url("/metrics")]
    assert (st.non_finite, st.incomplete_gpus) == (1, 1)


def test_dcgm_xid_gauge_changes_become_one_event_each_and_their_alert_resolves(
    exporter: Exporter,
) -> None:
    """dcgm-exporter's DCGM_FI_DEV_XID_ERRORS holds the last XID until the exporter
    restarts: as a value it would page forever. Its changes are XID events, as the nvml
    agent sends them, and GpuXidCritical fires once per new XID and ages out."""
    dcgm = (FIXTURES / "dcgm.txt").read_text()
    assert 'DCGM_FI_DEV_XID_ERRORS{gpu="0"' in dcgm
    clock = {"t": TS}
    src = PromSource(
        [exporter.serve("/metrics", dcgm)], host="agent-host", clock=lambda: clock["t"]
    )

    def scrape(xid0: int) -> list[Envelope]:
        lines = [
            (line.rsplit(" ", 1)[0] + f" {xid0}")
            if line.startswith('DCGM_FI_DEV_XID_ERRORS{gpu="0"')
            else line
            for line in dcgm.splitlines()
        ]
        exporter.serve("/metrics", "\n".join(lines) + "\n")
        clock["t"] += 60.0
        return src.sample()

    pipes = Pipelines(load_rules())
    events, pages = [], []
    for xid in (13, 13, 79, 79, 79, *([79] * 40), 43, 0, 0):  # 13: before the agent started
        for env in scrape(xid):
            if isinstance(env, EventEnvelope):
                events.append(env)
            pages += [t for t in pipes.process(env) if t.notify]
    assert [(e.type, e.attrs["xid"], e.attrs["gpu"]) for e in events] == [
        ("xid", 79, 0),
        ("xid", 43, 0),
    ]
    assert events[0].host == "gpu-node-07" and events[0].attrs["source"] == "dcgm-exporter"
    assert events[0].attrs["uuid"].startswith("GPU-3f7a1c2e")
    xid_pages = [
        (t.alert.status, t.alert.labels.get("xid")) for t in pages if "Xid" in t.alert.rule
    ]
    assert xid_pages == [("firing", "79"), ("resolved", "79"), ("firing", "43")]
    metrics = [e for e in src.sample() if isinstance(e, MetricsEnvelope)]
    assert all(s.name != prom_map.XID_FIELD for m in metrics for s in m.samples)
