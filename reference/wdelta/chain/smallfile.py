"""Reading a node's small local files (trust roots, keys, acceptance state) safely.

These files are named by operators and may be anything: a folder, a FIFO, a
device, a huge file.  They are read through one open file: its kind and size
are checked with ``fstat`` before reading, so a FIFO cannot hang the node and
nothing larger than the limit is read into memory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from ..errors import StorageError, WdeltaError


def read_regular(path: Path, limit: int, refuse: Callable[[str], WdeltaError]) -> bytes:
    """All bytes of the regular file ``path``, at most ``limit`` of them.

    A missing file raises FileNotFoundError (the caller says what absence
    means); another OS error is StorageError; a folder, FIFO, device or a file
    over ``limit`` bytes raises ``refuse(reason)``.
    """
    try:
        # O_NONBLOCK: opening a FIFO put in the file's place must not block.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse("a folder" if stat.S_ISDIR(info.st_mode) else "not a file")
        if info.st_size > limit:
            raise refuse(f"{info.st_size} bytes, at most {limit} expected")
        data = b"".join(iter(lambda: os.read(fd, limit + 1), b""))
    finally:
        os.close(fd)
    if len(data) > limit:
        raise refuse(f"over {limit} bytes")
    return data
