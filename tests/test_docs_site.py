"""The documentation site's nav (mkdocs.yml) against the pages there are: every docs/*.md and
every README that docs/hooks.py brings in is in the nav, so a new page cannot be left out of the
site, and every nav entry is a page, so a renamed or removed one cannot leave a dead entry.
`make test` also builds the site with `mkdocs build --strict` (broken links and anchors).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml
from conftest import ROOT

DOCS = ROOT / "docs"


def nav_pages(nav: list) -> list[str]:
    """Every page a nav names, depth first, in order (entries are `title: page`, `title: [...]`
    or a bare `page`)."""
    pages: list[str] = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            if isinstance(value, list):
                pages += nav_pages(value)
            else:
                pages.append(value)
    return pages


def outside_pages() -> dict[str, Path]:
    """The pages docs/hooks.py builds from Markdown outside docs/, whose source exists."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return {
        page: ROOT / source for page, source in hooks.OUTSIDE.items() if (ROOT / source).is_file()
    }


def site_pages() -> set[str]:
    return {p.name for p in DOCS.glob("*.md")} | set(outside_pages())


def config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_every_page_is_in_the_nav():
    missing = site_pages() - set(nav_pages(config()["nav"]))
    assert not missing, f"pages missing from mkdocs.yml's nav: {sorted(missing)}"


def test_every_nav_entry_is_a_page_once():
    pages = nav_pages(config()["nav"])
    assert pages, "mkdocs.yml has no nav"
    dead = [p for p in pages if p not in site_pages()]
    assert not dead, f"nav entries with no page behind them: {dead}"
    twice = sorted({p for p in pages if pages.count(p) > 1})
    assert not twice, f"nav entries listed twice: {twice}"


def test_the_site_reads_docs_and_the_hook():
    cfg = config()
    assert cfg["docs_dir"] == "docs"
    assert cfg["theme"]["name"] == "material"
    assert "docs/hooks.py" in cfg["hooks"]
    assert "tests.md" in outside_pages(), (
        "tests/README.md is no longer where docs/hooks.py reads it"
    )
