"""A GPU host's install, for real: a fresh venv with ``pip install '.[agent]'`` (what the
README tells GPU hosts to do). The agent works there; every other command says in one
line which extra it needs and exits 2, instead of an import traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding ragwatch with the agent extra only, from this working tree."""
    tmp = tmp_path_factory.mktemp("agent-only")
    src = tmp / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        path = ROOT / os.fsdecode(name)
        if path.is_file():
            (src / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            (src / os.fsdecode(name)).write_bytes(path.read_bytes())
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(
        [*pip, "--disable-pip-version-check", f"{src}[agent]"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return env_dir


def _ragwatch(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAGWATCH_")}
    return subprocess.run(
        [str(env_dir / "bin" / "ragwatch"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=env_dir,
    )


def test_the_agent_runs_with_the_agent_extra_alone(agent_venv: Path) -> None:
    proc = _ragwatch(agent_venv, "agent", "--source", "sim", "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('"kind":"gpu"') == 4  # one envelope per simulated host
    assert _ragwatch(agent_venv, "settings").returncode == 0
    # the venv really lacks the stream extra
    python = str(agent_venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import faust"], capture_output=True).returncode == 1
    assert sys.prefix != str(agent_venv)


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("status",), "stream"),
        (("worker",), "stream"),
        (("notify",), "stream"),
        (("serve",), "stream"),
        (("silence", "list"), "stream"),
        (("replay", "x.jsonl"), "stream"),
        (("record", "--out", "x.jsonl"), "stream"),
        (("demo",), "stream"),
        (("dev", "up"), "embedded"),
    ],
)
def test_other_commands_name_their_extra_in_one_line(
    agent_venv: Path, args: tuple[str, ...], extra: str
) -> None:
    proc = _ragwatch(agent_venv, *args)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"ragwatch: error: ragwatch {args[0]} needs the {extra} extra: "
        f"pip install 'ragwatch[{extra}]' (module {_first_missing(extra)} is missing)"
    ]
    assert not proc.stdout


def _first_missing(extra: str) -> str:
    from ragwatch.extras import MODULES

    agent = set(MODULES["agent"])
    return next(m for m in MODULES[extra] if m not in agent).split(".")[0]
