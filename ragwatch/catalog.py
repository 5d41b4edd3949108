"""The signal catalog: every signal each kind of series has, and its labels, declared once.

Each pipeline produces exactly these signals for its series (``SERIES_SIGNALS[kind]``; a
test runs the pipelines and holds them to it), rules may name only these (checked when a
rule is loaded), and the charts and the exporter read names from here. It is in the core,
not beside the rules, because the console (the exporter) reads it and may not import
``ragwatch.streams``. Kinds:
``process`` and ``gpu`` (:mod:`ragwatch.streams.pipelines.gpu`), ``service``
(:mod:`~ragwatch.streams.pipelines.requests`), ``event``
(:mod:`~ragwatch.streams.pipelines.events`), ``engine``
(:mod:`~ragwatch.streams.pipelines.metrics`).

>>> "leak_score" in SERIES_SIGNALS["process"], SERIES_LABELS["service"]
(True, ('service', 'instance'))
"""

from __future__ import annotations

# Signals of every memory series (leak detector output; see streams/pipelines/gpu_signals.py).
_MEMORY_SIGNALS = (
    "fb_used_bytes",
    "fb_total_bytes",
    "mem_increase_bytes",
    "mem_increase_gb",
    "mem_slope_bytes_per_s",
    "mem_steadiness",
    "recent_gb_per_hour",
    "recent_steadiness",
    "gb_per_hour",
    "leak_score",
    "window_h",
    "tte_s",
    "tte_h",
    "leak_gb_per_hour",
    "floor_gb_per_hour",
    "floor_steadiness",
    "above_known_gb",
)
SERIES_SIGNALS: dict[str, tuple[str, ...]] = {
    "process": ("gpu_mem_bytes", "rss_bytes", *_MEMORY_SIGNALS),
    "gpu": (
        *_MEMORY_SIGNALS,
        "attributed_gb_per_hour",  # the recent growth the GPU's processes explain
        "unattributed_gb_per_hour",  # the GPU's recent growth less that
        "unattributed_growth_gb",  # memory no process holds: now less its 1-2 h low
        "fb_used_ratio",
        "gpu_util",
        "mem_copy_util",
        "temp_c",
        "power_w",
        # against its like GPUs, as last compared (streams/pipelines/gpu_peers.py)
        *(
            f"replica_gpu_{name}_{field}"
            for name in ("mem", "util", "power", "temp")
            for field in ("value", "peers", "ratio", "deviant")
        ),
    ),
}
# Baselines that hold through a fault and may, after holding long enough, accept a new level
# (detectors/seasonal/view.py, detectors/tails.py): per series kind, family -> the signal
# holding the family's forecast. Each family also has the signals ``<family>_held_s`` (how long the
# baseline has been held), ``<family>_relearned_at`` (event time it last accepted a new level) and
# ``<family>_relearned_from`` (its forecast before that), so an alert whose ``expected`` is the
# forecast can say it resolved because of a re-learnt baseline, not because the signal recovered.
BASELINES: dict[str, dict[str, str]] = {
    "service": {
        "rps": "rps_forecast",
        "tpr": "tpr_forecast",
        "tps": "tps_forecast",
        "retriever_p99": "retriever_p99_baseline_ms",
        "e2e_p95": "e2e_p95_baseline_ms",
        "decode": "decode_baseline_tps",
        "ttft_net_p95": "ttft_net_p95_baseline_ms",
        "queue_p95": "queue_p95_baseline_ms",
    },
    "engine": {"tps": "tps_forecast"},
}


def _baseline_signals(series: str) -> tuple[str, ...]:
    return tuple(
        f"{family}_{what}"
        for family in BASELINES[series]
        for what in ("held_s", "relearned_at", "relearned_from")
    )


