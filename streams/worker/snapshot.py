"""Snapshots of a worker's state per host and per service, so a restart resumes, not relearns.

A worker keeps every detector, bucket and alert timer in memory. It writes, for each host
and service whose state changed, a snapshot to Redis at most every
``RAGWATCH_SNAPSHOT_INTERVAL`` seconds (10, spread over the interval; see
:mod:`ragwatch.store`); when it meets a host or service it does not know (after a
restart, or when a rebalance hands it a partition another worker had) it loads that
snapshot before processing the message:

- a **host** snapshot holds the host's GPU and process series (leak detectors, latest
  signals), its scraped engines (counters, baselines), the aging alerts and recent
  identities of its device events, and the engine state of every alert labelled with
  that host (pending timers included);
- a **service** snapshot holds its instances' series (open buckets, evidence windows,
  seasonal baselines), the shared request-outlier detector, and the engine state of every
  alert labelled with that service.

Together with the pipelines dropping what they have seen already (a sample not newer than
its series' last, an envelope not newer than its sender's last, a device event seen
before), replaying Kafka from the last committed offset after a crash changes nothing, and
the alert that was pending or firing stays so without paging again.

**Format (version 7).** :data:`MAGIC` and a version byte, then msgpack
(:mod:`msgspec.msgpack`) of plain data: ``{"v": 7, "kind": "host" | "service", "key": ...,
"parts": {pipeline name: its dump}, "alerts": [state, ...]}``. Every pipeline's ``dump`` is
plain data (str keys; str, int, float, bool, None, bytes, lists): series as typed arrays
(raw little-endian bytes per column, the banks' rows) and their keys and labels as lists;
each alert state holds its alert in the wire form
(:func:`~ragwatch.streams.alerting.plain.export_plain`). It
is decoded into plain Python only (no class is ever built from the data) and each
pipeline checks its part before it changes anything. The magic cannot be a pickle (whose
first byte is 0x80).

**The previous format.** Snapshots of version 6 and 5 were pickles. While
``RAGWATCH_SNAPSHOT_LEGACY`` is on (the default in this release: for the rolling upgrade),
they are read once with an allow-list unpickler (only classes of ragwatch's own detectors,
streams and schema, and a few containers from the standard library, can be rebuilt, and
nothing can be called), logged once per key, and the key's next snapshot is version 7;
with it off, nothing is ever unpickled and such a snapshot is refused. A snapshot that
fails to load (another version, corrupt, of other shapes) raises :class:`SnapshotError`:
the worker counts it and starts that key from scratch (nothing of it adopted).

>>> from ragwatch.agents.scenario import build
>>> from ragwatch.streams.pipelines.fleet import Pipelines
>>> from ragwatch.streams.alerting.rules import load_rules
>>> rules = load_rules()
>>> first = Pipelines(rules)
>>> for env in build("leak", hosts=1, gpus=1, services=0, interval_s=60.0).envelopes(hours=2):
...     _ = first.process(env)
>>> data = dump_host(first, "gpu-node-01")
>>> data.startswith(MAGIC)
True
>>> second = Pipelines(rules)                     # a restarted worker
>>> load_host(second, "gpu-node-01", data)
3
>>> [a.status for a in second.engine.active.values()]
['firing']
"""

from __future__ import annotations

import io
import logging
import pickle
from collections.abc import Mapping
from typing import Any

import msgspec

from ragwatch.errors import RagwatchError
from ragwatch.streams.alerting.engine import AlertState, fingerprint
from ragwatch.streams.alerting.plain import export_plain, states_of
from ragwatch.streams.pipelines.base import Domain, owns
from ragwatch.streams.pipelines.fleet import Pipelines

log = logging.getLogger(__name__)

