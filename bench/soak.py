"""Soak: scenario ``all`` at high speed for ten minutes, with workers killed at random.

Starts its own embedded stack (Tansu + redis-server) in a temp dir, a notifier and two
workers (``python -m ragwatch ...``), and one simulated agent (``ragwatch agent --source
sim --scenario all``: ``--hosts`` x ``--gpus`` GPUs and ``--services`` RAG services x 2
instances, a day of telemetry played at the speed that fits it into the run, with its
spool). The notifier sends every alert to a local webhook receiver, one group per alert
(``group_by: ['...']``), no repeats.

Faults. ``--kills`` SIGKILLs, at random times (seeded) in the first 60 % of the run, each
of a random worker; the killed worker is started again 1-10 s later.

Expected notifications. Before the online run, the same telemetry (``ragwatch agent
--json``, same seed and start) goes through ``ragwatch replay --json`` offline: every
firing transition and every resolution of a firing alert is one expected notification,
keyed (fingerprint, status, startsAt). After the agent has finished and the webhook is
quiet, each key must have arrived exactly once: ``lost`` (expected, never delivered),
``duplicates`` (delivered more than once) and ``unexpected`` (delivered, not expected) are
all 0 for a pass.

Memory. Each worker's RSS (``/proc/PID/status``) is sampled every second. After the last
kill plus ``--warmup`` seconds, the RSS of each worker still running must stay within 10 %
of its value at the start of that window (the median of the first and of the last 30 s
are compared, and the max is reported).

Prints the summary and writes ``bench/results/soak.json``; exit 0 on a pass.
Run: ``python bench/soak.py`` (10 minutes) or ``python bench/soak.py --minutes 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
DAY = 86_400


class Proc:
    """``python -m ragwatch ARGS`` with its own log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.log = args, log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "ragwatch", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def rss_mib(pid: int) -> float | None:
    from ragwatch.agents.procinfo import ProcInfo  # the agents' /proc reader

    rss = ProcInfo().rss_bytes(pid)
    return None if rss is None else rss / 2**20


def expected_notifications(
    agent_args: list[str], env: dict[str, str], tmp: Path
) -> tuple[Counter[tuple[str, str, str]], int]:
    """(fingerprint, status, startsAt) of every notification the offline replay implies,
    and the number of envelopes the agent produces."""
    from ragwatch.streams.notifier.webhook import rfc3339

    recording = tmp / "telemetry.jsonl"
    with open(recording, "wb") as out:
        subprocess.run(
            [sys.executable, "-m", "ragwatch", *agent_args, "--json"],
            env=env,
            stdout=out,
            check=True,
        )
    with open(recording, "rb") as f:
        n_envelopes = sum(1 for _ in f)
    out = subprocess.run(
        [sys.executable, "-m", "ragwatch", "replay", "--json", str(recording)],
        env=env,
        capture_output=True,
        check=True,
    ).stdout
    want: Counter[tuple[str, str, str]] = Counter()
    for line in out.splitlines():
        t = json.loads(line)
        if t.get("kind") != "alert":
            continue  # the closing summary
        if t["status"] == "firing" or (t["status"] == "resolved" and t["previous"] == "firing"):
            want[(t["fingerprint"], t["status"], rfc3339(t["starts_at"]))] += 1
    return want, n_envelopes


def delivered(bodies: list[Any]) -> Counter[tuple[str, str, str]]:
    got: Counter[tuple[str, str, str]] = Counter()
    for body in bodies:
        for a in body["alerts"]:
            got[(a["fingerprint"], a["status"], a["startsAt"])] += 1
    return got


