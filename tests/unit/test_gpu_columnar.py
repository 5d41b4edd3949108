"""The columnar GPU pipeline gives the transitions of one envelope at a time, whatever the
batches: waves of distinct hosts, envelopes of one host twice in a batch, duplicates and
late envelopes, a pid listed twice, a GPU handed to another pod, hosts that go silent
and are swept, series caps; and its rule masks give what evaluating every rule on every
sample gives (``every_sample=True``, the reference).

The transitions of the object pipeline this replaced are held in
``tests/unit/test_same_alerts.py`` (recorded from it); this holds the batch path to the
one-envelope path of the same code on random streams.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgspec
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragwatch.gpu_wire import GpuMessage, from_mapping
from ragwatch.schema import Transition
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import load_rules, parse_rule
from ragwatch.streams.pipelines.gpu import GpuPipeline
from ragwatch.streams.pipelines.gpu_signals import SCALAR_ROWS

T0 = 1_767_225_600.0
GB = 1e9
# a short window, so that a few hundred samples fill it and estimates come and go
LEAK = {"window_s": 600.0, "bucket_s": 30.0, "min_span_s": 120.0, "min_points": 4}
RULES = [
    *load_rules(),
    parse_rule(
        {
            "name": "Grows",
            "series": "gpu",
            "expr": "gb_per_hour > 3",
            "for": "1m",
            "resolve": "gb_per_hour < 1",
        }
    ),
    parse_rule({"name": "Big", "series": "process", "expr": "gpu_mem_bytes > 30GB", "for": "30s"}),
    parse_rule(
        {
            "name": "Flaps",
            "series": "process",
            "expr": "gb_per_hour > 3",
            "resolve": "recent_steadiness < 2",
            "keep_firing_for": "1m",
        }
    ),
    parse_rule({"name": "Full", "series": "gpu", "expr": "fb_used_ratio > 0.9"}),
]


@st.composite
def streams(draw: st.DrawFn) -> list[GpuMessage]:
    """Envelopes of up to three hosts: memory that grows, jumps or stays, pids that come
    and go, now and then a duplicate, a late envelope, one stamped far back, a pid listed
    twice, a pod change, a host falling silent for longer than the sweeps wait."""
    hosts = [f"h{i}" for i in range(draw(st.integers(1, 3)))]
    n = draw(st.integers(20, 160))
    rate = {h: draw(st.sampled_from([0.0, 2e6, 8e6])) for h in hosts}  # bytes per second
    silent = {h: draw(st.sampled_from([None, (40, 80)])) for h in hosts}
    out: list[GpuMessage] = []
    for i in range(n):
        for h in hosts:
            if silent[h] and silent[h][0] <= i < silent[h][1]:
                continue
            ts = T0 + 10.0 * i
            kinds = ["ok"] * 12 + ["dup", "late", "back", "twice", "pod", "jump"]
            kind = draw(st.sampled_from(kinds))
            if kind == "dup" and out:
                out.append(out[-1])
                continue
            if kind == "late":
                ts -= 25.0
            if kind == "back":  # beyond stale_s: its clock went back (for an envelope)
                ts -= 300.0
            gpus = []
            for g in range(2):
                used = int(20 * GB + rate[h] * 10.0 * i + (5 * GB if kind == "jump" else 0))
                pids = [100 + g, 200 + g + (i // 50)]  # a pid that restarts every 50 ticks
                procs: list[dict[str, Any]] = [
                    {"pid": p, "name": f"p{p}", "gpu_mem": used // 2 + k, "rss": 10**9}
                    for k, p in enumerate(pids)
                ]
                if kind == "twice":
                    procs.append(dict(procs[0], gpu_mem=procs[0]["gpu_mem"] + 1))
                gpu: dict[str, Any] = {
                    "index": g,
                    "uuid": f"GPU-{h}-{g}",
                    "name": "H100",
                    "fb_used": used,
                    "fb_total": 40 * 10**9,
                    "gpu_util": float(i % 100),
                    "procs": procs,
                }
                if g == 1:
                    pod = "a" if i < n // 2 or kind != "pod" else "b"
                    gpu.update(namespace="rag", pod=pod, container="server")
                gpus.append(gpu)
            out.append(from_mapping({"host": h, "ts": ts, "gpus": gpus}))
    return out


def _key(t: Transition) -> tuple[Any, ...]:
    a = t.alert
    return (a.at, a.fingerprint, a.status, t.previous, a.starts_at, a.ends_at, a.value)


def _run(
    envs: list[GpuMessage], cuts: list[int], **kw: Any
) -> tuple[list[tuple[Any, ...]], GpuPipeline]:
    pipe = GpuPipeline(RULES, AlertEngine(), leak=LEAK, stale_s=60.0, **kw)
    out: list[Transition] = []
    at = 0
    for cut in [*sorted(cuts), len(envs)]:
        out += pipe.process_batch(envs[at:cut])
        at = max(at, cut)
    return sorted(map(_key, out), key=repr), pipe


def _state(pipe: GpuPipeline) -> Any:
    hosts = sorted({k[0] for k in pipe.index})
    return [pipe.host_snapshot(h) for h in hosts], vars(pipe.stats), sorted(pipe.engine.active)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envs=streams(), data=st.data())
def test_any_batches_give_the_transitions_of_one_envelope_at_a_time(
    envs: list[GpuMessage], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(envs)), max_size=8))
    one, one_pipe = _run(envs, list(range(len(envs))))
    batched, batched_pipe = _run(envs, cuts)
    assert batched == one
    assert _state(batched_pipe) == _state(one_pipe)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envs=streams())
def test_rule_masks_give_the_transitions_of_evaluating_every_rule_on_every_sample(
    envs: list[GpuMessage],
) -> None:
    masked, _ = _run(envs, [])
    reference, _ = _run(envs, list(range(len(envs))), every_sample=True)
    assert masked == reference


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envs=streams(), cut=st.integers(0, 400))
def test_signals_in_floats_are_the_signals_in_arrays(envs: list[GpuMessage], cut: int) -> None:
    _, pipe = _run(envs[:cut], [])
    rows = np.array(sorted(pipe.index.get(k) for k in pipe.index), dtype=np.intp)
    if not len(rows):
        return
    # more rows than SCALAR_ROWS: the array path; then each row alone: the float path
    as_arrays = pipe.signal_dicts(np.concatenate([rows] * (SCALAR_ROWS + 1)))[: len(rows)]
    assert [pipe.row_signals(int(r)) for r in rows] == as_arrays


def test_the_status_of_many_hosts_is_the_status_of_each() -> None:
    """The worker writes the status and charts of every changed host at once (one array
    per signal for all their rows): the same as asking host by host (a few rows: floats)."""
    fixed = _fixed_stream()
    again = [msgspec.structs.replace(e, host=e.host + "2") for e in fixed]  # two hosts more
    _, pipe = _run([e for pair in zip(fixed, again, strict=True) for e in pair], [])
    hosts = sorted({k[0] for k in pipe.index})
    assert len(pipe) > SCALAR_ROWS and len(hosts) > 1
    assert pipe.status([*hosts, "gone"]) == {
        **{h: pipe.host_snapshot(h) for h in hosts},
        "gone": pipe.host_snapshot("gone"),
    }
    together = pipe.views(hosts)
    for h in hosts:
        one = pipe.host_series(h)
        assert list(one) == list(together[h])
        for k, s in one.items():
            assert dict(s.signals) == dict(together[h][k].signals)
            assert (s.labels, s.last_ts) == (together[h][k].labels, together[h][k].last_ts)


def test_the_streams_exercise_every_path() -> None:
    """The property tests above are only as good as their streams: on a fixed one, alerts
    start, fire and resolve, a pod change resolves the old pod's alerts, silent hosts are
    swept, duplicates and late envelopes are counted, and those stamped far back refused."""
    envs = _fixed_stream()
    out, pipe = _run(envs, [7, 50, 51, 300])
    statuses = {k[2] for k in out}
    assert statuses >= {"pending", "firing", "resolved"}
    assert pipe.stats.duplicates > 0  # the late envelopes and the repeated ones
    assert pipe.stats.clock_jumps_back > 0  # those stamped 300 s back
    assert pipe.stats.evicted_series > 0


def _fixed_stream() -> list[GpuMessage]:
    out: list[GpuMessage] = []
    for i in range(300):
        for h, rate in (("a", 8e6), ("b", 0.0)):
            if h == "b" and 100 <= i < 150:
                continue  # silent for 500 s: its series are swept, then come back
            used = int(20 * GB + rate * 10.0 * i)
            procs = [{"pid": 7, "name": "p", "gpu_mem": used // 2}]
            gpu = {
                "index": 0,
                "uuid": "GPU-0",
                "name": "H100",
                "fb_used": used,
                "fb_total": 40 * 10**9,
                "procs": procs,
                "namespace": "rag",
                "pod": "a" if i < 200 else "b",
                "container": "c",
            }
            ts = T0 + 10.0 * i - (25.0 if i % 37 == 0 else 0.0) - (300.0 if i % 53 == 7 else 0.0)
            out.append(from_mapping({"host": h, "ts": ts, "gpus": [gpu]}))
            if i % 41 == 0:
                out.append(out[-1])
    return out


def test_a_host_snapshot_is_typed_arrays_and_restores_the_same_pipeline() -> None:
    envs = _fixed_stream()
    first = GpuPipeline(RULES, AlertEngine(), leak=LEAK, stale_s=60.0)
    first.process_batch(envs[:250])
    state = first.dump("a")
    assert state["format"] == "gpu-rows/1"
    assert {type(v) for v in state["columns"].values()} == {bytes}
    # nothing in it unpickles into a class: builtins only
    assert b"ragwatch" not in pickle.dumps(state)
    second = GpuPipeline(RULES, AlertEngine(), leak=LEAK, stale_s=60.0)
    assert second.adopt("a", pickle.loads(pickle.dumps(state))) == len(first.host_series("a"))
    assert second.host_snapshot("a") == first.host_snapshot("a")
    for key in first.index:
        if key[0] == "a":
            assert second.estimate(key) == first.estimate(key)
    assert second.adopt("a", state) == 0  # it tracks the host now: its own state wins


# ---------------------------------------------------------------- review cases


def _env(host: str, ts: float, gpus: list[dict[str, Any]]) -> GpuMessage:
    return from_mapping({"host": host, "ts": ts, "gpus": gpus})


def _gpu(used: float, procs: list[tuple[int, float]] = (), **kw: Any) -> dict[str, Any]:  # type: ignore[assignment]
    ps = [{"pid": p, "name": f"p{p}", "gpu_mem": int(m), "rss": 10**9} for p, m in procs]
    return {"index": 0, "uuid": "GPU-0", "name": "H100", "fb_used": int(used),
            "fb_total": 80 * 10**9, "procs": ps, **kw}  # fmt: skip


def _pipe(**kw: Any) -> GpuPipeline:
    return GpuPipeline(RULES, AlertEngine(), leak=LEAK, stale_s=60.0, **kw)


def test_an_empty_namespace_is_no_change_of_pod() -> None:
    """A GPU whose namespace (or container) is "" (both decoders take it) is labelled
    without it; comparing the two read as a new pod every envelope, so its series started
    over each time and its leak estimate never came."""
    p = _pipe()
    for i in range(120):
        used = 20 * GB + 8e6 * 10 * i
        p.process_batch([_env("h", T0 + 10 * i, [_gpu(used, namespace="", pod="p", container="")])])
    assert p.stats.evicted_series == 0
    assert p.estimate(("h", 0, "", -1)) is not None


def test_a_redelivered_envelope_of_the_pod_before_is_a_duplicate() -> None:
    """An envelope from before a pod change, read again (Kafka redelivers after a crash), is
    a duplicate: it does not hand the GPU back to the old pod (resolving its alerts and
    dropping its estimate), nor does the next envelope hand it over again."""
    envs = [
        _env("h", T0 + 10 * i, [_gpu(20 * GB + 8e6 * 10 * i, namespace="n", pod=pod)])
        for i, pod in enumerate(["a"] * 5 + ["b"] * 195)
    ]
    p = _pipe()
    p.process_batch(envs)
    evicted, key = p.stats.evicted_series, ("h", 0, "", -1)
    assert p.engine.active and p.estimate(key) is not None
    assert p.process_batch([envs[2]]) == []
    # (1970 s behind the host's newest, beyond stale_s: refused whole as its clock gone
    # back, before its pod is read; a redelivery closer than that is a duplicate)
    assert p.stats.evicted_series == evicted and p.stats.clock_jumps_back == 1
    assert p.process_batch([envs[-3]]) == [] and p.stats.duplicates == 1
    nxt = _env("h", T0 + 2000, [_gpu(20 * GB + 8e6 * 2000, namespace="n", pod="b")])
    assert p.process_batch([nxt]) == [] and p.estimate(key) is not None


def test_at_the_series_cap_a_batch_keeps_the_series_one_at_a_time_keeps() -> None:
    """With every row taken, host a's exited pid is swept by a's own envelope, and host b's
    new pid arrives at the same tick: one at a time, b's pid takes the row a's freed; a
    batch holding both in one wave must do the same (it gathered b before a's sweep)."""
    envs = []
    for i in range(30):
        ts = T0 + 10 * i
        envs.append(_env("a", ts, [_gpu(20 * GB, [(1 if i <= 10 else 2, 5 * GB)])]))
        b_procs = [(1, 5 * GB)] + ([(9, 5 * GB + 4e7 * i)] if i >= 17 else [])
        envs.append(_env("b", ts, [_gpu(20 * GB, b_procs)]))

    def kept(cuts: list[int]) -> tuple[list[Any], int]:
        p, at = _pipe(max_series=4), 0
        for c in [*cuts, len(envs)]:
            p.process_batch(envs[at:c])
            at = c
        return sorted(p.index), p.stats.dropped_samples

    one = kept(list(range(1, len(envs))))
    assert ("b", 0, "", 9) in one[0]
    assert kept([34, 36]) == one  # a's and b's envelopes of tick 17 in one wave
    assert kept([]) == one


def test_hosts_of_no_gpus_keep_no_layout() -> None:
    """An envelope of no GPUs (a CPU node running the agent) leaves nothing behind once
    its host is swept: no cached layout for every such host ever seen."""
    p = _pipe()
    p.process_batch([_env(f"cpu-{i}", T0, []) for i in range(50)])
    p.process_batch([_env("h", T0 + 3600, [_gpu(20 * GB)])])
    assert len(p._layouts) <= 1