# 2: GPU series keep raw values; 3: request series keep evidence windows and seasonal
# baselines; 4: request buckets count an outlier cluster's records apart; 5: seasonal
# baselines keep a row per day seen and count rings grow as buckets arrive; 6: tail
# windows keep runs of one bucket, outlier windows doubles; 7: msgpack of plain data, not
# a pickle (a worker writes 7 and reads 7, and 6 and 5 while RAGWATCH_SNAPSHOT_LEGACY is
# on; a worker of version 6 counts a 7 as unreadable and relearns that key, once)
SNAPSHOT_VERSION = 7
MAGIC = b"ragwatch-snapshot\x00"  # then the version byte, then msgpack
LEGACY_VERSIONS = frozenset({5, 6})  # pickles, read only while the setting allows it
LEGACY_DEFAULT = True  # RAGWATCH_SNAPSHOT_LEGACY's default (ragwatch.config)
_PICKLE = b"\x80"  # the PROTO opcode every pickle of protocol 2 and later starts with
_ENCODER = msgspec.msgpack.Encoder()


class SnapshotError(RagwatchError):
    """A snapshot that cannot be used: corrupt, another version, or not allowed."""


def dump_host(p: Pipelines, host: str) -> bytes:
    """The host's state in every host pipeline and the engine state of its alerts."""
    return _dump(p, "host", host)


def dump_service(p: Pipelines, service: str) -> bytes:
    """The service's state in every service pipeline and the engine state of its alerts."""
    return _dump(p, "service", service)


def load_host(p: Pipelines, host: str, data: bytes, *, legacy: bool = LEGACY_DEFAULT) -> int:
    """Adopt a host snapshot (what ``p`` already knows wins); returns the series adopted.
    ``legacy``: whether a snapshot of the previous format (a pickle) may be read."""
    return _load(p, "host", host, data, legacy)


def load_service(p: Pipelines, service: str, data: bytes, *, legacy: bool = LEGACY_DEFAULT) -> int:
    """Adopt a service snapshot (what ``p`` already knows wins); returns the series adopted.
    ``legacy``: whether a snapshot of the previous format (a pickle) may be read."""
    return _load(p, "service", service, data, legacy)


def _dump(p: Pipelines, domain: Domain, key: str) -> bytes:
    body = {
        "v": SNAPSHOT_VERSION,
        "kind": domain,
        "key": key,
        "parts": p.dump(domain, key),
        "alerts": export_plain(p.engine, lambda lab: owns(domain, key, lab)),
    }
    return MAGIC + bytes([SNAPSHOT_VERSION]) + _ENCODER.encode(body)


def _load(p: Pipelines, domain: Domain, key: str, data: bytes, legacy: bool) -> int:
    if data.startswith(MAGIC):
        parts, alerts = _decode(domain, key, data)
    elif data.startswith(_PICKLE) and legacy:
        parts, alerts = _unpickle(domain, key, data)
    elif data.startswith(_PICKLE):
        raise SnapshotError(
            f"{domain} snapshot of {key!r} is of the previous format, not read "
            "(RAGWATCH_SNAPSHOT_LEGACY=false)"
        )
    else:
        raise SnapshotError(f"{domain} snapshot of {key!r} is not a snapshot (no header)")
    alerts = _own_alerts(domain, key, alerts)
    pipes = p.of(domain)
    fresh = not any(pipe.tracks(key) for pipe in pipes)
    try:
        n = p.adopt(domain, key, parts)
    except Exception as exc:  # untrusted data: whatever it raises (RecursionError, ...)
        if fresh:  # a part adopted before the one that failed goes too: from scratch
            for pipe in pipes:
                pipe.forget(key)
        raise SnapshotError(f"{domain} snapshot of {key!r} does not fit: {_why(exc)}") from None
    p.engine.restore(alerts, {r.name for r in p.rules})
    return n


def _own_alerts(
    domain: Domain, key: str, alerts: Mapping[str, AlertState]
) -> dict[str, AlertState]:
    """The key's own alerts (those its dump exported), each under the fingerprint of its
    rule and labels: a state filed under another alert's fingerprint would take that
    alert's place in the engine (SnapshotError)."""
    try:
        misfiled = [
            fp for fp, s in alerts.items() if fp != fingerprint(s.alert.rule, s.alert.labels)
        ]
        own = {fp: s for fp, s in alerts.items() if owns(domain, key, s.alert.labels)}
    except Exception as exc:  # a legacy state's alert of another shape
        raise SnapshotError(f"{domain} snapshot of {key!r}: its alerts: {_why(exc)}") from None
    if misfiled:
        raise SnapshotError(
            f"{domain} snapshot of {key!r}: {len(misfiled)} alert state(s) filed under "
            "another alert's fingerprint"
        )
    return own


