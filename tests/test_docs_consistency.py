"""The documentation points at files that exist.

The results page embeds committed result files (``--8<-- "path"``, pymdownx.snippets) and the pages
link to each other; a moved or renamed results folder must fail here rather than in a user's browser.
The oracle is the file system: every embedded file, every relative link and every navigation entry
of ``mkdocs.yml`` must name an existing file (and every embedded line range must lie inside it).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
SNIPPET = re.compile(r'^--8<-- "([^"]+)"', re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.DOTALL)


def _prose(page: Path) -> str:
    """The page without its code blocks (code may contain ``](`` that is not a link)."""
    return FENCE.sub("", page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_embedded_result_files_exist(page):
    for ref in SNIPPET.findall(page.read_text()):
        path, _, lines = ref.partition(":")
        target = ROOT / path
        assert target.is_file(), f"{page.relative_to(ROOT)} embeds {path}, which does not exist"
        if lines:
            first, last = (int(n) for n in lines.split(":"))
            n = len(target.read_text().splitlines())
            assert 1 <= first <= last <= n, f"{page.relative_to(ROOT)} embeds lines {lines} of {path} ({n} lines)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (page.parent / path).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_navigation_entries_exist():
    nav = re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert nav, "mkdocs.yml lists no pages"
    missing = [p for p in nav if not (ROOT / "docs" / p).is_file()]
    assert not missing, f"mkdocs.yml lists missing pages: {missing}"
