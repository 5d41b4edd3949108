"""Snapshots of version 7: msgpack of plain data behind a header, never a pickle. A host
and a service go through one and the restored worker does what the one that never stopped
does; the state restored is the state dumped (engines, their seasonal baselines, event
identities, alert states); the bytes are no pickle and reading them unpickles nothing;
truncated, corrupt and ill-shaped snapshots, and fuzzed bytes, raise SnapshotError only,
with nothing adopted; pickles (the retired versions 2-6) are refused without being
unpickled, and the setting that once let them be read is accepted and ignored."""

from __future__ import annotations

import copy
import logging
import math
import pickle
from array import array
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.agents.scenario import build
from ragwatch.config import Settings
from ragwatch.detectors.seasonal import Relearned
from ragwatch.schema import (
    Envelope,
    EventEnvelope,
    GpuEnvelope,
    MetricSample,
    MetricsEnvelope,
    Transition,
)
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.base import Domain
from ragwatch.streams.pipelines.fleet import Pipelines
from ragwatch.streams.pipelines.metrics import EngineSeries
from ragwatch.streams.pipelines.requests import MAX_INSTANCES
from ragwatch.streams.worker.snapshot import (
    MAGIC,
    SNAPSHOT_VERSION,
    SnapshotError,
    dump_host,
    dump_service,
    load_host,
    load_service,
)

RULES = load_rules()
T0 = 1_767_225_600.0
HOST, SERVICE = "gpu-node-01", "rag-api"
TARGET = "http://vllm:8000/metrics"
HOURS, DROP_H, BACK_H, EVENT_H, CUT_H = 30.0, 27.0, 28.5, 27.2, 27.25
HEADER = MAGIC + bytes([SNAPSHOT_VERSION])


def engine_stream() -> list[Envelope]:
    """gpu-node-01's GPU telemetry (the leak scenario) for 30 h, its engine scraped every
    minute (generated tokens with a daily rhythm, 40 % fewer from 27 h to 28.5 h: the
    throughput drop fires and recovers) and an OOM kill and a critical XID at 27.2 h. (The
    version-6 fixture ``v6-engines-*`` was written from this stream, cut at 27.25 h.)"""
    world = build("leak", hosts=1, gpus=1, services=0, interval_s=60.0)
    gpu = list(world.envelopes(hours=HOURS))
    tokens, scrapes = 0.0, []
    for i in range(int(HOURS * 60)):
        t = 60.0 * i
        rhythm = 1 + 0.3 * math.sin(2 * math.pi * t / 86400.0)
        rate = 200.0 * rhythm * (0.6 if DROP_H * 3600 <= t < BACK_H * 3600 else 1.0)
        tokens += rate * 60.0
        samples = (
            MetricSample("ragwatch_generation_tokens_total", {}, tokens),
            MetricSample("ragwatch_requests_total", {"model": "m"}, tokens / 250.0),
            MetricSample("ragwatch_requests_waiting", {"model": "m"}, 2.0),
        )
        scrapes.append(MetricsEnvelope(HOST, TARGET, T0 + t, samples))
    at = T0 + EVENT_H * 3600.0 + 1.0
    events = [
        EventEnvelope(HOST, at, "oom_kill", {"gpu": 0, "pid": 4001, "process": "rag-worker"}),
        EventEnvelope(HOST, at + 60.0, "xid", {"gpu": 0, "xid": 79}),
    ]
    return sorted([*gpu, *scrapes, *events], key=lambda e: e.ts)


@pytest.fixture(scope="module")
def engines() -> tuple[list[Envelope], int]:
    envs = engine_stream()
    return envs, sum(e.ts < T0 + CUT_H * 3600 for e in envs)


def summary(ts: list[Transition]) -> list[tuple[str, str, str, str | None, float]]:
    return [
        (t.alert.rule, t.previous, t.alert.status, t.alert.resolution, t.alert.starts_at)
        for t in ts
    ]


def run(p: Pipelines, envs: list[Envelope]) -> list[Transition]:
    return [t for env in envs for t in p.process(env)]


