"""Large objects: how they are uploaded in parts and downloaded with concurrent ranged reads.

``Transfer`` holds the settings of one storage (``Storage.transfer``).  An
object of at least ``threshold`` bytes is uploaded in parts of ``chunk``
bytes, ``concurrency`` at a time, where the backend can (S3 multipart through
boto3's transfer manager), and downloaded by :func:`download_ranges`:
``chunk``-byte ranged reads, ``concurrency`` in flight, built on
``Storage.read_range`` alone so it works on every backend; the read-back
check of an upload reads such an object the same way (:func:`read_blocks`).

The ranges are written to the partial file in order, so the file is always a
prefix of the object, the same invariant as a streamed download: an
interrupted download resumes from its length with either method, and at most
``concurrency + 1`` ranges are held in memory at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...errors import BadArgumentError, ChecksumMismatchError, StorageError
from ...ops.pipeline import ordered_map
from .backoff import Backoff
from .smallfile import append_blocks, kept_partial

_RETRY = Backoff(base=0.2, cap=2.0)


class RangedReads(Protocol):
    """All that a transfer needs of a storage: exact ranged reads (ST-3).  Not ``Storage``
    itself: ``storage.base`` imports this module for ``Transfer``, and naming it here
    would make an import cycle."""

    def read_range(self, key: str, start: int, length: int) -> bytes: ...


@dataclass(frozen=True)
class Transfer:
    """Large-object settings: ``threshold`` and ``chunk`` in bytes, ``concurrency`` requests
    in flight, ``attempts`` per ranged read (transport errors only, with backoff)."""

    threshold: int = 64 << 20
    chunk: int = 16 << 20
    concurrency: int = 8
    attempts: int = 3

    def __post_init__(self) -> None:
        for name in ("threshold", "chunk", "concurrency", "attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadArgumentError(f"Transfer.{name} must be an int >= 1, not {value!r}")


def _read_with_retries(
    storage: RangedReads, key: str, start: int, length: int, attempts: int
) -> bytes:
    """``storage.read_range``, retried after a transport error (io-error) ``attempts`` times
    in all; a missing object or a short one is not retried."""
    for failure in range(1, attempts + 1):
        try:
            return storage.read_range(key, start, length)
        except StorageError:
            if failure == attempts:
                raise
            time.sleep(_RETRY.delay(failure))
    raise AssertionError("unreachable")


def read_blocks(
    storage: RangedReads, key: str, start: int, end: int, transfer: Transfer | None = None
) -> Iterator[bytes]:
    """Bytes ``start`` to ``end`` of ``key``, in order, as ``transfer.chunk``-byte ranged
    reads with up to ``transfer.concurrency`` in flight (bounded memory: at most
    ``concurrency + 1`` blocks held at once)."""
    t = transfer or Transfer()
    ranges = [(s, min(t.chunk, end - s)) for s in range(start, end, t.chunk)]

    def fetch(r: tuple[int, int]) -> bytes:
        return _read_with_retries(storage, key, r[0], r[1], t.attempts)

    yield from ordered_map(fetch, ranges, t.concurrency, ahead=1)


def download_ranges(
    storage: RangedReads, key: str, part: Path, size: int,
    progress: Callable[[int], None] | None = None,
    transfer: Transfer | None = None,
) -> None:  # fmt: skip
    """Download ``key`` (``size`` bytes) into ``part`` with :func:`read_blocks`,
    continuing after the bytes already there (a longer file is discarded first).

    ``progress`` counts bytes transferred now.  The caller verifies the digest.
    """
    have = kept_partial(part, size)
    append_blocks(part, read_blocks(storage, key, have, size, transfer), progress, have=have)
    if part.stat().st_size != size:  # read_range returns exactly the bytes asked for (ST-3)
        part.unlink()
        raise ChecksumMismatchError(f"{key}: the download is not the {size} bytes listed")
