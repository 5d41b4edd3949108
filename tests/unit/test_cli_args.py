"""Range checks of every numeric option: a value that makes no sense is argparse's usual
error (the option named, exit 2) before anything starts; the edge values that do make
sense are taken."""

from __future__ import annotations

import argparse

import pytest

from ragwatch.cli import build_parser

REJECTED = [
    (["agent", "--interval", "0"], "--interval", "must be > 0"),
    (["agent", "--interval", "-1"], "--interval", "bad duration"),
    (["agent", "--speed", "-1"], "--speed", "must be >= 0"),
    (["agent", "--speed", "nan"], "--speed", "finite"),
    (["agent", "--speed", "inf"], "--speed", "finite"),
    (["agent", "--speed", "fast"], "--speed", "expected float"),
    (["agent", "--queue-max", "0"], "--queue-max", "at least 1"),
    (["agent", "--queue-max", "-5"], "--queue-max", "at least 1"),
    (["agent", "--spool-max", "0"], "--spool-max", "at least 1"),
    (["agent", "--hosts", "0"], "--hosts", "at least 1"),
    (["agent", "--gpus", "-2"], "--gpus", "at least 1"),
    (["agent", "--services", "-1"], "--services", "must be >= 0"),
    (["agent", "--services", "1.5"], "--services", "expected int"),
    (["agent", "--duration", "0"], "--duration", "must be > 0"),
    (["agent", "--duration=-10m"], "--duration", "bad duration"),
    (["agent", "--heal-after", "0s"], "--heal-after", "must be > 0"),
    (["agent", "--start", "-1"], "--start", "must be >= 0"),
    (["agent", "--series-cap", "0"], "--series-cap", "at least 1"),
    (["status", "--interval", "0"], "--interval", "must be > 0"),
    (["serve", "--port", "0"], "--port", "1..65535"),
    (["serve", "--port", "70000"], "--port", "1..65535"),
    (["silence", "add", "--match", "a=b", "--comment", "c", "--duration", "0"], "--duration", ">"),
    (["demo", "--timeout", "0"], "--timeout", "must be > 0"),
    (["demo", "--workers", "0"], "--workers", "must be at least 1"),
    (["demo", "--workers", "9"], "--workers", "must be at most 8"),
    (["replay", "f.jsonl", "--threshold", "0"], "--threshold", "(0, 1]"),
    (["replay", "f.jsonl", "--threshold", "1.5"], "--threshold", "(0, 1]"),
    (["record", "--out", "x.jsonl", "--duration", "0"], "--duration", "must be > 0"),
    (["record", "--out", "x.jsonl", "--max-messages", "0"], "--max-messages", "at least 1"),
]


@pytest.mark.parametrize(("argv", "option", "message"), REJECTED)
def test_a_value_that_makes_no_sense_is_an_argparse_error(
    argv: list[str], option: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ragwatch {argv[0]}") and f"argument {option}" in last, err
    assert message in last, err


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_edge_values_that_make_sense_are_taken() -> None:
    a = parse("agent", "--speed", "0", "--services", "0", "--start", "0", "--interval", "10ms")
    assert (a.speed, a.services, a.start, a.interval) == (0.0, 0, 0.0, 0.01)
    a = parse("agent", "--hosts", "1", "--gpus", "1", "--queue-max", "1", "--duration", "1d")
    assert (a.hosts, a.gpus, a.queue_max, a.duration) == (1, 1, 1, 86400.0)
    assert parse("serve", "--port", "65535").port == 65535
    assert parse("replay", "f.jsonl", "--threshold", "1").threshold == 1.0
    assert parse("record", "--out", "x", "--max-messages", "1").max_messages == 1
    assert parse("status", "--watch", "--interval", "0.5s").interval == 0.5


def test_defaults_pass_their_own_checks() -> None:
    a = parse("agent")
    assert (a.queue_max, a.spool_max, a.hosts, a.gpus, a.services, a.speed) == (
        100_000,
        256 << 20,
        4,
        2,
        2,
        1.0,
    )
    assert a.interval is a.duration is a.heal_after is a.start is None
    assert parse("status").interval == 2.0 and parse("replay", "f").threshold == 0.5
