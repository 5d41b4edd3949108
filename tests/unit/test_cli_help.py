"""Help that helps: every command and subcommand says what it does in its own ``-h``,
every option has a help text, and every option with a default shows it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from ragwatch.cli import build_parser, main


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = list(_parsers(build_parser()))
IDS = [" ".join(path) or "ragwatch" for path, _ in PARSERS]


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=IDS)
def test_every_command_describes_itself_in_its_own_help(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    assert parser.description and len(parser.description) > 30, path
    text = parser.format_help()
    assert parser.description.split()[0] in text


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=IDS)
def test_every_option_has_help_and_shows_its_default(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help, (path, choice.dest)
            continue
        assert action.help, (path, action.dest)
        shown = parser._get_formatter()._expand_help(action) if action.help else ""
        if action.option_strings and action.default not in (None, False, []):
            assert "default" in shown, (path, action.option_strings, shown)


def test_agent_help_gives_the_source_default_and_every_sources_options() -> None:
    text = _help(["agent"])
    assert "(default: sim)" in " ".join(text.split())
    for option in ("--target", "--series-cap", "--proc-root", "--spool-dir", "--queue-max"):
        assert option in text


def test_notify_help_names_its_configuration_file() -> None:
    text = " ".join(_help(["notify"]).split())
    assert "RAGWATCH_NOTIFY_FILE" in text and "RAGWATCH_WEBHOOK_URLS" in text


def test_worker_and_settings_help_are_not_empty() -> None:
    for cmd in ("worker", "settings"):
        lines = [ln for ln in _help([cmd]).splitlines() if ln.strip()]
        assert len(lines) > 4, cmd


def test_dev_actions_are_described() -> None:
    text = _help(["dev"])
    for action in ("up", "down", "status"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(action + " "))
        assert len(line.split()) > 3, line


def _help(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main([*argv, "-h"], environ={})
    assert exit_info.value.code == 0
    return buf.getvalue()