def flatness(samples: list[tuple[float, float]], window_s: float = 30.0) -> dict[str, float]:
    """Median RSS of the first and of the last ``window_s`` of ``samples`` (t, MiB)."""
    t0, t1 = samples[0][0], samples[-1][0]
    first = statistics.median(r for t, r in samples if t <= t0 + window_s)
    last = statistics.median(r for t, r in samples if t >= t1 - window_s)
    peak = max(r for _, r in samples)
    return {
        "start_mib": round(first, 1),
        "end_mib": round(last, 1),
        "max_mib": round(peak, 1),
        "end_vs_start": round(last / first - 1, 4),
        "max_vs_start": round(peak / first - 1, 4),
        "seconds": round(t1 - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the run")
    ap.add_argument("--hours", type=float, default=24.0, help="event time played")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--services", type=int, default=4)
    ap.add_argument("--kills", type=int, default=5, help="random worker SIGKILLs")
    ap.add_argument("--warmup", type=float, default=60.0, help="s after the last kill")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ragwatch.config import Settings
    from ragwatch.embedded import EmbeddedStack
    from ragwatch.kafka_admin import ensure_topics
    from ragwatch.receiver import WebhookReceiver

    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="ragwatch-soak-"))
    run_s = args.minutes * 60
    agent_s = run_s * 0.9  # the rest drains
    speed = args.hours * 3600 / agent_s
    start = (time.time() // DAY - 2) * DAY  # a whole day in the past, at midnight UTC
    agent_args = [
        "agent",
        "--source=sim",
        "--scenario=all",
        f"--hosts={args.hosts}",
        f"--gpus={args.gpus}",
        f"--services={args.services}",
        "--interval=10",
        f"--duration={args.hours * 3600:.0f}",
        f"--start={start:.0f}",
        "--heal-after=5h",
        f"--seed={args.seed}",
    ]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAGWATCH_")}
    print(
        f"soak: {args.minutes:g} min, {args.hours:g} h of scenario all at {speed:.0f}x, "
        f"{args.hosts} hosts x {args.gpus} GPUs, {args.services} services x 2; "
        f"{args.kills} worker kills; state in {tmp}",
        flush=True,
    )

    t = time.monotonic()
    want, n_envelopes = expected_notifications(agent_args, base_env, tmp)
    print(
        f"offline replay: {sum(want.values())} expected notifications "
        f"({n_envelopes} envelopes, {time.monotonic() - t:.0f} s)",
        flush=True,
    )

    stack = EmbeddedStack(tmp / "stack")
    stack.up()
    procs: list[Proc] = []
    try:
        run = uuid.uuid4().hex[:8]
        with WebhookReceiver() as rx:
            notify = tmp / "notify.yaml"
            notify.write_text(
                f'receivers:\n  - {{name: hook, type: webhook, url: "{rx.url}"}}\n'
                "route:\n  receiver: hook\n  group_by: ['...']\n  group_wait: 0s\n"
                "  group_interval: 1s\n  repeat_interval: 100000h\n"
            )
            env = {
                **base_env,
                **stack.env(),
                "RAGWATCH_TOPIC_PREFIX": f"s{run}.",
                "RAGWATCH_APP_ID": f"ragwatch-soak-{run}",
                "RAGWATCH_REDIS_PREFIX": f"soak-{run}",
                "RAGWATCH_KAFKA_SESSION_TIMEOUT": "6",
                "RAGWATCH_NOTIFY_FILE": str(notify),
                "RAGWATCH_STATE_DIR": str(tmp / "state"),
            }
            ensure_topics(Settings.from_env(env))

            def start(name: str, argv: list[str]) -> Proc:
                p = Proc(argv, env, tmp / f"{name}.log")
                procs.append(p)
                return p

            notifier = start("notify", ["notify"])
            workers = {name: start(name, ["worker"]) for name in ("worker-a", "worker-b")}
            time.sleep(5)  # let both join before the data comes
            agent = start(
                "agent", [*agent_args, f"--speed={speed:.3f}", f"--spool-dir={tmp / 'spool'}"]
            )
            t0 = time.monotonic()
            kill_at = sorted(rng.uniform(60, agent_s * 0.6) for _ in range(args.kills))
            kills: list[dict[str, Any]] = []
            restart: dict[str, float] = {}
            rss: dict[str, list[tuple[float, float]]] = {}  # "name pid" -> samples
            last_body, n_bodies = time.monotonic(), 0
            deadline = t0 + run_s + 240
            while time.monotonic() < deadline:
                now = time.monotonic() - t0
                if kill_at and now >= kill_at[0]:
                    kill_at.pop(0)
                    name = rng.choice(sorted(workers))
                    if workers[name].alive():
                        workers[name].kill()
                        restart[name] = now + rng.uniform(1, 10)
                        kills.append({"at_s": round(now, 1), "worker": name})
                        print(f"{now:6.0f}s kill -9 {name}", flush=True)
                for name, when in list(restart.items()):
                    if now >= when:
                        workers[name] = start(name, ["worker"])
                        del restart[name]
                        print(f"{now:6.0f}s restarted {name}", flush=True)
                for name, w in workers.items():
                    r = rss_mib(w.popen.pid) if w.alive() else None
                    if r is not None:
                        rss.setdefault(f"{name} {w.popen.pid}", []).append((now, r))
                if len(rx.bodies) != n_bodies:
                    n_bodies, last_body = len(rx.bodies), time.monotonic()
                if not agent.alive() and not restart:
                    got = delivered(list(rx.bodies))
                    quiet = time.monotonic() - last_body
                    if (got == want and quiet > 15) or quiet > 60:
                        break
                if int(now) % 60 == 0 and now - int(now) < 1.0:
                    print(f"{now:6.0f}s webhook bodies {n_bodies}", flush=True)
                for name, w in [*workers.items(), ("notifier", notifier)]:
                    if not w.alive() and name not in restart:
                        raise SystemExit(f"{name} died on its own: see {w.log}")
                time.sleep(1.0)
            wall = time.monotonic() - t0
            agent_rc = agent.popen.wait(60)
            got = delivered(list(rx.bodies))
    finally:
        for p in procs:
            p.kill(signal.SIGTERM)
        stack.down()

    last_kill = max((k["at_s"] for k in kills), default=0.0)
    window_from = last_kill + 10 + args.warmup
    memory = {}
    for key, samples in rss.items():
        steady = [(t, r) for t, r in samples if t >= window_from]
        if len(steady) >= 60:
            memory[key] = flatness(steady)
    lost = sorted(k for k in want if got[k] == 0)
    dups = sorted(k for k in got if got[k] > 1)
    unexpected = sorted(k for k in got if k not in want)
    flat = bool(memory) and all(m["end_vs_start"] <= 0.10 for m in memory.values())
    report = re_agent(tmp / "agent.log")
    summary = {
        "minutes": round(wall / 60, 2),
        "event_hours": args.hours,
        "speed": round(speed, 1),
        "fleet": {"hosts": args.hosts, "gpus": args.gpus, "services": args.services},
        "envelopes": n_envelopes,
        "agent": report,
        "agent_exit": agent_rc,
        "kills": kills,
        "expected_notifications": sum(want.values()),
        "delivered_notifications": sum(got.values()),
        "by_status": dict(Counter(s for _, s, _ in got.elements())),
        "lost": len(lost),
        "duplicates": len(dups),
        "unexpected": len(unexpected),
        "examples": {"lost": lost[:5], "duplicates": dups[:5], "unexpected": unexpected[:5]},
        "rss_after_warmup": memory,
        "rss_flat_within_10pct": flat,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "logs": str(tmp),
    }
    ok = not lost and not dups and not unexpected and flat and agent_rc == 0
    summary["pass"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


def re_agent(log: Path) -> dict[str, int]:
    """The counts of the agent's closing 'agent done:' line."""
    import re

    text = log.read_text(errors="replace")
    m = re.search(r"agent done: (.*)", text)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}


if __name__ == "__main__":
    sys.exit(main())
