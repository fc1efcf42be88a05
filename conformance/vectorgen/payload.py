"""Chunk payloads written from the spec text, independently of the reference.

The reference decoder must read what this module writes; had both been built
from the same helpers, a shared misreading of the spec (a bit order, a zigzag
sign) would pass unnoticed.  Everything here works on Python integers and bit
lists: slow, but obviously the rule, and the vectors are small.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

BITMAP, RICE = 0, 1
MAX_K = 31


def pack_bits(bits: Sequence[int]) -> bytes:
    """LSB-first bit stream: stream bit n is bit (n & 7) of byte (n >> 3)."""
    if not bits:
        return b""
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little").tobytes()


def zigzag(d: int, bits: int) -> int:
    """Zigzag code of the ``bits``-bit two's-complement word ``d``."""
    mask = (1 << bits) - 1
    sign = mask if d >> (bits - 1) else 0
    return ((d << 1) ^ sign) & mask


def transformed(kind: str, base: Sequence[int], target: Sequence[int], size: int) -> list[int]:
    """Transformed words: ``xor`` t ^ b, ``sub`` zigzag((t - b) mod 2^w)."""
    bits = 8 * size
    if kind == "xor":
        return [t ^ b for b, t in zip(base, target, strict=True)]
    assert kind == "sub", kind
    mask = (1 << bits) - 1
    return [zigzag((t - b) & mask, bits) for b, t in zip(base, target, strict=True)]


def planes(values: Sequence[int], size: int) -> bytes:
    """Byte planes: plane j holds byte j of every word, planes j = 0..size-1."""
    return b"".join(bytes((v >> (8 * j)) & 0xFF for v in values) for j in range(size))


def gaps(positions: Sequence[int]) -> list[int]:
    """g_0 = p_0, g_i = p_i - p_(i-1) - 1."""
    out, prev = [], -1
    for p in positions:
        out.append(p - prev - 1)
        prev = p
    return out


def bitmap(positions: Sequence[int], m: int, nbits: int | None = None) -> bytes:
    """ceil(m/8) bytes with bit p set for each position (``nbits`` overrides m)."""
    bits = [0] * (8 * ((m + 7) // 8) if nbits is None else nbits)
    for p in positions:
        bits[p] = 1
    return pack_bits(bits)


def rice_streams(gap_list: Sequence[int], k: int) -> tuple[bytes, bytes]:
    """(unary stream, remainder stream) of the gaps with parameter k."""
    unary: list[int] = []
    rem: list[int] = []
    for g in gap_list:
        unary += [0] * (g >> k) + [1]
        rem += [(g >> j) & 1 for j in range(k)]
    return pack_bits(unary), pack_bits(rem)


def rice_size(gap_list: Sequence[int], k: int) -> int:
    """Bytes of both Rice streams plus their u64 length field."""
    unary_bits = sum((g >> k) + 1 for g in gap_list)
    return 8 + (unary_bits + 7) // 8 + (len(gap_list) * k + 7) // 8


def best_k(gap_list: Sequence[int]) -> int:
    """The Rice parameter with the smallest streams (smallest k on ties)."""
    return min(range(MAX_K + 1), key=lambda k: (rice_size(gap_list, k), k))


def sparse_head(coding: int, k: int, count: int) -> bytes:
    """u8 position coding, u8 k, 6 zero bytes, u64 count."""
    return struct.pack("<BB6xQ", coding, k, count)


def sparse(
    positions: Sequence[int], values: Sequence[int], m: int, size: int, coding: int, k: int
) -> bytes:
    """A complete sparse payload (head, positions, value planes)."""
    head = sparse_head(coding, k, len(positions))
    if coding == BITMAP:
        return head + bitmap(positions, m) + planes(values, size)
    unary, rem = rice_streams(gaps(positions), k)
    return head + struct.pack("<Q", len(unary)) + unary + rem + planes(values, size)
