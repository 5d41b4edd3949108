"""End-to-end consume throughput on the embedded broker: the worker next to its baselines.

Starts its own embedded stack (Tansu + redis-server, ``ragwatch/embedded.py``) in a temp
dir, pre-produces one ``ragwatch.gpu`` topic of simulated host envelopes (confluent-kafka,
acks=all, delivered records counted from the delivery reports; Tansu's high watermark can
lag one batch, so it is never read), then consumes that same topic three times, each in
its own subprocess and consumer group:

a. a bare confluent-kafka loop + ``orjson.loads``;
b. a bare Faust agent that only counts (broker settings as ``streams/app.py:build_app``);
c. the full worker, ``python -m ragwatch worker``, whose ``messages`` counter is read from
   the Redis hash ``<prefix>:workers`` (written once a second with its ``seen`` time).

Rates run from the first message to the last, so the consumer-group join (half the session
timeout on Tansu) is excluded. For (c) the window is bounded by the worker's own
once-a-second counter writes: rate = counted messages / time between the first write with
messages > 0 and the first write with all of them. Prints the table and the ratios, then a
cProfile of the in-process hot path (decode + ``Pipelines.gpu``, no Kafka) over the same
envelopes, and writes ``bench/results/throughput.json``.
Run: ``make bench`` or ``python bench/throughput.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import platform
import pstats
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).parent / "results"
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
    out = tmp / f"{role}.json"
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


def run_worker(env: dict[str, str], n: int, timeout: float) -> dict[str, Any]:
    import redis

    prefix = env["RAGWATCH_REDIS_PREFIX"]
    r = redis.Redis.from_url(env["RAGWATCH_REDIS_URL"])
    t_start = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "ragwatch", "worker"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    samples: list[tuple[float, int, float]] = []  # (worker's seen time, messages, cpu)
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"worker exited with {p.returncode}")
            if time.perf_counter() - t_start > timeout:
                raise RuntimeError(f"worker: not done after {timeout} s ({samples[-1:]})")
            for raw in r.hgetall(f"{prefix}:workers").values():
                w = orjson.loads(raw)
                if w["messages"] and (not samples or w["seen"] > samples[-1][0]):
                    samples.append((w["seen"], w["messages"], proc_cpu(p.pid)))
            if samples and samples[-1][1] >= n:
                break
            time.sleep(0.02)
        hwm, total_cpu = proc_hwm_mib(p.pid), proc_cpu(p.pid)
    finally:
        stop(p)
        r.close()
    (ta, ma, ca), (tb, mb, cb) = samples[0], samples[-1]
    if len(samples) < 3:
        raise RuntimeError(f"worker finished within {len(samples)} counter writes: add --ticks")
    return {
        "messages": mb,
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
    from ragwatch.streams.pipelines import Pipelines
    from ragwatch.streams.rules import load_rules

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
    for marker in ("site-packages/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def print_profile(prof: dict[str, Any], key: str) -> None:
    print(
        f"\ntop {len(prof[f'top_{key}'])} by {key} time "
        f"({prof['envelopes']:,} envelopes, {prof['profiled_wall_s']} s under cProfile)"
    )
    print(f"{'ncalls':>10} {'tottime':>8} {'cumtime':>8} {'us/env':>7}  function")
    for r in prof[f"top_{key}"]:
        print(
            f"{r['ncalls']:>10,} {r['tottime_s']:>8.2f} {r['cumtime_s']:>8.2f} "
            f"{r['us_per_envelope']:>7.1f}  {r['function']}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=10, help="processes per GPU")
    ap.add_argument("--ticks", type=int, default=150, help="10 s ticks of the whole fleet")
    ap.add_argument("--timeout", type=float, default=300.0, help="per path, seconds")
    ap.add_argument("--top", type=int, default=15, help="profile rows")
    ap.add_argument("--role", choices=("kafka", "faust"), help=argparse.SUPPRESS)
    for hidden in ("--bootstrap", "--topic", "--group", "--out", "--datadir"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "kafka":
        return role_kafka(args)
    if args.role == "faust":
        return role_faust(args)

    from ragwatch.config import Settings
    from ragwatch.embedded import EmbeddedStack
    from ragwatch.kafka_admin import ensure_topics

    t_bench = time.perf_counter()
    data = telemetry(args.hosts, args.gpus, args.procs, args.ticks)
    size = sum(len(v) for _, v in data) / len(data)
    with tempfile.TemporaryDirectory(prefix="ragwatch-throughput-") as tmpdir:
        tmp = Path(tmpdir)
        stack = EmbeddedStack(tmp / "stack")
        try:
            stack.up()
            run_id = uuid.uuid4().hex[:8]
            env = {
                **stack.env(),
                "RAGWATCH_TOPIC_PREFIX": f"bench{run_id}.",
                "RAGWATCH_APP_ID": f"bench-worker-{run_id}",
                "RAGWATCH_REDIS_PREFIX": f"bench{run_id}",
                "RAGWATCH_KAFKA_SESSION_TIMEOUT": str(SESSION_TIMEOUT),
                "RAGWATCH_STATE_DIR": str(tmp / "state"),
                "RAGWATCH_LOG_LEVEL": "WARNING",
            }
            settings = Settings.from_env(env)
            ensure_topics(settings)
            topic = settings.topic("gpu")
            args.bootstrap = settings.kafka_bootstrap
            t0 = time.perf_counter()
            n = produce(args.bootstrap, topic, data)
            produce_s = time.perf_counter() - t0
            print(f"produced {n:,} envelopes to {topic} in {produce_s:.1f} s")
            rows = {
                "a: confluent-kafka + orjson.loads": run_child("kafka", args, topic, n, tmp),
                "b: bare Faust agent (count)": run_child("faust", args, topic, n, tmp),
                "c: ragwatch worker": run_worker(env, n, args.timeout),
            }
        finally:
            stack.down()
    for r in rows.values():
        r["messages_per_s"] = round(r["messages"] / r["seconds"])
        r["gpu_samples_per_s"] = round(r["messages"] * args.gpus / r["seconds"])
        r["cpu_us_per_message"] = round(1e6 * r["cpu_s"] / r["messages"], 1)
        for k in ("seconds", "cpu_s", "peak_rss_mib", "process_cpu_s", "join_and_consume_s"):
            r[k] = round(r[k], 2)
    a, b, c = (r["messages_per_s"] for r in rows.values())
    ratios = {"c_vs_b": round(c / b, 3), "c_vs_a": round(c / a, 3), "b_vs_a": round(b / a, 3)}

    print(
        f"{n:,} host envelopes ({args.hosts} hosts x {args.gpus} GPUs x {args.procs} procs, "
        f"{size / 1024:.1f} KiB each), Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'path':<36} {'msgs/s':>8} {'GPU samples/s':>14} {'window s':>9} {'CPU s':>7} "
        f"{'CPU us/msg':>11} {'peak RSS MiB':>13}"
    )
    for name, r in rows.items():
        print(
            f"{name:<36} {r['messages_per_s']:>8,} {r['gpu_samples_per_s']:>14,} "
            f"{r['seconds']:>9.2f} {r['cpu_s']:>7.2f} {r['cpu_us_per_message']:>11,.1f} "
            f"{r['peak_rss_mib']:>13.0f}"
        )
    print(
        f"c/b = {ratios['c_vs_b']:.2f}x (target >= 0.8x), c/a = {ratios['c_vs_a']:.3f}x, "
        f"b/a = {ratios['b_vs_a']:.2f}x"
    )
    prof = None
    if ratios["c_vs_b"] < 0.8:
        prof = profile(data, args.top)
        print_profile(prof, "cumulative")
        print_profile(prof, "tottime")
    bench_s = time.perf_counter() - t_bench
    print(f"\nbench took {bench_s:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "throughput.json").write_text(
        json.dumps(
            {
                "envelopes": n,
                "hosts": args.hosts,
                "gpus": args.gpus,
                "procs_per_gpu": args.procs,
                "bytes_per_envelope": size,
                "produce_s": round(produce_s, 2),
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "broker": "embedded Tansu (memory storage), 4 partitions",
                "session_timeout_s": SESSION_TIMEOUT,
                "results": rows,
                "ratios": ratios,
                "target_c_vs_b": 0.8,
                "profile": prof,
                "bench_s": round(bench_s),
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