SERIES_SIGNALS["service"] = (  # one (service, instance) of RAG requests; pipelines/requests.py
    "rps", "errors_ratio", "output_tokens_per_s", "tokens_per_request",
    "context_tokens_per_request", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms",
    *(f"{stage}_{q}" for stage in ("retriever", "reranker", "llm")
      for q in ("p50_ms", "p95_ms", "p99_ms", "share")),
    "ttft_p95_ms", "queue_p95_ms", "rps_forecast", "rps_deviation", "rps_z",
    "tpr_forecast", "tpr_deviation", "tpr_z", "tpr_score",
    "tps_forecast", "tps_deviation", "tps_z", "tps_score", "retriever_p99_baseline_ms",
    "retriever_p99_ratio", "e2e_p95_baseline_ms", "e2e_p95_ratio", "outliers",
    "recent_outliers", "outlier_ratio", "new_outlier_cluster", "outlier_cluster_size",
    "outlier_cluster_active",
    "window_s", "window_requests", "requests_total", "errors_total", "output_tokens_total",
    "errors_baseline", "errors_z", "window_errors",
    "retriever_tail_ratio", "retriever_tail_z", "e2e_tail_ratio", "e2e_tail_z",
    "retriever_tail_recovered", "e2e_tail_recovered", "retriever_tail_cusum", "e2e_tail_cusum",
    "retriever_p99_z", "e2e_p95_z",
    "decode_tps", "decode_baseline_tps", "decode_deviation", "decode_z", "decode_requests",
    "ttft_net_p95_ms", "ttft_net_p95_baseline_ms", "ttft_net_p95_ratio",
    "ttft_net_p95_excess_ms", "queue_recent_p95_ms", "queue_p95_baseline_ms", "queue_p95_ratio",
    "queue_p95_excess_ms", "queue_tail_ratio", "queue_tail_z", "queue_tail_recovered",
    "queue_tail_cusum", "tpr_recent", "tpr_recent_deviation", "tpr_recent_z",
    "clustered_requests", *_baseline_signals("service"),
    # 1 while a serving baseline (or the retriever P99's) holds a deviation back at the same
    # hour as a day or two before, no higher (detectors/recurrence.py)
    "decode_recurring", "ttft_net_p95_recurring", "queue_p95_recurring",
    "retriever_p99_recurring",
    # against the other instances of its service: their median, the ratio to it, and 1
    # while deviant (streams/pipelines/replica_signals.py)
    *(f"replica_{name}_{field}" for name in ("retriever", "e2e", "decode", "tpr", "errors")
      for field in ("peers", "ratio", "deviant")),
)  # fmt: skip
# a cumulative count of the evidence behind a series' signals, for keep_firing_requests
EVIDENCE_SIGNAL = {"service": "requests_total"}
# one device event (streams/pipelines/events.py): 1.0 for what happened (the XID code for xid)
SERIES_SIGNALS["event"] = ("oom_kill", "xid", "xid_critical", "device_event", "process_exit")
# one scraped serving engine (streams/pipelines/metrics.py): rates from counters, gauges, baseline
SERIES_SIGNALS["engine"] = (
    "requests_per_s", "errors_ratio", "generation_tokens_per_s", "generation_tokens_total",
    "prompt_tokens_per_s",
    "tokens_per_request", "preemptions_per_s", "requests_waiting", "requests_running",
    "kv_cache_usage_ratio", "counter_resets", "e2e_mean_s", "ttft_mean_s", "queue_mean_s",
    "tpot_mean_s", "tps_forecast", "tps_deviation", "tps_z", "tps_score",
    *_baseline_signals("engine"),
)  # fmt: skip
# Every numeric signal each kind of series gets scored by the generic detector
# (detectors/generic; streams/pipelines/scoring.py): its score in [0, 1] is the signal
# ``<name>_score`` (rules read it), its expected value and band go to status, /metrics
# (ragwatch_anomaly_score, _yhat, _yhat_lower, _yhat_upper) and the advisor.
SCORED: dict[str, tuple[str, ...]] = {
    "gpu": ("fb_used_ratio", "gb_per_hour", "gpu_util", "mem_copy_util", "temp_c", "power_w"),
    "process": ("gpu_mem_bytes", "rss_bytes"),
    "service": (
        "rps", "errors_ratio", "tokens_per_request", "output_tokens_per_s", "decode_tps",
        *(f"{stage}_{q}_ms" for stage in ("e2e", "retriever", "reranker", "llm")
          for q in ("p50", "p95", "p99")),
        "ttft_p95_ms", "queue_p95_ms",
    ),
    "engine": (
        "requests_per_s", "errors_ratio", "generation_tokens_per_s", "prompt_tokens_per_s",
        "tokens_per_request", "preemptions_per_s", "requests_waiting", "requests_running",
        "kv_cache_usage_ratio", "e2e_mean_s", "ttft_mean_s", "queue_mean_s", "tpot_mean_s",
    ),
}  # fmt: skip
# what status holds of each scored signal, in this order: the newest score, expected value
# and band, the value scored, and the highest score of the last PEAK_S with the value, the
# expected value and the event time of it (the advisor ranks by that peak)
SCORE_FIELDS = (
    "score", "yhat", "lower", "upper", "value", "peak", "peak_value", "peak_yhat", "peak_ts",
)  # fmt: skip
PEAK_S = 3600.0
# and of each scored series: the highest of its scores now, and how many of its signals
# are held out of their band (held score >= ANOMALOUS_SCORE, by ANOMALOUS_MOVE of their
# expected value at least) for 5 minutes already (the
# default rules page on several together, sustained; a burst of load is no deviation), of
# the signals that corroborate each other: not GPU or process memory, whose ratio and
# growth are one quantity seen twice and whose shapes (caching allocators, reloads,
# batch jobs) the leak detector judges (detectors/leak); their score is the onset score
# alone (a step is news for a moment, not a lasting deviation)
SCORE_SUMMARY = ("anomaly_max", "anomalous_signals")
NOT_CORROBORATING = frozenset({"fb_used_ratio", "gb_per_hour", "gpu_mem_bytes", "rss_bytes"})
# signals that are one quantity seen several ways count once in anomalous_signals: a
# GPU's utilisation and copy utilisation (its load), a retrieval stage's P95 and P99 (its
# tail: a few slow calls move both), the end-to-end latency with the LLM's, P50 to P99
# (the LLM is most of it, and the mix of answer lengths moves all of them), an engine's
# mean latencies, an instance's time to first token with its queue wait (the wait is part
# of it: a queue that builds at a busy hour moves both). A retrieval stage's P50 is a
# group of its own: its median and its tail out of their bands together are the whole
# stage slower, not a few slow calls (a reranker swapped for a larger model).
# None: in no group. Demand is in none: an instance's or an engine's requests/s, tokens
# per request and token rates are what its clients send, scored, shown and explained but
# no fault of the service by themselves, however far they move (a weekend, a new client,
# the day after an incident that a young profile half-learnt); the specific rules judge
# throughput with their own evidence (ThroughputDrop, TokensPerRequestDrop,
# EngineThroughputDrop). What counts is the service's health: its latencies, errors,
# queues, decode speed, saturation.
DEMAND = ("rps", "tokens_per_request", "output_tokens_per_s", "requests_per_s",
          "generation_tokens_per_s", "prompt_tokens_per_s")  # fmt: skip
