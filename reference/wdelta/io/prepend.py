"""Room for a file's head, made after its body was written.

``diff`` streams blobs into the output file before it knows how long the
header will be.  Where the file system can (Linux ext4 and XFS), the room
for prefix and header is inserted in front of the written data with
fallocate(FALLOC_FL_INSERT_RANGE), which moves extents and copies nothing:
the data, whose writeback began while encoding, is not written twice.
Elsewhere the data is shifted towards the end of the file in place, from
its last block back, so that no byte is overwritten before it was moved.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Callable
from functools import cache

from ..checkpoint.source import pread_into
from .output_file import pwrite_all

# Inserted ranges must be multiples of the file system block size; 4096 is
# the block size of every common ext4 and XFS volume.  Where a volume uses
# larger blocks the insert is refused (EINVAL) and the data is shifted.
BLOCK = 4096
# FALLOC_FL_INSERT_RANGE of linux/falloc.h.
_INSERT_RANGE = 0x20
# errno values meaning "not on this system or file system".
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.ENODEV)
_SHIFT_BYTES = 1 << 22


@cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's fallocate(2), or None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


def insert_front(fd: int, length: int) -> bool:
    """Insert ``length`` bytes (a multiple of :data:`BLOCK`) at offset 0 of ``fd``.

    The file must hold at least one byte.  Returns False, with the file
    unchanged, where the system or the file system cannot insert.
    """
    fallocate = _fallocate()
    if fallocate is None:
        return False
    while fallocate(fd, _INSERT_RANGE, 0, length) != 0:
        code = ctypes.get_errno()
        # A ctypes call is not retried on a signal as os functions are (PEP 475).
        if code == errno.EINTR:
            continue
        if code in _UNSUPPORTED:
            return False
        raise OSError(code, os.strerror(code))
    return True


def shift_forward(fd: int, length: int, by: int) -> None:
    """Move bytes ``[0, length)`` of ``fd`` to ``[by, by + length)``."""
    end = length
    while end > 0:
        start = max(0, end - _SHIFT_BYTES)
        block = memoryview(bytearray(end - start))
        pread_into(fd, block, start)
        pwrite_all(fd, block, start + by)
        end = start
