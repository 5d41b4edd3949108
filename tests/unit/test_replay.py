"""``ragwatch replay`` without Kafka: CSV and JSONL inputs, event-time merging, bad lines,
detector mode, and the same transitions as :class:`Pipelines` in-process."""

from __future__ import annotations

import gzip
import io
import itertools
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from ragwatch.agents.scenario import build
from ragwatch.cli import main
from ragwatch.codec import encode, to_dict
from ragwatch.commands import replay as replay_mod
from ragwatch.commands import replay_input
from ragwatch.commands.replay import replay
from ragwatch.commands.replay_input import (
    Point,
    Tally,
    input_files,
    merged,
    parse_time,
    read_csv,
)
from ragwatch.errors import ConfigError
from ragwatch.event_order import sort_items
from ragwatch.gpu_wire import GpuMessage
from ragwatch.schema import EventEnvelope, GpuEnvelope, RequestsEnvelope
from ragwatch.streams.alerting.rules import load_rules
from ragwatch.streams.pipelines.fleet import Pipelines

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


def write_jsonl(path: Path, lines: list[bytes]) -> Path:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return path


def gpu(host: str, ts: float) -> bytes:
    return encode(GpuEnvelope(host=host, ts=ts, gpus=()))


def run_replay(paths: list[Path], **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Transitions, the summary and stderr of a JSON replay."""
    out, err = io.StringIO(), io.StringIO()
    code = replay(paths, load_rules(), out, as_json=True, err=err, **kw)
    objs = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert objs[-1]["kind"] == "summary"
    assert code == (0 if objs[-1]["envelopes"] + objs[-1]["points"] else 2)
    return objs[:-1], objs[-1], err.getvalue()


# ---------------------------------------------------------------- CSV


@pytest.mark.parametrize(
    ("text", "ts"),
    [
        ("1396310700", 1396310700.0),
        ("1396310700.5", 1396310700.5),
        ("2014-04-01 00:05:00", 1396310700.0),
        ("2014-04-01T00:05:00", 1396310700.0),
        ("2014-04-01T02:05:00+02:00", 1396310700.0),
    ],
)
def test_parse_time_reads_epoch_seconds_and_iso_8601_as_utc(text: str, ts: float) -> None:
    assert parse_time(text) == ts


@pytest.mark.parametrize("text", ["", "yesterday", "nan", "inf", "2014-13-01 00:00:00"])
def test_parse_time_rejects_what_is_not_a_time(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)


def test_csv_with_header_and_bad_rows(tmp_path: Path) -> None:
    f = tmp_path / "s.csv"
    f.write_text(
        "timestamp,value\n"
        "2014-04-01 00:00:00,1.5\n"
        "\n"
        "2014-04-01 00:05:00,oops\n"
        "not a time,3\n"
        "2014-04-01 00:10:00\n"
        "1396311000,nan\n"
        "1396311300,4\n"
    )
    tally = Tally()
    points = list(read_csv(f, 7, tally))
    assert points == [Point(7, 1396310400.0, 1.5), Point(7, 1396311300.0, 4.0)]
    assert tally.points == 2 and tally.bad == 4
    assert [(b.line, b.reason.split(":")[0]) for b in tally.first_bad] == [
        (4, "value"),
        (5, "timestamp"),
        (6, "expected timestamp,value"),
        (7, "value"),
    ]
    assert str(tally.first_bad[0]) == f"{f}:4: value: not a number: 'oops'"


def test_csv_columns_by_header_name_or_position(tmp_path: Path) -> None:
    swapped = tmp_path / "a.csv"
    swapped.write_text("value,timestamp\n2.0,60\n")
    bare = tmp_path / "b.csv"
    bare.write_text("60,2.0\n120,3.0\n")
    wrong = tmp_path / "c.csv"
    wrong.write_text("time,v\n60,2\n")
    tally = Tally()
    assert list(read_csv(swapped, 0, tally)) == [Point(0, 60.0, 2.0)]
    assert list(read_csv(bare, 1, tally)) == [Point(1, 60.0, 2.0), Point(1, 120.0, 3.0)]
    assert list(read_csv(wrong, 2, tally)) == []
    assert [(b.path, b.line) for b in tally.first_bad] == [(str(wrong), 1)]
    assert "expected timestamp,value" in tally.first_bad[0].reason


def level_shift_csv(path: Path) -> Path:
    """200 noisy values around 10, then a shift to 20 that lasts the rest of the day (5-minute
    samples; a seasonal baseline compares the next day with its profile of this one)."""
    rng = random.Random(7)
    rows = ["timestamp,value"]
    for i in range(280):
        value = 10.0 + rng.gauss(0.0, 0.5) + (10.0 if i >= 200 else 0.0)
        rows.append(f"{T0 + 300 * i:.0f},{value:.4f}")
    path.write_text("\n".join(rows) + "\n")
    return path


SHIFT_TS = T0 + 300 * 200


def test_detector_mode_fires_at_a_level_shift_then_resolves(tmp_path: Path) -> None:
    """``seasonal`` (the default) scores a lasting shift high; once it accepts the new
    level the score falls back under the threshold and the alert resolves."""
    csv_file = level_shift_csv(tmp_path / "shift.csv")
    transitions, summary, _ = run_replay([csv_file], threshold=0.6)
    assert [(t["status"], t["previous"]) for t in transitions] == [
        ("firing", "inactive"),
        ("resolved", "firing"),
    ]
    fired, resolved = transitions
    assert fired["starts_at"] == fired["at"] == SHIFT_TS  # the first shifted value
    assert fired["labels"] == {
        "alertname": "AnomalyScore",
        "severity": "warning",
        "series": "shift.csv",
        "detector": "seasonal",
    }
    assert float(fired["annotations"]["score"]) >= 0.6 > float(resolved["annotations"]["score"])
    assert resolved["starts_at"] == SHIFT_TS < resolved["ends_at"] == resolved["at"]
    assert summary["points"] == 280 and summary["rules"]["AnomalyScore"] == {
        "fired": 1,
        "resolved": 1,
        "firing_at_end": 0,
        "first_firing": SHIFT_TS,
    }


def test_detector_and_threshold_choose_what_fires(tmp_path: Path) -> None:
    csv_file = level_shift_csv(tmp_path / "shift.csv")
    default, _, _ = run_replay([csv_file])  # seasonal, threshold 0.5
    assert default[0]["status"] == "firing" and default[0]["at"] == SHIFT_TS
    assert [t["status"] for t in default] == ["firing", "resolved"] * (len(default) // 2)
    low, _, _ = run_replay([csv_file], threshold=0.3)  # the healthy part's noise too
    assert low[0]["status"] == "firing" and low[0]["at"] < SHIFT_TS
    assert {t["labels"]["detector"] for t in default} == {"seasonal"}
    assert run_replay([csv_file], detector="leak")[0] == []  # no growth to judge
    with pytest.raises(ConfigError, match="unknown detector 'nope'"):
        run_replay([csv_file], detector="nope")


# ---------------------------------------------------------------- merging and bad lines


def test_files_are_merged_by_event_time_stably(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [gpu("a", 10), gpu("a", 30), gpu("a", 30)])
    b = write_jsonl(tmp_path / "b.jsonl.gz", [gpu("b", 5), gpu("b", 30), gpu("b", 40)])
    c = tmp_path / "c.csv"
    c.write_text("timestamp,value\n20,1\n30,2\n")
    items = list(merged([a, b, c], Tally()))
    got = [(getattr(i, "host", "csv"), i.ts) for i in items]
    assert got == [
        ("b", 5),
        ("a", 10),
        ("csv", 20),
        ("a", 30),  # ties: the earlier file first, each file in its own order
        ("a", 30),
        ("b", 30),
        ("csv", 30),
        ("b", 40),
    ]


def test_one_file_is_played_in_event_time_order_too(tmp_path: Path) -> None:
    """A recording is in consumption order (partition a read ahead of b): replay sorts it,
    keeping each sender's own order on ties."""
    envs = [gpu("a", 30), gpu("a", 40), gpu("b", 10), gpu("b", 30), gpu("b", 50)]
    f = write_jsonl(tmp_path / "rec.jsonl", envs)
    got = [(e.host, e.ts) for e in merged([f], Tally())]
    assert got == [("b", 10), ("a", 30), ("b", 30), ("a", 40), ("b", 50)]


def test_sorting_spills_to_disk_with_the_same_result(tmp_path: Path) -> None:
    envs = [gpu("a", float(t)) for t in range(300, 0, -1)]  # newest first
    f = write_jsonl(tmp_path / "rec.jsonl", envs)
    tally = Tally()
    lines = replay_input._lines(f, 0, tally)
    spilled = list(sort_items(lines, budget_bytes=2_000))  # many runs
    assert [i.ts for i in spilled] == [float(t) for t in range(1, 301)]
    assert [e.ts for e in merged([f], Tally())] == [float(t) for t in range(1, 301)]


def test_a_dir_means_its_inputs_sorted(tmp_path: Path) -> None:
    for name in ("b.csv", "a.jsonl.gz", "c.jsonl", "notes.txt", "d.json"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub.csv").mkdir()
    assert [p.name for p in input_files([tmp_path])] == ["a.jsonl.gz", "b.csv", "c.jsonl"]
    with pytest.raises(ConfigError, match="no such file"):
        input_files([tmp_path / "missing.jsonl"])


def test_bad_lines_are_counted_with_file_line_and_reason(tmp_path: Path) -> None:
    alert = b'{"v":1,"kind":"alert","rule":"R","severity":"info","status":"firing",'
    alert += b'"labels":{},"annotations":{},"value":1,"expected":null,"starts_at":1,'
    alert += b'"ends_at":null,"fingerprint":"x"}'
    lines = [
        gpu("h", 10),
        b"{not json",
        b"",
        b'{"v":1,"kind":"gpu","host":"h","ts":"soon","gpus":[]}',
        b'{"v":2,"kind":"gpu"}',
        alert,
        b"\xff\xfe",
        gpu("h", 20),
    ]
    f = write_jsonl(tmp_path / "mixed.jsonl", lines)
    _, summary, err = run_replay([f])
    assert summary["envelopes"] == 2 and summary["bad_lines"] == 5
    assert [(b["file"], b["line"]) for b in summary["bad"]] == [
        (str(f), 2),
        (str(f), 4),
        (str(f), 5),
        (str(f), 6),
        (str(f), 7),
    ]
    reasons = [b["reason"] for b in summary["bad"]]
    assert reasons[0].startswith("malformed JSON")
    assert reasons[1].startswith("ts:")
    assert reasons[2].startswith("v: unsupported schema version 2")
    assert reasons[3] == "kind 'alert' is an output, not telemetry"
    assert f"{f}:2: malformed JSON" in err


def test_a_truncated_gzip_is_reported_and_the_rest_replayed(tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [gpu("a", 10)])
    whole = gzip.compress(b"".join(gpu("b", float(t)) + b"\n" for t in range(1000)))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(whole[: len(whole) // 2])
    _, summary, _ = run_replay([good, broken])
    assert summary["envelopes"] > 1 and summary["bad_lines"] == 1
    assert summary["bad"][0]["file"] == str(broken)
    assert summary["bad"][0]["reason"].startswith("unreadable:")


def test_exit_code_2_when_nothing_could_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = write_jsonl(tmp_path / "junk.jsonl", [b"nope", b"[]"])
    assert main(["replay", str(junk)], environ={}) == 2
    captured = capsys.readouterr()
    assert "no alert fired" in captured.out and "0 envelopes" in captured.out
    assert f"{junk}:1: malformed JSON" in captured.err
    assert f"{junk}:2: message: expected a JSON object" in captured.err
    assert main(["replay", str(tmp_path / "none.csv")], environ={}) == 2
    assert "no such file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["replay", str(empty)], environ={}) == 2


# ---------------------------------------------------------------- the worker's pipelines


def test_jsonl_replay_gives_the_pipelines_transitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelopes = list(build("leak", hosts=1, gpus=1, services=0, interval_s=60).envelopes(hours=2.0))
    f = write_jsonl(tmp_path / "leak.jsonl", [encode(e) for e in envelopes])
    expected = [
        {**to_dict(t.alert), "previous": t.previous} for t in Pipelines(load_rules()).run(envelopes)
    ]
    assert main(["replay", str(f), "--json", "--pending"], environ={}) == 0
    *got, summary = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert got == orjson.loads(orjson.dumps(expected))  # hints and values included
    fired = [t for t in got if t["status"] == "firing"]
    assert [(t["rule"], t["labels"]["pid"]) for t in fired] == [("GpuMemoryLeak", "4001")]
    assert summary["envelopes"] == len(envelopes) and summary["bad_lines"] == 0
    assert summary["rules"] == {
        "GpuMemoryLeak": {
            "fired": 1,
            "resolved": 0,
            "firing_at_end": 1,
            "first_firing": fired[0]["at"],
        }
    }
    # Without --pending: only what receivers hear about.
    assert main(["replay", str(f), "--json"], environ={}) == 0
    lines = capsys.readouterr().out.splitlines()[:-1]
    assert [orjson.loads(line)["status"] for line in lines] == ["firing"]


def test_text_output_names_the_alert_its_values_and_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelopes = build("leak", hosts=1, gpus=1, services=1, interval_s=60).envelopes(hours=2.0)
    write_jsonl(tmp_path / "leak.jsonl.gz", [encode(e) for e in envelopes])
    oom = EventEnvelope(host="gpu-node-01", ts=T0 + 7300, type="oom_kill", attrs={"pid": 4001})
    write_jsonl(tmp_path / "oom.jsonl", [encode(oom)])
    assert main(["replay", str(tmp_path)], environ={}) == 0
    out = capsys.readouterr().out
    firing = [line for line in out.splitlines() if " FIRING " in line]
    assert any("GpuMemoryLeak" in line and "pid=4001" in line for line in firing), out
    assert any("GpuOomKill" in line and "pid=4001" in line for line in firing), out
    assert "    hint: GPU 0 memory +" in out
    assert "FIRED  RESOLVED  FIRING AT END  FIRST FIRING" in out
    assert "from 2 file(s)" in out and "0 bad line(s)" in out


def test_csv_series_are_named_by_file_or_by_path_where_names_clash(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [level_shift_csv(tmp_path / d / "s.csv") for d in ("a", "b")]
    files.append(level_shift_csv(tmp_path / "other.csv"))
    transitions, summary, _ = run_replay(files, threshold=0.6)
    assert sorted({t["labels"]["series"] for t in transitions}) == sorted(
        [str(files[0]), str(files[1]), "other.csv"]
    )
    assert summary["rules"]["AnomalyScore"]["fired"] == 3


class RecordingPipelines(Pipelines):
    """The worker's pipelines, with the size of every GPU batch recorded (``batches``, of
    every instance) and the envelopes each instance processed, in order (``seen``; request
    envelopes go through ``request_batch``, alone or in runs)."""

    batches: list[int] = []

    def __init__(self, rules: list[Any]) -> None:
        super().__init__(rules)
        self.seen: list[tuple[str, float]] = []

    def gpu_batch(self, envs: list[GpuMessage]) -> list[Any]:
        RecordingPipelines.batches.append(len(envs))
        self.seen += [(e.host, float(e.ts)) for e in envs]
        return super().gpu_batch(envs)

    def request_batch(self, envs: Any) -> list[Any]:
        self.seen += [(e.service, e.ts) for e in envs]
        return super().request_batch(envs)

    def process(self, env: Any) -> list[Any]:
        if not isinstance(env, RequestsEnvelope):  # (recorded by request_batch)
            self.seen.append((env.key, env.ts))
        return super().process(env)


def test_a_mixed_replay_batches_gpu_runs_and_gives_the_transitions_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU envelopes between request envelopes go through ``Pipelines.gpu_batch`` in runs
    (the worker's batches); the transitions, hints and order included, are those of
    ``Pipelines.process`` one envelope at a time."""
    world = build("all", hosts=4, gpus=1, services=1, interval_s=60, heal_after_s=40 * 60)
    envelopes = list(world.envelopes(hours=2.0))
    # an hour of GPU telemetry alone at the end: runs as long as GPU_RUN
    tail = build("leak", hosts=4, gpus=1, services=0, interval_s=10, start_ts=envelopes[-1].ts)
    envelopes += list(tail.envelopes(hours=1.0))[4:]
    assert {e.kind for e in envelopes} == {"gpu", "requests"}
    f = write_jsonl(tmp_path / "mixed.jsonl", [encode(e) for e in envelopes])
    pipes = Pipelines(load_rules())
    in_order = sorted(envelopes, key=lambda e: e.ts)  # replay's order (stable on ties)
    expected = [
        {**to_dict(t.alert), "previous": t.previous} for e in in_order for t in pipes.process(e)
    ]

    monkeypatch.setattr(replay_mod, "Pipelines", RecordingPipelines)
    RecordingPipelines.batches = []
    got, summary, _ = run_replay([f], pending=True)
    assert got == orjson.loads(orjson.dumps(expected))
    assert {"GpuMemoryLeak", "DecodeSpeedDrop"} <= {t["rule"] for t in got}
    assert summary["envelopes"] == len(envelopes)
    batches = RecordingPipelines.batches
    assert sum(batches) == sum(e.kind == "gpu" for e in envelopes)
    assert 4 in batches and max(batches) == replay_mod.BATCH_RUN


def test_gpu_lines_not_as_encode_writes_them_replay_the_same(tmp_path: Path) -> None:
    """A GPU line with its fields in another order (written by hand, or by another tool)
    is decoded through its record: the same transitions."""
    envelopes = list(build("leak", hosts=1, gpus=1, services=0, interval_s=60).envelopes(hours=2.0))
    lines = [encode(e) for e in envelopes]
    shuffled = [orjson.dumps(dict(reversed(orjson.loads(line).items()))) for line in lines]
    assert all(line.startswith(replay_input.GPU_LINE) for line in lines)  # the fast path's
    assert not any(line.startswith(replay_input.GPU_LINE) for line in shuffled)
    plain, _, _ = run_replay([write_jsonl(tmp_path / "a.jsonl", lines)], pending=True)
    other, summary, _ = run_replay([write_jsonl(tmp_path / "b.jsonl", shuffled)], pending=True)
    assert other == plain and any(t["status"] == "firing" for t in plain)
    assert summary["envelopes"] == len(envelopes) and summary["bad_lines"] == 0


def test_traces_gpu_and_request_lines_are_processed_in_the_order_of_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Traces assembled into request envelopes as GPU envelopes move event time on come
    between the GPU runs, where one item at a time (``Replay.process``) has them."""
    from ragwatch.agents.sim_requests import RequestSimConfig, RequestSimulator
    from tests.otel_spans import Fleet, otlp_json

    cfg = RequestSimConfig(services=1, scenario="retrieval", batch_s=10.0, base_qps=2.0)
    fleet, traces = Fleet(), tmp_path / "traces.otlp.jsonl"
    with traces.open("wb") as f:
        for _, batch in itertools.islice(RequestSimulator(cfg).ticks(), 360):  # 1 h
            f.writelines(otlp_json(sp) + b"\n" for env in batch if (sp := fleet.spans(env)))
    gpus = build("leak", hosts=2, gpus=1, services=0, interval_s=5).envelopes(hours=1.0)
    files = [traces, write_jsonl(tmp_path / "gpu.jsonl", [encode(e) for e in gpus])]
    monkeypatch.setattr(replay_mod, "Pipelines", RecordingPipelines)

    batched = replay_mod.Replay(load_rules(), files, detector="seasonal", threshold=0.5)
    got = list(batched.run(merged(files, Tally())))
    single = replay_mod.Replay(load_rules(), files, detector="seasonal", threshold=0.5)
    one_by_one = [t for item in merged(files, Tally()) for t in single.process(item)]
    one_by_one += single.finish()

    assert isinstance(batched.pipes, RecordingPipelines)
    assert isinstance(single.pipes, RecordingPipelines)
    assert batched.pipes.seen == single.pipes.seen
    kinds = [isinstance(k, str) and k.startswith("gpu-node") for k, _ in batched.pipes.seen]
    assert any(a and not b for a, b in itertools.pairwise(kinds))  # requests between GPU runs
    assert got == one_by_one and got


def test_event_times_are_read_as_orjson_reads_them_and_odd_lines_still_rejected(
    tmp_path: Path,
) -> None:
    """The sort reads each line's ts without building the line (msgspec skips the rest):
    the same times as parsing it whole; a line whose flaw is in what is skipped (a number
    beyond any float) is still rejected, with the reason and line the parse gives."""
    deep = b"[" * 990 + b"]" * 990  # orjson reads it, msgspec does not go that deep
    lines = [
        gpu("h", 10),
        b'{"v":1,"kind":"gpu","host":"h","ts":20,"gpus":[],"x":' + deep + b"}",
        b'{"v":1,"kind":"gpu","host":"h","ts":true,"gpus":[]}',
        b'{"v":1,"kind":"gpu","host":"h","ts":30,"gpus":[],"x":1e400}',
        b'{"v":1,"kind":"gpu","host":"h","ts":' + b"9" * 400 + b',"gpus":[]}',
        b"[1, 2]",
        gpu("h", 40),
    ]
    f = write_jsonl(tmp_path / "odd.jsonl", lines)
    _, summary, err = run_replay([f])
    assert summary["envelopes"] == 3
    # (a line with an event time is rejected when its turn comes, in event-time order)
    bad = {b["line"]: b["reason"] for b in summary["bad"]}
    assert sorted(bad) == [3, 4, 5, 6]
    assert bad[3].startswith("ts:") and bad[6].startswith("message: expected a JSON object")
    assert bad[4].startswith("malformed JSON") and bad[5].startswith("malformed JSON")
    assert f"{f}:4: malformed JSON" in err
