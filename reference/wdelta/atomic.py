"""Outputs that appear all at once or not at all.

Results are written to a temporary name in the destination's own folder,
fsynced, then renamed over the destination, and the folder is fsynced: an
interrupted run leaves at most a ``.wdelta-tmp-*`` file behind, never a
partial result at the destination.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import BadArgumentError, StorageError

TMP_PREFIX = ".wdelta-tmp-"


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
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=folder)
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
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent))
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
