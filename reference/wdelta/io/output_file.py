"""Positioned writes of rebuilt checkpoints, around the page cache where possible.

Measured here, a buffered write of 1 GB into a new file costs 1.2-1.6 s of
CPU (page-cache allocation and ext4 bookkeeping per 4 KiB page), as much as
decoding and verifying it; with O_DIRECT the same bytes cost 0.15 s (a copy
into an aligned staging buffer, then DMA).  So each write is split: the
4096-byte-aligned middle goes through a second descriptor opened with
O_DIRECT, the unaligned head and tail (< 4 KiB each; they share pages with
the neighbouring tensors or the safetensors header) through the ordinary
descriptor.  Direct and buffered writes never touch the same page.  Where
O_DIRECT is unavailable (not Linux, tmpfs, some network file systems) or the
first direct write is refused, every write is buffered, and the written
range is handed to writeback at once (POSIX_FADV_DONTNEED) so that the final
fsync does not flush the whole file.

Written data reaches stable storage only when it is flushed: measured here,
the final fsync of a rebuilt 1 GB checkpoint took 0.4-1.1 s, half of apply,
even with every byte already written (O_DIRECT).  :class:`BackgroundSync`
flushes a file in a background thread as it grows, so that storage catches up
while the writer works and the final fsync finds little left (0.01-0.02 s).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from typing import Any

import numpy as np

from ..errors import StorageError
from . import interrupts

# Covers the logical block size of every common device (512 or 4096 bytes).
ALIGN = 4096
# Below this a write is not worth a direct I/O request.
DIRECT_MIN_BYTES = 1 << 16
# A background flush is started each time this many bytes have been written.
SYNC_BYTES = 16 << 20
# Files below this size are written through the page cache only, each write a
# plain pwrite: O_DIRECT's advantage is CPU at scale (a buffered 1 GB costs
# 1.2-1.4 s more), while each direct write waits for the device, which small
# models pay per tensor.  Measured here (wdelta.apply, threads=2, median of 5):
# real-trace fp8 28 MB 170 -> 156 ms, bf16 55 MB 255 -> 212 ms, synthetic bf16
# 71 MB 246 -> 210 ms, fp8 42 MB 239 -> 194 ms, CPU within +-10%.
BUFFERED_FILE_BYTES = 128 << 20


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (pwrite may write less than asked)."""
    view = memoryview(data).cast("B")
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    finally:
        # A failed write's traceback keeps this frame alive: without the
        # release, a buffer under ``data`` (an mmap) could not be closed.
        view.release()


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Hand a just-written range to the kernel's writeback, so that a later
    fsync overlaps with the work in between (on Linux, POSIX_FADV_DONTNEED
    starts asynchronous I/O for dirty pages); nothing where there is no fadvise."""
    if hasattr(os, "posix_fadvise") and length > 0:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class BackgroundSync:
    """Flushes file ``fd`` to stable storage in a background thread as it is written.

    :meth:`wrote` counts bytes; every :data:`SYNC_BYTES` it starts an
    fdatasync unless one is still running (the next one covers what that
    skipped).  This never replaces the writer's final fsync; it only leaves
    that fsync less to do.  :meth:`finish` waits and raises StorageError if a
    flush failed: Linux reports a writeback error to one fsync caller only, so
    an error seen here would otherwise be lost.  :meth:`close` only waits (for
    failure paths); both must run before ``fd`` is closed.
    """

    def __init__(self, fd: int, every: int | None = None) -> None:
        self.fd = fd
        self.every = SYNC_BYTES if every is None else every
        self._unsynced = 0
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def wrote(self, nbytes: int) -> None:
        """Count ``nbytes`` just written; maybe start a flush."""
        self._unsynced += nbytes
        if self._unsynced < self.every or (self._thread and self._thread.is_alive()):
            return
        self._unsynced = 0
        thread = threading.Thread(target=self._sync, name="wdelta-sync", daemon=True)
        # A SIGTERM turned into an exception inside start() would leave a thread
        # recorded but never started, which close() cannot join (found by the
        # kill tests): the signal waits until the thread runs and is recorded.
        with interrupts.deferred():
            thread.start()
            self._thread = thread

    def _sync(self) -> None:
        try:
            getattr(os, "fdatasync", os.fsync)(self.fd)
        except OSError as exc:
            self._error = self._error or exc

    def close(self) -> None:
        """Wait for a running flush."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self) -> None:
        """Wait for a running flush; StorageError if any flush failed."""
        self.close()
        if self._error is not None:
            raise StorageError(f"flushing the output to storage failed: {self._error}")


