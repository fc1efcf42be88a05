"""OutputFile: split direct/buffered writes land every byte where it belongs."""

from __future__ import annotations

import errno
import itertools
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit import record_staged
from wdelta.errors import StorageError
from wdelta.io import output_file
from wdelta.io.output_file import ALIGN, OutputFile

SIZE = 6 * ALIGN + 3 * output_file.DIRECT_MIN_BYTES + 123


def _write_all(path: Path, pieces: list[tuple[int, int]], direct: bool) -> tuple[bytes, bool]:
    """Write random bytes at (offset, length) pieces; returns (expected file, direct used)."""
    rng = np.random.default_rng(len(pieces))
    expected = bytearray(SIZE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, SIZE)
        out = OutputFile(fd, direct=direct)
        used = out.direct
        for offset, length in pieces:
            data = rng.integers(0, 256, length, dtype=np.uint8)
            out.write(memoryview(data), offset)
            expected[offset : offset + length] = data.tobytes()
        out.close()
        os.fsync(fd)
    finally:
        os.close(fd)
    return bytes(expected), used


@st.composite
def _pieces(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Disjoint ranges in a random order, sizes from 1 byte to several aligned blocks."""
    cuts = sorted(draw(st.sets(st.integers(1, SIZE - 1), max_size=12)))
    bounds = [0, *cuts, SIZE]
    ranges = [(a, b - a) for a, b in itertools.pairwise(bounds)]
    return draw(st.permutations(ranges))


@settings(max_examples=40, deadline=None)
@given(pieces=_pieces(), direct=st.booleans())
def test_every_byte_lands(
    tmp_path_factory: Any, pieces: list[tuple[int, int]], direct: bool
) -> None:
    path = tmp_path_factory.mktemp("out") / "f.bin"
    expected, _ = _write_all(path, pieces, direct)
    assert path.read_bytes() == expected


def test_direct_is_used_where_supported(tmp_path: Path) -> None:
    probe = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT, 0o644)
    supported = output_file._open_direct(probe)
    os.close(probe)
    if supported is None:
        pytest.skip("no O_DIRECT on this file system")
    os.close(supported)
    expected, used = _write_all(tmp_path / "f.bin", [(100, SIZE - 200)], True)
    assert used
    assert (tmp_path / "f.bin").read_bytes() == expected


def test_refused_direct_writes_fall_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that opens O_DIRECT but refuses the writes (EINVAL)."""
    real = output_file.pwrite_all
    direct_fds: list[int] = []

    def pwrite_all(fd: int, data: Any, offset: int) -> None:
        if direct_fds and fd == direct_fds[0]:
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, data, offset)

    real_open = output_file._open_direct

    def open_direct(fd: int) -> int | None:
        got = real_open(fd)
        direct_fds.append(got if got is not None else os.dup(fd))
        return direct_fds[0]

    monkeypatch.setattr(output_file, "pwrite_all", pwrite_all)
    monkeypatch.setattr(output_file, "_open_direct", open_direct)
    pieces = [(0, 5), (5, SIZE - 5)]
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, SIZE)
    out = OutputFile(fd, direct=True)
    data = np.arange(SIZE, dtype=np.uint8)
    for offset, length in pieces:
        out.write(memoryview(data[offset : offset + length]), offset)
    assert not out.direct
    out.close()
    os.close(fd)
    assert path.read_bytes() == data.tobytes()


def test_other_write_errors_propagate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, SIZE)
    out = OutputFile(fd)

    def full(fd: int, data: Any, offset: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output_file, "pwrite_all", full)
    with pytest.raises(OSError, match="No space"):
        out.write(memoryview(bytes(SIZE)), 0)
    out.close()
    os.close(fd)


