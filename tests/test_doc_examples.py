"""The live-weights guides' examples run as written (copy-paste runnable on CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(guide: str) -> list[str]:
    """The ```python blocks of ``docs/<guide>``, in order."""
    return re.findall(r"```python\n(.*?)```", (DOCS / guide).read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize(("guide", "count"), [("training.md", 2), ("live-weights.md", 1)])
def test_guide_examples_run(tmp_path: Path, guide: str, count: int) -> None:
    """Every example of the guide, in one folder and in order (a node follows the chain
    the trainer's example published)."""
    blocks = python_blocks(guide)
    assert len(blocks) == count, f"{guide}: {len(blocks)} python examples"
    for i, code in enumerate(blocks):
        (tmp_path / f"ex{i}.py").write_text(code, encoding="utf-8")
        subprocess.run([sys.executable, f"ex{i}.py"], cwd=tmp_path, check=True, timeout=300)
