"""Help text that helps: each command's ``-h`` says what it does, which settings it reads,
and every option's default.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="ragwatch")
>>> sub = parser.add_subparsers()
>>> p = command(sub, "status", "the fleet", "The fleet at a glance, read from Redis.",
...             epilog=settings_epilog("RAGWATCH_REDIS_URL"))
>>> _ = p.add_argument("--interval", default=2.0, help="refresh period")
>>> print(p.format_help())  # doctest: +NORMALIZE_WHITESPACE
usage: ragwatch status [-h] [--interval INTERVAL]
<BLANKLINE>
The fleet at a glance, read from Redis.
<BLANKLINE>
options:
  -h, --help           show this help message and exit
  --interval INTERVAL  refresh period (default: 2.0)
<BLANKLINE>
settings it reads ('ragwatch settings' shows them all):
  RAGWATCH_REDIS_URL: Redis URL (redis:// or rediss://)
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from ragwatch.config import env_names


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions in paragraphs (blank lines kept; lines indented by two spaces kept as
    written: examples, lists), and every option's default in its help: appended as
    ``(default: X)`` where the help does not say it already."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            if para.startswith("  ") or "\n  " in para:  # preformatted
                paragraphs.append("\n".join(indent + line for line in para.splitlines()))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(para.split()),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                    )
                )
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or "%(default)" in text
            or default in (None, False, [], argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def command(sub: Any, name: str, help: str, description: str, **kw: Any) -> Any:
    """A subcommand whose ``-h`` says what it does (``description``), which settings it
    reads (``epilog``) and every option's default."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=HelpFormatter,
        **kw,
    )


def settings_epilog(*names: str) -> str:
    """The settings a command reads, each with its documentation line."""
    docs = env_names()
    lines = [
        textwrap.fill(f"{n}: {docs[n]}", 96, initial_indent="  ", subsequent_indent="      ")
        for n in names
    ]
    return "settings it reads ('ragwatch settings' shows them all):\n" + "\n".join(lines)
