"""The documentation holds together: a short README, links that resolve, no page left unlinked.

Every Markdown file at the root, in docs/ and bench/README.md is checked; no sandbox is needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
INDEX = DOCS / "index.md"
CHECKED = [*sorted(ROOT.glob("*.md")), *PAGES, ROOT / "bench" / "README.md"]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(_INLINE_CODE.sub("", line))
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            slug = _slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The relative link targets of a Markdown file (no URLs with a scheme, no mail)."""
    found = [target for line in _prose(path) for target in _LINK.findall(line)]
    return [target for target in found if not _SCHEME.match(target)]


def test_the_readme_fits_on_a_screen_or_three() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move the detail to a page in docs/"


@pytest.mark.parametrize("page", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_its_anchor(page: Path) -> None:
    broken = []
    for target in links(page):
        name, _, anchor = target.partition("#")
        file = (page.parent / name).resolve() if name else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_every_page_in_docs_is_linked_from_the_readme_or_the_index() -> None:
    linked = set()
    for source in (ROOT / "README.md", INDEX):
        for target in links(source):
            name = target.partition("#")[0]
            if name:
                linked.add((source.parent / name).resolve())
    orphans = [page.name for page in PAGES if page != INDEX and page.resolve() not in linked]
    assert not orphans, f"pages linked from neither README.md nor docs/index.md: {orphans}"
    assert INDEX.resolve() in linked, "README.md must link docs/index.md"


def test_the_index_lists_each_page_once() -> None:
    listed = [target for target in links(INDEX) if "#" not in target]
    twice = sorted({target for target in listed if listed.count(target) > 1})
    assert not twice, f"docs/index.md lists these pages more than once: {twice}"


def test_the_settings_table_sits_between_its_markers() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    start, end = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
    assert text.count(start) == 1 and text.count(end) == 1
    table = text.split(start)[1].split(end)[0].strip().splitlines()
    assert table[0].startswith("| Setting |") and all(row.startswith("|") for row in table)


def test_the_link_checker_sees_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A `title`, here\n\n[ok](#a-title-here) [gone](missing.md) [bad](#nope)\n`[code](x.md)`\n")
    assert anchors(page) == {"a-title-here"}
    assert links(page) == ["#a-title-here", "missing.md", "#nope"]