def _decode(domain: Domain, key: str, data: bytes) -> tuple[dict[str, Any], dict[str, AlertState]]:
    """A version-7 snapshot's parts and alert states (checked: SnapshotError)."""
    version = data[len(MAGIC)] if len(data) > len(MAGIC) else None
    if version != SNAPSHOT_VERSION:
        raise SnapshotError(f"{domain} snapshot of {key!r} has another version ({version})")
    try:
        state = msgspec.msgpack.decode(data[len(MAGIC) + 1 :])
    except Exception as exc:  # DecodeError, RecursionError (a deep nest), MemoryError, ...
        raise SnapshotError(f"unreadable {domain} snapshot of {key!r}: {exc}") from None
    _check_header(domain, key, state, {SNAPSHOT_VERSION})
    parts = state.get("parts")
    if not isinstance(parts, dict) or not all(isinstance(k, str) for k in parts):
        raise SnapshotError(f"{domain} snapshot of {key!r}: its parts are not a map by name")
    try:
        alerts = states_of(state.get("alerts"))
    except Exception as exc:  # ValueError, or what formatting a hostile value raises
        raise SnapshotError(f"{domain} snapshot of {key!r} does not fit: {_why(exc)}") from None
    return parts, alerts


def _check_header(
    domain: Domain, key: str, state: Any, versions: set[int] | frozenset[int]
) -> None:
    if not isinstance(state, dict) or type(state.get("v")) is not int or state["v"] not in versions:
        raise SnapshotError(f"{domain} snapshot of {key!r} has another version")
    if state.get("kind") != domain or state.get("key") != key:
        raise SnapshotError(
            f"snapshot under {domain} {key!r} is of {_shown(state.get('kind'))} "
            f"{_shown(state.get('key'))}"
        )


def _shown(value: Any) -> str:
    """A value read from a snapshot, for a message: a string (shortened) as it is, anything
    else by its type (its repr could be huge, or nested too deep to print)."""
    return repr(value[:100]) if isinstance(value, str) else f"a {type(value).__name__}"


