"""The README is a short guide and docs/ holds the reference: every setting, event field and
topic the code defines is documented there, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.events import SCHEMAS
from app.runtime.settings import ENV_DOCS, PROJECT_ROOT
from app.topics import TOPICS

README_PATH = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
README = README_PATH.read_text()
#: the packages whose environment variables must be in docs/configuration.md
SOURCE_PACKAGES = ("app", "agents", "jobs", "ingest", "dashboard")
ENV_LITERAL = re.compile(r"""["']((?:APP|KAFKA)_[A-Z0-9_]+)["']""")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file's headings define, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose file or anchor does not exist."""
    broken = []
    for line in prose_lines(path.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.name}: {target}: no such heading")
    return broken


def markdown_files() -> list[Path]:
    return [README_PATH, *sorted(DOCS.glob("*.md"))]


def test_readme_starts_with_the_two_commands() -> None:
    head = README.split("## ", 1)[0]
    assert "make run" in head and "make test" in head


def test_readme_is_a_guide_of_at_most_400_lines() -> None:
    assert len(README.splitlines()) <= 400


def test_readme_has_a_table_of_contents_of_its_sections() -> None:
    toc = README.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = {target.lstrip("#") for target in LINK.findall(toc)}
    headings = [line[3:] for line in prose_lines(README) if line.startswith("## ")]
    sections = [slug(h) for h in headings if h != "Contents"]
    assert sections
    assert [s for s in sections if s not in listed] == []


def test_the_readme_links_to_every_doc() -> None:
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(README)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name not in linked]
    assert missing == []


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.name)
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading: here\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n[ok](other.md#a-code-heading-here) [self](#doc) [gone](missing.md) "
        "[no anchor](other.md#nowhere)\n\n```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(doc) == [
        "doc.md: missing.md: no such file",
        "doc.md: other.md#nowhere: no such heading",
    ]


def test_every_environment_variable_is_documented() -> None:
    configuration = (DOCS / "configuration.md").read_text()
    read = set(ENV_DOCS)
    for package in SOURCE_PACKAGES:
        for source in (PROJECT_ROOT / package).rglob("*.py"):
            read |= set(ENV_LITERAL.findall(source.read_text()))
    missing = sorted(name for name in read if f"| `{name}` |" not in configuration)
    assert missing == []


def test_every_event_field_and_topic_is_documented() -> None:
    events = (DOCS / "events.md").read_text()
    missing = [f"{s.source}.{f}" for s in SCHEMAS.values() for f in s.fields if f"`{f}`" not in events]
    missing += [t.name for t in TOPICS if f"`{t.name}`" not in events]
    assert missing == []
