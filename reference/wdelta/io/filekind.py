"""What a file is, from its first bytes, so that a mistake is explained.

A user who passes a delta where a checkpoint goes, a Git LFS pointer left by a
clone without ``git lfs pull``, an HTML error page saved by a failed download
or a sharded checkpoint's index instead of its folder should be told so, not
``header of 738964500421826441 bytes exceeds 100000000``.  The kinds are told
apart from at most :data:`SNIFF_BYTES` bytes; none of them can be a valid
safetensors file or delta, so recognising them early changes no category.

:func:`naming` puts a file's path in front of the message of errors about it;
:func:`os_message` says what the operating system refused, in one wording for
every command.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import (
    BadMagicError,
    CheckpointInvalidError,
    StorageError,
    TruncatedError,
    WdeltaError,
)

E = TypeVar("E", bound=WdeltaError)

SNIFF_BYTES = 512
WDELTA_MAGIC = b"\x89WDELTA\n"

EMPTY, WDELTA, SAFETENSORS, LFS_POINTER, HTML, INDEX, JSON, ZIP, OTHER = (
    "empty", "wdelta", "safetensors", "lfs-pointer", "html", "index", "json", "zip", "other",
)  # fmt: skip
_HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml", b"<!--")


def sniff(head: bytes, size: int, name: str = "") -> str:
    """The kind of a file of ``size`` bytes that starts with ``head``.

    ``name`` (the file name) only tells a shard index from other JSON.
    """
    if size == 0:
        return EMPTY
    if head.startswith(WDELTA_MAGIC):
        return WDELTA
    # Checked before the text kinds: a header length's low byte may be "{".
    if len(head) > 8 and head[8:9] == b"{" and 8 + int.from_bytes(head[:8], "little") <= size:
        return SAFETENSORS
    if head.startswith(b"version https://git-lfs.github.com/spec/"):
        return LFS_POINTER
    if head.startswith(b"PK\x03\x04"):
        return ZIP
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").lower()
    if text.startswith(_HTML_STARTS):
        return HTML
    if text.startswith(b"{"):
        return INDEX if name.endswith(".index.json") or b'"weight_map"' in text else JSON
    return OTHER


def sniff_fd(fd: int, path: Path) -> str:
    """The kind of the open regular file ``fd`` (named ``path``)."""
    try:
        size = os.fstat(fd).st_size
        return sniff(os.pread(fd, min(size, SNIFF_BYTES), 0), size, path.name)
    except OSError as exc:
        raise StorageError(os_message(path, exc)) from exc


# Python's own text would be "[Errno 2] No such file or directory: 'x'": the path twice,
# a number and "directory" where the rest of wdelta says "folder".
_OS_REASONS = {
    errno.ENOENT: "no such file or folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "a folder, not a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
}


def os_message(path: object, exc: OSError) -> str:
    """``PATH: REASON`` for the OS error ``exc`` on ``path``: ``x: no such file or folder``,
    ``x: permission denied``, else the system's words without the errno."""
    reason = _OS_REASONS.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()
    return f"{path}: {reason}"


_ALWAYS = {
    LFS_POINTER: "is a Git LFS pointer, not the file: run `git lfs pull`",
    HTML: "is an HTML page (a failed download?), not a {want}: download it again",
    ZIP: "is a zip archive (a PyTorch .pt/.bin checkpoint?), not a {want}: "
    "convert it to safetensors",
    EMPTY: "is empty (0 bytes), not a {want}",
}


def checkpoint_refusal(path: Path, kind: str) -> CheckpointInvalidError | None:
    """Why ``path`` of ``kind`` cannot be a safetensors checkpoint (None: no idea)."""
    reasons = {
        **_ALWAYS,
        WDELTA: "is a wdelta delta, not a checkpoint",
        INDEX: "is the index of a sharded checkpoint: pass the folder, not its index",
        JSON: "is a JSON file, not a safetensors {want}",
    }
    reason = reasons.get(kind)
    if reason is None:
        return None
    return _mixed_up(CheckpointInvalidError(f"{path} " + reason.format(want="checkpoint")),
                     kind == WDELTA)  # fmt: skip


def delta_refusal(path: Path, kind: str) -> WdeltaError:
    """Why ``path`` of ``kind`` is not a wdelta delta (``truncated`` if empty, else
    ``bad-magic``)."""
    reasons = {
        **_ALWAYS,
        SAFETENSORS: "is a safetensors checkpoint, not a wdelta delta",
        INDEX: "is the index of a sharded checkpoint, not a wdelta delta",
        JSON: "is a JSON file, not a {want}",
    }
    reason = reasons.get(kind, "is not a {want} (it does not start with the wdelta magic bytes)")
    error = TruncatedError if kind == EMPTY else BadMagicError
    message = f"{path} " + reason.format(want="wdelta delta")
    return _mixed_up(error(message), kind in (SAFETENSORS, INDEX))


def document_refusal(path: Path, data: bytes, want: str) -> str | None:
    """Why the file ``path`` holding ``data`` cannot be the JSON document ``want`` (a
    trust root, a key, a manifest revision) when it is of a kind known to be something
    else; None when it has to be parsed to tell."""
    reasons = {
        **_ALWAYS,
        WDELTA: "is a wdelta delta, not a {want}",
        SAFETENSORS: "is a safetensors checkpoint, not a {want}",
        ZIP: "is a zip archive, not a {want}",
        INDEX: "is the index of a sharded checkpoint, not a {want}",
    }
    reason = reasons.get(sniff(data[:SNIFF_BYTES], len(data), path.name))
    return None if reason is None else f"{path} " + reason.format(want=want)


def folder_refusal(path: Path) -> StorageError:
    """A folder given where a delta (one file) goes."""
    return _mixed_up(StorageError(f"{path} is a folder; a delta is one .wdelta file"), True)


def _mixed_up(exc: E, mixed_up: bool) -> E:
    exc.mixed_up = mixed_up
    return exc


@contextlib.contextmanager
def naming(path: object, *kinds: type[WdeltaError], subject: str = "") -> Iterator[None]:
    """Put ``path`` in front of the message of errors of ``kinds`` raised inside.

    The error keeps its class (so its category); a message that already names
    the path is left alone, and one that starts with the word ``subject``
    ("input is not the delta's base") gets the path in its place.
    """
    try:
        yield
    except kinds as exc:
        where = str(path)
        if where not in exc.message:
            if subject and exc.message.startswith(subject + " "):
                exc.message = where + exc.message[len(subject) :]
            else:
                exc.message = f"{where}: {exc.message}"
            exc.args = (exc.message,)
        raise
