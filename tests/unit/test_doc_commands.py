"""Every ``ragwatch ...`` command line the README and docs show parses with the real CLI:
a flag renamed or removed makes the page that still shows it fail here."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from ragwatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:sh|bash|console)?\n(.*?)```", re.S)
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def _command_lines(text: str) -> list[str]:
    """The ragwatch invocations in the page's shell blocks (pipelines, ``&&``, ``$(...)``,
    comments, env assignments and a trailing ``&`` taken apart)."""
    out = []
    for block in FENCE.findall(text):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"\|\||&&|;|\||\$\(|\)|&$|& ", line):
                words = part.strip().strip('"').split()
                start = next(
                    (
                        i
                        for i, w in enumerate(words)
                        if (w == "ragwatch" or w.endswith("/ragwatch"))
                        and not (i and words[i - 1] == "-u")  # sudo -u ragwatch: the user
                    ),
                    None,
                )
                if start is not None and all(
                    ASSIGNMENT.match(w) or w in ("sudo", "-u") or words[i - 1] == "-u"
                    for i, w in enumerate(words[:start])
                ):
                    out.append(" ".join(["ragwatch", *words[start + 1 :]]))
    return out


CASES = [
    (page.relative_to(ROOT).as_posix(), cmd)
    for page in PAGES
    for cmd in _command_lines(page.read_text())
]


def test_the_pages_show_commands() -> None:
    pages = {p for p, _ in CASES}
    assert {"README.md", "docs/commands.md", "deploy/README.md"} <= pages
    assert len(CASES) >= 25


@pytest.mark.parametrize(("page", "cmd"), CASES, ids=[f"{p}: {c}" for p, c in CASES])
def test_every_command_line_in_the_docs_parses(page: str, cmd: str) -> None:
    argv = shlex.split(cmd)[1:]
    argv = [a for a in argv if not re.fullmatch(r"\.\.\.|<[^>]*>|\[.*\]|[A-Z]+", a)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 0, f"{page}: {cmd!r}: {err.getvalue()}"
