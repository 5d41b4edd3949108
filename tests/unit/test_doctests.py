"""Run every docstring example of the ragwatch package, imported under its real name.

pytest's ``--doctest-modules`` would import ``agents/sim.py`` as a top-level ``agents``
package (the folders are mapped to ``ragwatch.*`` only by the installer), so the
examples are collected here instead, by walking the installed package.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

SKIP = {"ragwatch.__main__"}
ROOT = Path(__file__).resolve().parents[2]


def _modules() -> list[str]:
    # The rooms live in other folders, so walk each package's own __path__, recursively:
    # a module moved into a subpackage must stay covered.
    names = set()
    for pkg_name in ("ragwatch", "ragwatch.agents", "ragwatch.streams", "ragwatch.detectors"):
        pkg = importlib.import_module(pkg_name)
        names.add(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, f"{pkg_name}."):
            names.add(info.name)
    return sorted(names - SKIP)


def test_every_subpackage_is_walked() -> None:
    names = _modules()
    for sub in ("agents", "streams", "detectors", "streams.pipelines", "streams.alerting"):
        assert any(n.startswith(f"ragwatch.{sub}.") for n in names), sub
    for sub in ("streams.worker", "streams.notifier", "console", "commands"):
        assert any(n.startswith(f"ragwatch.{sub}.") for n in names), sub
    for path in (ROOT / "streams").rglob("*.py"):  # every module file is collected
        rel = path.relative_to(ROOT / "streams").with_suffix("")
        name = ".".join(("ragwatch", "streams", *rel.parts)).removesuffix(".__init__")
        assert name in names, name


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
