"""A full disk or a file-size limit: one clear ``io-error`` line naming the output,
nothing half-written, no temporary left, inputs untouched (real CLI processes).

The file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so that the write
fails with EFBIG) works anywhere; the full file system is a small tmpfs,
mounted only where the tests run as root and may mount (skipped otherwise).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import wdelta
from kit import RawTensor, random_words, safetensors_bytes, tree_hashes
from test_cli import ENV, WDELTA, assert_error


def _tensors(seed: int) -> dict[str, RawTensor]:
    out = {}
    for i in range(4):
        words = random_words(np.random.default_rng(i), 2, 1 << 18)
        if seed:  # a random 30% of the elements change, to random values
            change = np.random.default_rng(seed + i).random(1 << 18) < 0.3
            words[change] = random_words(np.random.default_rng(9), 2, int(change.sum()))
        out[f"w{i}"] = RawTensor("BF16", (1 << 18,), words.tobytes())
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """b.safetensors, t.safetensors (2 MiB each) and d.wdelta (> 256 KiB)."""
    root = tmp_path_factory.mktemp("disk-full")
    (root / "b.safetensors").write_bytes(safetensors_bytes(_tensors(0)))
    (root / "t.safetensors").write_bytes(safetensors_bytes(_tensors(1)))
    wdelta.diff(root / "b.safetensors", root / "t.safetensors", root / "d.wdelta")
    assert (root / "d.wdelta").stat().st_size > 256 << 10
    return root


def _commands(root: Path, out: Path) -> dict[str, list[str]]:
    b, t, d = (str(root / n) for n in ("b.safetensors", "t.safetensors", "d.wdelta"))
    return {
        "diff": [str(WDELTA), "diff", b, t, "-o", str(out / "new.wdelta"), "-q"],
        "apply": [str(WDELTA), "apply", b, d, "-o", str(out / "new.safetensors"), "-q"],
    }


def _expect_clean_failure(
    result: subprocess.CompletedProcess[str], inputs: Path, before: dict[str, str], out: Path
) -> None:
    assert_error(result, "io-error")
    assert str(out / "new.") in result.stderr and "free some space" in result.stderr
    assert os.listdir(out) == []
    assert tree_hashes(inputs) == before


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.parametrize("command", ["diff", "apply"])
def test_file_size_limit(inputs: Path, tmp_path: Path, command: str) -> None:
    before = tree_hashes(inputs)
    argv = _commands(inputs, tmp_path)[command]
    result = subprocess.run(
        argv, capture_output=True, text=True, env=ENV, timeout=120, preexec_fn=_limit_file_size
    )
    _expect_clean_failure(result, inputs, before, tmp_path)
    assert "File too large" in result.stderr


@contextlib.contextmanager
def _small_tmpfs(size: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="wdelta-tmpfs-"))
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
        )
    except OSError:
        mounted = None
    if mounted is None or mounted.returncode != 0:
        folder.rmdir()
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
        folder.rmdir()


@pytest.mark.parametrize("command", ["diff", "apply"])
def test_full_file_system(inputs: Path, command: str) -> None:
    before = tree_hashes(inputs)
    with _small_tmpfs("128k") as out:
        result = subprocess.run(
            _commands(inputs, out)[command], capture_output=True, text=True, env=ENV, timeout=120
        )
        _expect_clean_failure(result, inputs, before, out)
        assert "No space left on device" in result.stderr