class _FakeSync:
    """Stands in for os.fdatasync: records calls, may block or fail."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.release = threading.Event()
        self.release.set()
        self.fail = fail

    def __call__(self, fd: int) -> None:
        self.release.wait()
        self.calls.append(fd)
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")


def test_background_sync_starts_every_n_bytes_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeSync()
    monkeypatch.setattr(os, "fdatasync", fake)
    sync = output_file.BackgroundSync(7, every=100)
    sync.wrote(99)
    sync.close()
    assert fake.calls == []
    fake.release.clear()
    sync.wrote(1)  # 100 bytes: a flush starts and blocks
    sync.wrote(500)  # one is running: no second thread, the bytes stay counted
    fake.release.set()
    sync.close()
    assert fake.calls == [7]
    sync.wrote(1)  # the 500 skipped bytes are flushed by the next one
    sync.finish()
    assert fake.calls == [7, 7]


def test_background_sync_failure_raised_by_finish_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fdatasync", _FakeSync(fail=True))
    sync = output_file.BackgroundSync(7, every=1)
    sync.wrote(1)
    sync.close()  # failure paths must not hide their own error
    with pytest.raises(StorageError, match="Input/output error"):
        sync.finish()


def test_output_file_flushes_in_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeSync()
    monkeypatch.setattr(os, "fdatasync", fake)
    monkeypatch.setattr(output_file, "SYNC_BYTES", 2 * ALIGN)
    expected, _ = _write_all(
        tmp_path / "f.bin", [(0, SIZE // 2), (SIZE // 2, SIZE - SIZE // 2)], True
    )
    assert (tmp_path / "f.bin").read_bytes() == expected
    assert len(fake.calls) >= 1


def test_a_signal_while_the_flush_thread_starts_leaves_it_joinable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM delivered as the background flush starts: the command unwinds with
    Interrupted and close() joins the flush (was: RuntimeError 'cannot join
    thread before it is started', a traceback found by tests/test_kill.py)."""
    import signal

    from wdelta.io import interrupts

    start = threading.Thread.start

    def start_after_signal(self: threading.Thread) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", start_after_signal)
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        sync = output_file.BackgroundSync(fd, every=1)
        with pytest.raises(interrupts.Interrupted), interrupts.as_exceptions():
            sync.wrote(1)
        monkeypatch.undo()
        sync.close()
        assert sync._thread is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", ["direct", "plain", "direct-unavailable"])
def test_only_a_large_file_without_direct_io_hands_each_write_to_writeback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A file meant for O_DIRECT on a file system without it hands each write to
    writeback; with direct writes on, small writes beside them, and the plain writes
    of a small file, wait for the background flush (bytes land either way)."""
    handed: list[tuple[int, int]] = []
    monkeypatch.setattr(output_file, "start_writeback", lambda fd, o, n: handed.append((o, n)))
    if mode == "direct-unavailable":
        monkeypatch.setattr(output_file, "_open_direct", lambda fd: None)
    pieces = [(0, 100), (ALIGN, output_file.DIRECT_MIN_BYTES - 1)]
    expected, used = _write_all(tmp_path / "f.bin", pieces, mode != "plain")
    if mode == "direct" and not used:
        pytest.skip("no O_DIRECT on this file system")
    assert (tmp_path / "f.bin").read_bytes() == expected
    assert handed == (pieces if mode == "direct-unavailable" else [])


def test_the_default_goes_direct_from_the_file_size_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """direct=None: a file below BUFFERED_FILE_BYTES is written through the page cache
    (no direct descriptor is even opened), one of that size or more as direct=True."""
    opened: list[int] = []
    real_open = output_file._open_direct
    monkeypatch.setattr(output_file, "_open_direct", lambda fd: opened.append(fd) or real_open(fd))
    monkeypatch.setattr(output_file, "BUFFERED_FILE_BYTES", SIZE)
    for size, expect_open in ((SIZE - 1, False), (SIZE, True)):
        fd = os.open(tmp_path / f"f{size}.bin", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, size)
            out = OutputFile(fd)
            assert bool(opened) == expect_open
            out.write(memoryview(bytes(range(256)) * 4), 0)
            out.close()
        finally:
            os.close(fd)
        assert (tmp_path / f"f{size}.bin").read_bytes()[:1024] == bytes(range(256)) * 4


@pytest.mark.parametrize("shift", [0, 1, 8, ALIGN // 2])
def test_data_aligned_in_memory_is_written_without_the_staging_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: int
) -> None:
    """O_DIRECT needs an aligned buffer: data that is one is written as it is, other
    data goes through the staging buffer; the file gets the bytes either way."""
    staged = record_staged(monkeypatch)
    n = 4 * output_file.DIRECT_MIN_BYTES
    raw = np.random.default_rng(shift).integers(0, 256, n + 2 * ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN + shift
    data = raw[start : start + n]
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, n)
        out = OutputFile(fd, direct=True)
        if not out.direct:
            pytest.skip("no O_DIRECT on this file system")
        out.write(memoryview(data), 0)
        out.close()
    finally:
        os.close(fd)
    assert path.read_bytes() == data.tobytes()
    assert staged == ([] if shift == 0 else [n])
