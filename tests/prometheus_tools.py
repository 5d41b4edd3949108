"""Where Prometheus' ``promtool`` and ``prometheus`` are: on PATH or beside the venv's python
(``make prometheus`` puts Debian's there)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def prometheus_binary(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``; fails the test, naming the make target."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed (make prometheus)"
    return found


def promtool() -> str:
    return prometheus_binary("promtool")
