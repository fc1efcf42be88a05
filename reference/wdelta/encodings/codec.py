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
MAX_WINDOW = 1 << 27
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


def compress(raw: bytes | memoryview, level: int | None) -> tuple[str, bytes | memoryview]:
    """(codec, stored bytes): zstd unless it would not shrink the payload.

    ``level`` None selects the "auto" policy: :data:`AUTO_SMALL_LEVEL` below
    :data:`AUTO_SMALL_BYTES`, :data:`AUTO_PARAMS` from there on.
    """
    if level is None and len(raw) < AUTO_SMALL_BYTES:
        level = AUTO_SMALL_LEVEL
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
    params = zstandard.get_frame_parameters(stored)
    if params.window_size > MAX_WINDOW or params.dict_id:
        raise EncodingInvalidError("zstd frame needs a dictionary or a window over 128 MiB")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    try:
        raw = dobj.decompress(stored)
    except zstandard.ZstdError as exc:
        raise EncodingInvalidError(f"zstd frame is corrupt: {exc}") from exc
    if not dobj.eof or dobj.unused_data or len(raw) != raw_length:
        raise EncodingInvalidError("zstd blob is incomplete, has trailing bytes or lies about size")
    return raw
