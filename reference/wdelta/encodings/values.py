"""Coded values (feature ``coded-values``, SPEC.md §7.6.6): split levels, then a final coding.

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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError, IndexOutOfRangeError
from . import leb128, planes, positions

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
    if len(np.unique(splits)) != levels:
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


def encode(values: Words, planes_bytes: int | None = None) -> Coded | None:
    """The coded section of ``values`` if its estimated size is below the byte planes'.

    ``planes_bytes`` is what the codec made of all the values as byte planes,
    if known: zstd's block and match overheads make that 10-30% more than
    the entropy estimate of :func:`_planes_bytes` on skewed values, and the
    estimates of the final planes are scaled alike.  None when no level pays
    and byte planes beat Rice: the payload is then the v1 form (value coding
    0), which readers without the feature read.
    """
    words, counts = _ranked(values)
    size = values.dtype.itemsize
    # Level 0: the v1 byte planes, or (2 bytes more: L and final coding) Rice.
    best_cost, best_final = _planes_bytes(words, counts, size), PLANES
    scale = 1.0
    if planes_bytes is not None and best_cost:
        scale = max(1.0, planes_bytes / best_cost)
        best_cost = planes_bytes
    cost, final = _final_cost(words, counts, size, scale)
    if final == RICE and 2 + cost < best_cost:
        best_cost, best_final = 2 + cost, RICE
    best_levels: list[_Level] = []
    levels: list[_Level] = []
    spent, rest = 2, values  # L and final-coding bytes
    for j in range(min(MAX_LEVELS, len(words))):
        level = _split(rest, words[j : j + 1].astype(values.dtype))
        levels.append(level)
        spent += size + len(level.data)
        rest = level.rest
        cost, final = _final_cost(words[j + 1 :], counts[j + 1 :], size, scale)
        if spent + cost < best_cost:
            best_cost, best_final, best_levels = spent + cost, final, list(levels)
        # Two words near 45% each (±1 ULP) pay only together: a level that does
        # not improve gets one more, two in a row end the search.
        elif len(levels) - len(best_levels) >= 2 or spent >= best_cost:
            break
        if not len(rest):
            break
    if not best_levels and best_final == PLANES:
        return None
    return _serialize(best_levels, best_levels[-1].rest if best_levels else values, best_final)


def encode_as(values: Words, levels: int, final: int) -> Coded:
    """The coded section with ``levels`` split levels (the most frequent words, at
    most as many as there are distinct words) and final coding ``final``: every
    form, for tests and measurements, where :func:`encode` picks the smallest."""
    words, _ = _ranked(values)
    chosen = []
    rest = values
    for j in range(min(levels, len(words), MAX_LEVELS)):
        chosen.append(_split(rest, words[j : j + 1].astype(values.dtype)))
        rest = chosen[-1].rest
    return _serialize(chosen, rest, final)


# Ranking the words and estimating what is left need only a histogram's
# shape: above this many values it is taken on an evenly strided sample and
# scaled to the count (a 65536-bin bincount costs ~13 ns per value, as much as
# the exact level passes; the levels themselves are always exact).
HISTOGRAM_SAMPLE = 1 << 15


def _ranked(values: Words) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(distinct words, counts) by decreasing count, then increasing word; counts
    of a sample scaled to ``len(values)`` (floats) above HISTOGRAM_SAMPLE values."""
    step = max(1, -(-len(values) // HISTOGRAM_SAMPLE))
    words, counts = _histogram(values[::step])
    if step > 1:
        counts = counts * (len(values) / counts.sum())
    order = np.lexsort((words, -counts))
    return words[order], counts[order]


@dataclass(frozen=True)
class _Level:
    """One split level: its word, its bytes from ``k_j`` on (the remainder stream at
    ``rem_at``) and the values it leaves open."""

    split: Words
    data: bytes
    rem_at: int
    rest: Words


# From this share of open values that stay open on, k = 0 is the best Rice
# parameter (for geometric gaps, when (1 - p) + (1 - p)^2 <= 1), and the
# unary stream of k = 0 is the mask itself up to its last 1 bit: one packbits.
DENSE_KEEP = 0.382


def _split(rest: Words, split: Words) -> _Level:
    """The level that splits ``split`` off the open values ``rest``."""
    mask = rest != split[0]
    kept = int(np.count_nonzero(mask))
    if not kept or kept >= DENSE_KEEP * len(rest):
        bits = np.packbits(mask, bitorder="little")
        unary = bits[: int(np.flatnonzero(bits)[-1]) + 1].tobytes() if kept else b""
        k, rem, after = 0, b"", rest[mask]
    else:
        keep = np.flatnonzero(mask)
        gaps = positions.gaps_of(keep)
        k = positions.best_rice_k(gaps)
        unary, rem = positions.rice_encode(gaps, k)
        after = rest.take(keep)
    head = bytes([k]) + leb128.encode(len(unary))
    return _Level(split, head + unary + rem, len(head) + len(unary), after)


def _histogram(values: Words) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(distinct words, their counts); a bincount for 1- and 2-byte words."""
    if values.dtype.itemsize <= 2:
        counts = np.bincount(values, minlength=1 << (8 * values.dtype.itemsize))
        words = np.flatnonzero(counts)
        return words.astype(np.uint64), counts[words]
    words, counts = np.unique(values, return_counts=True)
    return words.astype(np.uint64), counts


def _final_cost(
    words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], size: int, scale: float = 1.0
) -> tuple[int, int]:
    """(estimated bytes, coding) of the cheaper final coding of the words left;
    the planes' estimate is multiplied by ``scale``."""
    plane = math.ceil(_planes_bytes(words, counts, size) * scale)
    k = _rice_k(words, counts, size)
    if k is None:
        return plane, PLANES
    rice = 2 + _rice_bytes(words, counts, k)
    return (rice, RICE) if rice < plane else (plane, PLANES)


# An estimate of what zstd's Huffman stage makes of a byte plane: each byte
# costs at least one bit (a Huffman code has at least one), a plane of one
# repeated byte is an RLE block, and a table costs some bytes.
_TABLE_BYTES = 16


def _planes_bytes(words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], size: int) -> int:
    """Estimated bytes of the words left as compressed byte planes."""
    n = round(float(counts.sum()))
    total = 0.0
    for j in range(size):
        hist = np.bincount((words >> np.uint64(8 * j)) & np.uint64(255), weights=counts)
        hist = hist[hist > 0]
        if len(hist) <= 1:
            continue
        bits = np.maximum(1.0, np.log2(n / hist))
        total += min(float(np.dot(hist, bits)) / 8 + _TABLE_BYTES, n)
    return math.ceil(total)


def _rice_bytes(words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], k: int) -> int:
    """Bytes of both Rice streams of the words (quotients summed in float: an estimate
    exact to well under a byte for any chunk)."""
    n = round(float(counts.sum()))
    quotients = float(np.dot((words >> np.uint64(k)).astype(np.float64), counts))
    return math.ceil((quotients + n) / 8) + (n * k + 7) // 8 + leb128.MAX_BYTES


