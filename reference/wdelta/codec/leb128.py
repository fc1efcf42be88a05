"""Unsigned LEB128 integers (SPEC §7.6.6): 7 bits per byte, low group first.

A byte's high bit says another byte follows.  The reader accepts only the
minimal form (no final 0x00 group after the first byte) of a value below
2^64 (at most 10 bytes), so every value has exactly one spelling.
"""

from __future__ import annotations

from ..errors import EncodingInvalidError

MAX_BYTES = 10


def encode(value: int) -> bytes:
    """The minimal LEB128 bytes of ``0 <= value < 2^64``."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"LEB128 value {value} outside 0..2^64-1")
    out = bytearray()
    while True:
        group = value & 0x7F
        value >>= 7
        if value == 0:
            out.append(group)
            return bytes(out)
        out.append(group | 0x80)


def decode(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    """(value, offset after it) read at ``offset``; EncodingInvalidError if the
    bytes end first, the form is not minimal, or the value reaches 2^64."""
    value = 0
    for i in range(MAX_BYTES):
        if offset + i >= len(data):
            raise EncodingInvalidError("ULEB128 integer runs past the end of the payload")
        byte = data[offset + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if byte == 0 and i > 0:
                raise EncodingInvalidError("ULEB128 integer is not in its minimal form")
            if value >> 64:
                raise EncodingInvalidError("ULEB128 integer is 2^64 or more")
            return value, offset + i + 1
    raise EncodingInvalidError(f"ULEB128 integer longer than {MAX_BYTES} bytes")
