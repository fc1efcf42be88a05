"""An exception the CLI did not anticipate still keeps SPEC 12.2's contract.

The fault is injected into a real ``wdelta`` process (a bug cannot be
triggered on purpose otherwise): the command must print exactly one line
``error: internal-error: ...`` (or ``io-error`` for an exhausted memory), exit
1, and show the traceback only when WDELTA_TRACEBACK=1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import wdelta
from test_cli import ENV

# Runs ``wdelta inspect DELTA`` with the summary step replaced by one that raises.
PROGRAM = """
import sys
import wdelta.cli
import wdelta.cli.delta
def broken(*args, **kwargs):
    raise {raise_}
wdelta.cli.delta.summarize = broken
sys.exit(wdelta.cli.run(["inspect", sys.argv[1]]))
"""


def _inspect_with(raise_: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    delta = tmp_path / "d.wdelta"
    base = {"w": np.arange(64, dtype=np.uint16)}
    wdelta.diff(base, {"w": base["w"] ^ 1}, delta)
    code = PROGRAM.format(raise_=raise_)
    return subprocess.run(
        [sys.executable, "-c", code, str(delta)],
        capture_output=True,
        text=True,
        env={**ENV, **env},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("raise_", "category", "words"),
    [
        ("KeyError('chunks')", "internal-error", "unexpected KeyError: 'chunks' (a bug in wdelta"),
        ("ZeroDivisionError('x')", "internal-error", "WDELTA_TRACEBACK=1"),
        ("MemoryError()", "io-error", "out of memory: free memory or run with --threads 1"),
    ],
)
def test_an_unexpected_exception_is_one_line(
    raise_: str, category: str, words: str, tmp_path: Path
) -> None:
    result = _inspect_with(raise_, tmp_path)
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {category}: "), result.stderr
    assert words in lines[0]


def test_the_traceback_is_shown_on_request(tmp_path: Path) -> None:
    result = _inspect_with("KeyError('chunks')", tmp_path, WDELTA_TRACEBACK="1")
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: internal-error: unexpected KeyError")
