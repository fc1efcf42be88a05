"""Prefix and header put in front of already written blobs (wdelta.io.prepend, SPEC §4.1).

``diff`` writes the data section first.  Where fallocate can insert a range,
the header is padded so that the data starts on a 4096-byte boundary and
nothing is moved; elsewhere the data is shifted and the padding is 0-7 bytes.
Both paths must give the same data section and the same rebuilt target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
import wdelta.io.prepend as prepend
import wdelta.ops.encoder
from kit import RawTensor, safetensors_bytes


def _failing(code: int) -> Callable[[int, int, int, int], int]:
    def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(code)
        return -1

    return fallocate


@contextlib.contextmanager
def _opened(path: Path, data: bytes) -> Iterator[int]:
    """A read-write descriptor on ``path``, which is created holding ``data``."""
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)


def _insert_works(folder: Path) -> bool:
    with _opened(folder / "probe", b"x" * 10) as fd:
        works = prepend.insert_front(fd, prepend.BLOCK)
    (folder / "probe").unlink()
    return works


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=5000), by=st.integers(1, 3000),
       block=st.integers(1, 700))  # fmt: skip
def test_shift_forward_moves_every_byte(
    data: bytes, by: int, block: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("shift") / "f"
    with _opened(path, data) as fd, pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepend, "_SHIFT_BYTES", block)
        prepend.shift_forward(fd, len(data), by)
    moved = path.read_bytes()
    assert len(moved) == len(data) + by if data else len(moved) == 0
    assert moved[by:] == data


def test_insert_front_keeps_the_data(tmp_path: Path) -> None:
    if not _insert_works(tmp_path):
        pytest.skip("this file system cannot insert ranges")
    data = os.urandom(3 * prepend.BLOCK + 123)
    with _opened(tmp_path / "f", data) as fd:
        assert prepend.insert_front(fd, 2 * prepend.BLOCK)
    grown = (tmp_path / "f").read_bytes()
    assert len(grown) == len(data) + 2 * prepend.BLOCK
    assert grown[2 * prepend.BLOCK :] == data


@pytest.mark.parametrize(
    "code", [None, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.ENODEV],
    ids=["no-fallocate", "EOPNOTSUPP", "EINVAL", "ENOSYS", "ENODEV"],
)  # fmt: skip
def test_insert_front_unsupported_leaves_the_file(
    code: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepend, "_fallocate", lambda: None if code is None else _failing(code))
    with _opened(tmp_path / "f", b"abc") as fd:
        assert not prepend.insert_front(fd, prepend.BLOCK)
    assert (tmp_path / "f").read_bytes() == b"abc"


def test_insert_front_retries_after_a_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
        calls.append((fd, mode, offset, length))
        if len(calls) < 3:
            ctypes.set_errno(errno.EINTR)
            return -1
        return 0

    monkeypatch.setattr(prepend, "_fallocate", lambda: fallocate)
    assert prepend.insert_front(5, prepend.BLOCK)
    assert calls == [(5, 0x20, 0, prepend.BLOCK)] * 3


def test_insert_front_other_errors_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepend, "_fallocate", lambda: _failing(errno.ENOSPC))
    with _opened(tmp_path / "f", b"abc") as fd, pytest.raises(OSError) as info:
        prepend.insert_front(fd, prepend.BLOCK)
    assert info.value.errno == errno.ENOSPC


def _pair(folder: Path, elements: int) -> tuple[Path, Path]:
    """Base and target whose delta is about 4 bytes per element (random changes)."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 2**32, elements, dtype=np.uint32)
    target = base ^ rng.integers(1, 2**32, elements, dtype=np.uint32)
    paths = []
    for name, words in (("base", base), ("target", target)):
        path = folder / f"{name}.safetensors"
        path.write_bytes(safetensors_bytes({"w": RawTensor("U32", (elements,), words.tobytes())}))
        paths.append(path)
    return paths[0], paths[1]


def _layout(delta: Path) -> tuple[int, int, bytes]:
    """(N, D, data section) of a delta file."""
    raw = delta.read_bytes()
    n, d = struct.unpack_from("<Q", raw, 16)[0], struct.unpack_from("<Q", raw, 56)[0]
    assert len(raw) == 64 + n + d
    return n, d, raw[64 + n :]


@pytest.mark.parametrize("insert", [True, False], ids=["insert", "shift"])
def test_large_delta_either_path(
    insert: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data section of >= 4 MiB: 4096-aligned data when inserting, 0-7 spaces when shifting."""
    if insert and not _insert_works(tmp_path):
        pytest.skip("this file system cannot insert ranges")
    base, target = _pair(tmp_path, 1_100_000)
    reference = wdelta.diff(base, target, tmp_path / "ref.wdelta", chunk_elements=65536)
    if not insert:
        monkeypatch.setattr(prepend, "_fallocate", lambda: _failing(errno.EOPNOTSUPP))
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=65536)
    n, d, data = _layout(delta)
    assert d >= wdelta.ops.encoder.INSERT_MIN_DATA_BYTES == 1 << 22
    header = delta.read_bytes()[64 : 64 + n]
    padding = len(header) - len(header.rstrip(b" "))
    if insert:
        assert (64 + n) % prepend.BLOCK == 0 and padding < prepend.BLOCK
    else:
        assert padding < 8 and n % 8 == 0
    assert data == _layout(reference)[2]
    rebuilt = wdelta.apply(base, delta, tmp_path / "rebuilt.safetensors")
    assert rebuilt.read_bytes() == target.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "base.safetensors", "d.wdelta", "rebuilt.safetensors", "ref.wdelta", "target.safetensors",
    ]  # fmt: skip


@pytest.mark.parametrize("elements", [1000, 500_000])
def test_small_delta_keeps_short_padding(elements: int, tmp_path: Path) -> None:
    """Below 4 MiB of data, 4 KiB of alignment would cost more than moving the data.

    2 MB: 4 KiB of spaces would be 0.2% of the file, 2-4% of the header
    allowance of issue 15 for a 75-tensor model.
    """
    base, target = _pair(tmp_path, elements)
    n, d, _ = _layout(wdelta.diff(base, target, tmp_path / "d.wdelta"))
    assert 0 < d < 1 << 22
    header = (tmp_path / "d.wdelta").read_bytes()[64 : 64 + n]
    assert len(header) - len(header.rstrip(b" ")) < 8


def test_header_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder never writes a file whose header a reader must refuse."""
    base, target = _pair(tmp_path, 1000)
    monkeypatch.setattr(wdelta.ops.encoder, "MAX_HEADER_BYTES", 500)
    with pytest.raises(wdelta.LimitExceededError) as info:
        wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=16)
    assert info.value.category == "limit-exceeded"
    assert "larger chunks" in str(info.value) and "compact header form" not in str(info.value)
    assert not (tmp_path / "d.wdelta").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.safetensors", "target.safetensors"]


@pytest.mark.parametrize("compact", [True, False])
def test_header_over_the_limit_names_the_remedy_that_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compact: bool
) -> None:
    """Tensors of one chunk each: larger chunks would not help; the compact form would,
    when it was not asked for."""
    base, target = _pair(tmp_path, 1000)
    monkeypatch.setattr(wdelta.ops.encoder, "MAX_HEADER_BYTES", 300)
    with pytest.raises(wdelta.LimitExceededError, match="over the format's limit") as info:
        wdelta.diff(base, target, tmp_path / "d.wdelta", compact=compact)
    message = str(info.value)
    assert "larger chunks" not in message and "split the checkpoint" in message
    assert ("compact header form" in message) is not compact
    assert not (tmp_path / "d.wdelta").exists()
