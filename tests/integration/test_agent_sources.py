"""Every agent source publishes through the same publisher to a real broker, and every
source prints exactly what it would send with ``--once --json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragwatch import codec
from ragwatch.cli import main
from ragwatch.config import Settings
from ragwatch.kafka_admin import ensure_topics
from ragwatch.schema import EventEnvelope, GpuEnvelope, MetricsEnvelope
from tests.integration.conftest import read_records
from tests.integration.conftest import run_ragwatch as ragwatch
from tests.unit.test_nvml import GIB, FakeGpu, FakeNvml, write_proc


def read_topic(settings: Settings, role: str, expect: int) -> list[bytes]:
    return [m.value() for m in read_records(settings, settings.topic(role), expect)]


def test_nvml_without_a_driver_is_one_clear_line_and_exit_2() -> None:
    out = ragwatch("agent", "--source", "nvml", "--once", "--json")
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("ragwatch: error: NVML unavailable") and "--source sim" in line


def test_sim_once_json_prints_one_envelope_per_host() -> None:
    out = ragwatch("agent", "--source", "sim", "--hosts", "3", "--gpus", "2", "--once", "--json")
    assert out.returncode == 0, out.stderr
    envs = [codec.decode(line) for line in out.stdout.splitlines()]
    assert [e.host for e in envs if isinstance(e, GpuEnvelope)] == [
        "gpu-node-01",
        "gpu-node-02",
        "gpu-node-03",
    ]


def test_prom_once_json_prints_mapped_envelopes(exporter: str) -> None:
    out = ragwatch(
        "agent",
        "--source",
        "prom",
        "--target",
        f"{exporter}/dcgm.txt",
        "--target",
        f"{exporter}/vllm.txt",
        "--host",
        "node-a",
        "--once",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    envs = [codec.decode(line) for line in out.stdout.splitlines()]
    gpus = [e for e in envs if isinstance(e, GpuEnvelope)]
    metrics = {e.target: e for e in envs if isinstance(e, MetricsEnvelope)}
    assert gpus and all(g.fb_total > g.fb_used > 0 for e in gpus for g in e.gpus)
    names = {s.name for s in metrics[f"{exporter}/vllm.txt"].samples}
    assert {"ragwatch_generation_tokens_total", "ragwatch_requests_waiting"} <= names


def test_prom_once_that_scrapes_no_target_fails(rw_env: dict[str, str], exporter: str) -> None:
    """--once with every target down is exit 2 and one line naming them, published or
    printed; one target up is enough (the other is logged and skipped)."""
    from tests.fakes import closed_port_url

    down = closed_port_url()
    ensure_topics(Settings.from_env(rw_env))
    for extra in ((), ("--json",)):
        out = ragwatch("agent", "--source", "prom", "--target", down, "--once", *extra, env=rw_env)
        assert out.returncode == 2, out.stderr
        assert out.stdout == ""
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("ragwatch: error: agent --once: no --target could be scraped: ")
        assert down in last and "Connection refused" in last
    out = ragwatch(
        "agent", "--source", "prom", "--target", down, "--target", f"{exporter}/vllm.txt",
        "--once", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [codec.decode(line).host for line in out.stdout.splitlines()]


def test_prom_source_publishes_through_the_publisher(rw_env: dict[str, str], exporter: str) -> None:
    settings = Settings.from_env(rw_env)
    ensure_topics(settings)
    code = main(
        [
            "agent",
            "--source",
            "prom",
            "--target",
            f"{exporter}/vllm.txt",
            "--host",
            "node-a",
            "--once",
        ],
        environ=rw_env,
    )
    assert code == 0
    (raw,) = read_topic(settings, "metrics", expect=1)
    env = codec.decode(raw)
    assert isinstance(env, MetricsEnvelope) and env.host == "node-a"


def test_nvml_source_publishes_through_the_publisher(
    rw_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real pynvml module with its functions replaced (no GPU here), the real CLI,
    the real publisher and broker."""
    FakeNvml([FakeGpu("GPU-0000", procs=[(100, 6 * GIB)]), FakeGpu("GPU-1111")]).install(
        monkeypatch
    )
    proc = tmp_path / "proc"
    write_proc(proc, 100, "rag-worker", 500, "0::/\n")
    settings = Settings.from_env(rw_env)
    ensure_topics(settings)
    code = main(
        ["agent", "--source", "nvml", "--once", "--host", "gpu-host-1", "--proc-root", str(proc)],
        environ=rw_env,
    )
    assert code == 0
    (raw,) = read_topic(settings, "gpu", expect=1)
    env = codec.decode_as(GpuEnvelope, raw)
    assert env.host == "gpu-host-1" and [g.index for g in env.gpus] == [0, 1]
    assert env.gpus[0].procs[0].name == "rag-worker" and env.gpus[0].procs[0].rss
    (start,) = read_topic(settings, "events", expect=1)
    event = codec.decode_as(EventEnvelope, start)
    assert event.type == "agent_start" and event.attrs["gpu_count"] == 2
    assert json.loads(start)["source"] == "nvml"


