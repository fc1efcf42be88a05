"""Coded values (feature ``coded-values``, SPEC §7.6.6): split levels, then a final coding.

This module reads a section and writes one from the levels and final coding
the encoder chose (:mod:`wdelta.policy.values` chooses them).

The changed words of an optimizer step are very skewed (for ``sub``, 88-92%
are one ULP up or down), and zstd's Huffman literals cannot go below 1 bit
per byte.  Level j names a split word w_j and Rice-codes (§7.6.3) the
positions, among the values still *open*, of those that are not w_j; the
others are w_j.  A level costs close to n_j·H(p_j) bits instead of zstd's
n_j bits per byte plane.  The values still open after the last level are
stored as byte planes (§7.2) or as Rice-coded words.

Layout of the section (s-byte words, ``c`` values): u8 L; L split words;
per level u8 k_j, ULEB128 U_j, U_j unary bytes, ceil(c_j·k_j/8) remainder
bytes; u8 final coding (0 planes, 1 Rice); the final values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError, IndexOutOfRangeError
from . import leb128, native, planes, positions

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]
Positions = positions.Positions
FEATURE = "coded-values"
MAX_LEVELS = 8
PLANES, RICE = 0, 1


class _Reader:
    """Fields read in order from a values section; nothing is read past its end."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.at = 0

    def take(self, n: int) -> memoryview:
        if n > len(self.view) - self.at:
            raise EncodingInvalidError("coded values: a field runs past the end of the payload")
        out = self.view[self.at : self.at + n]
        self.at += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def uleb(self) -> int:
        value, self.at = leb128.decode(self.view, self.at)
        return value


def decode(view: memoryview, count: int, word: np.dtype[Any]) -> Words:
    """The ``count`` values (dtype ``word``) of a coded section that fills ``view``."""
    reader = _Reader(view)
    levels = reader.u8()
    if levels > MAX_LEVELS:
        raise EncodingInvalidError(f"coded values: {levels} split levels, at most {MAX_LEVELS}")
    splits = np.frombuffer(reader.take(levels * word.itemsize), dtype=word)
    if len(set(splits.tolist())) != levels:
        raise EncodingInvalidError("coded values: two split words are equal")
    out: Words = np.empty(count, dtype=word)
    still_open: Positions | None = None  # None: every value is open
    for split in splits:
        keep = _level(reader, count if still_open is None else len(still_open))
        if still_open is None:
            out[:] = split
            still_open = keep
        else:
            out[still_open] = split
            still_open = still_open.take(keep)
    final = _final(reader, count if still_open is None else len(still_open), word)
    if reader.at != len(view):
        raise EncodingInvalidError("coded values: bytes after the final values")
    if still_open is None:
        return final
    out[still_open] = final
    return out


def _unary(reader: _Reader) -> tuple[memoryview, Positions]:
    """A ULEB128 length, that many unary bytes, and the stream indices of its 1 bits;
    the last byte must hold a 1 bit."""
    unary = reader.take(reader.uleb())
    ones = positions.unary_ones_of(unary)
    if len(unary) and (not len(ones) or (int(ones[-1]) >> 3) + 1 != len(unary)):
        raise EncodingInvalidError("coded values: a unary stream's last byte holds no 1 bit")
    return unary, ones


