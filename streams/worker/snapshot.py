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

**Older formats.** :mod:`~.migrations` holds what this version reads of older snapshots
and until when: the pickles of version 6 and older are refused (the key starts afresh); parts
of version 7 written before a field existed are brought up to date before a pipeline
adopts them. A snapshot that fails to load (another version, corrupt, of other shapes)
raises :class:`SnapshotError`: the worker counts it and starts that key from scratch
(nothing of it adopted).

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

import logging
from collections.abc import Mapping
from typing import Any

import msgspec

from ragwatch.errors import RagwatchError
from ragwatch.streams.alerting.engine import AlertState, fingerprint
from ragwatch.streams.alerting.plain import export_plain, states_of
from ragwatch.streams.pipelines.base import Domain, owns
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.worker import migrations

log = logging.getLogger(__name__)

# the format written and read (the older ones, and what becomes of them: migrations.py)
SNAPSHOT_VERSION = 7
MAGIC = b"ragwatch-snapshot\x00"  # then the version byte, then msgpack
_ENCODER = msgspec.msgpack.Encoder()


class SnapshotError(RagwatchError):
    """A snapshot that cannot be used: corrupt, another version, or not allowed."""


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
    body = {
        "v": SNAPSHOT_VERSION,
        "kind": domain,
        "key": key,
        "parts": p.dump(domain, key),
        "alerts": export_plain(p.engine, lambda lab: owns(domain, key, lab)),
    }
    return MAGIC + bytes([SNAPSHOT_VERSION]) + _ENCODER.encode(body)


def _load(p: Pipelines, domain: Domain, key: str, data: bytes) -> int:
    if not data.startswith(MAGIC):
        raise SnapshotError(f"{domain} snapshot of {key!r} {migrations.not_read(data)}")
    parts, alerts = _decode(domain, key, data)
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
    except Exception as exc:  # an alert of another shape
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
