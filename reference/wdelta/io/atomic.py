"""Outputs that appear all at once or not at all.

Results are written to a temporary name in the destination's own folder,
fsynced, then renamed to the destination, and the folder is fsynced: an
interrupted run leaves at most a temporary file behind, never a partial
result at the destination.

Temporary names say what and whose they are:
``.OUTNAME.wdelta-tmp-HOST-PID-RANDOM`` (OUTNAME cut to 120 bytes, so the
name stays far below 255 bytes).  A process killed outright (SIGKILL, power
loss) cannot remove its temporary; the next run that creates a temporary in
the same folder removes those of processes that no longer run on this host
(:func:`remove_stale`).  Temporaries of other hosts (a shared or network
folder) and of live processes are never touched; a PID reused by another
process only keeps a stale temporary for longer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import TypeVar

from ..errors import BadArgumentError, StorageError
from . import interrupts, rename
from .destination import check_folder, exists_error

# Every temporary name contains this; listings of stored objects skip such names.
TMP_MARK = ".wdelta-tmp-"
_ATTEMPTS = 100
_STEM_BYTES = 120
_NAME = re.compile(
    r"\.(?P<stem>.*)" + re.escape(TMP_MARK) + r"(?P<host>\w*)-(?P<pid>[0-9]{1,10})-[0-9a-f]{16}",
    re.DOTALL | re.ASCII,
)
T = TypeVar("T")


@cache
def host_tag() -> str:
    """This host's name as it appears in temporary names (letters, digits, _).

    A name that had to be changed (other characters, over 32 of them) gets 8
    hex digits of its hash, so that two hosts' tags differ (but for a 2^-32
    chance) even where their cut or changed names agree.
    """
    name = socket.gethostname()
    tag = re.sub(r"\W", "_", name, flags=re.ASCII)[:32]
    if tag == name:
        return tag
    return f"{tag}_{hashlib.blake2b(os.fsencode(name), digest_size=4).hexdigest()}"


def temp_name(stem: str) -> str:
    """A fresh temporary name for an output called ``stem``."""
    cut = os.fsdecode(os.fsencode(stem)[:_STEM_BYTES])
    return f".{cut}{TMP_MARK}{host_tag()}-{os.getpid()}-{secrets.token_hex(8)}"


def _alive(pid: int) -> bool:
    """False only if no process ``pid`` runs on this host (a zombie counts as running)."""
    if pid <= 0:
        return True  # not a process ID (0 would signal our own process group)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass  # another user's process, or no valid PID: keep its files either way
    return True


def remove_stale(folder: Path) -> list[str]:
    """Remove this host's temporaries in ``folder`` whose process is gone; their names."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            m = _NAME.fullmatch(entry.name)
            if m is None or m["host"] != host_tag() or _alive(int(m["pid"])):
                continue
            # Another run may remove it at the same moment: never an error.
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            removed.append(entry.name)
    return removed


def _unique(folder: Path, stem: str, create: Callable[[Path], T]) -> tuple[T, Path]:
    """``create(path)`` for a fresh temporary name in ``folder``; retried on a clash."""
    remove_stale(folder)
    for _ in range(_ATTEMPTS):
        path = folder / temp_name(stem)
        with contextlib.suppress(FileExistsError):
            return create(path), path
    raise FileExistsError(f"no free temporary name in {folder}")


def temp_file(folder: Path, stem: str) -> tuple[int, Path]:
    """(fd, path) of a new, empty temporary file in ``folder`` for output ``stem``.

    Its mode is 0o666 less the umask, as for any file a program creates, so
    the renamed result is as readable as the user's other files
    (``tempfile.mkstemp`` would make every output 0o600).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    return _unique(folder, stem, lambda path: os.open(path, flags, 0o666))


def temp_folder(parent: Path, stem: str) -> Path:
    """A new, empty temporary folder in ``parent``, mode 0o777 less the umask."""
    return _unique(parent, stem, lambda path: os.mkdir(path, 0o777))[1]


def _new_file(folder: Path, stem: str) -> tuple[int, Path]:
    try:
        return temp_file(folder, stem)
    except OSError as exc:
        raise StorageError(f"cannot create a file in {folder}: {exc}") from exc


def _new_folder(parent: Path, stem: str) -> Path:
    try:
        return temp_folder(parent, stem)
    except OSError as exc:
        raise StorageError(f"cannot create a folder in {parent}: {exc}") from exc


# The callers below create their temporary inside ``interrupts.deferred()``
# and inside the ``try`` that removes it: a signal arriving while it is
# created is raised only once its path is known to the cleanup.


@contextlib.contextmanager
def temp_dir(parent: Path, stem: str) -> Iterator[Path]:
    """A temporary working folder in ``parent``, removed with its contents on exit."""
    path = None
    try:
        with interrupts.deferred():
            path = _new_folder(parent, stem)
        yield path
    finally:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parent(dest: Path) -> Path:
    return dest.parent if str(dest.parent) else Path(".")


def _commit(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``dest``; without ``overwrite`` only if ``dest`` is absent
    (an empty folder counts as absent for a folder)."""
    try:
        if overwrite:
            rename.replace(tmp, dest, _parent(dest) / temp_name(dest.name))
        elif tmp.is_dir() and dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
            os.replace(tmp, dest)
        else:
            rename.no_replace(tmp, dest)
    except FileExistsError:
        raise exists_error(dest) from None


def _output_error(dest: Path, exc: OSError) -> StorageError:
    """The error of a failed write of ``dest``: what happened and what to do."""
    return StorageError(
        f"cannot write {dest}: {exc.strerror or exc}; nothing was written (no partial "
        "output, no temporary file left): free some space and run again"
    )


@contextlib.contextmanager
def atomic_file(dest: Path, *, overwrite: bool) -> Iterator[int]:
    """Yield a writable fd; on success it is fsynced and renamed to ``dest``.

    Without ``overwrite`` an existing ``dest`` is refused (BadArgumentError),
    before anything is written and again, atomically, at the rename.
    """
    if dest.is_dir():
        raise BadArgumentError(f"{dest} is a folder; expected a file path")
    check_folder(dest)
    if not overwrite and os.path.lexists(dest):
        raise exists_error(dest)
    folder = _parent(dest)
    fd, tmp = -1, None
    try:
        with interrupts.deferred():
            fd, tmp = _new_file(folder, dest.name)
        yield fd
        os.fsync(fd)
        os.close(fd)
        fd = -1
        _commit(tmp, dest, overwrite)
        fsync_dir(folder)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in rename.NO_SPACE:
            raise _output_error(dest, exc) from exc
        raise


@contextlib.contextmanager
def atomic_folder(dest: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``dest`` on success.

    ``dest`` may be absent or an empty folder; a non-empty folder only with
    ``overwrite`` (it is then swapped out and removed); never a file.
    """
    if os.path.lexists(dest) and not dest.is_dir():
        raise BadArgumentError(f"{dest} exists and is not a folder")
    if not overwrite and dest.is_dir() and any(dest.iterdir()):
        raise exists_error(dest)
    parent = _parent(dest)
    tmp = None
    try:
        with interrupts.deferred():
            tmp = _new_folder(parent, dest.name)
        yield tmp
        for child in tmp.iterdir():
            with open(child, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(tmp)
        _commit(tmp, dest, overwrite)
        fsync_dir(parent)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in rename.NO_SPACE:
            raise _output_error(dest, exc) from exc
        raise