def _level(reader: _Reader, n: int) -> Positions:
    """Indices, among the ``n`` open values, of those that stay open at one level."""
    k = reader.u8()
    if k > positions.MAX_RICE_K:
        raise EncodingInvalidError(f"coded values: level Rice parameter {k} > 31")
    unary, ones = _unary(reader)
    if len(ones) > n:
        raise IndexOutOfRangeError(f"coded values: {len(ones)} positions among {n} open values")
    remainders = reader.take((len(ones) * k + 7) // 8)
    if not len(ones):
        return np.empty(0, dtype=np.int64)
    return positions.rice_decode(unary, remainders, k, len(ones), n, ones)


def _final(reader: _Reader, n: int, word: np.dtype[Any]) -> Words:
    """The ``n`` values still open after the last level."""
    coding = reader.u8()
    if coding == PLANES:
        return planes.join(reader.take(n * word.itemsize), n, word)
    if coding != RICE:
        raise EncodingInvalidError(f"coded values: final coding {coding} is not 0 or 1")
    bits = 8 * word.itemsize
    k = reader.u8()
    if k >= bits:
        raise EncodingInvalidError(f"coded values: final Rice parameter {k} >= {bits}")
    _, ones = _unary(reader)
    if len(ones) != n:
        raise EncodingInvalidError(f"coded values: {len(ones)} final codes, {n} values open")
    remainders = reader.take((n * k + 7) // 8)
    if not n:
        return np.empty(0, dtype=word)
    quotients = positions.gaps_of(ones)
    if int(quotients.max()) > ((1 << bits) - 1) >> k:
        raise EncodingInvalidError(f"coded values: a final value is {bits} bits or more")
    wide = quotients.astype(np.uint64) << np.uint64(k)
    if k:
        wide |= _fields(remainders, n, k)
    result: Words = wide.astype(word)
    return result


def _fields(data: memoryview, count: int, k: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The ``count`` k-bit fields (1 <= k <= 63) of a remainder stream; its padding
    bits must be zero.  Field i is read from the 8 (for k > 56: 9) bytes at bit i·k."""
    if k <= positions.MAX_RICE_K:
        return positions.remainder_fields(data, count, k).astype(np.uint64)
    raw = np.frombuffer(data, dtype=np.uint8)
    used = count * k
    if used & 7 and int(raw[-1]) >> (used & 7):
        raise EncodingInvalidError(
            "remainder stream: padding bits after the last field are not zero"
        )
    padded = np.zeros(len(raw) + 9, dtype=np.uint8)
    padded[: len(raw)] = raw
    start = np.arange(count, dtype=np.uint64) * np.uint64(k)
    byte = (start >> np.uint64(3)).astype(np.intp)
    shift = start & np.uint64(7)
    window = np.zeros(count, dtype=np.uint64)
    for t in range(8):
        window |= padded[byte + t].astype(np.uint64) << np.uint64(8 * t)
    value: np.ndarray[Any, np.dtype[np.uint64]] = window >> shift
    # The ninth byte's bits land above bit 63 - shift; for shift 0 they fall off.
    value |= (padded[byte + 8].astype(np.uint64) << (np.uint64(63) - shift)) << np.uint64(1)
    value &= np.uint64((1 << k) - 1)
    return value


@dataclass(frozen=True)
class Coded:
    """A coded values section and where its parts start (offsets into ``data``)."""

    data: bytes
    sections: list[int]


@dataclass(frozen=True)
class Level:
    """One split level: its word, its bytes from ``k_j`` on (the remainder stream at
    ``rem_at``) and the values it leaves open."""

    split: Words
    data: bytes
    rem_at: int
    rest: Words


def encode_level(
    rest: Words, split: Words, mask: np.ndarray[Any, np.dtype[np.bool_]], keep: Positions, k: int
) -> Level:
    """The level that splits ``split`` off the open values ``rest`` with Rice parameter
    ``k``; ``mask`` is ``rest != split`` and ``keep`` its set indices (k 0 if none)."""
    if not len(keep):
        unary, rem = b"", b""
    elif k == 0:
        # The unary stream of k = 0 is the mask itself up to the byte of its last 1 bit.
        unary, rem = np.packbits(mask[: int(keep[-1]) + 1], bitorder="little").tobytes(), b""
    else:
        unary, rem = positions.rice_encode(positions.gaps_of(keep), k)
    return level(split, k, unary, rem, rest.take(keep))


def level(split: Words, k: int, unary: bytes, rem: bytes, rest: Words) -> Level:
    """The level of split word ``split`` whose Rice streams (parameter k) are ``unary``
    and ``rem``, leaving the values ``rest`` open."""
    head = bytes([k]) + leb128.encode(len(unary))
    return Level(split, head + unary + rem, len(head) + len(unary), rest)


def serialize(levels: list[Level], rest: Words, final: int, k: int) -> Coded:
    """The section of the split ``levels`` in order, then the values ``rest`` they
    leave open with final coding ``final`` (for :data:`RICE`, parameter ``k``)."""
    parts = [bytes([len(levels)]), *(level.split.tobytes() for level in levels)]
    at = sum(len(p) for p in parts)
    sections = []
    for level in levels:
        parts.append(level.data)
        sections.append(at + level.rem_at)
        at += len(level.data)
    sections.append(at)
    if final == PLANES:
        parts.append(bytes([PLANES]))
        sections += [at + 1 + j * len(rest) for j in range(1, rest.dtype.itemsize)]
        parts.append(bytes(planes.split(rest)))
    else:
        parts.append(_rice_final(rest, k))
    return Coded(b"".join(parts), sections)


def _rice_final(rest: Words, k: int) -> bytes:
    """The final coding byte, k, then the Rice streams of the words ``rest``."""
    if not len(rest):  # no value left open: an empty unary stream
        return bytes([RICE, k, 0])
    wide = rest.astype(np.uint64)
    streams = native.rice_words(wide, k) if native.usable(wide) else None
    if streams is None:
        ones = wide >> np.uint64(k)
        ones += np.uint64(1)
        np.cumsum(ones, out=ones)
        ones -= np.uint64(1)
        streams = positions.unary_stream(ones), _pack_fields(wide, k)
    unary, rem = streams
    return b"".join((bytes([RICE, k]), leb128.encode(len(unary)), unary, rem))


def _pack_fields(wide: np.ndarray[Any, np.dtype[np.uint64]], k: int) -> bytes:
    """The LSB-first stream of the low k bits of each word (0 <= k <= 63)."""
    if k == 0:
        return b""
    if k <= 8:
        return positions.pack_fields(wide.astype(np.uint8) & np.uint8((1 << k) - 1), k)
    count = len(wide)
    value = wide & np.uint64((1 << k) - 1)
    start = np.arange(count, dtype=np.uint64) * np.uint64(k)
    byte = (start >> np.uint64(3)).astype(np.intp)
    shift = start & np.uint64(7)
    low = value << shift
    high = (value >> (np.uint64(63) - shift)) >> np.uint64(1)
    nbytes = (count * k + 7) // 8
    out = np.zeros(nbytes + 9, dtype=np.float64)
    # Fields occupy disjoint bits, so adding each field's bytes into place is an OR.
    for t in range(8):
        out += np.bincount(
            byte + t, weights=(low >> np.uint64(8 * t)) & np.uint64(255), minlength=nbytes + 9
        )
    out += np.bincount(byte + 8, weights=high & np.uint64(255), minlength=nbytes + 9)
    return out[:nbytes].astype(np.uint8).tobytes()
