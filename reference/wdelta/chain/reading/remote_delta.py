"""A stored delta read with ranged requests: its header, then only the blobs asked for.

A tensor-parallel rank following a chain needs the blobs of its own tensors
only.  The header gives every blob's offset and length (SPEC §4.6), so those
are read with ranged requests (consecutive blobs together, up to
``RANGE_WINDOW`` bytes) and nothing else of the link is downloaded.  The
header digest is checked and the header must name the link's versions; every
blob read is checked against its checksum before it is decompressed, as a
local file's are, and kept until ``close``: an apply is undone from those
bytes, never by reading the store again.  Blobs of other tensors are never
read, so a damaged blob elsewhere in the link goes unnoticed here, as in a
partial pull.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from typing import BinaryIO

from ...errors import StorageError
from ...format.header import Chunk, Header
from ...ops.decoder import plan_steps
from ..model.manifest import Link, LinkPart, Manifest
from ..storage.base import Progress, Storage
from .fetch import check_link_header
from .partial import Blobs, StoredDelta, read_remote_header


class RemoteDelta:
    """``header`` and ``payload(chunk)`` of a stored delta, as an open ``DeltaFile``
    has them, reading the blobs of the tensors ``keep`` selects on demand."""

    def __init__(
        self, storage: Storage, m: Manifest, link: Link, keep: Callable[[str], bool],
        progress: Progress | None = None,
    ) -> None:  # fmt: skip
        self._open(storage, link, keep, progress, None)
        check_link_header(m, link, self.header)

    def _open(
        self, storage: Storage, stored: StoredDelta, keep: Callable[[str], bool],
        progress: Progress | None, expect: str | None,
    ) -> None:  # fmt: skip
        header, data_start = read_remote_header(storage, stored, progress, expect)
        self.header: Header = header
        chunks = [c for t in header.tensors if keep(t.name) for c in t.chunks if c.in_data]
        chunks.sort(key=lambda c: c.offset)
        self._blobs = Blobs(storage, stored.key, data_start, chunks, progress)
        self._keep = keep
        self._lock = threading.Lock()
        self._held: dict[int, tuple[int, int]] = {}  # blob offset -> (place, length) in _spill
        self._spill: BinaryIO | None = None

    def payload(self, chunk: Chunk) -> bytes:
        """The decompressed payload of a chunk's blob (checksum checked).  A blob is read
        from storage once: its checked bytes are kept (in a private temporary file) and
        used again, so undoing an apply uses the very bytes it applied, whatever the
        store would answer to a second read."""
        if chunk.inline is not None:
            return self._blobs.get(chunk)
        with self._lock:  # one window for all threads; checks and decompression run outside
            held = self._held.get(chunk.offset)
            blob = self._blobs.raw(chunk) if held is None else self._read_held(*held)
        payload = self._blobs.check(chunk, blob)
        if held is None:
            with self._lock:
                self._hold(chunk.offset, blob)
        return payload

    def _hold(self, offset: int, blob: bytes) -> None:
        if offset in self._held:
            return
        try:
            if self._spill is None:
                # Lives until ``close``; no name, so nothing else can open it.
                self._spill = tempfile.TemporaryFile(prefix="wdelta-applied-")  # noqa: SIM115
            place = self._spill.seek(0, os.SEEK_END)
            self._spill.write(blob)
            self._spill.flush()
        except OSError as exc:
            raise StorageError(f"cannot keep the blobs read of {self._blobs.key}: {exc}") from exc
        self._held[offset] = (place, len(blob))

    def _read_held(self, place: int, length: int) -> bytes:
        assert self._spill is not None
        try:
            return os.pread(self._spill.fileno(), length, place)
        except OSError as exc:
            raise StorageError(f"cannot read the blobs kept of {self._blobs.key}: {exc}") from exc

    def hold_removed(self, reverse: bool) -> None:
        """Read now, and keep, the blobs of the selected tensors an apply in this direction
        removes, so that undoing it brings them back from bytes already held."""
        for step in plan_steps(self.header, reverse):
            if step.dst_digest is None and self._keep(step.entry.name):
                for chunk in step.entry.chunks:
                    if chunk.in_data:
                        self.payload(chunk)

    def close(self) -> None:
        """Drop the blobs kept (once the version they moved to is accepted)."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        self._held.clear()


class PartDelta(RemoteDelta):
    """One part of a multi-part link read by ranges, its header checked against the digest
    the manifest lists (MP-5, if it does); the caller checks the set of parts against the
    link (``parts.check_parts``)."""

    def __init__(
        self, storage: Storage, part: LinkPart, keep: Callable[[str], bool],
        progress: Progress | None = None,
    ) -> None:  # fmt: skip
        self._open(storage, part, keep, progress, part.header)
