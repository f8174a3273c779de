"""Every relative link in README.md and docs/ resolves: the file (or directory) exists in the
repository, and an anchor names a heading of its page by GitHub's slug rules. The README is a front
door that ends by linking every docs page.

The checker is tried on pages written for the test too, so that a broken link is seen to fail it.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target): the target up to a space (a title may follow) or the bracket.
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
# [label]: target, a reference definition on a line of its own.
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str, *, code_spans: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked out unless kept
    (a heading's anchor is made from its code spans' text too)."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            found.append((number, line if code_spans else CODE_SPAN.sub(" ", line)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lowercased, every character that is
    not a letter, digit, space, hyphen or underscore dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a Markdown page: its headings' slugs (a repeated one numbered -1, -2, ... as
    GitHub numbers them) and explicit <a name=...> / id=... anchors."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page.read_text(), code_spans=True):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on a page, outside code."""
    found = []
    for number, line in prose_lines(page.read_text()):
        found += [(number, target) for target in INLINE_LINK.findall(line)]
        reference = REFERENCE.match(line)
        if reference:
            found.append((number, reference.group(1)))
    return found


def broken_links(pages: list[Path], root: Path) -> list[str]:
    """One message per relative link that does not resolve: 'page:line: target: why'."""
    broken = []
    for page in pages:
        for number, target in links(page):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue  # an absolute URL (http:, mailto:) is no relative link
            path_part, _, anchor = target.partition("#")
            where = f"{page.relative_to(root)}:{number}: {target}"
            resolved = (page.parent / path_part).resolve() if path_part else page
            if root.resolve() not in (resolved, *resolved.parents):
                broken.append(f"{where}: points outside the repository")
            elif not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: no heading with the anchor #{anchor} in {resolved.name}")
    return broken


def documentation() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_in_readme_and_docs_resolves():
    assert broken_links(documentation(), ROOT) == []


def test_the_readme_ends_with_a_list_linking_every_docs_page():
    readme = ROOT / "README.md"
    headings = [HEADING.match(line) for _, line in prose_lines(readme.read_text())]
    last = [m.group(2) for m in headings if m and len(m.group(1)) == 2][-1]
    assert last == "Where to go next"
    start = readme.read_text().index("## Where to go next")
    linked = {
        (readme.parent / target.partition("#")[0]).resolve()
        for number, target in links(readme)
        if number > readme.read_text()[:start].count("\n")
    }
    unlinked = [
        str(page.relative_to(ROOT))
        for page in sorted((ROOT / "docs").rglob("*.md"))
        if page.resolve() not in linked
    ]
    assert unlinked == [], "add each page to the README's 'Where to go next'"


def test_the_readme_stays_a_front_door():
    """About 300 lines (issue 31): reference text goes to a page of docs/."""
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 360, f"README.md has {lines} lines: move reference text to docs/"


# -- the checker itself, on pages written here --------------------------------------------------


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "seeds").mkdir(parents=True)
    (tmp_path / "docs" / "plans.md").write_text(
        "# Plans\n\n## Presets: `[preset.seed]`, `--preset`\n\n## Notes\n\n## Notes\n\n"
        "```toml\n# not a heading\n```\n\n### Storage on NFS (seed 003)\n\n## 実機 Table 1\n"
    )
    (tmp_path / "docs" / "seeds" / "000.md").write_text("# Seed 000\n")
    return tmp_path


def write(site: Path, text: str) -> list[str]:
    (site / "README.md").write_text(text)
    return broken_links([site / "README.md", *sorted((site / "docs").rglob("*.md"))], site)


def test_slugs_follow_github():
    assert slug("Presets: `[preset.seed]`, `[preset.small]`, `--preset`") == (
        "presets-presetseed-presetsmall---preset"
    )
    assert slug('fio job files: `kind = "fio_job"`') == "fio-job-files-kind--fio_job"
    assert slug("Web scale-out (seed 001): N environments") == "web-scale-out-seed-001-n-environments"
    assert slug("The consolidation study (seed 001's vServCon tiles)") == (
        "the-consolidation-study-seed-001s-vservcon-tiles"
    )
    assert slug("実機 Table 1") == "実機-table-1"
    assert slug("See [the plans](docs/plans.md)") == "see-the-plans"


def test_good_links_pass(site: Path):
    text = (
        "# virtlab\n\n## Start\n\n"
        "[plans](docs/plans.md), [presets](docs/plans.md#presets-presetseed---preset), "
        "[the second Notes](docs/plans.md#notes-1), [NFS](docs/plans.md#storage-on-nfs-seed-003), "
        "[a table](docs/plans.md#実機-table-1), [seeds](docs/seeds/), [up](#start), "
        "[web](https://example.org/x#y), [mail](mailto:a@b), ![a picture](docs/seeds/000.md)\n\n"
        "[ref]: docs/seeds/000.md\n"
    )
    assert write(site, text) == []


@pytest.mark.parametrize(
    ("link", "why"),
    [
        ("[gone](docs/gone.md)", "no such file"),
        ("[typo](docs/plan.md#presets)", "no such file"),
        ("[anchor](docs/plans.md#presets)", "no heading with the anchor #presets in plans.md"),
        ("[third Notes](docs/plans.md#notes-2)", "no heading with the anchor #notes-2"),
        ("[in code](docs/plans.md#not-a-heading)", "no heading with the anchor #not-a-heading"),
        ("[here](#nowhere)", "no heading with the anchor #nowhere in README.md"),
        ("[out](../../etc/passwd)", "points outside the repository"),
        ('[titled](docs/none.md "a title")', "no such file"),
        ("![picture](docs/missing.png)", "no such file"),
    ],
)
def test_a_broken_link_is_named_with_its_page_line_and_cause(site: Path, link: str, why: str):
    found = write(site, f"# virtlab\n\ntext\n{link}\n")
    assert len(found) == 1
    assert found[0].startswith("README.md:4: ")
    assert why in found[0]


def test_a_broken_reference_definition_and_a_broken_link_in_docs_fail(site: Path):
    (site / "docs" / "seeds" / "000.md").write_text("# Seed 000\n\n[back](../plan.md)\n")
    found = write(site, "# virtlab\n\n[ref]: docs/seeds/001.md\n")
    assert found == [
        "README.md:3: docs/seeds/001.md: no such file",
        "docs/seeds/000.md:3: ../plan.md: no such file",
    ]


def test_links_inside_code_are_not_links(site: Path):
    text = "# virtlab\n\n`[x](docs/gone.md)`\n\n```md\n[y](docs/gone.md)\n```\n"
    assert write(site, text) == []
