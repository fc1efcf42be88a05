"""Partial checkpoints: a node that serves only some tensors (a tensor-parallel rank).

A partial checkpoint is one safetensors file holding the tensors whose names
match a pattern, with ``__metadata__`` recording the chain version and the
pattern.  A link is applied to it by reading, with ranged requests, only the
delta's prefix, header and the blobs of the matching tensors (the header
gives every blob's offset and length); each blob's checksum and each input
and output tensor digest is still checked.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import blake3

from ...checkpoint.safetensors_header import build_header
from ...checkpoint.source import Checkpoint, Words, open_checkpoint
from ...codec import blob
from ...codec import chunk as chunk_codec
from ...errors import (
    BaseMismatchError,
    ChecksumMismatchError,
    DeltaFormatError,
    LimitExceededError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
)
from ...format.container import PREFIX_SIZE, parse_prefix
from ...format.digest import new_hasher
from ...format.header import Chunk, Header, parse_header
from ...io.atomic import atomic_file
from ...io.filekind import naming
from ...io.output_file import pwrite_all
from ...ops.decoder import Step, check_digests, init_file, plan_steps
from ..model.manifest import Link
from ..storage.base import Progress, Storage
from .local import TENSORS_KEY, VERSION_KEY

# Consecutive blobs of a tensor are fetched together up to this many bytes,
# which bounds memory while keeping the number of requests small.
RANGE_WINDOW = 32 << 20


def matches(name: str, pattern: str) -> bool:
    """Does tensor ``name`` match the comma-separated glob ``pattern``?"""
    return any(fnmatch.fnmatchcase(name, p.strip()) for p in pattern.split(","))


class StoredDelta(Protocol):
    """A stored delta file as a manifest lists it: a link, or one part of a link."""

    @property
    def key(self) -> str: ...
    @property
    def size(self) -> int: ...


def read_remote_header(
    storage: Storage, link: StoredDelta, progress: Progress | None = None,
    expect: str | None = None,
) -> tuple[Header, int]:  # fmt: skip
    """The validated header of a stored delta and its data section's offset; with
    ``expect``, the hex BLAKE3 its header must have (a digest from signed data or the
    writer's own computation, not the one in the same file) → checksum-mismatch."""
    about_file = (DeltaFormatError, LimitExceededError, UnsupportedFeatureError,
                  UnsupportedVersionError)  # fmt: skip
    with naming(f"{storage.url.rstrip('/')}/{link.key}", *about_file):
        prefix = storage.read_range(link.key, 0, PREFIX_SIZE)
        n, digest, d = parse_prefix(prefix, link.size)
        if expect is not None and digest.hex() != expect:
            raise ChecksumMismatchError(
                f"{link.key}: its header digest {digest.hex()[:16]} is not {expect[:16]}, "
                "the one listed for it: not the part written"
            )
        header_bytes = storage.read_range(link.key, PREFIX_SIZE, n)
        if progress is not None:
            progress(PREFIX_SIZE + n)
        if blake3.blake3(header_bytes).digest() != digest:
            raise ChecksumMismatchError("header digest mismatch")
        return parse_header(header_bytes, d), PREFIX_SIZE + n


@dataclass
class Blobs:
    """A window of one stored delta's data section, refilled on demand."""

    storage: Storage
    key: str
    data_start: int
    chunks: list[Chunk]
    progress: Progress | None
    lo: int = 0
    buf: bytes = b""

    def get(self, chunk: Chunk) -> bytes:
        """The decompressed payload of ``chunk`` (checksum checked)."""
        if chunk.inline is not None:  # in the header, which its digest covered
            return blob.decompress(chunk.codec, chunk.inline, chunk.raw_length)
        return self.check(chunk, self.raw(chunk))

    def raw(self, chunk: Chunk) -> bytes:
        """The stored blob of ``chunk``, unchecked."""
        if not self.lo <= chunk.offset <= chunk.offset + chunk.length <= self.lo + len(self.buf):
            self._fill(chunk)
        return self.buf[chunk.offset - self.lo : chunk.offset - self.lo + chunk.length]

    def check(self, chunk: Chunk, data: bytes) -> bytes:
        """The decompressed payload of ``data``, once its checksum is the chunk's."""
        if blake3.blake3(data).hexdigest() != chunk.checksum:
            raise ChecksumMismatchError(f"{self.key}: blob at {chunk.offset}: checksum mismatch")
        return blob.decompress(chunk.codec, data, chunk.raw_length)

    def _fill(self, chunk: Chunk) -> None:
        """Fetch ``chunk`` and the wanted blobs right after it, up to RANGE_WINDOW bytes."""
        end = chunk.offset + chunk.length
        for c in self.chunks:
            if c.offset == end and c.offset + c.length - chunk.offset <= RANGE_WINDOW:
                end += c.length
        self.lo = chunk.offset
        self.buf = self.storage.read_range(self.key, self.data_start + self.lo, end - self.lo)
        if self.progress is not None:
            self.progress(len(self.buf))


def apply_tensor(
    header: Header, step: Step, ckpt: Checkpoint, blobs: Blobs, fd: int, out_offset: int
) -> None:
    """Decode one tensor's step chunk by chunk from ``blobs`` (ranged reads of a stored
    delta) and write it at ``out_offset`` of ``fd``, checking both sides' digests; the
    input side is read from ``ckpt``.  Partial pulls and multi-part links share it."""
    entry = step.entry
    nbytes = entry.elements * entry.dtype.size
    hashers = (new_hasher(1, nbytes), new_hasher(1, nbytes))
    count = -(-entry.elements // header.chunk_elements)
    for i in range(count):
        start, m = header.chunk_span(entry, i)
        src: Words | None = None
        if step.src_digest is not None:
            src = ckpt.tensors[entry.name].read(start, m)
            hashers[0].update(src.data.cast("B"))
        chunk = step.chunk(i)
        if chunk.encoding == "unchanged":
            assert src is not None
            dst = src
        else:
            dst = chunk_codec.decode(
                chunk.encoding, chunk.transform, blobs.get(chunk), src, m,
                entry.dtype.word, step.reverse, chunk.changed, header.coded_values,
            )  # fmt: skip
        hashers[1].update(dst.data.cast("B"))
        pwrite_all(fd, dst.data.cast("B"), out_offset + start * entry.dtype.size)
    check_digests(step, hashers[0].hexdigest(), hashers[1].hexdigest())


def apply_partial(
    storage: Storage, link: Link, header: Header, data_start: int, reverse: bool,
    src: Path, pattern: str, out: Path, progress: Progress | None = None,
) -> None:  # fmt: skip
    """Apply a stored delta to the partial checkpoint ``src``; write ``out`` atomically."""
    steps = [s for s in plan_steps(header, reverse) if matches(s.entry.name, pattern)]
    wanted = {s.entry.name: (s.entry.dtype, s.entry.shape) for s in steps if s.src_digest}
    outputs = [s for s in steps if s.dst_digest is not None]
    digest = header.raw["base" if reverse else "target"]["digest"]
    layout = build_header(
        [(s.entry.name, s.entry.dtype, s.entry.shape) for s in outputs],
        {VERSION_KEY: digest, TENSORS_KEY: pattern},
    )
    offsets = {t.name: layout.data_start + t.begin for t in layout.tensors}
    chunks = [c for s in outputs for c in s.entry.chunks if c.in_data]
    blobs = Blobs(storage, link.key, data_start, chunks, progress)
    with open_checkpoint(src) as ckpt:
        have = {t.name: (t.dtype, t.shape) for t in ckpt.tensors.values()}
        if have != wanted:
            raise BaseMismatchError(f"{src} does not hold the tensors matching {pattern!r}")
        with atomic_file(out, overwrite=True) as fd:
            init_file(fd, layout)
            for step in outputs:
                apply_tensor(header, step, ckpt, blobs, fd, offsets[step.entry.name])


def extract(full: Path, pattern: str, version_digest: str, out: Path) -> None:
    """Write the partial checkpoint of ``full`` (verified by the caller) to ``out``."""
    with open_checkpoint(full) as ckpt:
        tensors = [t for t in ckpt.sorted_tensors() if matches(t.name, pattern)]
        layout = build_header(
            [(t.name, t.dtype, t.shape) for t in tensors],
            {VERSION_KEY: version_digest, TENSORS_KEY: pattern},
        )
        offsets = {t.name: layout.data_start + t.begin for t in layout.tensors}
        with atomic_file(out, overwrite=True) as fd:
            init_file(fd, layout)
            for t in tensors:
                step = 1 << 22
                for start in range(0, t.elements, step):
                    words = t.read(start, min(step, t.elements - start))
                    pwrite_all(fd, words.data.cast("B"), offsets[t.name] + start * t.dtype.size)
