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

Snapshots are pickles, read with an allow-list: only classes of ragwatch's own detectors,
streams and schema, and a few containers from the standard library, can be rebuilt, and
nothing can be called. A host's GPU and process series are typed arrays in it (raw
little-endian bytes per column, keys and labels as plain tuples and dicts:
``GpuPipeline.dump``), so they rebuild no class at all; GPU series in the previous form
(a ``Series`` object each) are still adopted. A snapshot that fails to load (another
version, corrupt) is counted and skipped: the worker starts that key from scratch.

>>> from ragwatch.agents.scenario import build
>>> from ragwatch.streams.pipelines.fleet import Pipelines
>>> from ragwatch.streams.alerting.rules import load_rules
>>> rules = load_rules()
>>> first = Pipelines(rules)
>>> for env in build("leak", hosts=1, gpus=1, services=0, interval_s=60.0).envelopes(hours=2):
...     _ = first.process(env)
>>> data = dump_host(first, "gpu-node-01")
>>> second = Pipelines(rules)                     # a restarted worker
>>> load_host(second, "gpu-node-01", data)
3
>>> [a.status for a in second.engine.active.values()]
['firing']
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from ragwatch.errors import RagwatchError
from ragwatch.streams.pipelines.base import Domain, owns
from ragwatch.streams.pipelines.fleet import Pipelines

# 2: GPU series keep raw values; 3: request series keep evidence windows and seasonal
# baselines; 4: request buckets count an outlier cluster's records apart; 5: seasonal
# baselines keep a row per day seen and count rings grow as buckets arrive; 6: tail
# windows keep runs of one bucket, outlier windows doubles (a worker reads 5 and 6 and
# writes 6, so a worker of the version before relearns what it reads from this one
# instead of failing on it; a snapshot of another version is not used: its hosts and
# services learn again, once)
SNAPSHOT_VERSION = 6
READABLE_VERSIONS = frozenset({5, 6})

# (module, names) the unpickler may rebuild besides ragwatch's own classes
_STDLIB: dict[str, frozenset[str]] = {
    "builtins": frozenset({"set", "frozenset", "list", "dict", "tuple", "float", "int"}),
    "collections": frozenset({"deque", "Counter", "OrderedDict"}),
    "array": frozenset({"array", "_array_reconstructor"}),
    "random": frozenset({"Random"}),
    "copyreg": frozenset({"_reconstructor"}),
}
_OWN = ("ragwatch.detectors.", "ragwatch.streams.", "ragwatch.schema")
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


class SnapshotError(RagwatchError):
    """A snapshot that cannot be used: corrupt, another version, or not allowed."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = MOVED.get(module, module)
        if name in _STDLIB.get(module, ()):
            return super().find_class(module, name)
        if module.startswith(_OWN) or module == "ragwatch.schema":
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        raise SnapshotError(f"snapshot refers to {module}.{name}, which is not allowed")


def _dumps(kind: str, key: str, body: dict[str, Any]) -> bytes:
    return pickle.dumps({"v": SNAPSHOT_VERSION, "kind": kind, "key": key, **body}, protocol=5)


def _loads(kind: str, key: str, data: bytes) -> dict[str, Any]:
    try:
        state = _Unpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except Exception as exc:  # pickle raises many types on corrupt input
        raise SnapshotError(f"unreadable {kind} snapshot of {key!r}: {exc}") from None
    if not isinstance(state, dict) or state.get("v") not in READABLE_VERSIONS:
        raise SnapshotError(f"{kind} snapshot of {key!r} has another version")
    if state.get("kind") != kind or state.get("key") != key:
        raise SnapshotError(
            f"snapshot under {kind} {key!r} is of {state.get('kind')} {state.get('key')!r}"
        )
    return state


def _rule_names(p: Pipelines) -> set[str]:
    return {r.name for r in p.rules}


def _parts(kind: str, state: dict[str, Any]) -> dict[str, Any]:
    """The pipelines' parts of a snapshot, by pipeline name. Snapshots written before the
    pipelines had names held the same parts under fixed keys."""
    if "parts" in state:
        return dict(state["parts"])
    if kind == "host":
        return {"gpu": state["series"], "events": state["events"], "engines": state["engines"]}
    return {"requests": (state["series"], state["shared"])}


def dump_host(p: Pipelines, host: str) -> bytes:
    """The host's state in every host pipeline and the engine state of its alerts."""
    return _dump(p, "host", host)


def dump_service(p: Pipelines, service: str) -> bytes:
    """The service's state in every service pipeline and the engine state of its alerts."""
    return _dump(p, "service", service)


def load_host(p: Pipelines, host: str, data: bytes) -> int:
    """Adopt a host snapshot (what ``p`` already knows wins); returns the series adopted."""
    return _load(p, "host", host, data)


def load_service(p: Pipelines, service: str, data: bytes) -> int:
    """Adopt a service snapshot (what ``p`` already knows wins); returns the series adopted."""
    return _load(p, "service", service, data)


def _dump(p: Pipelines, domain: Domain, key: str) -> bytes:
    alerts = p.engine.export(lambda lab: owns(domain, key, lab))
    return _dumps(domain, key, {"parts": p.dump(domain, key), "alerts": alerts})


def _load(p: Pipelines, domain: Domain, key: str, data: bytes) -> int:
    state = _loads(domain, key, data)
    try:
        n = p.adopt(domain, key, _parts(domain, state))
        p.engine.restore(state["alerts"], _rule_names(p))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SnapshotError(f"{domain} snapshot of {key!r} does not fit: {exc}") from None
    return n
