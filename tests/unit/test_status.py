"""The ``ragwatch status`` view on status dicts (no Redis): missing data, large fleets,
hostile strings. The command itself runs against Redis in tests/integration."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from ragwatch.config import Settings
from ragwatch.console.status import _watch
from ragwatch.console.status_view import clean, render
from ragwatch.embedded import free_port

NOW = 1_767_232_800.0


def text(status: dict[str, Any], *, unicode: bool = True) -> str:
    out = io.StringIO()
    Console(file=out, width=160, markup=False, highlight=False).print(
        render(status, NOW, unicode=unicode)
    )
    return out.getvalue()


def gpu(index: int, used: float, growth: float | None = 0.0, util: float = 50.0) -> dict[str, Any]:
    return {
        "index": index,
        "mig": None,
        "fb_used_bytes": used,
        "fb_total_bytes": 80e9,
        "gb_per_hour": growth,
        "tte_h": None,
        "gpu_util": util,
        "procs": [],
    }


def test_an_empty_or_bare_status_renders() -> None:
    assert "no hosts reported yet" in text({})
    bare = {"hosts": [{"host": "h"}], "services": [{"service": "s"}], "alerts": [{}],
            "silences": [{}], "notifier": {}, "workers": {"w": {}}}  # fmt: skip
    out = text(bare)
    assert "ALERTS (0 firing, 0 pending)" in out and "never reported" in out


def test_a_large_fleet_lists_only_top_and_alerted_gpus() -> None:
    hosts = [
        {"host": f"node-{h:02d}", "gpus": [gpu(i, 40e9 + i * 1e9) for i in range(8)]}
        for h in range(8)
    ]  # 64 GPUs, no top_gpus (an older worker): computed from the GPUs
    hosts[3]["gpus"][5]["gb_per_hour"] = 1.3
    alert = {"rule": "GpuMemoryHigh", "status": "firing", "severity": "warning",
             "labels": {"host": "node-05", "gpu": "0"}, "annotations": {}}  # fmt: skip
    out = text({"hosts": hosts, "alerts": [alert]})
    rows = [line for line in out.splitlines() if line.startswith("node-")]
    gpu_rows = {tuple(r.split()[:2]) for r in rows if r.split()[1].isdigit() and len(r.split()) > 7}
    assert ("node-03", "5") in gpu_rows  # the growing one
    assert ("node-05", "0") in gpu_rows  # the alerted one
    assert ("node-01", "7") in gpu_rows  # the fullest of its host
    assert ("node-01", "4") not in gpu_rows
    assert "quieter GPUs not shown" in out
    assert "growth GPU5 +1.30 GB/h" in out


def test_strings_from_the_fleet_cannot_drive_the_terminal_or_rich_markup() -> None:
    assert clean("a\x1b[2Jb\x07\n") == "a\\x1b[2Jb\\x07\\x0a"
    alert = {
        "rule": "[bold]X[/bold]",
        "status": "pending",
        "severity": "info",
        "labels": {"process": "\x1b]0;pwned\x07"},
        "annotations": {"hint": "[red]h"},
    }
    out = text({"alerts": [alert]})
    assert "[bold]X[/bold]" in out and "hint: [red]h" in out
    assert "\x1b" not in out and "\\x1b]0;pwned\\x07" in out


def test_memory_bars_fall_back_to_ascii() -> None:
    out = text({"hosts": [{"host": "h", "gpus": [gpu(0, 60e9)]}]}, unicode=False)
    assert "#########..." in out and "█" not in out


def test_services_show_forecast_deviation_stages_in_order_and_queue() -> None:
    signals = {"rps": 2.0, "tokens_per_request": 150.0, "tpr_forecast": 240.0,
               "output_tokens_per_s": 300.0, "retriever_p95_ms": 90.0, "retriever_p99_ms": 120.0,
               "llm_p95_ms": 700.0, "llm_p99_ms": 800.0, "e2e_p95_ms": 900.0,
               "queue_p95_ms": 12.0, "ttft_p95_ms": 300.0, "errors_ratio": 0.02}  # fmt: skip
    svc = {"service": "rag", "instances": [{"instance": "i0", "host": "h", "signals": signals}]}
    out = text({"services": [svc]})
    assert "150/240 -38%" in out
    assert out.index("retriever 90/120") < out.index("llm 700/800")
    row = next(line for line in out.splitlines() if line.startswith("rag "))
    assert row.split()[-3:] == ["900/-", "12", "2.0%"]  # e2e P95/P99, queue P95, errors
    assert "ttft" not in out  # not a stage


def test_watch_keeps_the_last_status_when_redis_goes_away_and_stops_on_ctrl_c() -> None:
    settings = Settings.from_env({"RAGWATCH_REDIS_URL": f"redis://:pw@127.0.0.1:{free_port()}/0"})
    shown: list[tuple[dict[str, Any], str | None]] = []
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    last = {"hosts": []}
    assert _watch(settings, last, lambda s, e: shown.append((s, e)), 0.0, sleep, lambda: NOW) == 0
    assert sleeps == [0.1, 0.1, 0.1]  # never a busy loop
    assert shown[0] == (last, None)  # the status it was given, then the failed reads
    assert [s for s, _ in shown[1:]] == [last, last]
    for _, error in shown[1:]:
        assert error and error.startswith("cannot read status from Redis") and "pw" not in error


def test_watch_ends_when_its_wait_is_cut_short() -> None:
    """A wait that returns true (``Event.wait`` of an event that is set) ends the watch:
    exit 0, the first view and no redraw."""
    import threading

    settings = Settings.from_env({"RAGWATCH_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    stop = threading.Event()
    stop.set()
    shown: list[Any] = []
    assert _watch(settings, {}, lambda s, e: shown.append(s), 5.0, stop.wait, lambda: NOW) == 0
    assert shown == [{}]
