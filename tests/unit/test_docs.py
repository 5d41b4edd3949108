"""The documentation stays true to the code: every setting documented, every link lands,
the README fits on a few screens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragwatch.config import env_names

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_setting_is_documented_in_the_configuration_page() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`(RAGWATCH_[A-Z0-9_]+)`", page))
    assert set(env_names()) - documented == set()
    assert documented - set(env_names()) == set()  # and nothing that is not a setting


def test_the_readme_is_short_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 300
    linked = {m for m in LINK.findall(readme) if m.startswith("docs/")}
    assert {f"docs/{p.name}" for p in DOCS} <= linked


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_relative_links_land_on_files(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        assert (page.parent / target).exists(), f"{page.name} links to {target}"
