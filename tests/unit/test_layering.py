"""The direction of imports (STYLE.md "Three rooms plus a core"), checked on the source.

detectors/ imports nothing from agents/ or streams/ and no Kafka, Faust or Redis; agents/
never imports streams/, faust or river (it runs on GPU hosts with a minimal install). A
subprocess proves the agents really import with faust and river unavailable.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "detectors": (
        "ragwatch.agents",
        "ragwatch.streams",
        "confluent_kafka",
        "faust",
        "mode",
        "aiokafka",
        "redis",
        "aiohttp",
    ),
    "agents": (
        "ragwatch.streams",
        "ragwatch.detectors",
        "faust",
        "mode",
        "river",
        "redis",
        "aiokafka",
    ),
    "ragwatch": ("faust", "river", "aiokafka"),
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_import_only_what_they_may(room: str) -> None:
    bad = []
    for path in sorted((ROOT / room).glob("*.py")):
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[room]):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_no_top_level_package_named_like_a_room_is_importable() -> None:
    code = (
        "import importlib.util as u\n"
        "print([n for n in ('agents', 'streams', 'detectors') if u.find_spec(n)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True
    )
    assert out.stdout.strip() == "[]"


def test_agents_import_without_faust_or_river() -> None:
    code = (
        "import sys\n"
        "for name in ('faust', 'river', 'mode', 'redis', 'aiokafka'): sys.modules[name] = None\n"
        "import ragwatch.agents.sim, ragwatch.agents.publisher, ragwatch.agents.runner\n"
        "import ragwatch.codec, ragwatch.config\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
