"""Outputs that appear all at once or not at all.

Results are written to a temporary name in the destination's own folder,
fsynced, then renamed over the destination, and the folder is fsynced: an
interrupted run leaves at most a ``.wdelta-tmp-*`` file behind, never a
partial result at the destination.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from .errors import BadArgumentError, StorageError

TMP_PREFIX = ".wdelta-tmp-"
_ATTEMPTS = 100
T = TypeVar("T")


def _unique(folder: Path, create: Callable[[Path], T]) -> tuple[T, Path]:
    """``create(path)`` for a fresh ``TMP_PREFIX`` name in ``folder``; retried on a clash."""
    for _ in range(_ATTEMPTS):
        path = folder / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        with contextlib.suppress(FileExistsError):
            return create(path), path
    raise FileExistsError(f"no free temporary name in {folder}")


def temp_file(folder: Path) -> tuple[int, Path]:
    """(fd, path) of a new, empty temporary file in ``folder``.

    Its mode is 0o666 less the umask, as for any file a program creates, so
    the renamed result is as readable as the user's other files
    (``tempfile.mkstemp`` would make every output 0o600).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    return _unique(folder, lambda path: os.open(path, flags, 0o666))


def temp_folder(parent: Path) -> Path:
    """A new, empty temporary folder in ``parent``, mode 0o777 less the umask."""
    return _unique(parent, lambda path: os.mkdir(path, 0o777))[1]


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(dest: Path) -> Iterator[int]:
    """Yield a writable fd; on success it is fsynced and renamed to ``dest``."""
    if dest.is_dir():
        raise BadArgumentError(f"{dest} is a folder; expected a file path")
    folder = dest.parent if str(dest.parent) else Path(".")
    try:
        fd, tmp = temp_file(folder)
    except OSError as exc:
        raise StorageError(f"cannot create a file in {folder}: {exc}") from exc
    try:
        yield fd
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, dest)
        fsync_dir(folder)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_folder(dest: Path) -> Iterator[Path]:
    """Yield a temporary folder that replaces ``dest`` (absent or empty) on success."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadArgumentError(f"{dest} exists and is not an empty folder")
    parent = dest.parent if str(dest.parent) else Path(".")
    try:
        tmp = temp_folder(parent)
    except OSError as exc:
        raise StorageError(f"cannot create a folder in {parent}: {exc}") from exc
    try:
        yield tmp
        for child in tmp.iterdir():
            with open(child, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(tmp)
        os.replace(tmp, dest)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
