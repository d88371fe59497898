"""The docs: every relative markdown link from README.md, docs/ (docs/lab/ included) and bench/README.md points at a
file that exists, and every `#anchor` at a heading of its target (GitHub's slugs); the README stays the front door."""

import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks (a heading or link inside one is code)."""
    lines, code = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            code = not code
        elif not code:
            lines.append((i, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens, one each (so ` + ` leaves two)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a page; a repeated heading's later ones get GitHub's -1, -2 ... suffixes."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose(page.read_text()):
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = counts[base] = counts.get(base, -1) + 1
            found.add(f"{base}-{n}" if n else base)
    return found


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    """`page:line: target (why)` for each relative link that points at nothing."""
    bad = []
    for page in pages:
        for i, line in prose(page.read_text()):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    bad.append(f"{page.relative_to(root)}:{i}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    bad.append(f"{page.relative_to(root)}:{i}: {target} (no such heading in {dest.name})")
    return bad


def test_every_relative_link_and_anchor_in_the_docs_points_at_something():
    assert len(PAGES) > 10
    assert broken_links(PAGES) == []


def test_the_readme_is_the_front_door_not_the_archive():
    """Under 15k characters, and its Timings one row per command it gives (lab notes go to docs/lab/)."""
    text = (ROOT / "README.md").read_text()
    assert len(text) < 15_000
    commands = text.partition("## Two commands")[2].partition("\n## ")[0].count("```bash")
    timings = text.partition("### Timings")[2].partition("\n#")[0]
    rows = [line for line in timings.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    assert commands == len(rows) == 2


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    # The anchors GitHub gives these headings (the README links the first two so).
    assert slug("3. Maj@K and Pass@K from round 0 to the last round (GRPO + PRM)") == \
        "3-majk-and-passk-from-round-0-to-the-last-round-grpo--prm"
    assert slug("Shard schema (`samples.parquet`)") == "shard-schema-samplesparquet"
    assert slug("Progress credit and the implicit PRM (issue 39)") == "progress-credit-and-the-implicit-prm-issue-39"
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## 1. Step one (`x.py`)\n\n## Again\n\n## Again\n")
    page.write_text("[ok](b.md#1-step-one-xpy) [dup](b.md#again-1) [self](#top) [web](https://x.org/#y)\n\n"
                    "```\n[in code](nowhere.md)\n# Not a heading\n```\n\n"
                    "# Top\n[gone](c.md) [bad](b.md#step-two) ![img](b.png)\n")
    assert broken_links([page], tmp_path) == ["a.md:9: c.md (no such file)",
                                              "a.md:9: b.md#step-two (no such heading in b.md)",
                                              "a.md:9: b.png (no such file)"]