def _rice_k(words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], size: int) -> int | None:
    """The k near log2(mean · ln 2) minimising the Rice size (None: no words)."""
    n = round(float(counts.sum()))
    if not n:
        return None
    mean = float(np.dot(words.astype(np.float64), counts)) / n
    centre = int(math.log2(mean * math.log(2))) if mean * math.log(2) >= 1 else 0
    top = 8 * size - 1
    candidates = range(max(0, min(top, centre) - 1), min(top, centre + 1) + 1)
    return min(candidates, key=lambda k: _rice_bytes(words, counts, k))


def _serialize(levels: list[_Level], rest: Words, final: int) -> Coded:
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
        parts.append(_rice_final(rest))
    return Coded(b"".join(parts), sections)


def _rice_final(rest: Words) -> bytes:
    words, counts = _histogram(rest)
    k = _rice_k(words, counts, rest.dtype.itemsize)
    if k is None:  # no value left open: k 0, an empty unary stream
        return bytes([RICE, 0, 0])
    wide = rest.astype(np.uint64)
    ones = wide >> np.uint64(k)
    ones += np.uint64(1)
    np.cumsum(ones, out=ones)
    ones -= np.uint64(1)
    unary = positions.unary_stream(ones)
    rem = _pack_fields(wide, k)
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
