"""Atomic outputs: a crash part-way through leaves nothing behind.

Failures are injected in-process (the decoder's output sink, the encoder's
chunk coder, the disk writes) after some work has already been written; the
destination must then be absent (or, if it existed, unchanged), no
``.*.wdelta-tmp-*`` file or folder may remain, and the inputs are untouched.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
import wdelta.io.output_file
import wdelta.io.prepend
import wdelta.ops.decoder
import wdelta.policy.chunk
from kit import (
    RawTensor,
    leftovers,
    random_words,
    safetensors_bytes,
    tree_hashes,
    unchanged_inputs,
    write_sharded,
)


class Boom(RuntimeError):
    """The injected failure."""


def _tensors(seed: int) -> dict[str, RawTensor]:
    rng = np.random.default_rng(seed)
    out: dict[str, RawTensor] = {}
    for i in range(6):
        words = random_words(np.random.default_rng(i), 4, 1000)
        if seed:
            # Random new words: each tensor's blob (~300 bytes) is in the data section,
            # beyond the reference's inline blobs of at most 128 bytes (SPEC §4.12).
            changed = rng.choice(1000, 60, replace=False)
            words[changed] ^= rng.integers(1, 1 << 32, size=60, dtype=np.uint32)
        out[f"layer{i}"] = RawTensor("F32", (1000,), words.tobytes())
    return out


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(base file, sharded target folder, delta) in tmp_path/in."""
    folder = tmp_path / "in"
    folder.mkdir()
    base = folder / "base.safetensors"
    base.write_bytes(safetensors_bytes(_tensors(0)))
    t = _tensors(1)
    write_sharded(folder / "target", [{k: t[k] for k in list(t)[i::3]} for i in range(3)])
    single = folder / "target.safetensors"
    single.write_bytes(safetensors_bytes(t))
    return base, folder / "target", folder


