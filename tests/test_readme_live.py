"""The README's live-weights examples run as written (copy-paste runnable on CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of the README section titled ``section``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


@pytest.mark.parametrize("section", ["In a training loop", "For inference engines"])
def test_section_examples_run(tmp_path: Path, section: str) -> None:
    blocks = python_blocks(section)
    assert blocks, f"no python example in {section!r}"
    for i, code in enumerate(blocks):
        (tmp_path / f"ex{i}.py").write_text(code, encoding="utf-8")
        subprocess.run([sys.executable, f"ex{i}.py"], cwd=tmp_path, check=True, timeout=300)
