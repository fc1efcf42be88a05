"""Every relative link in the user documentation points to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "CHANGELOG.md"]
DOCUMENTS = sorted([*TOP_LEVEL, *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(document: Path) -> set[str]:
    """GitHub's anchors for the headings of ``document``."""
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    slugs = set()
    for title in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def links(document: Path) -> list[str]:
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(ROOT)) for d in DOCUMENTS])
def test_relative_links_resolve(document: Path) -> None:
    broken = []
    for target in links(document):
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        missing = not file.exists()
        if missing or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert broken == [], f"{document.name}: broken links {broken}"


def test_the_checks_catch_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n[x](missing.md) [y](#title) [z](#nope) [w](https://e.org/x)\n")
    assert links(doc) == ["missing.md", "#title", "#nope"]
    assert anchors(doc) == {"title"}


def test_architecture_names_only_files_that_exist() -> None:
    """ARCHITECTURE.md names modules (`ops/api.py`, `blob.py`) and folders (`codec/`): each
    must exist, in the package or the repository, so that the map does not go stale."""
    package = ROOT / "reference" / "wdelta"
    names = set(re.findall(r"`([\w./-]+(?:\.py|/))`", (ROOT / "ARCHITECTURE.md").read_text()))
    assert "trusted_set.py" in names and "codec/" in names
    found = [*package.rglob("*"), *ROOT.glob("*/*")]
    files = {p.name for p in found if p.suffix == ".py"}
    files |= {f"{p.name}/" for p in found if p.is_dir()}
    missing = [
        n for n in sorted(names)
        if not any((where / n).exists() for where in (package, ROOT, ROOT / "reference"))
        and n not in files
    ]  # fmt: skip
    assert not missing, missing