def _failing_sink(after: int, error: BaseException) -> Callable[..., Any]:
    """Wrap file_sink so that its sink raises after ``after`` successful writes."""
    real = wdelta.ops.decoder.file_sink
    calls = {"n": 0}

    def factory(*args: Any, **kwargs: Any) -> Callable[..., None]:
        sink = real(*args, **kwargs)

        def write(*a: Any) -> None:
            if calls["n"] >= after:
                raise error
            calls["n"] += 1
            sink(*a)

        return write

    return factory


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "folder"])
@pytest.mark.parametrize("after", [0, 1, 4])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "error", [Boom("disk on fire"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
def test_crash_mid_apply_leaves_nothing(
    pair: tuple[Path, Path, Path], sharded: bool, after: int, threads: int,
    error: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    base, target_folder, folder = pair
    target = target_folder if sharded else folder / "target.safetensors"
    delta = wdelta.diff(base, target, folder / "d.wdelta", chunk_elements=256)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / ("model" if sharded else "model.safetensors")
    monkeypatch.setattr(wdelta.ops.decoder, "file_sink", _failing_sink(after, error))
    with unchanged_inputs(folder), pytest.raises(type(error)):
        wdelta.apply(base, delta, out, threads=threads)
    assert list(out_dir.iterdir()) == []
    monkeypatch.undo()
    wdelta.apply(base, delta, out, threads=threads)  # the same call works without the fault
    assert tree_hashes(out) == tree_hashes(target)
    assert leftovers(out_dir) == []


def test_crash_keeps_existing_destination(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _, folder = pair
    delta = wdelta.diff(base, folder / "target.safetensors", folder / "d.wdelta")
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"previous version")
    monkeypatch.setattr(wdelta.ops.decoder, "file_sink", _failing_sink(2, Boom()))
    with pytest.raises(Boom):
        wdelta.apply(base, delta, out, threads=2, overwrite=True)
    assert out.read_bytes() == b"previous version"
    assert leftovers(tmp_path) == []


def test_wrong_base_discovered_late_leaves_nothing(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The last tensor of the base is corrupt: earlier output has been written."""
    base, target, folder = pair
    delta = wdelta.diff(base, target, folder / "d.wdelta", chunk_elements=100)
    tensors = _tensors(0)
    last = sorted(tensors)[-1]
    data = bytearray(tensors[last].data)
    data[-1] ^= 0x80
    tensors[last] = RawTensor("F32", (1000,), bytes(data))
    wrong = tmp_path / "wrong.safetensors"
    wrong.write_bytes(safetensors_bytes(tensors))
    (tmp_path / "out").mkdir()
    with unchanged_inputs(folder, wrong), pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply(wrong, delta, tmp_path / "out" / "model", threads=2)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("after", [0, 3])
@pytest.mark.parametrize(
    "error", [Boom("encoder bug"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
def test_crash_mid_diff_leaves_nothing(
    pair: tuple[Path, Path, Path], after: int, error: BaseException, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    base, target, folder = pair
    real = wdelta.policy.chunk.encode_modified
    calls = {"n": 0}

    def failing(*args: Any) -> Any:
        if calls["n"] >= after:
            raise error
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(wdelta.policy.chunk, "encode_modified", failing)
    out = tmp_path / "d.wdelta"
    out.write_bytes(b"older delta")
    with unchanged_inputs(folder), pytest.raises(type(error)):
        wdelta.diff(base, target, out, chunk_elements=128, threads=2, overwrite=True)
    assert out.read_bytes() == b"older delta"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.wdelta", "in"]


def _disk_full(monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if calls["n"] >= after:
            raise OSError(errno.ENOSPC, "No space left on device")
        calls["n"] += 1
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_disk_full_is_an_io_error(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _, folder = pair
    delta = wdelta.diff(base, folder / "target.safetensors", folder / "d.wdelta")
    _disk_full(monkeypatch, after=1)
    try:
        with pytest.raises(wdelta.StorageError) as info:
            wdelta.apply(base, delta, tmp_path / "model.safetensors")
        assert info.value.category == "io-error"
    finally:
        monkeypatch.undo()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_disk_full_leaves_nothing(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, target, folder = pair
    delta = wdelta.diff(base, target, folder / "d.wdelta")
    _disk_full(monkeypatch, after=2)
    with pytest.raises(wdelta.StorageError):
        wdelta.apply(base, delta, tmp_path / "model")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_diff_into_missing_folder(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, target, _ = pair
    with pytest.raises(wdelta.StorageError):
        wdelta.diff(base, target, tmp_path / "missing" / "d.wdelta")


def test_apply_into_missing_folder(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, target, folder = pair
    delta = wdelta.diff(base, target, folder / "d.wdelta")
    with pytest.raises(wdelta.StorageError):
        wdelta.apply(base, delta, tmp_path / "missing" / "model")
    assert not (tmp_path / "missing").exists()


def test_diff_error_while_prepending_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error while the header is put in front of the blobs: io-error, no file."""
    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**32, 400_000, dtype=np.uint32)
    base, target = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    base.write_bytes(safetensors_bytes({"w": RawTensor("U32", (400_000,), words.tobytes())}))
    target.write_bytes(safetensors_bytes({"w": RawTensor("U32", (400_000,), (~words).tobytes())}))

    def broken(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wdelta.io.prepend, "insert_front", broken)
    monkeypatch.setattr(wdelta.io.prepend, "shift_forward", broken)
    with pytest.raises(wdelta.StorageError) as info:
        wdelta.diff(base, target, tmp_path / "d.wdelta")
    assert info.value.category == "io-error"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors", "t.safetensors"]


@pytest.mark.parametrize("op", ["diff", "apply-file", "apply-folder"])
def test_failed_background_flush_is_an_io_error(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """A flush that fails in the background thread is not lost: io-error, nothing left."""
    base, target, folder = pair
    single = op == "apply-file"
    delta = wdelta.diff(base, folder / "target.safetensors" if single else target, folder / "d")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(wdelta.io.output_file, "SYNC_BYTES", 1)
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(wdelta.StorageError, match="Input/output error") as info:
        if op == "diff":
            wdelta.diff(base, target, tmp_path / "d.wdelta")
        else:
            wdelta.apply(base, delta, tmp_path / ("model.safetensors" if single else "model"))
    assert info.value.category == "io-error"
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_follow_the_umask(
    pair: tuple[Path, Path, Path], tmp_path: Path, umask: int
) -> None:
    """Outputs get 0o666 / 0o777 less the umask, like any created file (not mkstemp's 0o600)."""
    base, target, folder = pair
    old = os.umask(umask)
    try:
        single = wdelta.diff(base, folder / "target.safetensors", tmp_path / "d1.wdelta")
        sharded = wdelta.diff(base, target, tmp_path / "d2.wdelta")
        wdelta.apply(base, single, tmp_path / "m.safetensors")
        wdelta.apply(base, sharded, tmp_path / "m")
    finally:
        os.umask(old)
    files = [tmp_path / "d1.wdelta", tmp_path / "d2.wdelta", tmp_path / "m.safetensors"]
    files += list((tmp_path / "m").iterdir())
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o666 & ~umask)}
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o777 & ~umask