def same(a: Any, b: Any) -> bool:
    """Bit for bit (floats by their hex, NaN is NaN), containers element by element."""
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    if isinstance(a, array) and isinstance(b, array):
        return a.typecode == b.typecode and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Relearned) and isinstance(b, Relearned):
        return all(same(getattr(a, f), getattr(b, f)) for f in ("at", "held_s", "before", "after"))
    return type(a) is type(b) and bool(a == b)


def assert_same_engine(pa: Pipelines, a: EngineSeries, pb: Pipelines, b: EngineSeries) -> None:
    assert pa.metrics.tps.dump([a.row]) == pb.metrics.tps.dump([b.row])  # the baseline's bytes
    for name in ("labels", "gauges", "last_ts", "resets", "signals", "bucket", "sums"):
        assert same(getattr(a, name), getattr(b, name)), name
    assert same(a.relearned, b.relearned)
    assert list(a.counters) == list(b.counters)
    for k, c in a.counters.items():
        d = b.counters[k]
        assert same((c.last, c.total, list(c.points)), (d.last, d.total, list(d.points)))


def plain(v: Any, path: str = "") -> None:
    """Only what msgpack carries as itself: str-keyed maps, lists, str, int, float, bool,
    None, bytes (no numpy scalar: np.float64 is a float and encodes, an np.int64 does not)."""
    assert not isinstance(v, np.generic), path
    if isinstance(v, dict):
        for k, x in v.items():
            assert isinstance(k, str), f"{path}: key {k!r}"
            plain(x, f"{path}.{k}")
    elif isinstance(v, list | tuple):
        for i, x in enumerate(v):
            plain(x, f"{path}[{i}]")
    else:
        assert v is None or isinstance(v, str | int | float | bytes), f"{path}: {type(v)}"
        if isinstance(v, int):
            assert -(2**63) <= v < 2**64, path


def body(data: bytes) -> dict[str, Any]:
    assert data.startswith(HEADER)
    out: dict[str, Any] = msgspec.msgpack.decode(data[len(HEADER) :])
    return out


def encode(state: Any) -> bytes:
    return HEADER + msgspec.msgpack.encode(state)


def fresh_after_failure(p: Pipelines, domain: Domain, key: str) -> bool:
    return not any(pipe.tracks(key) for pipe in p.of(domain)) and not p.engine.active


# ---------------------------------------------------------------------- round trips


def test_a_host_with_engines_and_events_restores_to_the_same_behaviour(
    engines: tuple[list[Envelope], int],
) -> None:
    envs, cut = engines
    first = Pipelines(RULES)
    run(first, envs[:cut])
    assert {a.rule for a in first.engine.active.values()} >= {
        "EngineThroughputDrop",
        "GpuOomKill",
        "GpuXidCritical",
    }
    data = dump_host(first, HOST)
    second = Pipelines(RULES)
    assert load_host(second, HOST, data) == len(first.gpus.host_series(HOST)) + 1
    # the state restored is the state dumped
    (key,) = first.metrics.series
    assert_same_engine(second, second.metrics.series[key], first, first.metrics.series[key])
    assert second.engine.export(lambda _: True) == first.engine.export(lambda _: True)
    assert second.events.dump(HOST) == first.events.dump(HOST)
    # a replay of the input before the cut (the OOM kill included) pages nothing
    assert run(second, envs[cut - 30 : cut]) == []
    after = summary(run(second, envs[cut:]))
    assert after == summary(run(first, envs[cut:]))
    assert ("EngineThroughputDrop", "firing", "resolved", "recovered") in [a[:4] for a in after]


@pytest.fixture(scope="module")
def fleet() -> list[Envelope]:
    world = build("all", hosts=2, gpus=1, services=1, interval_s=60.0, heal_after_s=3600.0)
    return list(world.envelopes(hours=2.5))


