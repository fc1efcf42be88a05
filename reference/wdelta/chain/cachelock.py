"""Locks that let many processes, and hosts, share one cache folder.

A download of the object ``D`` into a cache holds an exclusive ``flock`` on
``<cache>/locks/<first two hex digits of D>.lock`` (256 lock files at most,
never removed: removing a lock file another process is waiting on would
let a third lock a new file of the same name).  The process holding it is
the only one writing ``partial/D.part`` and renaming it to ``objects/D``;
the others wait, then find ``objects/D`` stored and download nothing.  So
the GPU workers of one node that fetch the same objects download each once,
and an interrupted download is continued by whichever process comes next.
A process that dies releases its locks (the kernel drops them with its
descriptors); two unrelated objects share a lock file with probability
1/256, and then download one after the other.  ``gc`` removes an entry
only while it holds that entry's lock, so never a partial file being written.

On NFS, Linux takes ``flock`` as a lock of the whole file on the server
(NFSv4, or NFSv3 with the lock manager), so hosts sharing the folder
exclude one another.  Where the file system has no locks (an NFS mount
with ``nolock``; ``flock`` fails with ENOLCK or EOPNOTSUPP) each process
downloads into a partial file of its own instead (a fresh temporary name,
created exclusively): objects may then be downloaded more than once, but
every stored object is still verified and renamed into place atomically.
A mount whose locks are local to each host (``local_lock=flock``) must not
be shared by several hosts: use one cache folder per host there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..errors import StorageError
from .storage.smallfile import kind_of

# What flock answers on a file system that offers no locks.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


def lock_path(cache: Path, digest: str) -> Path:
    """The lock file that guards the cache entry ``digest``."""
    return cache / "locks" / f"{digest[:2].lower()}.lock"


def _open(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created if missing; never through a
    symlink, never blocking on a FIFO put there)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        raise StorageError(f"cannot open the cache lock {path}: {exc.strerror or exc}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StorageError(f"the cache lock {path} is {kind_of(mode)}: remove it")
    return fd


def _flock(fd: int, path: Path, wait: bool) -> bool | None:
    """Lock ``fd`` exclusively: True once held, False if busy (``wait`` False), None
    where the file system offers no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _NO_LOCKS:
            return None
        raise StorageError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    return True


@contextlib.contextmanager
def locked(cache: Path, digest: str) -> Iterator[bool]:
    """Wait for the lock of the cache entry ``digest`` and hold it while the block
    runs; yields True, or False where the file system offers no locks (the caller
    then writes only files of its own)."""
    path = lock_path(cache, digest)
    fd = _open(path)
    try:
        yield _flock(fd, path, wait=True) is True
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def unless_busy(cache: Path, digest: str) -> Iterator[bool]:
    """Hold the lock of the cache entry ``digest`` if no other process does; yields
    False if one does (a download of it is running), else True (also where the
    file system offers no locks)."""
    path = lock_path(cache, digest)
    fd = _open(path)
    try:
        yield _flock(fd, path, wait=False) is not False
    finally:
        os.close(fd)
