"""Alert latency at a steady produce rate: envelope produced -> firing in Redis -> webhook.

Starts its own embedded stack (Tansu + redis-server) in a temp dir, a worker
(``python -m ragwatch worker``) and a notifier (``python -m ragwatch notify``, no notify
file, ``RAGWATCH_WEBHOOK_URLS`` -> a local :class:`~ragwatch.receiver.WebhookReceiver`),
then streams simulated telemetry in real time, paced by the wall clock.

Workload. ``--leaks`` leak-scenario fleets (``SimConfig(scenario="leak")``, one seed each),
each of ``hosts_per_fleet`` hosts x 8 GPUs, hosts renamed ``fNN-gpu-node-MM`` so they do
not collide; fleet k leaks on host ``k % hosts_per_fleet`` from event time
``--leak-from + k * spread`` on, so the leak alerts fire staggered over the run. Event time
is accelerated by a fixed factor, ``--speedup`` (default 40: one 10 s tick of the whole
fleet every 0.25 s of wall time); the fleet size is chosen so that this tick rate gives the
target envelope rate (``--rate`` host envelopes/s; 1,250/s x 8 GPUs = 10,000 GPU
samples/s). Envelopes are generated and encoded before the clock starts, so the producer
only paces and produces (confluent-kafka, acks=all, linger 5 ms, like an agent).

Measure. The produce wall time of every envelope is kept by (host, ts). A firing alert's
``at`` is the event time of the evaluation that fired it, i.e. the ts of the envelope whose
processing made the rule fire; its latency is the wall time the alert was seen minus the
produce wall time of envelope (alert host, at):

1. Redis: ``<prefix>:alerts:active`` polled every 20 ms, first poll showing the
   fingerprint with status firing;
2. webhook: arrival time of the first body carrying that fingerprint as firing.

Lag: the worker's ``messages`` counter (``<prefix>:workers``, written once a second) is
compared with the envelopes produced by then; the rate is "sustained" when the lag does
not grow over the second half of the run. Prints p50/p99/max/count for both, the achieved
rate and the lag, and writes ``bench/results/latency.json``.
Run: ``make bench`` or ``python bench/latency.py [--rate 1250]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from throughput import SESSION_TIMEOUT, proc_cpu, stop


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


RESULTS = Path(__file__).parent / "results"
TICK_S = 10.0  # event time between two samples of a host
TARGET_P99_S = 1.0


# --- workload ---------------------------------------------------------------------------


def workload(args: argparse.Namespace) -> tuple[int, list[list[tuple[str, float, bytes]]]]:
    """(hosts in all, per tick the (host, ts, encoded envelope) of every host)."""
    import dataclasses

    from ragwatch.agents.sim import FleetSimulator, SimConfig
    from ragwatch.codec import encode

    ticks_per_s = args.speedup / TICK_S
    per_fleet = max(1, round(args.rate / ticks_per_s / args.leaks))
    n_ticks = int(args.duration * ticks_per_s)
    spread = (args.leak_to - args.leak_from) / max(1, args.leaks - 1)
    sims = [
        FleetSimulator(
            SimConfig(
                hosts=per_fleet,
                gpus=args.gpus,
                seed=k,
                scenario="leak",
                interval_s=TICK_S,
                leak_start_s=args.leak_from + k * spread,
                leak_host=k % per_fleet,
            )
        ).ticks()
        for k in range(args.leaks)
    ]
    out = []
    for _ in range(n_ticks):
        row = []
        for k, it in enumerate(sims):
            _, envs, _ = next(it)
            for env in envs:
                env = dataclasses.replace(env, host=f"f{k:02d}-{env.host}")
                row.append((env.host, env.ts, encode(env)))
        out.append(row)
    return per_fleet * args.leaks, out


class TimedBodies(list):  # type: ignore[type-arg]
    """``WebhookReceiver.bodies`` that also keeps each body's arrival wall time."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, body: Any) -> None:
        self.times.append(time.time())
        super().append(body)


# --- watchers ---------------------------------------------------------------------------