def test_hosts_and_services_restore_to_the_same_transitions(fleet: list[Envelope]) -> None:
    cut = 300
    first = Pipelines(RULES)
    run(first, fleet[:cut])
    second = Pipelines(RULES)
    hosts = {e.host for e in fleet if isinstance(e, GpuEnvelope)}
    for h in hosts:
        assert load_host(second, h, dump_host(first, h)) > 0
    assert load_service(second, SERVICE, dump_service(first, SERVICE)) > 0
    assert second.engine.export(lambda _: True) == first.engine.export(lambda _: True)
    # and a second round trip writes the same bytes (nothing is lost or reordered)
    assert dump_service(second, SERVICE) == dump_service(first, SERVICE)
    assert all(dump_host(second, h) == dump_host(first, h) for h in hosts)
    expected = summary(run(first, fleet[cut:]))
    assert expected
    assert summary(run(second, fleet[cut:])) == expected


@pytest.fixture(scope="module")
def worker(engines: tuple[list[Envelope], int], fleet: list[Envelope]) -> Pipelines:
    """A worker at the engine stream's cut that has also seen the fleet's service for 150
    envelopes (tests only dump it)."""
    envs, cut = engines
    p = Pipelines(RULES)
    run(p, envs[:cut])
    run(p, [e for e in fleet[:150] if not isinstance(e, GpuEnvelope)])
    return p


@pytest.fixture(scope="module")
def host_bytes(worker: Pipelines) -> bytes:
    return dump_host(worker, HOST)


def test_the_bytes_are_a_header_and_plain_msgpack_not_a_pickle(worker: Pipelines) -> None:
    p = worker
    for data, kind, key in (
        (dump_host(p, HOST), "host", HOST),
        (dump_service(p, SERVICE), "service", SERVICE),
    ):
        assert data.startswith(b"ragwatch-snapshot\x00\x07") and data[0] != 0x80
        with pytest.raises(pickle.UnpicklingError):
            pickle.loads(data)
        state = body(data)
        assert set(state) == {"v", "kind", "key", "parts", "alerts"}
        assert (state["v"], state["kind"], state["key"]) == (7, kind, key)
        assert state["alerts"] and state["parts"]
        plain(state)
        plain(p.dump(kind, key))  # what the pipelines give is plain already


def test_reading_version_7_never_unpickles(
    host_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = host_bytes

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "Unpickler", boom)
    assert load_host(Pipelines(RULES), HOST, data) > 0


def test_an_engine_bucket_beyond_64_bits_and_a_baseline_the_bank_cannot_hold() -> None:
    """Scrapes stamped 1e22 s (a bucket number beyond 2**63: written as digits) and 5e23 s
    (a day number beyond 2**62: beyond the baseline's calendar, it learns nothing)."""
    for ts, kept in ((1e22, True), (5e23, False)):
        p = Pipelines(RULES)
        for i in range(3):
            v = 100.0 * i
            sample = MetricSample("ragwatch_generation_tokens_total", {}, v)
            p.process(MetricsEnvelope(HOST, TARGET, ts + 1e9 * i, (sample,)))
        (s,) = p.metrics.series.values()
        assert s.bucket is not None and s.bucket >= 2**63
        data = dump_host(p, HOST)
        restored = Pipelines(RULES)
        assert load_host(restored, HOST, data) == 1
        (r,) = restored.metrics.series.values()
        assert r.bucket == s.bucket and r.counters.keys() == s.counters.keys()
        if kept:
            assert_same_engine(restored, r, p, s)
        else:
            # beyond the baseline's calendar nothing is learnt, before or after a restore
            assert restored.metrics.tps.nrows([r.row])[0] == p.metrics.tps.nrows([s.row])[0] == 0


# ---------------------------------------------------------------------- refused


