"""A stored delta read with ranged requests: its header, then only the blobs asked for.

A tensor-parallel rank following a chain needs the blobs of its own tensors
only.  The header gives every blob's offset and length (SPEC §4.6), so those
are read with ranged requests (consecutive blobs together, up to
``RANGE_WINDOW`` bytes) and nothing else of the link is downloaded.  The
header digest is checked and the header must name the link's versions; every
blob read is checked against its checksum before it is decompressed, as a
local file's are.  Blobs of other tensors are never read, so a damaged blob
elsewhere in the link goes unnoticed here, as in a partial pull.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..format.header import Chunk, Header
from .fetch import check_link_header
from .manifest import Link, LinkPart, Manifest
from .partial import Blobs, StoredDelta, read_remote_header
from .storage.base import Progress, Storage


class RemoteDelta:
    """``header`` and ``payload(chunk)`` of a stored delta, as an open ``DeltaFile``
    has them, reading the blobs of the tensors ``keep`` selects on demand."""

    def __init__(
        self, storage: Storage, m: Manifest, link: Link, keep: Callable[[str], bool],
        progress: Progress | None = None,
    ) -> None:  # fmt: skip
        self._open(storage, link, keep, progress)
        check_link_header(m, link, self.header)

    def _open(
        self, storage: Storage, stored: StoredDelta, keep: Callable[[str], bool],
        progress: Progress | None,
    ) -> None:  # fmt: skip
        header, data_start = read_remote_header(storage, stored, progress)
        self.header: Header = header
        chunks = [c for t in header.tensors if keep(t.name) for c in t.chunks if c.in_data]
        chunks.sort(key=lambda c: c.offset)
        self._blobs = Blobs(storage, stored.key, data_start, chunks, progress)
        self._lock = threading.Lock()

    def payload(self, chunk: Chunk) -> bytes:
        """The decompressed payload of a chunk's blob (checksum checked)."""
        if chunk.inline is not None:
            return self._blobs.get(chunk)
        with self._lock:  # one window for all threads; checks and decompression run outside
            blob = self._blobs.raw(chunk)
        return self._blobs.check(chunk, blob)


class PartDelta(RemoteDelta):
    """One part of a multi-part link read by ranges; the caller checks the set of parts
    against the link (``parts.check_parts``)."""

    def __init__(
        self, storage: Storage, part: LinkPart, keep: Callable[[str], bool],
        progress: Progress | None = None,
    ) -> None:  # fmt: skip
        self._open(storage, part, keep, progress)