def _why(exc: Exception) -> str:
    """Why a snapshot did not fit, for a message (shortened: it may quote the snapshot)."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


# ---------------------------------------------------------------------- versions 5 and 6
# Pickles, read with an allow-list while RAGWATCH_SNAPSHOT_LEGACY is on (the next version
# drops this part and the setting).

# (module, names) the unpickler may rebuild besides ragwatch's own classes
_STDLIB: dict[str, frozenset[str]] = {
    "builtins": frozenset({"set", "frozenset", "list", "dict", "tuple", "float", "int"}),
    "collections": frozenset({"deque", "Counter", "OrderedDict"}),
    "array": frozenset({"array", "_array_reconstructor"}),
    "random": frozenset({"Random"}),
    "copyreg": frozenset({"_reconstructor"}),
}
# ragwatch's classes whose objects versions 5 and 6 held (as their modules name them now):
# data classes only, whose construction sizes nothing by its arguments (a bank or a
# pipeline, built by a pickle, would allocate what the pickle asks for)
_OWN: dict[str, frozenset[str]] = {
    "ragwatch.detectors.leak": frozenset({"LeakDetector", "LeakEstimate"}),
    "ragwatch.detectors.request_outliers": frozenset({"RequestOutliers"}),
    "ragwatch.detectors.seasonal": frozenset({"SeasonalBaseline"}),
    "ragwatch.schema": frozenset({"Alert"}),
    "ragwatch.streams.alerting.engine": frozenset({"AlertState"}),
    "ragwatch.streams.pipelines.evidence": frozenset(
        {"CountRing", "LatencyBaseline", "TailWindow"}
    ),
    "ragwatch.streams.pipelines.gpu": frozenset({"Series"}),
    "ragwatch.streams.pipelines.metrics": frozenset({"EngineSeries", "_Counter"}),
    "ragwatch.streams.pipelines.buckets": frozenset({"Bucket", "Reservoir"}),
    "ragwatch.streams.pipelines.legacy_series": frozenset({"ServiceSeries", "_Pending"}),
    "ragwatch.streams.pipelines.service_clusters": frozenset({"ServiceClusters"}),
}
# modules that moved when streams/ got packages by job (snapshots of version 5 written
# before the move name the old ones): old -> new
MOVED = {
    f"ragwatch.streams.{old}": f"ragwatch.streams.{new}"
    for old, new in {
        "budget": "pipelines.budget",
        "evidence": "pipelines.evidence",
        "gpu": "pipelines.gpu",
        "requests": "pipelines.requests",
        "metrics": "pipelines.metrics",
        "events": "pipelines.events",
        "hints": "pipelines.hints",
        "pipelines": "pipelines.fleet",
        "series": "pipelines.charts",
        "rules": "alerting.rules",
        "engine": "alerting.engine",
    }.items()
}


# classes of version-6 snapshots that live elsewhere now (the request series became rows;
# their objects are read once, into rows: service_snapshot.adopt): (module, name) -> new
RENAMED = {
    ("ragwatch.streams.pipelines.requests", name): (f"ragwatch.streams.pipelines.{mod}", new)
    for name, (mod, new) in {
        "ServiceSeries": ("legacy_series", "ServiceSeries"),
        "_Pending": ("legacy_series", "_Pending"),
        "_Service": ("service_clusters", "ServiceClusters"),
        "Bucket": ("buckets", "Bucket"),
        "Reservoir": ("buckets", "Reservoir"),
    }.items()
}
RENAMED[("ragwatch.streams.alerting.engine", "_State")] = (
    "ragwatch.streams.alerting.engine",
    "AlertState",
)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = MOVED.get(module, module)
        module, name = RENAMED.get((module, name), (module, name))
        if name in _STDLIB.get(module, ()) or name in _OWN.get(module, ()):
            return super().find_class(module, name)
        raise SnapshotError(f"snapshot refers to {module}.{name}, which is not allowed")


def _unpickle(
    domain: Domain, key: str, data: bytes
) -> tuple[dict[str, Any], dict[str, AlertState]]:
    """A version-5 or 6 snapshot's parts and alert states (SnapshotError if unusable)."""
    try:
        state = _Unpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except Exception as exc:  # pickle raises many types on corrupt input
        raise SnapshotError(f"unreadable {domain} snapshot of {key!r}: {exc}") from None
    _check_header(domain, key, state, LEGACY_VERSIONS)
    try:
        parts = _legacy_parts(domain, state)
        alerts = state["alerts"]
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"{domain} snapshot of {key!r} does not fit: {exc!r}") from None
    if not isinstance(alerts, Mapping) or not all(
        isinstance(s, AlertState) for s in alerts.values()
    ):
        raise SnapshotError(f"{domain} snapshot of {key!r}: its alerts are not alert states")
    # once per key in practice: the key's next snapshot is of this version
    log.info(
        "%s %s: read a snapshot of the previous format (version %s); its next one is "
        "version %d (RAGWATCH_SNAPSHOT_LEGACY=false once every worker is upgraded)",
        domain,
        key,
        state["v"],
        SNAPSHOT_VERSION,
    )
    return parts, dict(alerts)


def _legacy_parts(kind: str, state: dict[str, Any]) -> dict[str, Any]:
    """The pipelines' parts of a snapshot, by pipeline name. Snapshots written before the
    pipelines had names held the same parts under fixed keys."""
    if "parts" in state:
        return dict(state["parts"])
    if kind == "host":
        return {"gpu": state["series"], "events": state["events"], "engines": state["engines"]}
    return {"requests": (state["series"], state["shared"])}
