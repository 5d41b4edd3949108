"""End-to-end consume throughput on the embedded broker: the worker next to its baselines.

Starts its own embedded stack (Tansu + redis-server, ``ragwatch/embedded.py``) in a temp
dir and, for each envelope shape (``--procs``: processes per GPU, one shape each; by default
64 hosts x 8 GPUs x 10 processes = 88 series per envelope, and x 4 processes = 40 series,
the shape measured in issue 17), pre-produces one ``ragwatch.gpu`` topic of simulated host
envelopes (confluent-kafka, acks=all, delivered records counted from the delivery reports;
Tansu's high watermark can lag one batch, so it is never read), then consumes that same
topic three times, each in its own subprocess and consumer group:

a. a bare confluent-kafka loop + ``orjson.loads``;
b. a bare Faust agent that only counts (broker settings as ``streams/worker/app.py:build_app``);
c. the full worker, ``python -m ragwatch worker``, whose ``messages`` counter is read from
   the Redis hash ``<prefix>:workers`` (written once a second with its ``seen`` time, keyed
   by ``RAGWATCH_WORKER_ID``: the bench names each worker it starts, as two on one host
   would otherwise share the host name's record);

(c0) the full worker with ``RAGWATCH_SCORE_SIGNALS=false`` (no signal scored by the generic
detector: the ratio c / c0 is what scoring every signal costs), and (c2) two workers of a
new consumer group sharing the topic's partitions. The request
topic (``ragwatch.requests``) is consumed the same way, without (c2).

Scoring on and off are run ``--pairs`` times each (default 2), alternated, a pair's order
turned each time (on, off, off, on, ...): one pair's ratio moved from 0.73x to 0.83x
between runs of the same code on this 2-core machine, whose speed drifts within minutes, and
alternating cancels a steady drift. The ratio reported is the median of the pairs' ratios
of messages/s, each pair's beside it, and the same of CPU per message (the worker's own
cost, whatever the broker beside it did); rows (c) and (c0) are the first pair.

Rates run from the first message to the last, so the consumer-group join (half the session
timeout on Tansu) is excluded. For (c) the window is bounded by the worker's own
once-a-second counter writes: rate = counted messages / time between the first write with
messages > 0 and the first write with all of them. Prints a table and the ratios per shape
(each round's 1-minute load average beside it: the rounds run one after another, so a
neighbour's load shows there), then per shape a cProfile of the in-process hot path (decode
+ ``Pipelines.gpu_wire``, no Kafka) over the same envelopes, and writes
``bench/results/throughput.json`` (``shapes.<N>_series``: each shape's rounds, ratios,
target, in-process rate and profile; ``requests``; ``in_process``: request path, memory).
Run: ``make bench`` or ``python bench/throughput.py`` (``--ticks 150`` for a shorter run,
if the worker still takes more than two of its once-a-second counter writes).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import json
import os
import platform
import pstats
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).parent / "results"
# issue 17: (c)/(b) per series per envelope, decode and validation included
TARGET_C_VS_B = {88: 0.5, 40: 0.7}
SESSION_TIMEOUT = 6.0  # as the tests' workers: a Tansu group join waits half of it
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- telemetry ------------------------------------------------------------------------


def telemetry(hosts: int, gpus: int, procs: int, ticks: int) -> list[tuple[bytes, bytes]]:
    """(key = host, value = encoded GpuEnvelope) for ``ticks`` ticks of the simulated fleet,
    each GPU padded to ``procs`` processes (the simulator runs 2; the extra ones are small
    steady processes, added to ``fb_used``)."""
    from ragwatch.agents.sim import FleetSimulator, SimConfig
    from ragwatch.codec import encode

    sim = FleetSimulator(SimConfig(hosts=hosts, gpus=gpus, interval_s=10.0))
    out = []
    for _, (_, envs, _) in zip(range(ticks), sim.ticks(), strict=False):
        for env in envs:
            env = dataclasses.replace(env, gpus=tuple(pad(g, procs) for g in env.gpus))
            out.append((env.host.encode(), encode(env)))
    return out


def pad(gpu: Any, procs: int) -> Any:
    from ragwatch.schema import ProcessSample

    extra = tuple(
        ProcessSample(pid=50_000 + 100 * gpu.index + i, name=f"rag-tool-{i}", gpu_mem=64 << 20)
        for i in range(max(0, procs - len(gpu.procs)))
    )
    used = min(gpu.fb_total, gpu.fb_used + sum(p.gpu_mem for p in extra))
    return dataclasses.replace(gpu, procs=gpu.procs + extra, fb_used=used)


def request_telemetry(services: int, instances: int, ticks: int) -> list[tuple[bytes, bytes]]:
    """(key = service, value = encoded RequestsEnvelope): one batch a second per instance
    of every request (100 qps, sample rate 1; ~70 records, ~13 KiB per batch)."""
    from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
    from ragwatch.codec import encode

    sim = RequestSimulator(
        RequestSimConfig(
            services=services, instances=instances, batch_s=1.0, base_qps=100.0, sample_rate=1.0
        )
    )
    return [
        (env.service.encode(), encode(env))
        for _, (_, envs) in zip(range(ticks), sim.ticks(), strict=False)
        for env in envs
    ]


def produce(bootstrap: str, topic: str, data: list[tuple[bytes, bytes]]) -> int:
    """Produce everything with acks=all; return the records the broker acknowledged."""
    from confluent_kafka import Producer

    ok, failed = 0, 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal ok, failed
        if err is None:
            ok += 1
        else:
            failed += 1

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    for key, value in data:
        while True:
            try:
                p.produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    if p.flush(60) or failed:
        raise RuntimeError(f"produce: {ok} delivered, {failed} failed")
    return ok


# --- child roles: (a) and (b) run in subprocesses of this script -----------------------


def cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def report(out: Path, n: int, t0: float, c0: float) -> None:
    t1, c1 = time.perf_counter(), cpu_self()
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"messages": n, "seconds": t1 - t0, "cpu_s": c1 - c0}))
    tmp.replace(out)


def role_kafka(args: argparse.Namespace) -> None:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": int(SESSION_TIMEOUT * 1000),
        }
    )
    c.subscribe([args.topic])
    n, t0, c0 = 0, 0.0, 0.0
    while n < args.n:
        for msg in c.consume(500, 1.0):
            if msg.error():
                continue
            if n == 0:
                t0, c0 = time.perf_counter(), cpu_self()
            orjson.loads(msg.value())
            n += 1
    report(Path(args.out), n, t0, c0)
    signal.pause()  # the parent reads /proc, then SIGTERMs


def role_faust(args: argparse.Namespace) -> None:
    import faust
    from faust.worker import Worker

    app = faust.App(
        args.group,
        broker=f"kafka://{args.bootstrap}",
        broker_session_timeout=SESSION_TIMEOUT,
        broker_heartbeat_interval=min(3.0, SESSION_TIMEOUT / 3),
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        store="memory://",
        datadir=args.datadir,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
    )
    topic = app.topic(
        args.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    state = {"n": 0, "t0": 0.0, "c0": 0.0}

    @app.agent(topic, name="bench.count")  # type: ignore[misc]
    async def count(stream: Any) -> None:
        async for _ in stream.events():
            if state["n"] == 0:
                state["t0"], state["c0"] = time.perf_counter(), cpu_self()
            state["n"] += 1
            if state["n"] == args.n:
                report(Path(args.out), args.n, state["t0"], state["c0"])

    Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False).execute_from_commandline()


def rss_bytes() -> int:
    gc.collect()
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def role_memory(args: argparse.Namespace) -> None:
    """RSS growth per tracked series once every window is full (a fresh process: GPU
    series first, then request series), printed as JSON."""
    from ragwatch.agents.sim import FleetSimulator, SimConfig
    from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
    from ragwatch.codec import gpu_wire
    from ragwatch.streams.alerting.rules import load_rules
    from ragwatch.streams.pipelines.fleet import Pipelines

    procs = args.procs[0]
    hosts = -(-args.memory_series // (args.gpus * (procs + 1)))
    base = rss_bytes()
    pipes = Pipelines(load_rules(), max_series=1_000_000)
    # 2 min samples for 2 h 4 min: every leak window (2 h of 2 min buckets) is full
    sim = FleetSimulator(SimConfig(hosts=hosts, gpus=args.gpus, interval_s=120.0))
    for _, (_, envs, _) in zip(range(62), sim.ticks(), strict=False):
        for env in envs:
            pipes.gpu_wire(
                gpu_wire(dataclasses.replace(env, gpus=tuple(pad(g, procs) for g in env.gpus)))
            )
    gpu_series = len(pipes.gpus)
    # one service first, not counted: what the request path allocates once (its modules,
    # numpy's machinery, the arrays' first rows) is not a cost per series
    warm = RequestSimulator(RequestSimConfig(services=1, instances=1, seed=99))
    for _, (_, envs) in zip(range(6 * 10), warm.ticks(), strict=False):  # 10 minutes
        for renv in envs:
            pipes.request(dataclasses.replace(renv, service="warm-up"))
    warmed = len(pipes.requests.series)
    after_gpu = rss_bytes()
    rsim = RequestSimulator(RequestSimConfig(services=5, instances=4))
    for _, (_, envs) in zip(range(6 * 60 * 2), rsim.ticks(), strict=False):  # 2 h of 10 s batches
        for renv in envs:
            pipes.request(renv)
    svc_series = len(pipes.requests.series) - warmed
    after_svc = rss_bytes()
    print(
        json.dumps(
            {
                "gpu_series": gpu_series,
                "gpu_bytes_per_series": round((after_gpu - base) / gpu_series),
                "service_series": svc_series,
                "service_bytes_per_series": round((after_svc - after_gpu) / svc_series),
                "method": "RSS growth after gc / series, windows full (request series: "
                "after a first service, not counted)",
            }
        )
    )


def in_process_gpu(gpus: int, procs: int) -> dict[str, Any]:
    """The GPU path without Kafka once every leak window is full (the Kafka rounds cover
    25 min, so their windows are partly empty)."""
    from ragwatch.codec import decode_gpu_wire
    from ragwatch.streams.alerting.rules import load_rules
    from ragwatch.streams.pipelines.fleet import Pipelines

    data = [v for _, v in telemetry(4, gpus, procs, 1500)]  # 4 h 10 min
    pipes = Pipelines(load_rules())
    warm = len(data) * 2 // 3
    for v in data[:warm]:
        pipes.gpu_wire(decode_gpu_wire(v))
    t0 = time.perf_counter()
    for v in data[warm:]:
        pipes.gpu_wire(decode_gpu_wire(v))
    us = 1e6 * (time.perf_counter() - t0) / (len(data) - warm)
    return {
        "us_per_envelope": round(us, 1),
        "envelopes_per_s": round(1e6 / us),
        "gpu_samples_per_s": round(gpus * 1e6 / us),
        "series_updates_per_s": round(gpus * (procs + 1) * 1e6 / us),
    }


def in_process(args: argparse.Namespace) -> dict[str, Any]:
    """The request path without Kafka (decoded and processed in batches of 512, as the
    worker takes them), and memory per series (in a subprocess, on the first shape)."""
    from ragwatch.codec import decode_requests_wire
    from ragwatch.streams.alerting.rules import load_rules
    from ragwatch.streams.pipelines.fleet import Pipelines

    out: dict[str, Any] = {}
    req = [v for _, v in request_telemetry(args.services, args.instances, 600)]
    pipes = Pipelines(load_rules())
    warm = len(req) // 3
    for v in req[:warm]:
        pipes.request(decode_requests_wire(v))
    n = sum(len(orjson.loads(v)["records"]) for v in req[warm:])
    t0 = time.perf_counter()
    for i in range(warm, len(req), 512):
        pipes.request_batch([decode_requests_wire(v) for v in req[i : i + 512]])
    out["requests"] = {"records_per_s": round(n / (time.perf_counter() - t0))}
    mem = subprocess.run(
        [sys.executable, __file__, "--role", "memory", "--memory-series", str(args.memory_series),
         "--gpus", str(args.gpus), "--procs", str(args.procs[0])],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    out["memory"] = {**json.loads(mem.stdout), "procs_per_gpu": args.procs[0]}
    m = out["memory"]
    print(
        f"\nin process, no Kafka: requests {out['requests']['records_per_s']:,} records/s; "
        f"memory: {m['gpu_bytes_per_series'] / 1024:.1f} KiB per GPU/process series "
        f"({m['gpu_series']:,} series, {args.procs[0]} processes per GPU), "
        f"{m['service_bytes_per_series'] / 1024:.1f} KiB per service instance "
        f"({m['service_series']} instances), target < 64 KiB"
    )
    return out


# --- parent: run each path, measure it from /proc --------------------------------------


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def proc_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_child(role: str, args: argparse.Namespace, topic: str, n: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{role}-{uuid.uuid4().hex[:8]}.json"
    group = f"bench-{role}-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, __file__, "--role", role, "--bootstrap", args.bootstrap]
    cmd += ["--topic", topic, "--n", str(n), "--group", group, "--out", str(out)]
    cmd += ["--datadir", str(tmp / f"faust-{role}")]
    t_start = time.perf_counter()
    p = subprocess.Popen(cmd)
    try:
        while not out.exists():
            if p.poll() is not None:
                raise RuntimeError(f"{role} consumer exited with {p.returncode}")
            if time.perf_counter() - t_start > args.timeout:
                raise RuntimeError(f"{role} consumer: not done after {args.timeout} s")
            time.sleep(0.05)
        r = json.loads(out.read_text())
        r["peak_rss_mib"] = proc_hwm_mib(p.pid)
        r["process_cpu_s"] = proc_cpu(p.pid)
        r["join_and_consume_s"] = time.perf_counter() - t_start
    finally:
        stop(p)
    return r


def run_worker(env: dict[str, str], n: int, timeout: float, workers: int = 1) -> dict[str, Any]:
    """``workers`` worker processes in one consumer group; rate from their summed counters.

    Each is named (``RAGWATCH_WORKER_ID``, else all default to the host name and share one
    record of ``<prefix>:workers``); only those records are read, and each must stay
    written by one process (its ``process`` field) for the whole round."""
    import redis

    prefix = env["RAGWATCH_REDIS_PREFIX"]
    ids = [f"bench-worker-{i}" for i in range(workers)]
    r = redis.Redis.from_url(env["RAGWATCH_REDIS_URL"])
    t_start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ragwatch", "worker"],
            env={**os.environ, **env, "RAGWATCH_LOG_LEVEL": "WARNING", "RAGWATCH_WORKER_ID": wid},
            stdout=subprocess.DEVNULL,
        )
        for wid in ids
    ]
    writer: dict[str, str] = {}  # worker id -> the process that writes its record
    samples: list[tuple[float, int, float]] = []  # (newest counter write, messages, cpu)
    try:
        while True:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker exited with {p.returncode}")
            if time.perf_counter() - t_start > timeout:
                raise RuntimeError(f"worker: not done after {timeout} s ({samples[-1:]})")
            rows = {
                wid: orjson.loads(raw)
                for wid, raw in zip(ids, r.hmget(f"{prefix}:workers", ids), strict=True)
                if raw is not None
            }
            for wid, w in rows.items():
                if writer.setdefault(wid, w["process"]) != w["process"]:
                    raise RuntimeError(f"worker {wid}: its record written by a second process")
            total = sum(w["messages"] for w in rows.values())
            seen = max((w["seen"] for w in rows.values()), default=0.0)
            if total and (not samples or total > samples[-1][1]):
                samples.append((seen, total, sum(proc_cpu(p.pid) for p in procs)))
            if samples and samples[-1][1] >= n:
                break
            time.sleep(0.02)
        hwm = max(proc_hwm_mib(p.pid) for p in procs)
        total_cpu = sum(proc_cpu(p.pid) for p in procs)
    finally:
        for p in procs:
            stop(p)
        r.close()
    (ta, ma, ca), (tb, mb, cb) = samples[0], samples[-1]
    if len(samples) < 3 or mb == ma:
        raise RuntimeError(f"worker finished within {len(samples)} counter writes: add --ticks")
    clashes = sum(w.get("worker_id_clashes", 0) for w in rows.values())
    if clashes:
        raise RuntimeError(f"workers {ids}: {clashes} status writes under another's id")
    return {
        "messages": mb,
        "workers": workers,
        "worker_ids": sorted(rows),
        # first write with messages > 0 -> first write with all of them: (mb - ma) messages
        "seconds": (tb - ta) * mb / (mb - ma),
        "cpu_s": (cb - ca) * mb / (mb - ma),
        "counter_writes": len(samples),
        "peak_rss_mib": hwm,
        "process_cpu_s": total_cpu,
        "join_and_consume_s": time.perf_counter() - t_start,
    }


def profile(data: list[tuple[bytes, bytes]], top: int) -> dict[str, Any]:
    """cProfile of decode_gpu_wire + Pipelines.gpu_wire over the envelopes, in process, no Kafka."""
    from ragwatch.codec import decode_gpu_wire
    from ragwatch.streams.alerting.rules import load_rules
    from ragwatch.streams.pipelines.fleet import Pipelines

    pipes = Pipelines(load_rules())
    values = [v for _, v in data]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for v in values:
        pipes.gpu_wire(decode_gpu_wire(v))
    prof.disable()
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"envelopes": len(values), "profiled_wall_s": round(wall, 2)}
    for key in ("cumulative", "tottime"):
        st = pstats.Stats(prof)
        st.sort_stats(key)
        rows = []
        for func in st.fcn_list[:top]:  # type: ignore[attr-defined]
            _cc, nc, tt, ct, _ = st.stats[func]  # type: ignore[attr-defined]
            rows.append(
                {
                    "function": f"{short(func[0])}:{func[1]}({func[2]})",
                    "ncalls": nc,
                    "tottime_s": round(tt, 3),
                    "cumtime_s": round(ct, 3),
                    "us_per_envelope": round(
                        1e6 * (ct if key == "cumulative" else tt) / len(values), 1
                    ),
                }
            )
        out[f"top_{key}"] = rows
    return out


def short(path: str) -> str:
    for marker in ("site-packages/", f"{Path(__file__).resolve().parents[1]}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def print_profile(prof: dict[str, Any], key: str, label: str) -> None:
    print(
        f"\n{label}: top {len(prof[f'top_{key}'])} by {key} time "
        f"({prof['envelopes']:,} envelopes, {prof['profiled_wall_s']} s under cProfile)"
    )
    print(f"{'ncalls':>10} {'tottime':>8} {'cumtime':>8} {'us/env':>7}  function")
    for r in prof[f"top_{key}"]:
        print(
            f"{r['ncalls']:>10,} {r['tottime_s']:>8.2f} {r['cumtime_s']:>8.2f} "
            f"{r['us_per_envelope']:>7.1f}  {r['function']}"
        )


def shape_key(gpus: int, procs: int) -> str:
    return f"{gpus * (procs + 1)}_series"


def pair_row(on: bool, i: int) -> str:
    """The row of pair ``i``'s round with scoring ``on``: (c) and (c0) for the first."""
    name = "c: ragwatch worker" if on else "c0: ragwatch worker, scoring off"
    return name if i == 0 else f"{name.split(':')[0]} (pair {i + 1})"


