"""Blob codecs (SPEC §8): ``zstd`` (one frame, content size declared) or ``none``.

The decompressed size is recorded in the header and enforced before any
output buffer is allocated: a frame that declares another size, hides its
size, carries trailing bytes or expands past it is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import zstandard

from ..errors import EncodingInvalidError, UnsupportedFeatureError
from ..format.names import Codec
from ..limits import MAX_ZSTD_WINDOW

_local = threading.local()


# The "auto" policy for payloads of AUTO_SMALL_BYTES and more: zstd's fast
# strategy with a 32 KiB window, a tiny hash table and 7-byte minimum matches.
# Measured on the bench payloads of 64 KiB and more (sparse values and
# positions at 2-30% density, fp8 and bf16 dense and full): 2-7% smaller than
# levels 1 and 3 and 1.3-1.6x faster than level 1.  Value planes hold few
# distinct bytes, so short matches are frequent but cost more to code than the
# literals they replace; the 32 KiB window caps blocks at 32 KiB, whose Huffman
# tables follow the local statistics more closely.  Smaller payloads (sparse
# chunks at 0.1%, fp8 chunks of small tensors) are 4-6% smaller at level 3,
# and cost little at any level.
AUTO_SMALL_BYTES = 1 << 16
AUTO_SMALL_LEVEL = 3
AUTO_PARAMS = {
    "strategy": zstandard.STRATEGY_FAST,
    "window_log": 15,
    "hash_log": 6,
    "chain_log": 6,
    "search_log": 1,
    "min_match": 7,
    "target_length": 0,
}


def _compressor(level: int | None) -> zstandard.ZstdCompressor:
    # Compressor objects are not thread-safe; keep one per thread and level.
    cache: dict[int | None, zstandard.ZstdCompressor] = _local.__dict__.setdefault("cctx", {})
    if level not in cache:
        if level is None:
            params = zstandard.ZstdCompressionParameters(**AUTO_PARAMS, write_content_size=True)
            cache[level] = zstandard.ZstdCompressor(compression_params=params)
        else:
            cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def compress(
    raw: bytes | memoryview, level: int | None, sections: Sequence[int] = ()
) -> tuple[Codec, bytes | memoryview]:
    """(codec, stored bytes): zstd unless it would not shrink the payload.

    ``level`` None selects the "auto" policy: :data:`AUTO_SMALL_LEVEL` below
    :data:`AUTO_SMALL_BYTES`, :data:`AUTO_PARAMS` from there on.  With
    ``sections`` (increasing offsets) and at least :data:`SECTIONS_MIN_BYTES`,
    a zstd block ends at each of them, still in one frame (see
    :func:`_compress_sections`).
    """
    if level is None and len(raw) < AUTO_SMALL_BYTES:
        level = AUTO_SMALL_LEVEL
    cctx = _compressor(level)
    if sections and len(raw) >= SECTIONS_MIN_BYTES:
        stored = _compress_sections(cctx, memoryview(raw).cast("B"), sections)
    else:
        stored = cctx.compress(raw)
    if len(stored) >= len(raw):
        return "none", raw
    return "zstd", stored


# Far below this, a block per section costs more in block headers and tables
# than it saves.  Measured on the real trace: 1 KiB bf16 norm payloads grow by
# 4-8 bytes each, while fp8 sparse payloads of 1-3 KiB shrink by 2.8% in all
# (from 2 KiB on, 0.7% less gain for fp8 lr 1e-6).
SECTIONS_MIN_BYTES = 1 << 10


def _compress_sections(
    cctx: zstandard.ZstdCompressor, raw: memoryview, sections: Sequence[int]
) -> bytes:
    """One frame (content size declared) whose blocks end at every section boundary.

    A payload's sections (position streams, then one byte plane per value
    byte) have unrelated statistics, yet zstd codes all the literals of a
    block with one Huffman table: the near-uniform Rice remainders and low
    mantissa bytes spoil the table of the skewed exponent and fp8 value bytes.
    A block per section gets its own table (or is stored raw) for a few bytes
    of block header.  Measured on the real trace (step pair 6-7): data
    sections 3.1-4.0% smaller (bf16 lr 1e-6 1.144 -> 1.100 of the bound, fp8
    lr 1e-5 1.142 -> 1.102, fp8 lr 1e-6 1.176 -> 1.145).
    """
    cobj = cctx.compressobj(size=len(raw))
    parts = []
    start = 0
    for end in sections:
        if start < end < len(raw):
            parts.append(cobj.compress(raw[start:end]))
            parts.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
            start = end
    parts.append(cobj.compress(raw[start:]))
    parts.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
    return b"".join(parts)


def decompress(codec: str, stored: bytes, raw_length: int) -> bytes:
    """The raw payload of exactly ``raw_length`` bytes, or EncodingInvalidError."""
    if codec == "none":
        if len(stored) != raw_length:
            raise EncodingInvalidError(f"codec none: {len(stored)} bytes, expected {raw_length}")
        return stored
    if codec != "zstd":
        raise UnsupportedFeatureError(f"unknown codec {codec!r}")
    try:
        declared = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as exc:
        raise EncodingInvalidError(f"not a zstd frame: {exc}") from exc
    if declared != raw_length:
        raise EncodingInvalidError(
            f"zstd frame declares {declared} bytes, header says {raw_length}"
        )
    params = zstandard.get_frame_parameters(stored)
    if params.window_size > MAX_ZSTD_WINDOW or params.dict_id:
        raise EncodingInvalidError("zstd frame needs a dictionary or a window over 128 MiB")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    try:
        raw = dobj.decompress(stored)
    except zstandard.ZstdError as exc:
        raise EncodingInvalidError(f"zstd frame is corrupt: {exc}") from exc
    if not dobj.eof or dobj.unused_data or len(raw) != raw_length:
        raise EncodingInvalidError("zstd blob is incomplete, has trailing bytes or lies about size")
    return raw
