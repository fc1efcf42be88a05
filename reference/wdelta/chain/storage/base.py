"""The storage interface every backend implements (SPEC.md "Storage model").

Keys are ``/``-separated relative names (``deltas/<digest>.wdelta``).  The
chain layer needs only: whole and ranged reads, a streamed read from an
offset (resumable downloads), an overwriting upload of a local file, a
*create-only* write of a small object (the one primitive concurrency rests
on), a listing by prefix, and delete.  A missing object is always
:class:`NotFoundError`, never an empty result.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import (
    BadArgumentError,
    ChecksumMismatchError,
    StorageError,
    UnsupportedFeatureError,
)
from .transfer import Transfer

Progress = Callable[[int], None]
STREAM_BLOCK = 1 << 20


@dataclass(frozen=True)
class ObjectInfo:
    """A stored object: its key and size in bytes."""

    key: str
    size: int


def missing_package(scheme: str, exc: ImportError, install: str) -> UnsupportedFeatureError:
    """The error for a backend whose optional package cannot be imported."""
    name = exc.name or str(exc)
    return UnsupportedFeatureError(
        f"{scheme} storage needs the Python package {name}, which cannot be imported "
        f"({exc}): {install}"
    )


def check_key(key: str) -> str:
    """Refuse keys that could escape the chain's root (``..``, absolute, empty parts)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise BadArgumentError(f"invalid storage key {key!r}")
    return key


class Storage(abc.ABC):
    """A flat key -> bytes store rooted at one URL."""

    url: str
    # Large-object settings: multipart uploads (where the backend has them) and
    # concurrent ranged downloads (``transfer.download_ranges``).
    transfer: Transfer = Transfer()

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """The object's size, or None if it does not exist."""

    @abc.abstractmethod
    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``start`` (short object: TruncatedError)."""

    @abc.abstractmethod
    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        """The object's bytes from ``start`` to its end, in blocks."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        """Upload a local file to ``key`` (replacing any object there)."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` at ``key`` only if no object exists there; False if one does.

        Atomic: of two concurrent creates of one key exactly one returns True.
        """

    @abc.abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object (no error if it is already gone)."""

    def read(self, key: str) -> bytes:
        """The whole object (for small objects such as manifests)."""
        return b"".join(self.stream(key))

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None


def download(
    storage: Storage, key: str, part: Path, size: int, progress: Progress | None = None
) -> None:
    """Stream ``key`` into ``part``, continuing after the bytes already there.

    ``part`` is a partial download kept across interruptions; a file longer
    than ``size`` is discarded first.  ``progress`` counts bytes transferred
    now (not those kept from before).  The caller verifies the digest.
    """
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    if have == size:
        return
    try:
        with open(part, "ab") as f:
            for block in storage.stream(key, have):
                have += len(block)
                if have > size:
                    break  # endless data: never store more than the manifest's size
                f.write(block)
                if progress is not None:
                    progress(len(block))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise StorageError(f"cannot write {part}: {exc}") from exc
    if have > size:
        part.unlink()
        raise ChecksumMismatchError(f"{key}: longer than the {size} bytes the manifest lists")
    if part.stat().st_size != size:
        raise StorageError(f"{key}: got {part.stat().st_size} bytes, expected {size}")
