"""``engines.changed_names`` on the chains a ``DistributedPublisher`` writes (multi-part
links), over several links and backwards; and the docs' imports import."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_chain_follow_weights import publisher
from test_chain_parts import published
from wdelta import chain
from wdelta.ops import engines

DOCS = Path(__file__).resolve().parent.parent / "docs"


def changed(a: dict, b: dict) -> list[str]:  # type: ignore[type-arg]
    return sorted(n for n in b if n not in a or a[n].tobytes() != b[n].tobytes())


def test_changed_names_of_multi_part_links(tmp_path: Path) -> None:
    """Every part's header is read (cached or by ranges): no AssertionError."""
    _, history = published(tmp_path, 2)
    node = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "node-cache")
    m = node.head()
    assert engines.changed_names(node, m, 0, 1) == changed(history[0], history[1])
    assert "d.norm" not in engines.changed_names(node, m, 1, 2)  # type: ignore[operator]
    chain.prefetch(node, at=1, to=2)  # now from the cached parts
    assert engines.changed_names(node, m, 1, 2) == changed(history[1], history[2])
    assert engines.changed_names(node, m, 2, 0) == changed(history[2], history[0])


def test_changed_names_over_several_links(tmp_path: Path) -> None:
    _, history = publisher(tmp_path, 3)
    node = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "node-cache")
    names = engines.changed_names(node, node.head(), 0, 3)
    assert names is not None and set(names) >= set(changed(history[0], history[3]))
    assert engines.changed_names(node, node.head(), 2, 2) == []


@pytest.mark.parametrize("guide", sorted(p.name for p in DOCS.glob("*.md")))
def test_the_docs_imports_import(guide: str) -> None:
    """Every ``import``/``from wdelta`` line of a guide's Python blocks runs."""
    text = (DOCS / guide).read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if re.match(r"(from wdelta\S* import |import wdelta)", line):
                exec(line, {})
