"""The anomaly advisor: which signals of a host and its services moved together, ranked.

The worker scores every numeric signal of every series with the generic detector
(``streams/pipelines/scoring.py``) and its status entries carry, per scored signal,
:data:`~ragwatch.catalog.SCORE_FIELDS`: the newest score, expected value and band, and
the highest score of the last hour with the value and expected value at that moment.
This module reads those entries (a status from Redis, or the worker's own for a hint),
so the seed's seven manual steps across dashboards (GPU memory, RSS, token throughput,
vector-search latency, pod load: which moved, when, how far) become one ranked list:

- :func:`gather` takes the scored signals of a host (its GPUs, their processes, its
  scraped engines and the service instances that run on it) or of a service (its
  instances and the hosts they run on) from status entries, as :class:`Move` s;
- :func:`rank` keeps those whose peak score reaches ``min_score`` and orders them by it;
- :meth:`Move.words` says one in a few words ("GPU 2 power -80 %"), :func:`summary` a
  list of them grouped by series ("GPU 2 power -80 %, utilisation 0 %"), as hints do.

Pure: no Redis, no worker; ``ragwatch explain``, ``/api/v1/explain`` and the hints call it.

>>> host = {"host": "h1", "gpus": [{"index": 2, "mig": None, "scores": {
...     "power_w": [1.0, 300.0, 250.0, 350.0, 60.0, 1.0, 60.0, 300.0, 1e9],
...     "gpu_util": [0.99, 85.0, 60.0, 100.0, 0.0, 0.99, 0.0, 85.0, 1e9],
...     "temp_c": [0.1, 70.0, 60.0, 80.0, 66.0, 0.2, 65.0, 70.0, 1e9]}, "procs": []}]}
>>> moves = rank(gather({"hosts": [host]}, host="h1"))
>>> summary(moves)
'GPU 2 power -80 %, utilisation 0 % (expected 85 %)'
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ragwatch.catalog import PEAK_S, SCORE_FIELDS
from ragwatch.schema import AnomalyFact

MIN_SCORE = 0.9  # a signal is "anomalous" to the advisor when its peak reaches this
AT = {name: i for i, name in enumerate(SCORE_FIELDS)}
# how each scored signal is said: its words, and how its move is put
#   pct: a value in percent (0..100); share: a 0..1 ratio shown in percent;
#   rel: the change against the expected value, in percent (a multiple beyond 2x);
#   delta: the value and its difference in the signal's unit (``unit``)
_STAGE = re.compile(r"^(?P<stage>e2e|retriever|reranker|llm)_(?P<q>p\d\d)_ms$")
WORDS: dict[str, tuple[str, str]] = {
    "fb_used_ratio": ("memory", "share"),
    "gb_per_hour": ("memory growth", "delta GB/h"),
    "gpu_util": ("utilisation", "pct"),
    "mem_copy_util": ("copy utilisation", "pct"),
    "temp_c": ("temperature", "delta C"),
    "power_w": ("power", "rel"),
    "gpu_mem_bytes": ("GPU memory", "rel"),
    "rss_bytes": ("RSS", "rel"),
    "rps": ("requests/s", "rel"),
    "errors_ratio": ("errors", "share"),
    "tokens_per_request": ("tokens/request", "rel"),
    "output_tokens_per_s": ("output tokens/s", "rel"),
    "decode_tps": ("decode speed", "rel"),
    "ttft_p95_ms": ("TTFT P95", "rel"),
    "queue_p95_ms": ("queue P95", "rel"),
    "requests_per_s": ("requests/s", "rel"),
    "generation_tokens_per_s": ("generated tokens/s", "rel"),
    "prompt_tokens_per_s": ("prompt tokens/s", "rel"),
    "preemptions_per_s": ("preemptions/s", "delta /s"),
    "requests_waiting": ("waiting requests", "delta "),
    "requests_running": ("running requests", "rel"),
    "kv_cache_usage_ratio": ("KV cache", "share"),
    "e2e_mean_s": ("mean latency", "rel"),
    "ttft_mean_s": ("mean TTFT", "rel"),
    "queue_mean_s": ("mean queue wait", "rel"),
    "tpot_mean_s": ("time per output token", "rel"),
}


@dataclass(frozen=True, slots=True)
class Move:
    """One scored signal of one series, as the advisor weighs it: its peak score of the
    last hour (``score``), the value and expected value then, and its score now."""

    kind: str  # gpu, process, service, engine
    where: str  # the series in words: "GPU 2", "pid 4011 (python)", "rag-api-1"
    signal: str
    score: float
    value: float | None
    expected: float | None
    at: float | None  # event time of the peak
    now: float | None  # the newest score
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def change(self) -> float | None:
        """The value against the expected value, relative (0.5: 50 % above)."""
        v, e = self.value, self.expected
        if v is None or e is None or e == 0:
            return None
        return v / e - 1.0

    def words(self, *, where: bool = True) -> str:
        """``GPU 2 power -80 %``, without the series with ``where=False``."""
        word, how = _words(self.signal)
        text = f"{word} {_size(how, self.value, self.expected, self.change)}".rstrip()
        return f"{self.where} {text}" if where else text

    def as_dict(self) -> dict[str, Any]:
        """For ``--json`` and the API."""
        return {
            "kind": self.kind,
            "series": self.where,
            "labels": dict(self.labels),
            "signal": self.signal,
            "score": self.score,
            "score_now": self.now,
            "value": self.value,
            "expected": self.expected,
            "change": self.change,
            "at": self.at,
            "words": self.words(),
        }


def _words(signal: str) -> tuple[str, str]:
    if signal in WORDS:
        return WORDS[signal]
    m = _STAGE.match(signal)
    if m:
        return f"{m.group('stage')} {m.group('q').upper()}", "rel"
    return signal, "rel"


def _size(how: str, value: float | None, expected: float | None, change: float | None) -> str:
    """How far a signal moved, in the way its kind is read (see :data:`WORDS`)."""
    if value is None:
        return ""
    if how in ("pct", "share"):
        scale = 100.0 if how == "share" else 1.0
        text = f"{value * scale:.0f} %"
        return text if expected is None else f"{text} (expected {expected * scale:.0f} %)"
    if how.startswith("delta"):
        unit = how.removeprefix("delta").strip()
        unit = f" {unit}" if unit else ""
        if expected is None:
            return f"{value:.3g}{unit}"
        return f"{value:.3g}{unit} ({value - expected:+.3g}{unit})"
    if change is None:
        return f"{value:.3g}"
    if change >= 1.0:
        return f"{change + 1.0:.1f}x"
    return f"{change * 100:+.0f} %"


# ---------------------------------------------------------------------------- gathering


def gather(
    status: Mapping[str, Any], *, host: str | None = None, service: str | None = None
) -> list[Move]:
    """The scored signals of ``host`` (its GPUs, processes, engines and the service
    instances on it) and of ``service`` (its instances and the hosts they run on), from a
    status dict (:func:`~ragwatch.store.read_status`'s shape)."""
    services = [s for s in _dicts(status.get("services")) if s.get("service") == service]
    hosts = {host} if host else set()
    instances = []
    for svc in _dicts(status.get("services")):
        for inst in _dicts(svc.get("instances")):
            if svc in services or (host and inst.get("host") == host):
                instances.append((str(svc.get("service")), inst))
                if svc in services and inst.get("host"):
                    hosts.add(str(inst["host"]))
    out: list[Move] = []
    for h in _dicts(status.get("hosts")):
        if h.get("host") in hosts:
            out += _host_moves(h)
    for name, inst in instances:
        labels = {"service": name, "service_instance": str(inst.get("instance"))}
        out += _moves("service", str(inst.get("instance")), inst.get("scores"), labels)
    return out


def gpu_words(index: Any, mig: Any) -> str:
    """A GPU as the advisor names it: ``GPU 2``, ``GPU 0/1g.10gb``."""
    return f"GPU {index}/{mig}" if mig else f"GPU {index}"


def process_words(pid: Any, name: Any) -> str:
    """A process as the advisor names it: ``pid 4011 (python)``."""
    return f"pid {pid} ({name})"


def fact_moves(facts: Iterable[AnomalyFact], kind: str = "") -> list[Move]:
    """Anomalous signals as the facts topic carries them (:class:`~ragwatch.schema.
    AnomalyFact`), as moves."""
    return [Move(kind, f.where, f.signal, f.score, f.value, f.expected, f.at, None) for f in facts]


def _host_moves(h: Mapping[str, Any]) -> Iterator[Move]:
    host = str(h.get("host"))
    for g in _dicts(h.get("gpus")):
        labels = {"host": host, "gpu": str(g.get("index"))}
        where = gpu_words(g.get("index"), g.get("mig"))
        yield from _moves("gpu", where, g.get("scores"), labels)
        for p in _dicts(g.get("procs")):
            where = process_words(p.get("pid"), p.get("name"))
            plabels = {**labels, "pid": str(p.get("pid"))}
            yield from _moves("process", where, p.get("scores"), plabels)
    for e in _dicts(h.get("engines")):
        labels = {"host": host, "target": str(e.get("target"))}
        yield from _moves("engine", f"engine {e.get('target')}", e.get("scores"), labels)


def _moves(kind: str, where: str, scores: Any, labels: Mapping[str, str]) -> Iterator[Move]:
    if not isinstance(scores, Mapping):
        return
    for signal, v in scores.items():
        if not isinstance(v, list) or len(v) != len(SCORE_FIELDS):
            continue
        peak = _num(v[AT["peak"]])
        if peak is None:
            continue
        yield Move(
            kind, where, str(signal), peak, _num(v[AT["peak_value"]]),
            _num(v[AT["peak_yhat"]]), _num(v[AT["peak_ts"]]), _num(v[AT["score"]]), labels,
        )  # fmt: skip


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _num(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


# ---------------------------------------------------------------------------- ranking


def rank(moves: Iterable[Move], min_score: float = MIN_SCORE, limit: int = 20) -> list[Move]:
    """The moves whose peak reaches ``min_score``, highest first (then the larger relative
    change), at most ``limit``."""
    kept = [m for m in moves if m.score >= min_score]
    kept.sort(key=lambda m: (-m.score, -abs(m.change or 0.0), m.where, m.signal))
    return kept[:limit]


def summary(moves: Iterable[Move], limit: int = 4) -> str:
    """``moves`` in words, grouped by series in order of their first:
    ``GPU 2 power -80 %, utilisation 0 %; rag-api-1 retriever P95 2.3x``."""
    groups: dict[str, list[str]] = {}
    for m in list(moves)[:limit]:
        groups.setdefault(m.where, []).append(m.words(where=False))
    return "; ".join(f"{where} {', '.join(said)}" for where, said in groups.items())


# ---------------------------------------------------------------------------- explaining


def explain(
    status: Mapping[str, Any],
    *,
    fingerprint: str | None = None,
    host: str | None = None,
    service: str | None = None,
    min_score: float = MIN_SCORE,
    limit: int = 20,
) -> dict[str, Any]:
    """What moved around an alert (``fingerprint``: its host and service, from its
    labels), on a host or in a service: the ranked moves, in words too. LookupError if
    the alert, the host or the service is not in ``status``."""
    target: dict[str, Any] = {}
    if fingerprint is not None:
        alert = next(
            (a for a in _dicts(status.get("alerts")) if a.get("fingerprint") == fingerprint),
            None,
        )
        if alert is None:
            raise LookupError(f"no active alert with fingerprint {fingerprint}")
        raw = alert.get("labels")
        labels: dict[str, Any] = raw if isinstance(raw, dict) else {}
        host, service = host or labels.get("host"), service or labels.get("service")
        target["alert"] = {
            k: alert.get(k) for k in ("fingerprint", "rule", "status", "starts_at", "labels")
        }
    known_hosts = {h.get("host") for h in _dicts(status.get("hosts"))}
    known_services = {s.get("service") for s in _dicts(status.get("services"))}
    if host is None and service is None:
        raise LookupError("name an alert's fingerprint, a host or a service")
    if host is not None and host not in known_hosts and service not in known_services:
        raise LookupError(f"no host {host} in the status")
    if service is not None and service not in known_services and host not in known_hosts:
        raise LookupError(f"no service {service} in the status")
    moves = rank(gather(status, host=host, service=service), min_score, limit)
    return {
        **target,
        "host": host,
        "service": service,
        "window_s": PEAK_S,
        "min_score": min_score,
        "moves": [m.as_dict() for m in moves],
        "summary": summary(moves, limit=limit) or "nothing anomalous",
    }