def poll_redis(
    url: str,
    prefix: str,
    seen: dict[str, tuple[float, dict[str, Any]]],
    lag: list[tuple[float, int]],
    halt: threading.Event,
) -> None:
    """Every 20 ms: first wall time each fingerprint is firing; the worker's counter."""
    import redis

    from ragwatch.store import Keys

    keys = Keys(prefix)
    r = redis.Redis.from_url(url)
    last_seen = 0.0
    while not halt.is_set():
        now = time.time()
        for key, raw in r.hgetall(keys.active).items():
            fp = key.decode()
            if fp not in seen:
                a = orjson.loads(raw)
                if a["status"] == "firing":
                    seen[fp] = (now, a)
        for raw in r.hgetall(keys.workers).values():
            w = orjson.loads(raw)
            if w["seen"] > last_seen:
                last_seen = w["seen"]
                lag.append((w["seen"], w["messages"]))
        time.sleep(max(0.0, 0.02 - (time.time() - now)))
    r.close()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]  # nearest rank


def summary(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"count": 0}
    return {
        "count": len(xs),
        "p50_s": round(pct(xs, 0.50), 3),
        "p99_s": round(pct(xs, 0.99), 3),
        "max_s": round(max(xs), 3),
        "mean_s": round(statistics.fmean(xs), 3),
    }


