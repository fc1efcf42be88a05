"""The storage interface every backend implements (SPEC §17.4).

Keys are ``/``-separated relative names (``deltas/<digest>.wdelta``).  The
chain layer needs only: whole and ranged reads, a streamed read from an
offset (resumable downloads), an overwriting upload of a local file, a
*create-only* write of a small object (the one primitive concurrency rests
on), a listing by prefix, and delete.  A missing object is always
:class:`NotFoundError`, never an empty result.

Every read is bounded by what the caller asked for (SPEC §17.6, RD-5):
a ranged read by its length, a whole read by the caller's limit, so a store
that answers more than it was asked (a lying mirror, ``/dev/zero`` behind a
symlink) costs at most one byte past it before the answer is refused.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import (
    BadArgumentError,
    ChecksumMismatchError,
    LimitExceededError,
    StorageError,
    UnsupportedFeatureError,
)
from .smallfile import append_blocks, kept_partial
from .transfer import Transfer

Progress = Callable[[int], None]
STREAM_BLOCK = 1 << 20
# Listing finds manifest revisions only (RD-4): a chain has one per publish, and prune keeps
# them few. A store that lists millions, or pages without end, is refused, not followed.
MAX_LISTED = 1_000_000


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


def too_large(key: str, limit: int) -> LimitExceededError:
    """The error for an object longer than the ``limit`` bytes its reader allows."""
    return LimitExceededError(f"{key}: longer than the {limit} bytes allowed for it")


def longer_than_asked(url: str, key: str, length: int) -> StorageError:
    """The error for a store that answered more than the ``length`` bytes asked (ST-3)."""
    return StorageError(f"{url}{key}: the store answered more than the {length} bytes asked")


def check_listed(url: str, prefix: str, count: int) -> None:
    """Refuse a listing of ``count`` objects so far if that is past :data:`MAX_LISTED`."""
    if count > MAX_LISTED:
        raise LimitExceededError(
            f"{url}{prefix}: the listing goes past {MAX_LISTED:,} objects (a store that lists "
            "without end); refused"
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

    def read(self, key: str, limit: int) -> bytes:
        """The whole object, at most ``limit`` bytes of it (manifests, signatures, roots).

        An object longer than ``limit``, whatever its size was said to be, is
        LimitExceededError naming it, after at most ``limit + 1`` bytes read.
        """
        parts, have = [], 0
        blocks = self.stream(key)
        try:
            for block in blocks:
                parts.append(block)
                have += len(block)
                if have > limit:
                    raise too_large(key, limit)
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()  # stop the transfer the stream holds open
        return b"".join(parts)

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
    have = kept_partial(part, size)
    if have == size:
        return

    def within_size() -> Iterator[bytes]:
        nonlocal have
        for block in storage.stream(key, have):
            have += len(block)
            if have > size:
                return  # endless data: never store more than the manifest's size
            yield block

    try:
        append_blocks(part, within_size(), progress, have=have)
    finally:
        if have == 0:  # nothing to resume from (the first read failed): keep no file
            part.unlink(missing_ok=True)
    if have > size:
        part.unlink()
        raise ChecksumMismatchError(f"{key}: longer than the {size} bytes the manifest lists")
    if have != size:
        raise StorageError(f"{key}: got {have} bytes, expected {size}")