def pair_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Scoring on / off: the median of the pairs' ratios of messages/s, each pair's, and
    the same of CPU per message (off / on: the worker's own cost)."""
    pairs = [
        (rows[pair_row(True, i)], rows[pair_row(False, i)])
        for i in range(len(rows))
        if pair_row(True, i) in rows and pair_row(False, i) in rows
    ]
    rate = [on["messages_per_s"] / off["messages_per_s"] for on, off in pairs]
    cpu = [off["cpu_us_per_message"] / on["cpu_us_per_message"] for on, off in pairs]
    return {
        "scoring_on_vs_off": round(statistics.median(rate), 3),
        "scoring_on_vs_off_pairs": [round(v, 3) for v in rate],
        "scoring_cpu_on_vs_off": round(statistics.median(cpu), 3),
        "scoring_cpu_on_vs_off_pairs": [round(v, 3) for v in cpu],
    }


def finish(rows: dict[str, dict[str, Any]], per: float, unit: str) -> dict[str, Any]:
    """Rates and rounding of one topic's rows (in place); returns its ratios."""
    for r in rows.values():
        r["messages_per_s"] = round(r["messages"] / r["seconds"])
        r[unit] = round(r["messages"] * per / r["seconds"])
        r["cpu_us_per_message"] = round(1e6 * r["cpu_s"] / r["messages"], 1)
        for k in ("seconds", "cpu_s", "peak_rss_mib", "process_cpu_s", "join_and_consume_s"):
            r[k] = round(r[k], 2)
    a, b = (rows[k]["messages_per_s"] for k in list(rows)[:2])
    c = rows[pair_row(True, 0)]["messages_per_s"]
    ratios: dict[str, Any] = {
        "c_vs_b": round(c / b, 3), "c_vs_a": round(c / a, 3), "b_vs_a": round(b / a, 3)
    }  # fmt: skip
    ratios |= pair_ratios(rows)
    if "c2: 2 ragwatch workers" in rows:
        ratios["two_workers_vs_one"] = round(
            rows["c2: 2 ragwatch workers"]["messages_per_s"] / c, 3
        )
    return ratios


def scoring(ra: dict[str, Any]) -> str:
    """Scoring on / off, the median of the pairs, each pair's, and the CPU's."""
    each = ", ".join(f"{v:.2f}" for v in ra["scoring_on_vs_off_pairs"])
    cpu = ", ".join(f"{v:.2f}" for v in ra["scoring_cpu_on_vs_off_pairs"])
    return (
        f"scoring on / off = {ra['scoring_on_vs_off']:.2f}x (target >= 0.75x; pairs {each}), "
        f"CPU per message {ra['scoring_cpu_on_vs_off']:.2f}x (pairs {cpu})"
    )


def print_rows(title: str, rows: dict[str, dict[str, Any]], unit: str, label: str) -> None:
    print(
        f"\n{title:<36} {'msgs/s':>8} {label:>14} {'window s':>9} {'CPU s':>7} "
        f"{'CPU us/msg':>11} {'peak RSS MiB':>13} {'load 1m':>8}"
    )
    for name, r in rows.items():
        print(
            f"{name:<36} {r['messages_per_s']:>8,} {r[unit]:>14,} "
            f"{r['seconds']:>9.2f} {r['cpu_s']:>7.2f} {r['cpu_us_per_message']:>11,.1f} "
            f"{r['peak_rss_mib']:>13.0f} {r['load_1m']:>8.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument(
        "--procs",
        type=int,
        nargs="+",
        default=[10, 4],
        help="processes per GPU, one envelope shape each (GPUs x (procs + 1) series)",
    )
    ap.add_argument("--ticks", type=int, default=400, help="10 s ticks of the whole fleet")
    ap.add_argument("--services", type=int, default=4)
    ap.add_argument("--instances", type=int, default=4, help="per service")
    ap.add_argument("--request-ticks", type=int, default=300, help="1 s request batches")
    ap.add_argument("--memory-series", type=int, default=10_000, help="GPU series to size")
    ap.add_argument("--timeout", type=float, default=300.0, help="per path, seconds")
    ap.add_argument(
        "--pairs", type=int, default=2, help="scoring on/off rounds per topic, alternated"
    )
    ap.add_argument("--top", type=int, default=15, help="profile rows")
    ap.add_argument("--role", choices=("kafka", "faust", "memory"), help=argparse.SUPPRESS)
    for hidden in ("--bootstrap", "--topic", "--group", "--out", "--datadir"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error(f"--pairs must be at least 1, got {args.pairs}")
    if args.role == "kafka":
        return role_kafka(args)
    if args.role == "faust":
        return role_faust(args)
    if args.role == "memory":
        return role_memory(args)

    from ragwatch.config import Settings
    from ragwatch.embedded import EmbeddedStack
    from ragwatch.kafka_admin import ensure_topics

    t_bench = time.perf_counter()
    shapes: dict[str, dict[str, Any]] = {}
    gpu_data: dict[str, list[tuple[bytes, bytes]]] = {}
    for procs in dict.fromkeys(args.procs):
        key = shape_key(args.gpus, procs)
        data = gpu_data[key] = telemetry(args.hosts, args.gpus, procs, args.ticks)
        shapes[key] = {
            "hosts": args.hosts,
            "gpus": args.gpus,
            "procs_per_gpu": procs,
            "series_per_envelope": args.gpus * (procs + 1),
            "envelopes": len(data),
            "bytes_per_envelope": sum(len(v) for _, v in data) / len(data),
        }
    req_data = request_telemetry(args.services, args.instances, args.request_ticks)
    records = sum(len(orjson.loads(v)["records"]) for _, v in req_data)
    req_size = sum(len(v) for _, v in req_data) / len(req_data)
    rounds: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ragwatch-throughput-") as tmpdir:
        tmp = Path(tmpdir)
        stack = EmbeddedStack(tmp / "stack")
        try:
            stack.up()

            def fresh_env() -> dict[str, str]:
                run_id = uuid.uuid4().hex[:8]
                return {
                    **stack.env(),
                    "RAGWATCH_TOPIC_PREFIX": f"bench{run_id}.",
                    "RAGWATCH_APP_ID": f"bench-worker-{run_id}",
                    "RAGWATCH_REDIS_PREFIX": f"bench{run_id}",
                    "RAGWATCH_KAFKA_SESSION_TIMEOUT": str(SESSION_TIMEOUT),
                    "RAGWATCH_STATE_DIR": str(tmp / f"state-{run_id}"),
                }

            def timed(r: dict[str, Any]) -> dict[str, Any]:
                return {**r, "load_1m": round(os.getloadavg()[0], 2)}

            topics = [("gpu", key, data) for key, data in gpu_data.items()]
            for kind, key, payload in [*topics, ("requests", "requests", req_data)]:
                env = fresh_env()
                settings = Settings.from_env(env)
                ensure_topics(settings)
                topic = settings.topic(kind)
                args.bootstrap = settings.kafka_bootstrap
                t0 = time.perf_counter()
                n = produce(args.bootstrap, topic, payload)
                took = time.perf_counter() - t0
                print(f"produced {n:,} {kind} envelopes ({key}) to {topic} in {took:.1f} s")
                rows = {
                    "a: confluent-kafka + orjson.loads": timed(
                        run_child("kafka", args, topic, n, tmp)
                    ),
                    "b: bare Faust agent (count)": timed(run_child("faust", args, topic, n, tmp)),
                }
                # the same topic again by workers that score every signal and none, in
                # alternated pairs (issue 34: what scoring costs, on and off in the same run)
                for i in range(args.pairs):
                    for on in (True, False) if i % 2 == 0 else (False, True):
                        e = {**fresh_env(), "RAGWATCH_TOPIC_PREFIX": env["RAGWATCH_TOPIC_PREFIX"]}
                        if not on:
                            e["RAGWATCH_SCORE_SIGNALS"] = "false"
                        rows[pair_row(on, i)] = timed(run_worker(e, n, args.timeout))
                if kind == "gpu":
                    # the same topic again, by two workers of a new group sharing its partitions
                    env2 = {**fresh_env(), "RAGWATCH_TOPIC_PREFIX": env["RAGWATCH_TOPIC_PREFIX"]}
                    rows["c2: 2 ragwatch workers"] = timed(
                        run_worker(env2, n, args.timeout, workers=2)
                    )
                rounds[key] = rows
        finally:
            stack.down()

    req_out = {
        "request_batches": len(req_data),
        "records_per_batch": records / len(req_data),
        "bytes_per_batch": req_size,
        "results": rounds["requests"],
        "ratios": finish(rounds["requests"], records / len(req_data), "request_records_per_s"),
    }
    for key, shape in shapes.items():
        shape["results"] = rounds[key]
        shape["ratios"] = finish(rounds[key], args.gpus, "gpu_samples_per_s")
        shape["target_c_vs_b"] = TARGET_C_VS_B.get(shape["series_per_envelope"])

    print(
        f"\n{args.hosts} hosts x {args.gpus} GPUs, {args.ticks} ticks, "
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        "rounds run one after another (load 1m: the machine's load as each one ended)"
    )
    for shape in shapes.values():
        print_rows(
            f"ragwatch.gpu, {shape['series_per_envelope']} series",
            shape["results"],
            "gpu_samples_per_s",
            "GPU samples/s",
        )
        print(
            f"  {shape['envelopes']:,} envelopes of {args.gpus} GPUs x {shape['procs_per_gpu']} "
            f"processes ({shape['series_per_envelope']} series, "
            f"{shape['bytes_per_envelope'] / 1024:.1f} KiB each)"
        )
    print_rows("ragwatch.requests", req_out["results"], "request_records_per_s", "records/s")
    print(
        f"  {len(req_data):,} request batches ({records / len(req_data):.0f} records, "
        f"{req_size / 1024:.1f} KiB each)"
    )
    print()
    for shape in shapes.values():
        ra, target = shape["ratios"], shape["target_c_vs_b"]
        goal = f" (target >= {target}x)" if target is not None else ""
        print(
            f"gpu {shape['series_per_envelope']:>3} series: c/b = {ra['c_vs_b']:.2f}x{goal}, "
            f"c/a = {ra['c_vs_a']:.2f}x, b/a = {ra['b_vs_a']:.2f}x; "
            f"2 workers / 1 = {ra['two_workers_vs_one']:.2f}x; {scoring(ra)}"
        )
    req_rate = req_out["results"][pair_row(True, 0)]["request_records_per_s"]
    print(
        f"requests: c/b = {req_out['ratios']['c_vs_b']:.2f}x; worker {req_rate:,} records/s "
        f"(target >= 50,000); {scoring(req_out['ratios'])}"
    )

    print()
    for shape in shapes.values():
        g = shape["in_process"] = in_process_gpu(args.gpus, shape["procs_per_gpu"])
        print(
            f"in process, no Kafka, {shape['series_per_envelope']} series: GPU path with full "
            f"leak windows {g['us_per_envelope']:,.0f} us per envelope = "
            f"{g['envelopes_per_s']:,} envelopes/s = {g['gpu_samples_per_s']:,} GPU samples/s "
            f"({g['series_updates_per_s']:,} series updates/s)"
        )
    inproc = in_process(args)
    for key, shape in shapes.items():
        prof = shape["profile"] = profile(gpu_data[key], args.top)
        label = f"{shape['series_per_envelope']} series"
        print_profile(prof, "cumulative", label)
        print_profile(prof, "tottime", label)
    bench_s = time.perf_counter() - t_bench
    print(f"\nbench took {bench_s:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "throughput.json").write_text(
        json.dumps(
            {
                "hosts": args.hosts,
                "gpus": args.gpus,
                "ticks": args.ticks,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "broker": "embedded Tansu (memory storage), 4 partitions",
                "session_timeout_s": SESSION_TIMEOUT,
                "shapes": shapes,
                "requests": req_out,
                "in_process": inproc,
                "bench_s": round(bench_s),
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
