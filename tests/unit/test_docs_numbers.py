"""The numbers the docs quote from demo runs come from recorded runs (issue 29, point 10).

README's demo sample said 1.12 GB/h and "+1.31 GB over 1.2 h" (a run: 1.06 GB/h, +0.44 GB
over 0.7 h); docs/commands.md said 9 Slack messages for ``all`` and 34,560 messages for
``healthy``. Now ``bench/docs_numbers.py`` runs the demos, records what they printed in
``bench/results/docs-numbers.json`` and writes the docs' marked blocks from it. Here: each
block is exactly what the script renders from the results file, and the results file's
numbers are those of the outputs it recorded. A fresh run is held to the recorded ranges
by the integration suite's own demo runs (``tests/integration/test_cli.py``).
"""

from __future__ import annotations

import json
import re
from types import ModuleType
from typing import Any

import pytest

from tests.bench_modules import load


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load("docs_numbers")


@pytest.fixture(scope="module")
def data(tool: ModuleType) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(tool.RESULTS.read_text())
    return recorded


def test_every_block_is_what_the_script_writes_from_the_recorded_runs(
    tool: ModuleType, data: dict[str, Any]
) -> None:
    for name, path in tool.BLOCKS.items():
        assert tool.block(path.read_text(), name) == tool.RENDER[name](data), (
            f"{path.name}: the <!-- demo:{name} --> block is not what the recorded runs say; "
            "run python bench/docs_numbers.py (or --docs-only)"
        )


def test_the_recorded_numbers_are_those_of_the_recorded_outputs(
    tool: ModuleType, data: dict[str, Any]
) -> None:
    assert data["tolerance"] == tool.TOLERANCE
    assert {s: len(r) >= (1 if s == "healthy" else 3) for s, r in data["scenarios"].items()} == {
        "leak": True,
        "all": True,
        "healthy": True,
    }
    for scenario, runs in data["scenarios"].items():
        for run in runs:
            assert run["rc"] == 0 and run["numbers"]["ok"], (scenario, run["said"])
            assert run["numbers"] == tool.numbers(scenario, run["stdout"], run["said"])
            assert not run["numbers"]["unexpected"], (scenario, run["said"])


def test_the_readme_quotes_the_leak_runs(tool: ModuleType, data: dict[str, Any]) -> None:
    """The numbers a reader sees: the sample is the first run, the ranges cover them all."""
    text = tool.block(tool.README.read_text(), "leak")
    first = data["scenarios"]["leak"][0]["numbers"]
    assert f"grows {first['gb_per_hour']:.2f} GB/h" in text
    assert f"+{first['increase_gb']:.2f} GB over the last {first['window_h']:.1f} h" in text
    lo, hi = tool.spread(data, "leak", "gb_per_hour")
    said = re.search(r"the page said ([\d.]+)(?:-([\d.]+))? GB/h", text)
    assert said, text
    assert (float(said[1]), float(said[2] or said[1])) == (round(lo, 2), round(hi, 2))


def test_commands_md_quotes_the_all_and_healthy_runs(
    tool: ModuleType, data: dict[str, Any]
) -> None:
    text = " ".join(tool.block(tool.COMMANDS.read_text(), "scenarios").split())
    lo, hi = tool.spread(data, "all", "slack_messages")
    slack = f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"
    assert f"Slack {slack} grouped messages" in text
    msgs = {f"{r['numbers']['messages']:,.0f}" for r in data["scenarios"]["healthy"]}
    assert any(f"processed {m}" in text or f"{m} messages" in text for m in msgs), text
