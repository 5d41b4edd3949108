"""Run every docstring example of the ragwatch package, imported under its real name.

pytest's ``--doctest-modules`` would import ``agents/sim.py`` as a top-level ``agents``
package (the folders are mapped to ``ragwatch.*`` only by the installer), so the
examples are collected here instead, by walking the installed package.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

SKIP = {"ragwatch.__main__"}


def _modules() -> list[str]:
    # The subpackages live in other folders, so walk each package's own __path__.
    names = set()
    for pkg_name in ("ragwatch", "ragwatch.agents", "ragwatch.streams", "ragwatch.detectors"):
        pkg = importlib.import_module(pkg_name)
        names.add(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__, f"{pkg_name}."):
            if not info.ispkg:
                names.add(info.name)
    return sorted(names - SKIP)


def test_every_subpackage_is_walked() -> None:
    names = _modules()
    for sub in ("agents", "streams", "detectors"):
        assert any(n.startswith(f"ragwatch.{sub}.") for n in names), sub


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
