"""Checks of an output path before anything is written to it.

An output must not be, or resolve to, one of the command's inputs: the same
path, a symlink to it, another hard link of the same file, a file inside an
input folder (a sharded checkpoint), or a folder holding an input.  It must
not be ``-`` (outputs are written under a temporary name and renamed, which
standard output cannot be), an existing device, FIFO or socket, nor a symlink
(renaming over it would replace the link, not the file it names).  An
existing output is refused unless the caller passes ``overwrite`` (``--force``);
an empty folder counts as absent.  All of these are ``bad-argument``.  Its folder
must exist: a missing one is ``io-error``, as a missing input is, but refused
before anything is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..errors import BadArgumentError, StorageError

_Identity = tuple[int, int]


def _identity(st: os.stat_result) -> _Identity:
    return st.st_dev, st.st_ino


def _input_files(path: Path) -> Iterable[_Identity]:
    """(device, inode) of a file input, or of every file at the top of a folder input."""
    try:
        if not path.is_dir():
            return [_identity(path.stat())]
        with os.scandir(path) as entries:
            return [_identity(e.stat()) for e in entries if e.is_file()]
    except OSError:
        return []  # an unreadable input is reported by the code that reads it


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def overlaps(a: Path, b: Path) -> bool:
    """True if ``a`` and ``b``, symlinks resolved, are the same or one lies inside the other."""
    real_a, real_b = os.path.realpath(a), os.path.realpath(b)
    return _inside(real_a, real_b) or _inside(real_b, real_a)


def check_kind(out: Path) -> None:
    """Refuse ``-`` and an existing device, FIFO or socket as an output."""
    if str(out) == "-":
        raise BadArgumentError(
            "output '-': writing to standard output is not supported (outputs are written "
            "to a temporary file and renamed into place); give a file path"
        )
    try:
        st = out.stat()
    except OSError:
        return  # absent, or a dangling symlink: a name that can be replaced
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise BadArgumentError(
            f"{out} is not a regular file or folder (a device, FIFO or socket): wdelta writes "
            "a new file under a temporary name and renames it, so it cannot write there; "
            "give a file path"
        )


def check_folder(out: Path) -> None:
    """Refuse an output whose folder is missing or is a file (a mistyped ``-o``):
    StorageError before anything is read, not once the output is written."""
    folder = out.parent
    if folder.is_dir():
        return
    if os.path.lexists(folder):
        why = "is not a folder: nothing was written; choose another output path"
    else:
        why = "does not exist: nothing was written; create it or choose another output path"
    raise StorageError(f"{out}: its folder {folder} {why}")


def _check_inputs(out: Path, inputs: Iterable[Path]) -> None:
    out_id = _identity(out.stat()) if out.is_file() else None
    for path in inputs:
        if overlaps(out, path):
            same = os.path.realpath(out) == os.path.realpath(path)
            what = "is" if same else "overlaps"
            raise BadArgumentError(
                f"output {out} {what} the input {path}: writing it would destroy the input; "
                "choose another output path"
            )
        if out_id is not None and out_id in _input_files(path):
            raise BadArgumentError(
                f"output {out} is the same file as the input {path} (a hard link): "
                "choose another output path"
            )


def check_output(out: Path, inputs: Iterable[Path], *, overwrite: bool) -> None:
    """Refuse ``out`` for any reason of the module doc (BadArgumentError; StorageError
    for a missing folder)."""
    check_folder(out)
    check_kind(out)
    _check_inputs(out, list(inputs))
    if out.is_symlink():
        # The rename would replace the link itself (/dev/stdout, say), not what it names.
        raise BadArgumentError(
            f"{out} is a symlink: wdelta replaces the path itself, not the file it points "
            "to; give the real path (or remove the link)"
        )
    if overwrite or not os.path.lexists(out):
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    raise exists_error(out)


def exists_error(out: Path) -> BadArgumentError:
    """The refusal of an existing output."""
    return BadArgumentError(
        f"{out} exists: nothing was written; remove it, choose another output or pass "
        "overwrite=True to replace it"
    )