class OutputFile:
    """Writes to an open, already sized output file ``fd``; see the module doc.

    ``fd`` stays owned by the caller.  On success call :meth:`finish` (it
    raises if a background flush failed) before the final fsync; :meth:`close`
    then, on every path, releases the direct descriptor and the staging
    buffer.  Not thread-safe: one writer.  ``direct``: True splits writes
    around O_DIRECT where the file system allows it, False writes through the
    page cache, None (default) does the first for files of BUFFERED_FILE_BYTES
    or more.
    """

    def __init__(self, fd: int, direct: bool | None = None) -> None:
        self.fd = fd
        if direct is None:  # by the (already sized) file's size
            direct = os.fstat(fd).st_size >= BUFFERED_FILE_BYTES
        self._direct_fd = _open_direct(fd) if direct else None
        # A small file: plain buffered writes, no writeback hint each (the
        # background flushes and the final fsync write them out).
        self._plain = not direct
        self._stage: mmap.mmap | None = None
        self._sync = BackgroundSync(fd)

    @property
    def direct(self) -> bool:
        """True while writes bypass the page cache."""
        return self._direct_fd is not None

    def write(self, data: memoryview, offset: int) -> None:
        """Write ``data`` (bytes) at ``offset``."""
        data = data.cast("B")
        self._split_write(data, offset)
        self._sync.wrote(len(data))

    def _split_write(self, data: memoryview, offset: int) -> None:
        head = -offset % ALIGN
        body = (len(data) - head) // ALIGN * ALIGN
        if self._direct_fd is None and not self._plain:
            self._buffered(data, offset)
            return
        if self._plain or body < DIRECT_MIN_BYTES:
            # Small next to the direct writes: handing each to writeback at
            # once cost a syscall and a tiny I/O request amid the direct ones
            # (75 of the 133 tensors of the fp8 real trace); the background
            # flushes and the final fsync write them out.
            pwrite_all(self.fd, data, offset)
            return
        if head:
            pwrite_all(self.fd, data[:head], offset)
        if not self._write_direct(data[head : head + body], offset + head):
            self._buffered(data[head : head + body], offset + head)
        if head + body < len(data):
            pwrite_all(self.fd, data[head + body :], offset + head + body)

    def finish(self) -> None:
        """Wait for the background flush; StorageError if one failed."""
        self._sync.finish()

    def close(self) -> None:
        self._sync.close()
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None
        if self._stage is not None:
            self._stage.close()
            self._stage = None

    def _buffered(self, data: memoryview, offset: int) -> None:
        pwrite_all(self.fd, data, offset)
        start_writeback(self.fd, offset, len(data))

    def _write_direct(self, data: memoryview, offset: int) -> bool:
        """Write an aligned range, through the staging buffer unless ``data`` is
        itself aligned in memory; False if refused."""
        assert self._direct_fd is not None
        source = np.frombuffer(data, dtype=np.uint8)
        stage = memoryview(data) if source.ctypes.data % ALIGN == 0 else self._staged(source)
        try:
            pwrite_all(self._direct_fd, stage, offset)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # The file system takes O_DIRECT opens but not these writes.
            os.close(self._direct_fd)
            self._direct_fd = None
            return False
        finally:
            stage.release()
        return True

    def _staged(self, source: np.ndarray[Any, np.dtype[np.uint8]]) -> memoryview:
        """``source`` copied into the page-aligned staging buffer (O_DIRECT needs one)."""
        if self._stage is None or len(self._stage) < len(source):
            if self._stage is not None:
                self._stage.close()
            self._stage = mmap.mmap(-1, len(source))
        stage = memoryview(self._stage)[: len(source)]
        np.frombuffer(stage, dtype=np.uint8)[:] = source
        return stage


def _open_direct(fd: int) -> int | None:
    """A second, O_DIRECT descriptor on the file of ``fd``, or None."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    with contextlib.suppress(OSError):
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | flag)
    return None
