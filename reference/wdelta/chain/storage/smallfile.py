"""Reading files that may be anything, safely: a node's small local files (trust roots,
keys, acceptance state) and the objects of a chain in a local folder.

A path is named by an operator, or written by whoever can write a chain's
folder, and may be a folder, a FIFO, a device (``/dev/zero`` behind a symlink)
or a huge file.  It is opened without blocking (so a FIFO cannot hang the
node), its kind is checked with ``fstat`` on that open file, and a whole read
takes at most the caller's limit (so nothing larger is read into memory).
A partial download in a node's cache is created exclusively, and continued
only if it is a regular file of one link owned by the node's user, appended to
without following a symlink.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from ...errors import StorageError, WdeltaError
from ...io.filekind import os_message

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def kind_of(mode: int) -> str:
    """Why a file of mode ``mode`` is refused, in words (``a FIFO, not a file``)."""
    return next((name for test, name in _KINDS if test(mode)), "of another kind") + ", not a file"


def open_regular(path: Path, refuse: Callable[[str], WdeltaError]) -> int:
    """A read-only descriptor of the regular file ``path``.

    A missing file raises FileNotFoundError (the caller says what absence
    means); another OS error is StorageError; anything but a regular file
    raises ``refuse(kind_of(mode))``.  Symlinks are followed: the file they lead
    to is what is checked.
    """
    try:
        # O_NONBLOCK: opening a FIFO put in the file's place must not block.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(os_message(path, exc)) from exc
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise StorageError(os_message(path, exc)) from exc
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise refuse(kind_of(mode))
    return fd


def read_bounded(fd: int, limit: int, refuse: Callable[[str], WdeltaError]) -> bytes:
    """All bytes of the open regular file ``fd``, or ``refuse(why)`` past ``limit``.

    The size is checked before reading and the read stops one byte past the
    limit, so a file that grows meanwhile is refused too.
    """
    size = os.fstat(fd).st_size
    if size > limit:
        raise refuse(f"{size} bytes, at most {limit} expected")
    parts, have = [], 0
    while have <= limit and (block := os.read(fd, limit + 1 - have)):
        parts.append(block)
        have += len(block)
    if have > limit:
        raise refuse(f"over {limit} bytes")
    return b"".join(parts)


def read_regular(path: Path, limit: int, refuse: Callable[[str], WdeltaError]) -> bytes:
    """All bytes of the regular file ``path``, at most ``limit`` of them.

    A missing file raises FileNotFoundError; another OS error is StorageError;
    a folder, FIFO, device or a file over ``limit`` bytes raises ``refuse(reason)``.
    """
    fd = open_regular(path, refuse)
    try:
        return read_bounded(fd, limit, refuse)
    finally:
        os.close(fd)


def _ours(info: os.stat_result) -> bool:
    """A partial download this node may continue: a regular file with one name (a
    hard link would write through to another file: the node's checkpoint, say),
    owned by this user."""
    owner = os.geteuid() if hasattr(os, "geteuid") else info.st_uid
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == owner


def kept_partial(part: Path, size: int) -> int:
    """Bytes of an earlier download in ``part`` to continue after (0: start afresh).

    Anything but a regular file of one link owned by this user is removed first
    (it is the node's own cache; removing a hard link leaves the file it names):
    a FIFO would block the download, a symlink or hard link would write
    elsewhere.  So is a file longer than ``size``.
    """
    try:
        info = part.lstat()
    except FileNotFoundError:
        return 0
    if _ours(info) and info.st_size <= size:
        return info.st_size
    try:
        shutil.rmtree(part) if stat.S_ISDIR(info.st_mode) else part.unlink()
    except OSError as exc:
        raise StorageError(f"cannot remove {part}: {exc}") from exc
    return 0


def _open_partial(part: Path, have: int) -> int:
    """A descriptor appending to ``part``: created here, exclusively, when ``have`` is 0;
    else the file :func:`kept_partial` found, if it still is one to continue (a regular
    file of one link, this user's, of ``have`` bytes: nothing swapped in meanwhile).
    Never through a symlink, never waiting on a FIFO."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(part, flags | (os.O_CREAT | os.O_EXCL if have == 0 else 0), 0o666)
    info = os.fstat(fd)
    if not _ours(info) or info.st_size != have:
        os.close(fd)
        raise StorageError(
            f"refusing to continue the partial download {part}: it changed since it was "
            "checked (another link to it, another owner or size); it is removed next time"
        )
    return fd


def append_blocks(
    part: Path, blocks: Iterable[bytes], progress: Callable[[int], None] | None, *, have: int
) -> None:
    """Append ``blocks`` to the partial download ``part`` of ``have`` bytes (as
    :func:`kept_partial` found it; 0: a new file, created exclusively), then fsync
    it; ``progress`` counts each block's bytes.  An OSError is a StorageError
    naming ``part``."""
    try:
        with open(_open_partial(part, have), "ab") as f:
            for block in blocks:
                f.write(block)
                if progress is not None:
                    progress(len(block))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise StorageError(f"cannot write {part}: {exc}") from exc