def test_a_truncated_snapshot_is_refused_and_nothing_is_adopted(host_bytes: bytes) -> None:
    step = max(1, len(host_bytes) // 300)
    for n in [*range(0, len(HEADER) + 40), *range(len(HEADER) + 40, len(host_bytes), step)]:
        p = Pipelines(RULES)
        with pytest.raises(SnapshotError):
            load_host(p, HOST, host_bytes[:n])
        assert fresh_after_failure(p, "host", HOST), n


def corrupt(state: dict[str, Any]) -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    """Ways to spoil a decoded host snapshot, each of another shape than a dump."""

    def setter(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
        def spoil(s: dict[str, Any]) -> None:
            at: Any = s
            for k in path[:-1]:
                at = at[k]
            at[path[-1]] = value

        return spoil

    engine = ("parts", "engines", "series", 0)
    return [
        ("top level not a map", lambda s: s.clear()),
        ("version", setter(("v",), 6)),
        ("kind", setter(("kind",), "service")),
        ("key", setter(("key",), "other")),
        ("parts", setter(("parts",), [1, 2])),
        ("alerts", setter(("alerts",), {"a": 1})),
        ("an alert", setter(("alerts", 0), {"fingerprint": "x"})),
        ("an alert's status", setter(("alerts", 0, "status"), "resolved")),
        ("an alert's value", setter(("alerts", 0, "alert", "value"), "high")),
        ("an alert's labels", setter(("alerts", 0, "alert", "labels"), {"host": 1})),
        ("an alert's header", setter(("alerts", 0, "alert", "v"), 2)),
        ("an alert of another", setter(("alerts", 0, "fingerprint"), "0" * 16)),
        ("gpu part", setter(("parts", "gpu"), 5)),
        ("gpu keys", setter(("parts", "gpu", "keys"), [[HOST]])),
        ("gpu column", setter(("parts", "gpu", "last_ts"), b"\x00" * 3)),
        ("gpu leak bank", setter(("parts", "gpu", "leak"), {})),
        ("engines part", setter(("parts", "engines"), "x")),
        ("engine target", setter((*engine, "target"), 1)),
        ("engine counters", setter((*engine, "counters"), [[1, 2]])),
        ("engine counter points", setter((*engine, "counters", 0, 4), [["a", 1.0]])),
        ("engine baseline", setter((*engine, "tps", "version"), 99)),
        ("engine baseline params", setter((*engine, "tps", "params"), [1.0])),
        ("engine baseline array", setter((*engine, "tps", "level"), b"\x01")),
        ("engine bucket", setter((*engine, "bucket"), "12x")),
        ("engine sums", setter((*engine, "sums"), [1.0])),
        ("engine signals", setter((*engine, "signals"), {"a": "b"})),
        ("events part", setter(("parts", "events"), [])),
        ("event identity", setter(("parts", "events", "recent", 0), [1.0, "oom_kill", [[1]]])),
        ("event alert", setter(("parts", "events", "active", 0), [7, []])),
        # well-formed, but naming what the snapshot's key does not own
        ("gpu labels of no series", setter(("parts", "gpu", "labels", 0), {})),
        ("gpu labels of another host", lambda s: s["parts"]["gpu"]["labels"][0].update(host="x")),
        ("gpu labels of another process", lambda s: s["parts"]["gpu"]["labels"][1].pop("pid")),
        ("engine labels of no engine", setter((*engine, "labels"), {})),
        ("event alert of another host", setter(("parts", "events", "active", 0, 1), OTHER_HOST)),
        ("an alert filed under another's fingerprint", misfile),
        # values the pipelines would fail on later, every message of the key after
        ("leak window beyond its points", full_window),
        ("engine bucket of no event time", setter((*engine, "bucket"), "9" * 399)),
    ]


OTHER_HOST = [["host", "other"], ["type", "oom_kill"]]


def misfile(s: dict[str, Any]) -> None:
    """The first alert state filed (and its alert fingerprinted) as another alert."""
    s["alerts"][0]["fingerprint"] = s["alerts"][0]["alert"]["fingerprint"] = "0" * 16


def full_window(s: dict[str, Any]) -> None:
    """Every leak window claims as many points as its arrays hold: the next close would
    write past them."""
    gpu = s["parts"]["gpu"]
    points = int(np.frombuffer(gpu["leak"]["points_max"], dtype="<i8")[0])
    gpu["leak"]["count"] = np.full(len(gpu["keys"]), points, dtype="<i8").tobytes()


@pytest.mark.parametrize("case", range(len(corrupt({}))))
def test_a_snapshot_of_other_shapes_is_refused_and_nothing_is_adopted(
    host_bytes: bytes, case: int
) -> None:
    state = body(host_bytes)
    name, spoil = corrupt(state)[case]
    spoil(state)
    p = Pipelines(RULES)
    with pytest.raises(SnapshotError):
        load_host(p, HOST, encode(state))
    assert fresh_after_failure(p, "host", HOST), name


def test_a_snapshot_that_names_another_series_resolves_nothing_it_does_not_own(
    fleet: list[Envelope],
) -> None:
    """A snapshot under a made-up host whose series have no labels: refused, and the
    worker's alerts (another host's, a service's) all stay, however long it runs."""
    p = Pipelines(RULES)
    run(p, fleet[:300])
    active = dict(p.engine.active)
    assert active
    state = body(dump_host(p, HOST))
    state["key"] = "evil-node"
    state["parts"]["gpu"]["keys"] = [["evil-node", *k[1:]] for k in state["parts"]["gpu"]["keys"]]
    state["parts"]["gpu"]["labels"] = [{} for _ in state["parts"]["gpu"]["labels"]]
    state["parts"]["gpu"]["last_ts"] = bytes(len(state["parts"]["gpu"]["last_ts"]))
    state["alerts"] = []
    with pytest.raises(SnapshotError, match="labels of another series"):
        load_host(p, "evil-node", encode(state))
    assert fresh_after_failure_of(p, "evil-node")
    assert p.engine.active == active


def fresh_after_failure_of(p: Pipelines, host: str) -> bool:
    return not any(pipe.tracks(host) for pipe in p.of("host"))


@pytest.mark.parametrize("field", ["key", "resets"])
def test_values_nested_near_the_recursion_limit_raise_only_snapshot_error(
    host_bytes: bytes, field: str
) -> None:
    """Lists nested just shallow enough for msgpack and too deep to print: refused as
    snapshots, at any depth (where printing fails depends on the stack's depth)."""
    state = body(host_bytes)
    mark = "@@deep@@"
    if field == "key":
        state["key"] = mark
    else:
        state["parts"]["engines"]["series"][0]["resets"] = mark
    raw, m = msgspec.msgpack.encode(state), msgspec.msgpack.encode(mark)
    for depth in range(700, 1000, 7):
        p = Pipelines(RULES)
        with pytest.raises(SnapshotError):
            load_host(p, HOST, HEADER + raw.replace(m, b"\x91" * depth + b"\xc0"))
        assert fresh_after_failure(p, "host", HOST), depth


def service_corruptions() -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    def zero_buckets(s: dict[str, Any]) -> None:
        s["parts"]["requests"]["tails"][0]["params"][3] = 0.0

    def runs_beyond_values(s: dict[str, Any]) -> None:
        tail = s["parts"]["requests"]["tails"][0]
        name = next(iter(tail["starts"]))
        tail["starts"][name] = np.array([0, 10**6], dtype="<i8").tobytes()
        tail["runs"][name] = np.array([1, 2], dtype="<i8").tobytes()

    def many_instances(s: dict[str, Any]) -> None:
        s["parts"]["requests"]["instances"] = [f"i{k}" for k in range(MAX_INSTANCES + 1)]

    return [
        ("a tail window of 0 s buckets", zero_buckets),
        ("a tail window's runs beyond its values", runs_beyond_values),
        ("more instances than a service has", many_instances),
    ]


@pytest.mark.parametrize("case", range(len(service_corruptions())))
def test_a_service_snapshot_the_pipeline_would_fail_on_later_is_refused(
    worker: Pipelines, case: int
) -> None:
    state = body(dump_service(worker, SERVICE))
    name, spoil = service_corruptions()[case]
    spoil(state)
    p = Pipelines(RULES)
    with pytest.raises(SnapshotError):
        load_service(p, SERVICE, encode(state))
    assert fresh_after_failure(p, "service", SERVICE), name


@pytest.mark.parametrize(
    "data",
    [
        b"",
        MAGIC,
        MAGIC + b"\x06" + msgspec.msgpack.encode({"v": 6}),
        MAGIC + b"\x08",
        HEADER,
        HEADER + b"\xc1",  # never used in msgpack
        HEADER + msgspec.msgpack.encode([1, 2, 3]),
        HEADER + msgspec.msgpack.encode({"v": 7, "kind": "host", "key": HOST}),
        HEADER + msgspec.msgpack.encode({"v": 7, "kind": "host", "key": HOST, "parts": {}}),
        HEADER + b"\x91" * 100_000,  # arrays nested 100,000 deep
        HEADER + msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b"x")),
        b"not a snapshot",
        orjson.dumps({"v": 7, "kind": "host", "key": HOST}),
    ],
    ids=lambda d: repr(d[:24]),
)
def test_garbage_is_refused_with_a_reason(data: bytes) -> None:
    with pytest.raises(SnapshotError):
        load_host(Pipelines(RULES), HOST, data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tail=st.binary(max_size=512), version=st.sampled_from([b"", b"\x07", b"\x06", b"\x00"]))
