"""A service's request series as plain data: what its snapshot holds, and back.

:func:`dump` writes a service's rows of :class:`~.service_rows.ServiceRows` as plain data
(str keys; numbers, strings, lists and dicts; the arrays as raw little-endian bytes), no
object that unpickling would rebuild: scalar columns and the banks' rows as typed arrays,
the per-row lists (open buckets, tail windows, gaps, senders) element by element, the
signals with their names (a snapshot of another signal set maps by name), and the
service's outlier window and cluster state. :func:`adopt` checks all of it before any row
changes.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from ragwatch.detectors.counts import CountBank
from ragwatch.detectors.latency import LatencyBank
from ragwatch.detectors.request_outliers import RequestOutliers
from ragwatch.detectors.seasonal import SeasonalBank
from ragwatch.detectors.service_clusters import ServiceClusters
from ragwatch.detectors.tails import TailWindow
from ragwatch.streams.pipelines.buckets import DERIVED, Bucket, Reservoir
from ragwatch.streams.pipelines.service_rows import (
    RECENT_BUCKETS,
    SCALARS,
    SERVING,
    SIGNAL_AT,
    SIGNALS,
    ServiceRows,
)

FORMAT = "service-rows/1"
BANKS = ("traffic", "latency", "counts")  # ServiceRows' banks
PAIRED = frozenset({"traffic", "latency"})  # two rows a series (ServiceRows.both)
# rows a series of the serving bank (ServiceRows.three); a snapshot without it (written
# before it existed) leaves the series' serving baselines fresh
SERVING_ROWS = len(SERVING)
Rows = npt.NDArray[np.intp]
INT64 = 2**63


def _int(v: int) -> int | str:
    """An int msgpack can carry (64 bits), else its digits (a sum of huge token counts)."""
    return v if -INT64 <= v < INT64 else str(v)


def _probe(bank: Any, n: int) -> Any:
    """An empty bank of ``bank``'s kind and parameters, for ``n`` rows: a snapshot's part
    is loaded into it first, so one that does not fit raises before a row changes."""
    if isinstance(bank, SeasonalBank):
        return SeasonalBank(bank.params, max(1, n))
    if isinstance(bank, LatencyBank):
        return LatencyBank(
            max(1, n), entry_values=bank.entry_values, min_entries=bank.min_entries,
            hold=bank.hold, hold_max_s=bank.hold_max_s,
        )  # fmt: skip
    if isinstance(bank, CountBank):
        return CountBank(bank.capacity, bank.bucket_s, max(1, n))
    raise TypeError(f"not a bank: {type(bank).__name__}")


def _from_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise ValueError(f"expected an integer, got {type(v).__name__}")
    return int(v)


def _bytes(v: Any, dtype: str) -> npt.NDArray[Any]:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise ValueError(f"expected bytes, got {type(v).__name__}")
    return np.frombuffer(v, dtype=dtype)


# ---------------------------------------------------------------------- dump


def dump(
    st: ServiceRows, service: str, instances: Sequence[tuple[str, int]], svc: ServiceClusters | None
) -> dict[str, Any]:
    """The service's series (``instances``: instance and row, in order) and its shared
    outlier state, as plain data."""
    r = np.array([row for _, row in instances], dtype=np.intp)
    rows = r.tolist()
    return {
        "format": FORMAT,
        "service": service,
        "instances": [i for i, _ in instances],
        "scalars": {
            name: st.col[name][r].astype(st.col[name].dtype.newbyteorder("<")).tobytes()
            for name in SCALARS
        },
        "recent": st.recent[r].astype("<i8").tobytes(),
        "signal_names": list(SIGNALS),
        "signals": st.signals[r].astype("<f8").tobytes(),
        "banks": {
            "traffic": st.traffic.dump(st.both(r)),
            "latency": st.latency.dump(st.both(r)),
            "counts": st.counts.dump(r),
            "serving": st.serving.dump(st.three(r)),
        },
        "next_bucket": [None if (b := st.next_bucket[x]) is None else _int(b) for x in rows],
        "buckets": [[[_int(b), _bucket(k)] for b, k in st.buckets[x].items()] for x in rows],
        "tails": [_tail(st.tails[x]) for x in rows],
        "gaps": [[[_int(a), _int(b)] for a, b in st.gaps[x]] for x in rows],
        "senders": [[[pid, ts] for pid, ts in st.senders[x].items()] for x in rows],
        "host": [st.host[x] for x in rows],
        "label": [st.label[x] for x in rows],
        "scores": st.scores.dump_many(rows),  # None: not scored (.scoring)
        "shared": None if svc is None else _clusters(svc),
    }


def _bucket(b: Bucket) -> dict[str, Any]:
    return {
        "n": b.n,
        "errors": b.errors,
        "output_tokens": _int(b.output_tokens),
        "output_sq": b.output_sq,
        "context_tokens": _int(b.context_tokens),
        "outliers": b.outliers,
        "novel": b.novel,
        "clustered": b.clustered,
        "labels": [[k, v] for k, v in b.labels.items()],
        "latencies": {k: [r.seen, r.values.tobytes()] for k, r in b.latencies.items()},
    }


def _tail(t: TailWindow) -> dict[str, Any]:
    cache = t.cache
    return {
        "params": [t.min_values, t.min_s, t.max_s, t.bucket_s],
        "vals": {k: v.tobytes() for k, v in t._vals.items()},
        "runs": {k: np.asarray(v, dtype="<i8").tobytes() for k, v in t._runs.items()},
        "starts": {k: np.asarray(v, dtype="<i8").tobytes() for k, v in t._starts.items()},
        "seen": dict(t.seen),
        "version": t.version,
        "newest": t.newest,
        "expiry": t.expiry,
        "cache": None if cache is None else [cache[0], cache[1], dict(cache[2])],
    }


def _clusters(svc: ServiceClusters) -> dict[str, Any]:
    det = svc.detector.__getstate__()
    return {
        "detector": {**det, "points": det["points"].tobytes()},
        "name": svc.name,
        "known": [list(c) for c in svc.known],
        "checked": svc.checked,
        "flag": svc.flag,
        "size": svc.size,
        "scanned": svc.scanned,
        "dense": sorted(list(c) for c in svc.dense),
        "novel": svc.novel,
        "active": None if svc.active is None else list(svc.active),
        "active_instance": svc.active_instance,
        "active_label": svc.active_label,
        "active_cells": sorted(list(c) for c in svc.active_cells),
        "memory": svc.memory_state(),
    }


# ---------------------------------------------------------------------- adopt


def adopt(
    st: ServiceRows,
    service: str,
    state: Any,
    room: int,
    rng: random.Random,
    max_instances: int,
) -> tuple[ServiceClusters, list[int]] | None:
    """Rows for the series of a snapshot's state (:func:`dump`'s), at most ``room`` of
    them, and the service's shared state; None if the state is of another service.
    ValueError (nothing changed) if it does not fit, or holds more than ``max_instances``
    series (a service never has more: checked before anything is sized by what the
    snapshot claims)."""
    if isinstance(state, Mapping) and state.get("format") == FORMAT:
        if len(state.get("instances") or ()) > max_instances:
            raise ValueError(f"more than max_instances={max_instances} series")
        return _adopt_rows(st, service, state, room, rng)
    raise ValueError(f"request state of service {service!r} in an unknown format")


def _adopt_rows(
    st: ServiceRows, service: str, state: Mapping[str, Any], room: int, rng: random.Random
) -> tuple[ServiceClusters, list[int]] | None:
    if state.get("service") != service or state.get("shared") is None:
        return None  # another service's, or one this worker did not track (nothing in it)
    instances = [str(i) for i in state["instances"]]
    n = len(instances)
    parsed = _parse(st, state, n, rng)  # every check, before a row changes
    shared = _parse_clusters(state["shared"], service)
    order = sorted(range(n), key=lambda i: instances[i])[: max(0, room)]
    rows = [st.add((service, instances[i]), at=-math.inf) for i in order]
    if rows:
        _write(st, np.array(rows, dtype=np.intp), np.array(order, dtype=np.intp), parsed)
    return shared, rows


def _parse(st: ServiceRows, state: Mapping[str, Any], n: int, rng: random.Random) -> dict[str, Any]:
    scalars = {}
    for name, (dtype, fresh) in SCALARS.items():
        if name not in state["scalars"]:  # a snapshot from before the column: fresh
            scalars[name] = np.full(n, fresh, dtype=dtype)
            continue
        a = _bytes(state["scalars"][name], np.dtype(dtype).newbyteorder("<").str)
        if len(a) != n:
            raise ValueError(f"{name}: {len(a)} values for {n} series")
        scalars[name] = a
    recent = _bytes(state["recent"], "<i8")
    names = [str(x) for x in state["signal_names"]]
    signals = _bytes(state["signals"], "<f8")
    if len(recent) != n * RECENT_BUCKETS or len(signals) != n * len(names):
        raise ValueError("recent outliers or signals of another shape")
    lists = {
        k: list(state[k])
        for k in ("next_bucket", "buckets", "tails", "gaps", "senders", "host", "label")
    }
    scores = list(state.get("scores") or [None] * n)  # (none before issue 34)
    if any(len(v) != n for v in [*lists.values(), scores]):
        raise ValueError("per-series lists of another length")
    banks = dict(state["banks"])
    probes = {name: _probe(getattr(st, name), 2 * n if name in PAIRED else n) for name in BANKS}
    for name, probe in probes.items():  # each raises if its part does not fit
        probe.load(np.arange(2 * n if name in PAIRED else n), banks[name])
    if "serving" in banks:
        probes["serving"] = _probe(st.serving, SERVING_ROWS * n)
        probes["serving"].load(np.arange(SERVING_ROWS * n), banks["serving"])
    cap = st.reservoir
    return {
        "scalars": scalars,
        "recent": recent.reshape(n, RECENT_BUCKETS),
        "signals": _by_name(signals.reshape(n, len(names)), names),
        "banks": probes,
        "next_bucket": [None if b is None else _from_int(b) for b in lists["next_bucket"]],
        "buckets": [
            {_from_int(b): _parse_bucket(k, rng, cap) for b, k in row} for row in lists["buckets"]
        ],
        "tails": [_parse_tail(t, st.tail_params, st.bucket_s) for t in lists["tails"]],
        "gaps": [deque((_from_int(a), _from_int(b)) for a, b in g) for g in lists["gaps"]],
        "senders": [
            {(None if p is None else _from_int(p)): float(ts) for p, ts in s}
            for s in lists["senders"]
        ],
        "host": [None if h is None else str(h) for h in lists["host"]],
        "label": [None if x is None else str(x) for x in lists["label"]],
        "scores": [st.scores.check(x) for x in scores],
    }


def _by_name(values: npt.NDArray[np.float64], names: list[str]) -> npt.NDArray[np.float64]:
    """The snapshot's signals in this build's columns (NaN where it has none)."""
    out = np.full((len(values), len(SIGNALS)), np.nan)
    for j, name in enumerate(names):
        if name in SIGNAL_AT:
            out[:, SIGNAL_AT[name]] = values[:, j]
    return out


def _parse_bucket(d: Mapping[str, Any], rng: random.Random, cap: int) -> Bucket:
    latencies = {}
    for name, (seen, raw) in dict(d["latencies"]).items():
        values = array("d", _bytes(raw, "<f8").tolist())
        if len(values) > cap or int(seen) < len(values):
            raise ValueError(f"a reservoir of {len(values)} values (cap {cap}, seen {seen})")
        latencies[str(name)] = Reservoir(cap, rng, values, int(seen))
    b = Bucket(cap, rng)
    own = b.rng_for(DERIVED[0])  # the derived values' generator, as at the bucket's start
    for name in DERIVED:
        if name in latencies:
            latencies[name].rng = own
    b.n, b.errors = int(d["n"]), int(d["errors"])
    b.output_tokens, b.output_sq = _from_int(d["output_tokens"]), float(d["output_sq"])
    b.context_tokens = _from_int(d["context_tokens"])
    b.outliers, b.novel, b.clustered = int(d["outliers"]), int(d["novel"]), int(d["clustered"])
    b.labels = Counter({str(k): int(v) for k, v in d["labels"]})
    b.latencies = latencies
    return b


def _parse_tail(
    d: Mapping[str, Any], params: tuple[int, float, float], bucket_s: float
) -> TailWindow:
    """A tail window of this pipeline's parameters (``params``: its size; its runs are
    numbered in buckets of ``bucket_s``, which must be the snapshot's), every run inside
    its values (ValueError)."""
    if float(d["params"][3]) != bucket_s:
        raise ValueError(f"tail window of {d['params'][3]:g} s buckets, not {bucket_s:g}")
    t = TailWindow(*params, bucket_s=bucket_s)
    t._vals = {str(k): array("d", _bytes(v, "<f8").tolist()) for k, v in dict(d["vals"]).items()}
    t._runs = {str(k): array("q", _bytes(v, "<i8").tolist()) for k, v in dict(d["runs"]).items()}
    t._starts = {
        str(k): array("q", _bytes(v, "<i8").tolist()) for k, v in dict(d["starts"]).items()
    }
    if not (t._vals.keys() == t._runs.keys() == t._starts.keys()):
        raise ValueError("tail window: values, runs and starts of other names")
    for name, vals in t._vals.items():
        _check_runs(t._runs[name], t._starts[name], len(vals))
    t.seen = {str(k): int(v) for k, v in dict(d["seen"]).items()}
    t.version, t.newest = int(d["version"]), float(d["newest"])
    t.expiry = float(d.get("expiry", -math.inf))  # older snapshots: compute again
    cache = d["cache"]
    if cache is not None:
        got = {str(k): None if v is None else float(v) for k, v in dict(cache[2]).items()}
        t.cache = (int(cache[0]), bool(cache[1]), got)
    return t


def _check_runs(runs: array[int], starts: array[int], n: int) -> None:
    """Runs of a tail window's ``n`` values: as many runs as starts, buckets rising, the
    first run at value 0 and each after the one before, within the values."""
    if len(runs) != len(starts) or not runs or starts[0] != 0 or starts[-1] >= n:
        raise ValueError("tail window: runs that do not cover its values")
    if any(a >= b for a, b in pairwise(starts)) or any(a >= b for a, b in pairwise(runs)):
        raise ValueError("tail window: runs out of order")


def _parse_clusters(d: Any, service: str) -> ServiceClusters:
    if d is None:
        raise ValueError(f"service {service!r}: no outlier state")
    det = dict(d["detector"])
    outliers = RequestOutliers.__new__(RequestOutliers)
    features = det["features"]
    outliers.__setstate__(
        {
            "eps": float(det["eps"]),
            "min_samples": int(det["min_samples"]),
            "window": int(det["window"]),
            "warmup": int(det["warmup"]),
            "features_param": None
            if det["features_param"] is None
            else tuple(det["features_param"]),
            "features": None if features is None else tuple(str(f) for f in features),
            "points": array("d", _bytes(det["points"], "<f8").tolist()),
        }
    )
    active = d["active"]
    svc = ServiceClusters(
        outliers,
        str(d["name"]),
        set(),
        [tuple(float(v) for v in c) for c in d["known"]],
        None if d["checked"] is None else int(d["checked"]),
        float(d["flag"]),
        float(d["size"]),
        None if d["scanned"] is None else int(d["scanned"]),
        frozenset(tuple(int(v) for v in c) for c in d["dense"]),
        int(d["novel"]),
        None if active is None else tuple(float(v) for v in active),
        None if d["active_instance"] is None else str(d["active_instance"]),
        None if d["active_label"] is None else str(d["active_label"]),
        frozenset(tuple(int(v) for v in c) for c in d["active_cells"]),
    )
    svc.restore_memory(d.get("memory"))  # None (a snapshot from before it): a fresh one
    return svc


def _write(st: ServiceRows, rows: Rows, picked: Rows, p: dict[str, Any]) -> None:
    for name, values in p["scalars"].items():
        st.col[name][rows] = values[picked]
    st.recent[rows] = p["recent"][picked]
    st.signals[rows] = p["signals"][picked]
    for name in BANKS:
        paired = name in PAIRED
        n = len(p["next_bucket"])  # a paired dump: every first row, then every second
        to, of = (st.both(rows), np.concatenate([picked, picked + n])) if paired else (rows, picked)
        getattr(st, name).load(to, p["banks"][name].dump(of))
    if "serving" in p["banks"]:
        n = len(p["next_bucket"])
        of = np.concatenate([picked + i * n for i in range(SERVING_ROWS)])
        st.serving.load(st.three(rows), p["banks"]["serving"].dump(of))
    for row, i in zip(rows.tolist(), picked.tolist(), strict=True):
        for name in ("next_bucket", "buckets", "tails", "gaps", "senders", "host", "label"):
            getattr(st, name)[row] = p[name][i]
        st.scores.adopt(row, p["scores"][i])