CORROBORATION_GROUP: dict[str, str | None] = {
    "mem_copy_util": "gpu_util",
    **dict.fromkeys(DEMAND),
    **{f"{stage}_{q}_ms": stage for stage in ("retriever", "reranker") for q in ("p95", "p99")},
    **{f"{stage}_{q}_ms": "e2e" for stage in ("e2e", "llm") for q in ("p50", "p95", "p99")},
    "e2e_mean_s": "tpot_mean_s",
    "queue_p95_ms": "ttft_p95_ms",
}  # fmt: skip
# a scored signal whose move counts in anomalous_signals only where its own statistical
# test finds evidence too: (a signal, the bound it must reach), each. An instance's error
# ratio is a ratio of a few counts: a quiet hour's one failed request in twenty is 5 %,
# far out of a band learnt on hours of 0 %, a window of minutes keeps it there for
# minutes, and against a usual share near 0 even its binomial z is large. It counts
# where the window holds 5 failed requests at least (ErrorRateHigh's floor: one or two
# unlucky requests are no incident) and their binomial z against the instance's usual
# share (``errors_z``) is 3 or more, not on its band alone.
EVIDENCE: dict[str, tuple[tuple[str, float], ...]] = {
    "errors_ratio": (("window_errors", 5.0), ("errors_z", 3.0)),
}
# a scored signal whose move does not count in anomalous_signals where another signal
# explains it: (that signal, the bound from which it does; NaN explains nothing). An
# instance's queue wait, and its time to first token with it, grow with its load, faster
# than the load (a queue's wait goes as rho / (1 - rho)): a busier day than the profile
# has seen (the first weekday of an install that started on a Sunday, a launch) builds a
# queue several times the usual one, and no fault. They count while its requests are
# less than 50 % above their expectation (``rps_deviation``), QueueWaitHigh's guard. An
# engine's load, the same: the requests it runs (Little's law: arrivals x latency), the KV
# cache they fill, the requests waiting and their wait, while its generated tokens/s are
# less than 50 % above their expectation (``tps_deviation``); a KV cache that fills at
# the usual demand still counts.
EXPLAINED_BY: dict[str, tuple[str, float]] = {
    "queue_p95_ms": ("rps_deviation", 0.5),
    "ttft_p95_ms": ("rps_deviation", 0.5),
    **dict.fromkeys(
        ("requests_running", "kv_cache_usage_ratio", "requests_waiting", "queue_mean_s",
         "ttft_mean_s"),
        ("tps_deviation", 0.5),
    ),
}  # fmt: skip
# a series' load, seen several ways: (its witnesses, the signals its load moves). Where
# every witness is above its expected value by ANOMALOUS_MOVE at least, a move up of those
# signals is that load, and does not count in anomalous_signals. A GPU busier than its
# daily profile has seen (a flash crowd, a job at a new hour) is busier, copies more, draws
# more power and runs hotter, together; a fault decouples them: a power cap (busier, less
# power), a hang (idle at a busy hour: moves down), heat at the usual load. An engine sent
# more requests than expected runs more, queues more and longer, fills more of its KV
# cache and answers slower: its requests/s are the witness that every engine has (one
# that generates no tokens, an embedder or a reranker, has no tokens/s for EXPLAINED_BY).
LOAD: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("gpu_util", "power_w"), ("gpu_util", "mem_copy_util", "power_w", "temp_c")),
    (
        ("requests_per_s",),
        ("requests_running", "requests_waiting", "kv_cache_usage_ratio", "queue_mean_s",
         "ttft_mean_s", "e2e_mean_s", "tpot_mean_s"),
    ),
)  # fmt: skip
ANOMALOUS_SCORE = 0.9
# ... and moved by at least this much of its expected value (vmanomaly's
# min_dev_from_expected, relative): a very steady signal's band is narrow, and a move of
# a few percent (a deploy making the LLM 10 % slower, a load's drift) is no anomaly to
# page on, however many band widths it is
ANOMALOUS_MOVE = 0.2
# ... in the direction that is a fault (vmanomaly's detection_direction): +1 above its
# expected value only (latencies, errors, queues: a service faster or calmer than usual
# at a quiet hour, or as a fault's windows drain, is no anomaly to page on), -1 below it
# only (decode speed); both for the rest (requests/s, utilisation, power: a hang and a
# flood are both faults)
_ABOVE = (
    "errors_ratio", "ttft_p95_ms", "queue_p95_ms", "preemptions_per_s", "requests_waiting",
    "kv_cache_usage_ratio", "e2e_mean_s", "ttft_mean_s", "queue_mean_s", "tpot_mean_s",
    *(f"{stage}_{q}_ms" for stage in ("e2e", "retriever", "reranker", "llm")
      for q in ("p50", "p95", "p99")),
)  # fmt: skip
ANOMALOUS_DIRECTION: dict[str, int] = {**dict.fromkeys(_ABOVE, 1), "decode_tps": -1}
# signals that score above their expected value only (0 below it): a GPU never fails by
# running cool, and a GPU cooler than usual (a quiet holiday, an idle or hung GPU, whose
# load and power say so) is not "running hot"; its move down still counts in
# anomalous_signals beside theirs (a hang)
SCORED_ABOVE_ONLY = frozenset({"temp_c"})
for _kind, _names in SCORED.items():
    assert set(_names) <= set(SERIES_SIGNALS[_kind]), _kind
    SERIES_SIGNALS[_kind] += (*(f"{n}_score" for n in _names), *SCORE_SUMMARY)
# the labels people read first, in this order (the status view, Slack): where, then what
LABEL_ORDER = ("host", "gpu", "mig", "pid", "process", "namespace", "pod", "container",
               "service", "instance")  # fmt: skip
# the Kubernetes container a GPU or process belongs to, where the agent knows it (set only
# then; docs/kubernetes.md)
POD_LABELS = ("namespace", "pod", "container")
# a process's own: its ``container`` label is always set (the Kubernetes name, else the
# runtime's id, else "none")
PROCESS_POD_LABELS = ("namespace", "pod")
SERIES_LABELS: dict[str, tuple[str, ...]] = {
    "process": ("host", "gpu", "uuid", "mig", "pid", "process", "container", *PROCESS_POD_LABELS),
    "gpu": ("host", "gpu", "uuid", "mig", "gpu_name", *POD_LABELS),
    "service": ("service", "instance"),
    "event": ("host", "gpu", "mig", "pid", "process", "container", "type", "xid", "event"),
    "engine": ("host", "target"),
}

# upper bounds (seconds, Prometheus' le) of the notifier's delivery latency histogram: from
# a notification's entering the outbox to its delivery (streams/notifier/delivery_stats.py
# counts, ragwatch/console/exporter.py exports)
DELIVERY_LATENCY_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