def test_sim_json_with_a_duration_prints_a_replayable_recording(tmp_path: Path) -> None:
    out = ragwatch(
        "agent", "--source", "sim", "--scenario", "leak", "--hosts", "1", "--gpus", "1",
        "--services", "0", "--interval", "60", "--duration", "2h", "--start", "1767225600",
        "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 120  # one host envelope a minute for two hours
    f = tmp_path / "leak.jsonl"
    f.write_text(out.stdout)
    replay = ragwatch("replay", str(f), "--json")
    assert replay.returncode == 0, replay.stderr
    fired = [json.loads(x) for x in replay.stdout.splitlines()]
    assert any(r.get("status") == "firing" and r.get("rule") == "GpuMemoryLeak" for r in fired)


def test_an_agent_started_first_creates_its_topics_and_loses_nothing(
    rw_env: dict[str, str],
) -> None:
    """The README's order: the agent before the worker. Its topics do not exist yet; it
    creates them (with the configured partitions) and every envelope arrives."""
    settings = Settings.from_env(rw_env)
    out = ragwatch(
        "agent", "--source", "sim", "--hosts", "2", "--gpus", "1", "--services", "0",
        "--speed", "0", "--duration", "5m", "--interval", "30",
        env=rw_env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"created topics {settings.topic('gpu')}" in out.stderr
    assert "dropped=0" in out.stderr
    envs = [codec.decode(raw) for raw in read_topic(settings, "gpu", expect=20)]
    assert sorted(e.host for e in envs) == ["gpu-node-01"] * 10 + ["gpu-node-02"] * 10


def test_prom_agent_says_what_it_scrapes_and_files_a_named_target_under_its_host(
    rw_env: dict[str, str], exporter: str
) -> None:
    """``--target HOST=URL`` files an engine scraped from elsewhere under the host that its
    GPUs and SDK records name; the start lines say what is scraped, as which host, and
    where it goes."""
    settings = Settings.from_env(rw_env)
    ensure_topics(settings)
    vllm, dcgm = f"{exporter}/vllm.txt", f"{exporter}/dcgm.txt"
    out = ragwatch(
        "agent", "--source", "prom", "--target", f"gpu-node-07={vllm}", "--target", dcgm,
        "--once",
        env=rw_env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        f"agent: prom: scraping 2 target(s) every 15s -> Kafka {settings.kafka_bootstrap}, "
        f"topics {settings.topic('gpu')}" in out.stderr
    )
    assert f"agent: prom: {vllm} as host gpu-node-07 (named by --target)" in out.stderr
    assert f"agent: prom: {dcgm} as host " in out.stderr and "(this machine;" in out.stderr
    metrics = {
        e.target: e.host
        for e in map(codec.decode, read_topic(settings, "metrics", expect=2))
        if isinstance(e, MetricsEnvelope)
    }
    # the engine joins the GPUs its dcgm-exporter names (Hostname="gpu-node-07")
    assert metrics == {vllm: "gpu-node-07", dcgm: "gpu-node-07"}


def test_sim_json_reports_progress_on_stderr() -> None:
    """A long --json recording says how far it got (stderr), while stdout stays data."""
    out = ragwatch(
        "agent", "--source", "sim", "--hosts", "1", "--gpus", "1", "--services", "0",
        "--interval", "600", "--duration", "2h", "--start", "1767225600", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert all(line.startswith("{") for line in out.stdout.splitlines())
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("[agent] done: ") and "h of event time" in last
