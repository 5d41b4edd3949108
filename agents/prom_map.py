"""What the Prometheus scrape source makes of what it scrapes: the tables and pure functions.

:mod:`ragwatch.agents.prom` fetches an exposition; this module turns its text into
samples (:func:`parse`), folds dcgm-exporter's framebuffer, utilisation, temperature and
power fields into :class:`~ragwatch.schema.GpuSample` records (:func:`split_gpus`), and
renames the serving engines' metrics to engine-neutral ragwatch names (:func:`map_sample`,
:func:`triton_counts`, :func:`trtllm_derived`). Everything here is a function of its
input; no I/O.

The renaming is one table, :data:`METRICS`: exposed name -> (ragwatch name, unit scale),
and :data:`BY_LABEL` for a gauge family whose label says what each series is.
A histogram or summary is listed once under its base name and its ``_bucket``, ``_sum``
and ``_count`` samples follow it: ``_sum``, quantile values and ``le`` bounds are scaled,
counts are not. A renamed sample keeps its labels and gains ``engine`` (``vllm``,
``sglang``, ``llamacpp``, ``tgi``, ``tei``, ``triton``, ``dcgm``) and ``source_metric``
(the exposed sample name); an exposed label already called so is kept as
``exported_<name>``, as Prometheus does (vLLM V1 labels every sample ``engine="<index>"``).
Counters stay cumulative, as scraped.

The table's order is a priority: when two entries give the same series (vLLM's
deprecated twins during their deprecation window, Triton's latency summary next to its
counters), the one listed first is kept (:func:`select`).

>>> s = parse('# TYPE nv_inference_queue_duration_us counter\\n'
...           'nv_inference_queue_duration_us{model="m",version="1"} 2500000\\n')[0]
>>> mapped = map_sample(s)
>>> mapped is not None and (mapped[1].name, mapped[1].value, mapped[1].labels["engine"])
('ragwatch_queue_seconds_sum', 2.5, 'triton')
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from ragwatch.schema import MAX_UINT, GpuSample, MetricSample, is_label

ONE: Final = Fraction(1)
PERCENT: Final = Fraction(1, 100)
MILLI: Final = Fraction(1, 1000)
MICRO: Final = Fraction(1, 1_000_000)
MIB: Final = Fraction(1024 * 1024)

# Which engine a source metric belongs to, by its prefix.
ENGINE_PREFIXES: Final = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("llamacpp:", "llamacpp"),
    ("tgi_", "tgi"),
    ("te_", "tei"),
    ("nv_", "triton"),
    ("DCGM_", "dcgm"),
)
HISTOGRAM_SUFFIXES: Final = ("_bucket", "_sum", "_count")
ADDED_LABELS: Final = ("engine", "source_metric")

# exposed name -> (ragwatch name, unit scale). Order is priority (first listed wins).
METRICS: Final[Mapping[str, tuple[str, Fraction]]] = {
    # vLLM (docs/design/metrics.md): queue, KV cache, tokens, request latency histograms.
    "vllm:num_requests_waiting": ("ragwatch_requests_waiting", ONE),
    "vllm:num_requests_running": ("ragwatch_requests_running", ONE),
    "vllm:kv_cache_usage_perc": ("ragwatch_kv_cache_usage_ratio", ONE),  # 0-1 despite "perc"
    "vllm:gpu_cache_usage_perc": ("ragwatch_kv_cache_usage_ratio", ONE),  # deprecated name
    "vllm:prompt_tokens_total": ("ragwatch_prompt_tokens_total", ONE),
    "vllm:generation_tokens_total": ("ragwatch_generation_tokens_total", ONE),
    "vllm:request_success_total": ("ragwatch_requests_succeeded_total", ONE),
    "vllm:num_preemptions_total": ("ragwatch_preemptions_total", ONE),
    "vllm:prefix_cache_queries_total": ("ragwatch_prefix_cache_queries_total", ONE),
    "vllm:prefix_cache_hits_total": ("ragwatch_prefix_cache_hits_total", ONE),
    "vllm:time_to_first_token_seconds": ("ragwatch_ttft_seconds", ONE),
    "vllm:inter_token_latency_seconds": ("ragwatch_itl_seconds", ONE),
    "vllm:time_per_output_token_seconds": ("ragwatch_itl_seconds", ONE),  # deprecated name
    "vllm:request_time_per_output_token_seconds": ("ragwatch_tpot_seconds", ONE),
    "vllm:e2e_request_latency_seconds": ("ragwatch_e2e_seconds", ONE),
    "vllm:request_queue_time_seconds": ("ragwatch_queue_seconds", ONE),
    "vllm:request_prefill_time_seconds": ("ragwatch_prefill_seconds", ONE),
    "vllm:request_decode_time_seconds": ("ragwatch_decode_seconds", ONE),
    "vllm:request_inference_time_seconds": ("ragwatch_inference_seconds", ONE),
    "vllm:request_prompt_tokens": ("ragwatch_request_prompt_tokens", ONE),
    "vllm:request_generation_tokens": ("ragwatch_request_generation_tokens", ONE),
    # SGLang (python/sglang/srt/metrics/collector.py; served with --enable-metrics): the
    # scheduler's gauges (of TP rank 0 unless --enable-metrics-for-all-schedulers) and
    # queue time, the tokenizer manager's counters and histograms (counted as each request
    # finishes). Not renamed: num_aborted_requests_total (aborts and client disconnects,
    # not failures), cache_hit_rate (the last prefill batch's only), gen_throughput (a
    # gauge of the last log interval: the rate comes from generation_tokens_total).
    "sglang:num_queue_reqs": ("ragwatch_requests_waiting", ONE),
    "sglang:num_running_reqs": ("ragwatch_requests_running", ONE),
    "sglang:token_usage": ("ragwatch_kv_cache_usage_ratio", ONE),  # 0-1 of the KV token pool
    "sglang:prompt_tokens_total": ("ragwatch_prompt_tokens_total", ONE),
    "sglang:generation_tokens_total": ("ragwatch_generation_tokens_total", ONE),
    "sglang:num_requests_total": ("ragwatch_requests_total", ONE),
    "sglang:num_retracted_requests_total": ("ragwatch_preemptions_total", ONE),
    "sglang:cached_tokens_total": ("ragwatch_prefix_cache_hits_total", ONE),
    "sglang:time_to_first_token_seconds": ("ragwatch_ttft_seconds", ONE),
    "sglang:inter_token_latency_seconds": ("ragwatch_itl_seconds", ONE),
    "sglang:e2e_request_latency_seconds": ("ragwatch_e2e_seconds", ONE),
    "sglang:queue_time_seconds": ("ragwatch_queue_seconds", ONE),
    "sglang:prompt_tokens_histogram": ("ragwatch_request_prompt_tokens", ONE),
    "sglang:generation_tokens_histogram": ("ragwatch_request_generation_tokens", ONE),
    # llama.cpp's server (tools/server, --metrics): gauges and counters, no histograms;
    # tokens are counted as each request finishes. kv_cache_usage_ratio where a build
    # still exposes it (current ones do not).
    "llamacpp:requests_deferred": ("ragwatch_requests_waiting", ONE),
    "llamacpp:requests_processing": ("ragwatch_requests_running", ONE),
    "llamacpp:kv_cache_usage_ratio": ("ragwatch_kv_cache_usage_ratio", ONE),
    "llamacpp:prompt_tokens_total": ("ragwatch_prompt_tokens_total", ONE),
    "llamacpp:tokens_predicted_total": ("ragwatch_generation_tokens_total", ONE),
    # Text Embeddings Inference (the embedder or reranker of a RAG service; router/src,
    # core/src): counters without _total and no HELP (the metrics crate's exporter);
    # latencies in seconds, a batch request's queue and inference times the mean of its
    # inputs'; the queue counts inputs. No tokens are generated.
    "te_request_count": ("ragwatch_requests_total", ONE),
    "te_request_success": ("ragwatch_requests_succeeded_total", ONE),
    "te_request_failure": ("ragwatch_requests_failed_total", ONE),  # label err
    "te_queue_size": ("ragwatch_requests_waiting", ONE),
    "te_request_duration": ("ragwatch_e2e_seconds", ONE),
    "te_request_queue_duration": ("ragwatch_queue_seconds", ONE),
    "te_request_inference_duration": ("ragwatch_inference_seconds", ONE),
    "te_request_input_length": ("ragwatch_request_prompt_tokens", ONE),  # per input
    # TGI (docs/source/reference/metrics.md); counters are exposed without _total.
    "tgi_queue_size": ("ragwatch_requests_waiting", ONE),
    "tgi_batch_current_size": ("ragwatch_requests_running", ONE),
    "tgi_request_count": ("ragwatch_requests_total", ONE),
    "tgi_request_success": ("ragwatch_requests_succeeded_total", ONE),
    "tgi_request_failure": ("ragwatch_requests_failed_total", ONE),  # label err=...
    "tgi_request_duration": ("ragwatch_e2e_seconds", ONE),
    "tgi_request_queue_duration": ("ragwatch_queue_seconds", ONE),
    "tgi_request_inference_duration": ("ragwatch_inference_seconds", ONE),
    "tgi_request_validation_duration": ("ragwatch_validation_seconds", ONE),
    "tgi_request_mean_time_per_token_duration": ("ragwatch_tpot_seconds", ONE),  # per request
    "tgi_request_input_length": ("ragwatch_request_prompt_tokens", ONE),
    "tgi_request_generated_tokens": ("ragwatch_request_generation_tokens", ONE),
    # Triton (docs/user_guide/metrics.md): latencies are cumulative microsecond counters
    # by default; they are the _sum of a histogram whose _count is derived from the
    # success counter (triton_counts). Listed before the opt-in summaries, which repeat
    # their _sum and _count.
    "nv_inference_request_success": ("ragwatch_requests_succeeded_total", ONE),
    "nv_inference_request_failure": ("ragwatch_requests_failed_total", ONE),  # label reason
    "nv_inference_count": ("ragwatch_inferences_total", ONE),
    "nv_inference_exec_count": ("ragwatch_batch_executions_total", ONE),
    "nv_inference_pending_request_count": ("ragwatch_requests_waiting", ONE),
    "nv_inference_request_duration_us": ("ragwatch_e2e_seconds_sum", MICRO),
    "nv_inference_queue_duration_us": ("ragwatch_queue_seconds_sum", MICRO),
    "nv_inference_compute_input_duration_us": ("ragwatch_compute_input_seconds_total", MICRO),
    "nv_inference_compute_infer_duration_us": ("ragwatch_compute_infer_seconds_total", MICRO),
    "nv_inference_compute_output_duration_us": ("ragwatch_compute_output_seconds_total", MICRO),
    "nv_inference_request_summary_us": ("ragwatch_e2e_seconds", MICRO),
    "nv_inference_queue_summary_us": ("ragwatch_queue_seconds", MICRO),
    "nv_inference_compute_input_summary_us": ("ragwatch_compute_input_seconds", MICRO),
    "nv_inference_compute_infer_summary_us": ("ragwatch_compute_infer_seconds", MICRO),
    "nv_inference_compute_output_summary_us": ("ragwatch_compute_output_seconds", MICRO),
    "nv_inference_first_response_histogram_ms": ("ragwatch_ttft_seconds", MILLI),
    # TensorRT-LLM's backend (its custom metrics reporter): each completed request's
    # output and input tokens are observed once, so a histogram's _sum counts the tokens
    # (its buckets and count pass through; the requests are Triton's own counters)
    "nv_llm_output_token_len_sum": ("ragwatch_generation_tokens_total", ONE),
    "nv_llm_input_token_len_sum": ("ragwatch_prompt_tokens_total", ONE),
    "nv_gpu_utilization": ("ragwatch_gpu_utilization_ratio", ONE),  # 0-1
    "nv_gpu_memory_used_bytes": ("ragwatch_gpu_memory_used_bytes", ONE),
    "nv_gpu_memory_total_bytes": ("ragwatch_gpu_memory_total_bytes", ONE),
    "nv_gpu_power_usage": ("ragwatch_gpu_power_watts", ONE),
    "nv_gpu_power_limit": ("ragwatch_gpu_power_limit_watts", ONE),
    "nv_energy_consumption": ("ragwatch_gpu_energy_joules_total", ONE),
    # dcgm-exporter fields of a GPU that could not become a GpuSample (split_gpus).
    "DCGM_FI_DEV_FB_USED": ("ragwatch_gpu_memory_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("ragwatch_gpu_memory_free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("ragwatch_gpu_memory_reserved_bytes", MIB),
    "DCGM_FI_DEV_GPU_UTIL": ("ragwatch_gpu_utilization_ratio", PERCENT),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("ragwatch_gpu_mem_copy_utilization_ratio", PERCENT),
    "DCGM_FI_DEV_GPU_TEMP": ("ragwatch_gpu_temperature_celsius", ONE),
    "DCGM_FI_DEV_POWER_USAGE": ("ragwatch_gpu_power_watts", ONE),
}
# exposed name -> (the label that says what each series is, its value -> (ragwatch name,
# unit scale)): a gauge family of TensorRT-LLM's backend for Triton. "waiting" (active
# less scheduled requests) is in its newer releases only; "fraction" (used / max KV cache
# blocks, 0-1) too: for older ones they are computed the same way (trtllm_derived).
# Listed after METRICS in priority.
BY_LABEL: Final[Mapping[str, tuple[str, Mapping[str, tuple[str, Fraction]]]]] = {
    "nv_trt_llm_request_metrics": (
        "request_type",
        {
            "waiting": ("ragwatch_requests_waiting", ONE),
            "scheduled": ("ragwatch_requests_running", ONE),
        },
    ),
    "nv_trt_llm_kv_cache_block_metrics": (
        "kv_cache_block_type",
        {"fraction": ("ragwatch_kv_cache_usage_ratio", ONE)},
    ),
}
PRIORITY: Final[Mapping[str, int]] = {name: i for i, name in enumerate((*METRICS, *BY_LABEL))}

# Triton adds to its latency counters on success only (core/src/infer_stats.cc,
# UpdateSuccess), so a counter's _count is nv_inference_request_success of the same
# model and version: ragwatch _count name -> (its _sum's source, the count's source).
TRITON_COUNTS: Final[Mapping[str, tuple[str, str]]] = {
    "ragwatch_e2e_seconds_count": (
        "nv_inference_request_duration_us",
        "nv_inference_request_success",
    ),
    "ragwatch_queue_seconds_count": (
        "nv_inference_queue_duration_us",
        "nv_inference_request_success",
    ),
}

# dcgm-exporter field -> (GpuSample field, scale). FB fields are MiB; utilisation stays %.
GPU_FIELDS: Final[Mapping[str, tuple[str, Fraction]]] = {
    "DCGM_FI_DEV_FB_USED": ("fb_used", MIB),
    "DCGM_FI_DEV_FB_FREE": ("fb_free", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("fb_reserved", MIB),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", ONE),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_copy_util", ONE),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", ONE),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", ONE),
}
NONNEGATIVE_GPU_FIELDS: Final = frozenset(f for f, _ in GPU_FIELDS.values()) - {"temp_c"}
HOST_LABELS: Final = ("Hostname", "hostname")  # older and newer dcgm-exporter
# dcgm-exporter's Kubernetes mapping: (namespace, pod, container) labels, and the names
# its --kubernetes-use-old-namespace option gives them instead.
POD_LABELS: Final = (
    ("namespace", "pod", "container"),
    ("pod_namespace", "pod_name", "container_name"),
)
# host, gpu, UUID, modelName, GPU_I_PROFILE, GPU_I_ID
GpuKey = tuple[str, str, str, str, str, str]
SeriesKey = tuple[str, frozenset[tuple[str, str]]]


# ---------------------------------------------------------------- parsing


def _declared_counters(text: str) -> set[str]:
    """Names on ``# TYPE <name> counter`` lines.

    prometheus_client's text parser appends ``_total`` to a counter sample that lacks
    it (Triton's ``nv_inference_request_success``, TGI's ``tgi_request_count``), so the
    exposed name is recovered from the TYPE line. Only TYPE lines are read here; the
    exposition itself is parsed by prometheus_client.
    """
    names = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"] and parts[3] == "counter":
            names.add(parts[2])
    return names


def parse(text: str) -> list[MetricSample]:
    """Samples of a text-format (0.0.4) exposition, named as exposed; ValueError if malformed.

    Values may be NaN or infinite here (the source drops them); timestamps are ignored.

    >>> [(s.name, s.value) for s in parse('# TYPE tgi_request_count counter\\n'
    ...                                     'tgi_request_count 7\\n')]
    [('tgi_request_count', 7.0)]
    """
    counters = _declared_counters(text)
    out = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = s.name
                bare = name.removesuffix("_total")
                if family.type == "counter" and name not in counters and bare in counters:
                    name = bare
                out.append(MetricSample(name=name, labels=dict(s.labels), value=float(s.value)))
    except (IndexError, KeyError, TypeError) as exc:  # the parser's own slips on bad input
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc
    return out


# ---------------------------------------------------------------- renaming


def scale(value: float, factor: Fraction) -> float:
    """``value * factor``, correctly rounded (57 % is 0.57, not 0.5700000000000001);
    infinite where the product is beyond float range."""
    if factor == 1 or not math.isfinite(value):
        return value
    try:
        return float(Fraction(value) * factor)
    except OverflowError:
        return math.copysign(math.inf, value)


def engine_of(name: str) -> str:
    """The engine a source metric comes from, by its prefix (``""`` if none)."""
    return next((engine for prefix, engine in ENGINE_PREFIXES if name.startswith(prefix)), "")


def _lookup(name: str) -> tuple[str, str, Fraction, str] | None:
    """(table key, ragwatch name, scale, histogram suffix) for an exposed sample name."""
    rule = METRICS.get(name)
    if rule is not None:
        return name, rule[0], rule[1], ""
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and (rule := METRICS.get(base)) is not None:
            return base, rule[0] + suffix, rule[1], suffix
    return None


def _labels(labels: Mapping[str, str], engine: str, source: str) -> dict[str, str]:
    out = {(f"exported_{k}" if k in ADDED_LABELS else k): v for k, v in labels.items()}
    out["engine"] = engine
    out["source_metric"] = source
    return out


def _scale_le(le: str, factor: Fraction) -> str:
    """A histogram bound in the new unit; ``+Inf`` (and anything unreadable) as it was."""
    try:
        bound = float(le)
    except ValueError:
        return le
    return repr(scale(bound, factor)) if math.isfinite(bound) else le


def map_sample(s: MetricSample) -> tuple[int, MetricSample] | None:
    """(priority, renamed sample) for a known metric, None for one to pass through."""
    if s.name in BY_LABEL:
        label, table = BY_LABEL[s.name]
        rule = table.get(s.labels.get(label, ""))
        if rule is None:
            return None
        renamed = _labels(s.labels, engine_of(s.name), s.name)
        return PRIORITY[s.name], MetricSample(rule[0], renamed, scale(s.value, rule[1]))
    hit = _lookup(s.name)
    if hit is None:
        return None
    key, name, factor, suffix = hit
    labels = _labels(s.labels, engine_of(key), s.name)
    value = s.value if suffix in ("_bucket", "_count") else scale(s.value, factor)
    if suffix == "_bucket" and factor != 1 and "le" in labels:
        labels["le"] = _scale_le(labels["le"], factor)
    return PRIORITY[key], MetricSample(name=name, labels=labels, value=value)


def triton_counts(samples: Iterable[MetricSample]) -> list[tuple[int, MetricSample]]:
    """The ``_count`` of each Triton latency counter present (see :data:`TRITON_COUNTS`)."""
    present = {(s.name, frozenset(s.labels.items())): s for s in samples}
    out = []
    for name, (sum_source, count_source) in TRITON_COUNTS.items():
        for (source, labels), s in present.items():
            if source == count_source and (sum_source, labels) in present:
                sample = MetricSample(name, _labels(s.labels, "triton", count_source), s.value)
                out.append((PRIORITY[sum_source], sample))
    return out


# what TensorRT-LLM's newer releases export and older ones let compute: (a BY_LABEL
# family, the label value computed, the minuend's and the divisor's or subtrahend's label
# values, whether it is a ratio)
TRTLLM_DERIVED: Final = (
    ("nv_trt_llm_request_metrics", "waiting", "active", "scheduled", False),
    ("nv_trt_llm_kv_cache_block_metrics", "fraction", "used", "max", True),
)


def trtllm_derived(samples: Iterable[MetricSample]) -> list[tuple[int, MetricSample]]:
    """For a TensorRT-LLM model whose release exports no ``waiting`` or ``fraction``
    series: its active less its scheduled requests, and its used over its max KV cache
    blocks (0 where max is 0), as the newer releases compute them, at the same priority."""
    samples, out = list(samples), []
    for family, want, first, second, ratio in TRTLLM_DERIVED:
        label, table = BY_LABEL[family]
        name = table[want][0]
        groups: dict[frozenset[tuple[str, str]], dict[str, MetricSample]] = {}
        for s in samples:
            if s.name == family and label in s.labels:
                rest = frozenset((k, v) for k, v in s.labels.items() if k != label)
                groups.setdefault(rest, {})[s.labels[label]] = s
        for by_value in groups.values():
            a, b = by_value.get(first), by_value.get(second)
            if want in by_value or a is None or b is None:
                continue
            value = (a.value / b.value if b.value else 0.0) if ratio else a.value - b.value
            labels = _labels({**a.labels, label: want}, engine_of(family), family)
            out.append((PRIORITY[family], MetricSample(name, labels, max(0.0, value))))
    return out


def _series(s: MetricSample) -> SeriesKey:
    """Identity of a series: its name and labels, less ``source_metric``."""
    return s.name, frozenset((k, v) for k, v in s.labels.items() if k != "source_metric")


def select(samples: Iterable[MetricSample]) -> tuple[list[MetricSample], int]:
    """What to ship of a target's samples, and how many duplicate series were left out.

    Renamed series come first, one per series: where two sources give the same one, the
    source listed first in :data:`METRICS` wins. Passed-through series follow, unchanged,
    in exposition order.
    """
    samples = list(samples)
    known: list[tuple[int, MetricSample]] = []
    unknown: list[MetricSample] = []
    for s in samples:
        mapped = map_sample(s)
        if mapped is None:
            unknown.append(s)
        else:
            known.append(mapped)
    chosen: dict[SeriesKey, tuple[int, MetricSample]] = {}
    duplicates = 0
    derived = triton_counts(samples) + trtllm_derived(samples)
    for prio, s in known + derived + [(len(PRIORITY), s) for s in unknown]:
        key = _series(s)
        if key in chosen:
            duplicates += 1
            if chosen[key][0] <= prio:
                continue
        chosen[key] = (prio, s)
    return [s for _, s in chosen.values()], duplicates


# ---------------------------------------------------------------- dcgm-exporter


def host_of(
    labels: Mapping[str, str], default_host: str, host_labels: Sequence[str] = HOST_LABELS
) -> str:
    """The host a sample's labels name (the first of ``host_labels`` it has), else
    ``default_host``.

    >>> host_of({"Hostname": "gpu-node-07"}, "agent-1"), host_of({}, "agent-1")
    ('gpu-node-07', 'agent-1')
    """
    return next((labels[k] for k in host_labels if labels.get(k)), default_host)


def by_host(
    samples: Iterable[MetricSample], default_host: str, host_labels: Sequence[str] = HOST_LABELS
) -> dict[str, list[MetricSample]]:
    """``samples`` grouped by the host their labels name (:func:`host_of`), in order."""
    out: dict[str, list[MetricSample]] = {}
    for s in samples:
        out.setdefault(host_of(s.labels, default_host, host_labels), []).append(s)
    return out


def _gpu_key(
    labels: Mapping[str, str], default_host: str, host_labels: Sequence[str] = HOST_LABELS
) -> GpuKey:
    return (
        host_of(labels, default_host, host_labels),
        labels.get("gpu", ""),
        labels.get("UUID", ""),
        labels.get("modelName", ""),
        labels.get("GPU_I_PROFILE", ""),
        labels.get("GPU_I_ID", ""),
    )


PodLabels = tuple[str | None, str | None, str | None]
_NO_POD: Final[PodLabels] = (None, None, None)


def _pod_of(labels: Mapping[str, str]) -> PodLabels | None:
    """(namespace, pod, container) of a dcgm-exporter sample, None if it names no pod."""
    for names in POD_LABELS:
        ns, pod, container = (labels.get(n) or None for n in names)
        if pod is not None and all(v is None or is_label(v) for v in (ns, pod, container)):
            return ns, pod, container
    return None


def pod_labels(samples: Iterable[MetricSample]) -> PodLabels:
    """The one pod a GPU's samples name; none when they name none, or several (a GPU
    shared by several containers, which dcgm-exporter repeats once per container)."""
    pods = {p for s in samples if (p := _pod_of(s.labels)) is not None}
    return pods.pop() if len(pods) == 1 else _NO_POD


def _gpu_sample(
    key: GpuKey, fields: Mapping[str, float], pod: PodLabels = _NO_POD
) -> GpuSample | None:
    """A GpuSample, or None where dcgm-exporter left out what the schema needs."""
    _, index, uuid, model, profile, instance = key
    if not (index.isdigit() and uuid and "fb_used" in fields and "fb_free" in fields):
        return None  # e.g. MIG instances without FB fields (NVIDIA/dcgm-exporter#512)
    if not all(math.isfinite(v) for v in fields.values()):
        return None
    if any(fields[f] < 0 for f in NONNEGATIVE_GPU_FIELDS & fields.keys()):
        return None
    used, free = round(fields["fb_used"]), round(fields["fb_free"])
    reserved = round(fields["fb_reserved"]) if "fb_reserved" in fields else None
    if used + free + (reserved or 0) > MAX_UINT:
        return None
    return GpuSample(
        index=int(index),
        uuid=uuid,
        name=f"{model} MIG {profile}" if profile else model,  # as NVML names a MIG device
        mig=f"GI{instance}" if instance else None,  # the nvml agent's fallback form
        fb_used=used,
        fb_total=used + free + (reserved or 0),
        fb_reserved=reserved,
        gpu_util=fields.get("gpu_util"),
        mem_copy_util=fields.get("mem_copy_util"),
        temp_c=fields.get("temp_c"),
        power_w=fields.get("power_w"),
        namespace=pod[0],
        pod=pod[1],
        container=pod[2],
    )


XID_FIELD: Final = "DCGM_FI_DEV_XID_ERRORS"  # a gauge: the last XID since the exporter started
XidKey = tuple[str, str, str, str]  # host, GPU index, UUID, GPU instance id


def xid_gauges(
    samples: Iterable[MetricSample], default_host: str, host_labels: Sequence[str] = HOST_LABELS
) -> tuple[dict[XidKey, float], list[MetricSample]]:
    """dcgm-exporter's XID gauges by GPU (host, index, UUID, GPU instance), and the rest.

    The gauge holds the last XID until the exporter restarts: a page on its value would
    never resolve, so the source turns its *changes* into XID events (:mod:`.prom`)."""
    gauges: dict[XidKey, float] = {}
    rest: list[MetricSample] = []
    for s in samples:
        if s.name == XID_FIELD and math.isfinite(s.value):
            key = (
                host_of(s.labels, default_host, host_labels),
                s.labels.get("gpu", ""),
                s.labels.get("UUID", ""),
                s.labels.get("GPU_I_ID", ""),
            )
            gauges[key] = s.value
        else:
            rest.append(s)
    return gauges, rest


def xid_event_attrs(key: XidKey, xid: float) -> dict[str, object]:
    """The attributes of the XID event a new gauge value means, as the nvml agent sends."""
    _, index, uuid, instance = key
    attrs: dict[str, object] = {"gpu": int(index) if index.isdigit() else None, "xid": int(xid)}
    if uuid:
        attrs["uuid"] = uuid
    if instance:
        attrs["mig"] = f"GI{instance}"  # as the GPU series of this exporter name the instance
    attrs["source"] = "dcgm-exporter"
    return attrs


def split_gpus(
    samples: Iterable[MetricSample], default_host: str, host_labels: Sequence[str] = HOST_LABELS
) -> tuple[dict[str, list[GpuSample]], list[MetricSample], int]:
    """dcgm-exporter samples folded into GpuSamples by host; the rest; and the count of
    GPUs that could not be folded (their fields are part of the rest).

    The host is the first of ``host_labels`` a sample has (dcgm-exporter's ``Hostname``
    / ``hostname`` by default), else ``default_host``.
    A GPU's ``namespace``/``pod``/``container`` are the exporter's Kubernetes labels
    (:func:`pod_labels`).
    """
    groups: dict[GpuKey, list[MetricSample]] = {}
    rest: list[MetricSample] = []
    for s in samples:
        if s.name in GPU_FIELDS:
            groups.setdefault(_gpu_key(s.labels, default_host, host_labels), []).append(s)
        else:
            rest.append(s)
    by_host: dict[str, list[GpuSample]] = {}
    incomplete = 0
    for key, members in groups.items():
        fields = {GPU_FIELDS[m.name][0]: scale(m.value, GPU_FIELDS[m.name][1]) for m in members}
        gpu = _gpu_sample(key, fields, pod_labels(members))
        if gpu is None:
            rest.extend(members)
            incomplete += 1
        else:
            by_host.setdefault(key[0], []).append(gpu)
    for gpus in by_host.values():
        gpus.sort(key=lambda g: (g.index, g.mig or ""))
    return by_host, rest, incomplete