# --- main -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1250, help="host envelopes/s (x8 GPUs)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--speedup", type=float, default=40, help="event s per wall s")
    ap.add_argument("--duration", type=float, default=150, help="wall s of streaming")
    ap.add_argument("--leaks", type=int, default=40, help="fleets, one leaking process each")
    ap.add_argument("--leak-from", type=float, default=300, help="first leak start, event s")
    ap.add_argument("--leak-to", type=float, default=3600, help="last leak start, event s")
    ap.add_argument("--drain", type=float, default=15, help="wall s to wait after producing")
    args = ap.parse_args()

    from confluent_kafka import Producer

    from ragwatch.config import Settings
    from ragwatch.embedded import EmbeddedStack
    from ragwatch.kafka_admin import ensure_topics
    from ragwatch.receiver import WebhookReceiver

    t_bench = time.perf_counter()
    hosts, ticks = workload(args)
    n_env = sum(len(t) for t in ticks)
    size = sum(len(v) for t in ticks[:5] for _, _, v in t) / sum(len(t) for t in ticks[:5])
    gen_s = time.perf_counter() - t_bench
    target = hosts * args.speedup / TICK_S
    print(
        f"{args.leaks} fleets x {hosts // args.leaks} hosts = {hosts} hosts x {args.gpus} GPUs, "
        f"{len(ticks)} ticks ({n_env:,} envelopes, {size / 1024:.1f} KiB) built in {gen_s:.0f} s;"
        f" target {target:,.0f} envelopes/s = {target * args.gpus:,.0f} GPU samples/s, "
        f"event time x{args.speedup:g}"
    )
    produced_at: dict[tuple[str, float], float] = {}
    fired: dict[str, tuple[float, dict[str, Any]]] = {}
    lag: list[tuple[float, int]] = []
    produced_log: list[tuple[float, int]] = []
    halt = threading.Event()
    rx = WebhookReceiver()
    rx.bodies = TimedBodies()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="ragwatch-latency-") as tmpdir:
        tmp = Path(tmpdir)
        stack = EmbeddedStack(tmp / "stack")
        poller = None
        try:
            stack.up()
            rx.start()
            run_id = uuid.uuid4().hex[:8]
            env = {
                **stack.env(),
                "RAGWATCH_TOPIC_PREFIX": f"lat{run_id}.",
                "RAGWATCH_APP_ID": f"lat-worker-{run_id}",
                "RAGWATCH_REDIS_PREFIX": f"lat{run_id}",
                "RAGWATCH_KAFKA_SESSION_TIMEOUT": str(SESSION_TIMEOUT),
                "RAGWATCH_STATE_DIR": str(tmp / "state"),
                "RAGWATCH_LOG_LEVEL": "WARNING",
                "RAGWATCH_WEBHOOK_URLS": rx.url,
            }
            settings = Settings.from_env(env)
            ensure_topics(settings)
            topic = settings.topic("gpu")
            for cmd in ("worker", "notify"):
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "ragwatch", cmd],
                        env={**os.environ, **env},
                        stdout=subprocess.DEVNULL,
                        stderr=(tmp / f"{cmd}.log").open("wb"),
                    )
                )
            poller = threading.Thread(
                target=poll_redis,
                args=(env["RAGWATCH_REDIS_URL"], env["RAGWATCH_REDIS_PREFIX"], fired, lag, halt),
                daemon=True,
            )
            poller.start()
            failed = 0

            def on_delivery(err: Any, _msg: Any) -> None:
                nonlocal failed
                failed += err is not None

            p = Producer(
                {
                    "bootstrap.servers": settings.kafka_bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                }
            )

            def send(row: list[tuple[str, float, bytes]]) -> None:
                for host, ts, value in row:
                    while True:
                        try:
                            p.produce(topic, value, host.encode(), on_delivery=on_delivery)
                            break
                        except BufferError:
                            p.poll(0.05)
                    produced_at[(host, ts)] = time.time()
                p.poll(0)

            # Warm-up: tick 0 unpaced, then wait for the worker to have consumed it (group
            # joined), so the paced clock does not start with a backlog.
            send(ticks[0])
            p.flush(30)
            deadline = time.monotonic() + 90
            while not lag or lag[-1][1] < hosts:
                if time.monotonic() > deadline or any(q.poll() is not None for q in procs):
                    raise RuntimeError(f"worker not consuming (counter {lag[-1:]})")
                time.sleep(0.05)
            print(f"worker joined and consumed tick 0 after {time.perf_counter() - t_bench:.0f} s")

            # Paced: envelope i of the run is due at t0 + i / target.
            flat = [e for t in ticks[1:] for e in t]
            t0 = time.time()
            cpu0 = proc_cpu(procs[0].pid)
            broker_pid = stack.services()["kafka"].pid
            broker0, busy0 = proc_cpu(broker_pid), machine_busy()
            i = 0
            while i < len(flat):
                due = int((time.time() - t0) * target) + 1
                if due > i:
                    send(flat[i : min(due, len(flat))])
                    i = min(due, len(flat))
                    produced_log.append((time.time(), i + hosts))
                time.sleep(0.005)
            t1 = time.time()
            p.flush(30)
            worker_cpu = proc_cpu(procs[0].pid) - cpu0
            broker_cpu = proc_cpu(broker_pid) - broker0
            busy1 = machine_busy()
            machine = (busy1[0] - busy0[0]) / max(1e-9, busy1[1] - busy0[1])
            produce_s = t1 - t0
            time.sleep(args.drain)
        except BaseException:
            for cmd in ("worker", "notify"):
                log = tmp / f"{cmd}.log"
                if log.exists():
                    print(f"--- {cmd} log tail:\n{log.read_text()[-2000:]}", file=sys.stderr)
            raise
        finally:
            halt.set()
            if poller is not None:
                poller.join(5)
            for q in procs:
                stop(q)
            rx.stop()
            stack.down()

    # (1) Redis and (2) webhook latencies, each from the produce time of envelope (host, at).
    redis_lat, hook_lat, unmatched = [], [], []
    for fp, (t_seen, a) in fired.items():
        t_prod = produced_at.get((a["labels"]["host"], a["at"]))
        if t_prod is None:
            unmatched.append(fp)
            continue
        redis_lat.append(t_seen - t_prod)
    hook_first: dict[str, float] = {}
    for body, t_arr in zip(rx.bodies, rx.bodies.times, strict=True):
        for a in body.get("alerts", []):
            fp = a.get("fingerprint")
            if a.get("status") == "firing" and fp and fp not in hook_first:
                hook_first[fp] = t_arr
    for fp, t_arr in hook_first.items():
        if fp in fired:
            a = fired[fp][1]
            t_prod = produced_at.get((a["labels"]["host"], a["at"]))
            if t_prod is not None:
                hook_lat.append(t_arr - t_prod)

    # Lag: envelopes produced by the worker's counter write minus its counter.
    def produced_by(t: float) -> int:
        n = 0
        for tp, k in produced_log:
            if tp > t:
                break
            n = k
        return n

    lags = [(t - t0, produced_by(t) - m) for t, m in lag if t0 <= t <= t1]
    half = [x for t, x in lags if t >= produce_s / 2]
    first_q = [x for t, x in lags if produce_s / 2 <= t < 3 * produce_s / 4]
    last_q = [x for t, x in lags if t >= 3 * produce_s / 4]
    growth = (statistics.fmean(last_q) - statistics.fmean(first_q)) if first_q and last_q else 0
    achieved = (len(flat)) / produce_s
    processed = lag[-1][1] if lag else 0
    sustained = growth < target * 1.0 and (max(half) if half else 0) < target * 2
    r_sum, h_sum = summary(redis_lat), summary(hook_lat)
    bench_s = time.perf_counter() - t_bench

    print(
        f"produced {len(flat) + hosts:,} envelopes ({failed} failed); paced {len(flat):,} in "
        f"{produce_s:.1f} s = {achieved:,.0f} envelopes/s = {achieved * args.gpus:,.0f} GPU "
        f"samples/s; worker processed {processed:,} (CPU {worker_cpu / produce_s:.0%} of a core; "
        f"broker {broker_cpu / produce_s:.0%}; all {os.cpu_count()} cores {machine:.0%} busy)"
    )
    print(
        f"worker lag (envelopes): max {max((x for _, x in lags), default=0):,}, "
        f"2nd half max {max(half, default=0):,}, growth over the last half "
        f"{growth:+,.0f} -> {'sustained' if sustained else 'NOT sustained (lag grows)'}"
    )
    print(f"{'latency, produce ->':<26} {'count':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for name, s in (("(1) firing in Redis", r_sum), ("(2) webhook received", h_sum)):
        if s["count"]:
            print(
                f"{name:<26} {s['count']:>6} {s['p50_s']:>7.3f} {s['p99_s']:>7.3f} "
                f"{s['max_s']:>7.3f}"
            )
        else:
            print(f"{name:<26} {0:>6}")
    print(
        f"alerts firing in Redis {len(fired)} (unmatched to an envelope: {len(unmatched)}), "
        f"at the webhook {len(hook_first)}; target p99 < {TARGET_P99_S} s"
    )
    print(f"bench took {bench_s:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latency.json").write_text(
        json.dumps(
            {
                "target_envelopes_per_s": round(target),
                "target_gpu_samples_per_s": round(target * args.gpus),
                "achieved_envelopes_per_s": round(achieved),
                "achieved_gpu_samples_per_s": round(achieved * args.gpus),
                "sustained": sustained,
                "lag_envelopes": {
                    "max": max((x for _, x in lags), default=0),
                    "second_half_max": max(half, default=0),
                    "growth_last_half": round(growth),
                    "samples": [[round(t, 1), x] for t, x in lags],
                },
                "worker_cpu_cores": round(worker_cpu / produce_s, 2),
                "broker_cpu_cores": round(broker_cpu / produce_s, 2),
                "machine_busy": round(machine, 3),
                "hosts": hosts,
                "fleets": args.leaks,
                "gpus": args.gpus,
                "bytes_per_envelope": round(size),
                "event_time_speedup": args.speedup,
                "tick_s": TICK_S,
                "produce_s": round(produce_s, 1),
                "envelopes": len(flat) + hosts,
                "redis_latency": r_sum,
                "webhook_latency": h_sum,
                "alerts_firing": len(fired),
                "alerts_unmatched": len(unmatched),
                "alerts_at_webhook": len(hook_first),
                "target_p99_s": TARGET_P99_S,
                "redis_poll_s": 0.02,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "broker": "embedded Tansu (memory storage), 4 partitions",
                "bench_s": round(bench_s),
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