def test_random_bytes_after_the_magic_raise_only_snapshot_error(
    tail: bytes, version: bytes
) -> None:
    with pytest.raises(SnapshotError):
        load_host(Pipelines(RULES), HOST, MAGIC + version + tail)


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=24),
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def paths(v: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(v, dict):
        for k, x in v.items():
            out += paths(x, (*at, k))
    elif isinstance(v, list):
        for i, x in enumerate(v[:3]):  # the first few of long lists
            out += paths(x, (*at, i))
    return out


@pytest.fixture(scope="module")
def states(
    host_bytes: bytes, worker: Pipelines
) -> dict[str, tuple[dict[str, Any], list[tuple[Any, ...]]]]:
    out = {}
    for kind, data in (("host", host_bytes), ("service", dump_service(worker, SERVICE))):
        state = body(data)
        out[kind] = state, [q for q in paths(state) if q]
    return out


@pytest.mark.parametrize("kind", ["host", "service"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_any_value_anywhere_in_a_snapshot_loads_or_raises_snapshot_error(
    states: dict[str, tuple[dict[str, Any], list[tuple[Any, ...]]]],
    kind: Domain,
    data: st.DataObject,
) -> None:
    """A real snapshot with one value, anywhere, replaced by any plain value: it is
    adopted (the value fits) or refused with SnapshotError and nothing adopted."""
    base, where = states[kind]
    path = data.draw(st.sampled_from(where), label="path")
    state = copy.deepcopy(base)
    at: Any = state
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = data.draw(values, label="value")
    p = Pipelines(RULES)
    key = HOST if kind == "host" else SERVICE
    load = load_host if kind == "host" else load_service
    try:
        load(p, key, encode(state))
    except SnapshotError:
        assert fresh_after_failure(p, kind, key), path


# ---------------------------------------------------------------------- retired formats


@pytest.mark.parametrize("version", [5, 6])
def test_a_pickle_of_a_retired_version_is_refused_unread_and_the_key_starts_afresh(
    version: int, monkeypatch: pytest.MonkeyPatch, worker: Pipelines
) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "Unpickler", boom)
    host = {"v": version, "kind": "host", "key": HOST, "parts": {}, "alerts": {}}
    service = {**host, "kind": "service", "key": SERVICE}
    for kind, key, state in (("host", HOST, host), ("service", SERVICE, service)):
        data = pickle.dumps(state, protocol=4)
        load = load_host if kind == "host" else load_service
        p = Pipelines(RULES)
        with pytest.raises(SnapshotError, match=r"is a pickle .*no longer read.*afresh"):
            load(p, key, data)
        assert fresh_after_failure(p, kind, key)  # type: ignore[arg-type]


def test_the_retired_legacy_setting_is_accepted_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ragwatch.config"):
        assert Settings.from_env({"RAGWATCH_SNAPSHOT_LEGACY": "false"}) == Settings()
    (record,) = [r for r in caplog.records if "RAGWATCH_SNAPSHOT_LEGACY" in r.getMessage()]
    assert "no effect" in record.getMessage() and "no longer read" in record.getMessage()
