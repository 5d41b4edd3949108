"""Chart series ids: how the worker names the Redis lists of its charts, and how the
console finds the charts of an alert. Shared by the worker (which writes them) and the
console (which reads them), so they live in the core.

An id is ``kind:WHERE:suffix``; each name in ``WHERE`` has ``%`` and ``:`` escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# the labels an alert needs to be on a series of each kind, best kind first ("mig" too
# names a GPU, when not empty)
KINDS: dict[str, tuple[str, ...]] = {
    "process": ("host", "gpu", "pid"),
    "gpu": ("host", "gpu"),
    "engine": ("host", "target"),
    "service": ("service", "instance"),
}


def series_prefix(kind: str, labels: Mapping[str, Any]) -> str:
    """``kind:WHERE:``, the start of the ids of one series' charts (ids end in a suffix).
    Each name has its ``%`` and ``:`` escaped (``%25``, ``%3A``), so service ``a:b`` with
    instance ``c`` and service ``a`` with instance ``b:c`` are two series, not one.

    >>> series_prefix("process", {"host": "h", "gpu": "0", "mig": "", "pid": "7"})
    'process:h:0:7:'
    >>> series_prefix("service", {"service": "a:b", "instance": "c"})
    'service:a%3Ab:c:'
    """

    def get(name: str) -> str:
        return _escaped(labels.get(name, ""))

    if kind == "service":
        return f"service:{get('service')}:{get('instance')}:"
    if kind == "engine":
        return f"engine:{get('host')}:{get('target')}:"
    mig = get("mig") if labels.get("mig") else ""
    where = f"{get('host')}:{get('gpu')}" + (f":{mig}" if mig else "")
    return f"gpu:{where}:" if kind == "gpu" else f"{kind}:{where}:{get('pid')}:"


def _escaped(name: Any) -> str:
    return str(name).replace("%", "%25").replace(":", "%3A")


def owner_prefixes(hosts: Iterable[str], services: Iterable[str]) -> tuple[str, ...]:
    """The starts of every chart id of these hosts' GPU, process and engine series and of
    these services' instances.

    >>> owner_prefixes(["h:1"], ["rag"])
    ('gpu:h%3A1:', 'process:h%3A1:', 'engine:h%3A1:', 'service:rag:')
    """
    out = [f"{kind}:{_escaped(h)}:" for h in hosts for kind in ("gpu", "process", "engine")]
    return (*out, *(f"service:{_escaped(s)}:" for s in services))


def alert_prefixes(labels: Mapping[str, str]) -> dict[str, str]:
    """kind -> :func:`series_prefix` of each kind of series an alert with ``labels`` can
    be on (a process alert is on its process and on its GPU)."""
    return {
        kind: series_prefix(kind, labels)
        for kind, need in KINDS.items()
        if all(labels.get(k) for k in need)
    }


def alert_series(
    rule: str, labels: Mapping[str, str], index: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The ids in ``index`` (series id -> index entry) that chart the alert of ``rule``
    with ``labels``, best first: the series whose entry lists the rule, then the other
    charts of its process, GPU, engine or service instance."""
    prefixes = alert_prefixes(labels)
    order = list(KINDS)
    found = []
    for sid, meta in index.items():
        kind, own = meta.get("kind"), meta.get("labels")
        prefix = prefixes.get(kind) if isinstance(kind, str) else None
        if prefix is None or not isinstance(own, Mapping) or not sid.startswith(prefix):
            continue
        if series_prefix(str(kind), own) == prefix:  # not a MIG instance of the GPU
            rules = meta.get("rules")
            charts = isinstance(rules, list) and rule in rules
            found.append((not charts, order.index(str(kind)), sid))
    return [sid for _, _, sid in sorted(found)]


# the small multiples of an alert's page (what the seed's SRE hunted through Grafana for):
# each GPU's memory, utilisation and power, its processes' memory, and each instance's
# tokens/s, decode speed and per-stage P95, in this order
MULTIPLES: dict[str, tuple[str, ...]] = {
    "gpu": ("fb_used", "gpu_util", "power_w"),
    "process": ("gpu_mem",),
    "service": ("tokens_per_s", "decode_tps", "e2e_p95", "retriever_p95", "reranker_p95",
                "llm_p95"),
}  # fmt: skip
MAX_MULTIPLES = 36
# the columns of a chart's points (streams/pipelines/charts.py), and of a band chart's: its
# forecast is the generic detector's expected value, its band lower to upper
POINT_COLUMNS = ("ts", "value", "forecast", "score")
BAND_COLUMNS = (*POINT_COLUMNS, "lower", "upper")


def multiple_starts(hosts: Iterable[str], instances: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The starts of the ids of the small multiples of ``hosts`` and of the service
    ``instances`` ((service, instance) pairs)."""
    own = [series_prefix("service", {"service": s, "instance": i}) for s, i in instances]
    return (*owner_prefixes(hosts, []), *own)


def multiples(
    index: Mapping[str, Mapping[str, Any]],
    hosts: Iterable[str],
    instances: Iterable[tuple[str, str]],
) -> list[str]:
    """The ids in ``index`` of the small multiples of ``hosts`` (their GPUs' and
    processes') and of the service ``instances`` ((service, instance) pairs), in
    :data:`MULTIPLES`' order, series by series, at most :data:`MAX_MULTIPLES`.

    >>> index = {i: {} for i in ("gpu:h:0:power_w", "gpu:h:0:fb_used", "gpu:h2:0:fb_used",
    ...                          "service:rag:r-1:decode_tps", "service:rag:r-1:errors")}
    >>> multiples(index, ["h"], [("rag", "r-1")])
    ['gpu:h:0:fb_used', 'gpu:h:0:power_w', 'service:rag:r-1:decode_tps']
    """
    starts = multiple_starts(hosts, instances)
    found = []
    for sid in index:
        kind, _, rest = sid.partition(":")
        where, _, suffix = rest.rpartition(":")
        if suffix in MULTIPLES.get(kind, ()) and sid.startswith(starts):
            found.append((list(MULTIPLES).index(kind), where, MULTIPLES[kind].index(suffix), sid))
    return [sid for *_, sid in sorted(found)][:MAX_MULTIPLES]
