"""An input that another process shortens while wdelta reads it (issue 12).

Headers are checked against each file's size when it is opened; a file that
shrinks afterwards is caught by the short positioned read.  The error must
name the file (and the tensor or blob) and say what happened, and the output
must not appear.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import wdelta
from kit import leftovers
from wdelta.checkpoint import source
from wdelta.errors import CheckpointInvalidError, TruncatedError
from wdelta.format.container import DeltaFile


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(7)
    words = rng.integers(0, 2**16, 50_000, dtype=np.uint16)
    changed = words.copy()
    # Random new words: a blob of about 1 KB, in the data section (not inline, SPEC §4.12).
    changed[::97] ^= rng.integers(1, 2**16, len(changed[::97]), dtype=np.uint16)
    base, target = {"w": words.view(np.float16)}, {"w": changed.view(np.float16)}
    save_file(base, str(tmp_path / "base.safetensors"))
    save_file(target, str(tmp_path / "target.safetensors"))
    return tmp_path / "base.safetensors", tmp_path / "target.safetensors"


def test_a_checkpoint_shortened_during_diff_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, target = _pair(tmp_path)
    read = source.Tensor.read

    def shorten_then_read(
        self: source.Tensor, start: int, count: int, scratch: source.Scratch | None = None
    ) -> source.Words:
        if self._path == target:
            os.truncate(target, 200)
        return read(self, start, count, scratch)

    monkeypatch.setattr(source.Tensor, "read", shorten_then_read)
    out = tmp_path / "d.wdelta"
    with pytest.raises(CheckpointInvalidError) as info:
        wdelta.diff(base, target, out)
    message = str(info.value)
    assert str(target) in message and "'w'" in message
    assert "changed while it was being read" in message
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_delta_shortened_during_apply_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, target = _pair(tmp_path)
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta)
    read_blob = DeltaFile.read_blob

    def shorten_then_read(self: DeltaFile, chunk: object) -> bytes:
        os.truncate(delta, 100)
        return read_blob(self, chunk)  # type: ignore[arg-type]

    monkeypatch.setattr(DeltaFile, "read_blob", shorten_then_read)
    out = tmp_path / "out.safetensors"
    with pytest.raises(TruncatedError) as info:
        wdelta.apply(base, delta, out)
    assert str(delta) in str(info.value) and "blob at data offset" in str(info.value)
    assert not out.exists() and leftovers(tmp_path) == []
