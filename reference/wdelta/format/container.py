"""The delta file container: 64-byte prefix, header, data section.

Prefix (SPEC §3): magic ``89 57 44 45 4C 54 41 0A``, u32 version,
u32 reserved (0), u64 header length N (multiple of 8), 32-byte BLAKE3 of the
header, u64 data length D.  The file is exactly 64 + N + D bytes long.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from ..arguments import as_path
from ..checkpoint.source import pread_into
from ..codec.blob import decompress
from ..errors import (
    BadMagicError,
    ChecksumMismatchError,
    HeaderInvalidError,
    LimitExceededError,
    StorageError,
    TruncatedError,
    UnsupportedVersionError,
    WdeltaError,
)
from ..io.filekind import (
    WDELTA_MAGIC,
    delta_refusal,
    folder_refusal,
    naming,
    os_message,
    sniff_fd,
)
from ..limits import MAX_HEADER_BYTES
from .digest import digest_bytes
from .header import FORMAT_VERSION, Chunk, Header, entries_json, parse_header

MAGIC = WDELTA_MAGIC
PREFIX = struct.Struct("<8sII Q32sQ".replace(" ", ""))
PREFIX_SIZE = 64


def pack_prefix(header: bytes, data_length: int) -> bytes:
    """The 64-byte prefix for padded header bytes and a data section length."""
    digest = blake3.blake3(header).digest()
    return PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header), digest, data_length)


def parse_prefix(prefix: bytes, file_size: int) -> tuple[int, bytes, int]:
    """(N, header digest, D) from the first bytes of a file of ``file_size``."""
    if prefix[:8] != MAGIC[: len(prefix[:8])]:
        raise BadMagicError("not a wdelta file (bad magic bytes)")
    if len(prefix) < PREFIX_SIZE:
        raise TruncatedError(f"file is {len(prefix)} bytes, shorter than the 64-byte prefix")
    _magic, version, reserved, n, digest, d = PREFIX.unpack(prefix[:PREFIX_SIZE])
    if version != FORMAT_VERSION:
        raise UnsupportedVersionError(f"format version {version}; this reader implements 1")
    if reserved != 0:
        raise HeaderInvalidError("reserved prefix field is not zero")
    if n > MAX_HEADER_BYTES:
        raise LimitExceededError(f"header of {n} bytes exceeds the limit {MAX_HEADER_BYTES}")
    if n < 2 or n % 8:
        raise HeaderInvalidError(f"header length {n} is not a positive multiple of 8")
    expected = PREFIX_SIZE + n + d
    if file_size < expected:
        raise TruncatedError(f"file is {file_size} bytes, prefix describes {expected}")
    if file_size > expected:
        raise HeaderInvalidError(f"file has {file_size - expected} bytes past its data section")
    return n, digest, d


@dataclass
class DeltaFile:
    """An open, validated delta file; blobs are read by positioned reads."""

    path: Path
    header: Header
    header_length: int
    data_length: int
    _fd: int

    @property
    def data_start(self) -> int:
        return PREFIX_SIZE + self.header_length

    def header_json(self) -> dict[str, Any]:
        """The header's whole JSON object in the v1 form: ``header.raw`` with its tensor
        entries, read from the file again (``raw`` does not keep them)."""
        data = bytearray(self.header_length)
        pread_into(self._fd, memoryview(data), PREFIX_SIZE, f"{self.path}: header")
        return {**self.header.raw, "tensors": entries_json(bytes(data))}

    def __enter__(self) -> DeltaFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def read_blob(self, chunk: Chunk) -> bytes:
        """The stored bytes of a chunk's blob, checksum verified."""
        buf = bytearray(chunk.length)
        where = f"{self.path}: blob at data offset {chunk.offset}"
        pread_into(self._fd, memoryview(buf), self.data_start + chunk.offset, where)
        if digest_bytes(buf) != chunk.checksum:
            raise ChecksumMismatchError(f"{where}: checksum mismatch")
        return bytes(buf)

    def payload(self, chunk: Chunk) -> bytes:
        """The decompressed payload of a chunk's blob (checksum and size checked; an
        inline blob is covered by the header digest, checked at open)."""
        blob = chunk.inline if chunk.inline is not None else self.read_blob(chunk)
        with naming(self.path, WdeltaError):
            return decompress(chunk.codec, blob, chunk.raw_length)


def _read_header(fd: int, path: Path) -> tuple[Header, int, int]:
    """The validated header of the open delta ``fd``, its length N and data length D."""
    size = os.fstat(fd).st_size
    prefix = os.pread(fd, PREFIX_SIZE, 0)
    if size == 0 or prefix[:8] != MAGIC[: len(prefix[:8])]:
        raise delta_refusal(path, sniff_fd(fd, path))
    n, digest, d = parse_prefix(prefix, size)
    header_bytes = bytearray(n)
    pread_into(fd, memoryview(header_bytes), PREFIX_SIZE, f"{path}: header")
    if blake3.blake3(header_bytes).digest() != digest:
        raise ChecksumMismatchError("header digest mismatch: the header is corrupt")
    return parse_header(bytes(header_bytes), d), n, d


def open_delta(path: str | os.PathLike[str]) -> DeltaFile:
    """Open a delta file and validate its prefix and header (not its blobs)."""
    p = as_path(path, "delta")
    if p.is_dir():
        raise folder_refusal(p)
    if p.exists() and not p.is_file():
        raise StorageError(f"{p} is not a regular file")
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as exc:
        raise StorageError(os_message(p, exc)) from exc
    try:
        with naming(p, WdeltaError):
            header, n, d = _read_header(fd, p)
    except OSError as exc:
        os.close(fd)
        raise StorageError(os_message(p, exc)) from exc
    except BaseException:
        os.close(fd)
        raise
    return DeltaFile(p, header, n, d, fd)
