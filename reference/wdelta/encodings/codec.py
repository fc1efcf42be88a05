"""Blob codecs: ``zstd`` (one frame, content size declared) or ``none``.

The decompressed size is recorded in the header and enforced before any
output buffer is allocated: a frame that declares another size, hides its
size, carries trailing bytes or expands past it is refused.
"""

from __future__ import annotations

import threading

import zstandard

from ..errors import EncodingInvalidError, UnsupportedFeatureError

CODECS = ("zstd", "none")
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # Compressor objects are not thread-safe; keep one per thread and level.
    cache: dict[int, zstandard.ZstdCompressor] = _local.__dict__.setdefault("cctx", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def compress(raw: bytes, level: int) -> tuple[str, bytes]:
    """(codec, stored bytes): zstd unless it would not shrink the payload."""
    stored = _compressor(level).compress(raw)
    if len(stored) >= len(raw):
        return "none", raw
    return "zstd", stored


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
    dobj = zstandard.ZstdDecompressor().decompressobj()
    try:
        raw = dobj.decompress(stored)
    except zstandard.ZstdError as exc:
        raise EncodingInvalidError(f"zstd frame is corrupt: {exc}") from exc
    if not dobj.eof or dobj.unused_data or len(raw) != raw_length:
        raise EncodingInvalidError("zstd blob is incomplete, has trailing bytes or lies about size")
    return raw
