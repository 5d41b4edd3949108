"""What recording one request costs the RAG service, with ``ragwatch.agents.sdk``.

Two request paths, each timed over ``n`` calls, best of ``repeat`` runs, into a
:class:`~ragwatch.agents.publisher.ListSink`:

- ``record()``: ``rec.record(e2e_ms=..., stages={3 stages}, context_tokens=...,
  output_tokens=...)``;
- ``request()``: ``with rec.request() as r:`` with three ``r.stage(...)`` blocks and
  ``r.tokens(...)``, timed by the SDK.

Each is measured with the background flusher running (the flusher's validation and
encoding share the GIL, so its cost shows up here too) and on the hot path alone
(flusher off), each both for the calls alone and until ``close()`` has sent every record.
Also reported: the per-call tail (p99, p99.9, max) with the flusher running, and two floors: a bare
``deque.append`` and the same append under the SDK's lock with its counters.

Run: ``python bench/bench_sdk.py [--n 200000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ragwatch.agents.publisher import ListSink
from ragwatch.agents.sdk import RequestRecorder

STAGES = {"retriever": 41.5, "reranker": 12.25, "llm": 702.0}


def _recorder(*, flusher: bool, n: int) -> RequestRecorder:
    return RequestRecorder(
        ListSink(), service="bench", instance="b-1", buffer_size=max(n, 100_000), autostart=flusher
    )


def _record_loop(rec: RequestRecorder, n: int) -> None:
    record = rec.record
    for i in range(n):
        record(e2e_ms=812.5, stages=STAGES, context_tokens=i, output_tokens=250)


def _request_loop(rec: RequestRecorder, n: int) -> None:
    request = rec.request
    for i in range(n):
        with request() as r:
            with r.stage("retriever"):
                pass
            with r.stage("reranker"):
                pass
            with r.stage("llm"):
                pass
            r.tokens(context=i, output=250)


def _best_ns(
    loop: Callable[[RequestRecorder, int], None], n: int, repeat: int, flusher: bool
) -> dict[str, Any]:
    """``ns``: the calls alone; ``ns_with_send``: until close() has sent every record."""
    best, total, dropped = float("inf"), float("inf"), 0
    for _ in range(repeat):
        rec = _recorder(flusher=flusher, n=n)
        t0 = time.perf_counter_ns()
        loop(rec, n)
        t1 = time.perf_counter_ns()
        rec.close()  # the final flush; without the flusher this is all of the sending
        t2 = time.perf_counter_ns()
        s = rec.stats
        assert s.sent_records + s.dropped == n and s.invalid == s.failed_records == 0, s
        dropped = max(dropped, s.dropped)
        best, total = min(best, (t1 - t0) / n), min(total, (t2 - t0) / n)
    return {"ns": round(best, 1), "ns_with_send": round(total, 1), "dropped": dropped}


def _tail_ns(loop: Callable[[RequestRecorder, int], None], n: int) -> dict[str, float]:
    """Per-call latency with the flusher running (each call timed alone, so ~+60 ns)."""
    rec = _recorder(flusher=True, n=n)
    samples = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        loop(rec, 1)
        samples.append(clock() - t0)
    rec.close()
    samples.sort()
    return {
        "p50_ns": samples[n // 2],
        "p99_ns": samples[int(n * 0.99)],
        "p999_ns": samples[int(n * 0.999)],
        "max_ns": samples[-1],
    }


def _floors(n: int, repeat: int) -> dict[str, float]:
    item = (1.0, "ok", 812.5, 1200, 250, None, None, None)
    buf: deque[tuple[Any, ...]] = deque(maxlen=n)
    lock = threading.Lock()
    counts = [0, 0]

    def bare() -> None:
        append = buf.append
        for _ in range(n):
            append(item)

    def locked() -> None:
        for _ in range(n):
            with lock:
                if len(buf) == n:
                    counts[1] += 1
                buf.append(item)
                counts[0] += 1

    out = {}
    for name, fn in (("deque_append_ns", bare), ("locked_append_ns", locked)):
        best = float("inf")
        for _ in range(repeat):
            buf.clear()
            t0 = time.perf_counter_ns()
            fn()
            best = min(best, (time.perf_counter_ns() - t0) / n)
        out[name] = round(best, 1)
    return out


def run(n: int = 200_000, repeat: int = 3) -> dict[str, Any]:
    """Measure both request paths; ns per request (best of ``repeat`` runs of ``n``)."""
    results: dict[str, Any] = {
        "n": n,
        "repeat": repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    for name, loop in (("record", _record_loop), ("request", _request_loop)):
        results[name] = {
            "with_flusher": _best_ns(loop, n, repeat, flusher=True),
            "hot_path_only": _best_ns(loop, n, repeat, flusher=False),
            "tail_with_flusher": _tail_ns(loop, n),
        }
    results["floors"] = _floors(n, repeat)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    r = run(args.n, args.repeat)
    print(f"{args.n:,} requests, best of {args.repeat}, Python {r['python']}, {r['machine']}")
    print("us per request: the call alone | until every record is sent | tail of single calls")
    head = ("path", "flusher on", "+ sending", "hot only", "+ sending", "p50", "p99", "p99.9")
    print("{:<9}{:>11}{:>11}{:>10}{:>11}{:>8}{:>8}{:>9}{:>10}".format(*head, "max"))
    for name in ("record", "request"):
        w, h, t = r[name]["with_flusher"], r[name]["hot_path_only"], r[name]["tail_with_flusher"]
        row = (w["ns"], w["ns_with_send"], h["ns"], h["ns_with_send"])
        tail = (t["p50_ns"], t["p99_ns"], t["p999_ns"], t["max_ns"])
        print(
            f"{name:<9}"
            + "".join(f"{v / 1000:>11.2f}" for v in row[:2])
            + f"{row[2] / 1000:>10.2f}{row[3] / 1000:>11.2f}"
            + "".join(f"{v / 1000:>8.2f}" for v in tail[:2])
            + f"{tail[2] / 1000:>9.2f}{tail[3] / 1000:>10.1f}"
        )
    f = r["floors"]
    print(
        f"floors: deque.append {f['deque_append_ns'] / 1000:.3f} us, "
        f"with lock + counters {f['locked_append_ns'] / 1000:.3f} us"
    )
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
