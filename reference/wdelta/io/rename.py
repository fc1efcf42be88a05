"""Renames that refuse to replace, and that replace a whole folder.

``no_replace`` and the folder swap of ``replace`` use Linux's renameat2(2)
(RENAME_NOREPLACE, RENAME_EXCHANGE), which do it in one atomic step.  Where
that call or its flag is missing (not Linux, some network file systems) they
fall back to a check followed by a rename, and to moving the old folder
aside before renaming the new one in: correct, but another process acting
between the two steps can slip in.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

# errno values of a write that ran out of room: disk full, size limit, quota.
NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_AT_FDCWD = -100
_NOREPLACE = 1
_EXCHANGE = 2
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)


@cache
def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _try_renameat2(src: Path, dest: Path, flags: int) -> bool:
    """renameat2(src, dest, flags); False if this system or file system lacks it."""
    fn = _renameat2()
    if fn is None:
        return False
    while fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dest), flags) != 0:
        code = ctypes.get_errno()
        if code == errno.EINTR:
            continue
        if code in _UNSUPPORTED:
            return False
        raise OSError(code, os.strerror(code), str(dest))
    return True


def no_replace(src: Path, dest: Path) -> None:
    """Rename ``src`` to ``dest``; FileExistsError if ``dest`` exists."""
    if _try_renameat2(src, dest, _NOREPLACE):
        return
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest))
    os.rename(src, dest)


def replace(src: Path, dest: Path, aside: Path) -> None:
    """Rename ``src`` over ``dest``; a non-empty folder ``dest`` is swapped out and removed
    (moved to the unused name ``aside`` first where it cannot be swapped)."""
    if not (dest.is_dir() and not dest.is_symlink() and any(dest.iterdir())):
        os.replace(src, dest)
        return
    if _try_renameat2(src, dest, _EXCHANGE):
        shutil.rmtree(src, ignore_errors=True)
        return
    os.rename(dest, aside)
    os.rename(src, dest)
    shutil.rmtree(aside, ignore_errors=True)
