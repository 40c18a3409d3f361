"""The manual holds together: docs/index.md lists every page of docs/, the README stays a front
page, and every relative link of the README, docs/ and the benchmark history reaches a file
that exists and, where it names one, a heading of that file (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [
    ROOT / "README.md",
    *sorted(DOCS.glob("*.md")),
    ROOT / "benchmarks" / "published" / "HISTORY.md",
]
#: ``[text](target)`` and ``![alt](target)``; a target has no spaces.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> list[str]:
    """The lines of a Markdown page outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _outside_code(page.read_text()):
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [m for line in _outside_code(page.read_text()) for m in LINK.findall(line)]


def test_the_slug_follows_github() -> None:
    assert slug("Time budgets: what `--max-time` bounds") == "time-budgets-what---max-time-bounds"
    assert slug("5. Workers join and leave") == "5-workers-join-and-leave"
    assert slug("Fleet at scale (simulated)") == "fleet-at-scale-simulated"


def test_the_index_lists_every_page() -> None:
    listed = {Path(target.partition("#")[0]).name for target in links(DOCS / "index.md")}
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    assert pages - listed == set(), "docs/index.md must link every page of docs/"


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "](docs/index.md)" in readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links {broken}"
