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
class Costs:
    """What :func:`encode` needs from a set of values, computed once: the distinct
    words by decreasing count (of a sample, scaled), and per number of split
    levels L = 0 .. ``len(plane) - 1`` the estimated bytes of the values left as
    byte planes and as final Rice, of L and the final coding, and the values the
    levels scan.  Costing a payload twice (before and after its v1 form is
    compressed) reuses them."""

    values: Words
    words: np.ndarray[Any, Any]
    plane: np.ndarray[Any, Any]
    rice: np.ndarray[Any, Any]
    spent: np.ndarray[Any, Any]
    scanned: np.ndarray[Any, Any]


def costs(values: Words) -> Costs | None:
    """The :class:`Costs` of ``values``; None for no values."""
    words, counts = _ranked(values)
    if not len(words):
        return None
    size = values.dtype.itemsize
    most = min(MAX_LEVELS, len(words))
    plane, rice = _suffix_estimates(words, counts, size, most)
    # L and final-coding bytes, then the levels.
    spent = np.concatenate(([2.0], 2 + np.cumsum(_level_estimates(counts, size, most))))
    return Costs(values, words, plane, rice, spent, LEVEL_SCAN_BYTES * _scanned(counts, most))


def encode(values: Words, planes_bytes: int | None = None, min_gain: float = 0.0) -> Coded | None:
    """The coded section of ``values`` if its estimated size is below the byte planes'
    by more than ``min_gain`` of theirs (a share, 0 <= min_gain < 1); see :func:`choose`."""
    found = costs(values)
    return None if found is None else choose(found, planes_bytes, min_gain)


def choose(found: Costs, planes_bytes: int | None = None, min_gain: float = 0.0) -> Coded | None:
    """The coded section of ``found.values`` if its estimated size is below the byte
    planes' by more than ``min_gain`` of theirs.

    Every number of levels is costed from the histogram first (the levels'
    Rice streams by :func:`_level_estimates`, the values left by
    :func:`_suffix_estimates`), and only the levels of the cheapest total are
    built.  ``planes_bytes`` is what the codec made of all the values as byte
    planes, if known: zstd's block and match overheads make that 10-30% more
    than the entropy estimate on skewed values, and the estimates of the final
    planes are scaled alike.  None when no level pays and byte planes beat
    Rice: the payload is then the v1 form (value coding 0), which readers
    without the feature read.  The levels are built only once the estimates
    say they pay, so a None costs a histogram, not a pass over the values.
    """
    plane, rice = found.plane, found.rice
    v1 = float(plane[0])
    if planes_bytes is not None and v1:
        # planes_bytes can also be below the estimate: the caller counts the
        # positions raw, and zstd may have shrunk them (Rice unary streams).
        plane = np.ceil(plane * max(1.0, planes_bytes / v1))
        v1 = float(plane[0])
    finals = np.where(rice < plane, RICE, PLANES)
    totals = found.spent + np.minimum(plane, rice)
    best = int(np.argmin(totals + found.scanned))
    if best == 0 and (finals[0] == PLANES or totals[0] >= v1):
        return None
    if totals[best] >= v1 * (1 - min_gain):
        return None
    return _build(found.values, found.words, best, int(finals[best]))


# What a level's pass over the values still open is worth in bytes, per value:
# the choice of the number of levels minimises estimated bytes plus this times
# the values scanned.  The estimates slightly overrate the third and later
# levels, which each scan most of what the second left for 0.1-0.5% of the
# bytes; against 0, 1/32 made the real trace's deltas up to 0.3% smaller.  But
# at 1/32 the fp8 weights of a step at lr 1e-4 (17% of elements changed, values
# 2.25 bits of entropy) kept their values as zstd'ed planes, 15% over their
# entropy, instead of two levels 3.5% over it: on a held-out trace
# (bench/realtrace.py --seed 4 --trace-lrs 1e-7,3e-6,1e-4 --trace-steps 6) the
# worst fp8 pair was 1.011x issue 15's allowance.  At 1/128 it is 0.969x; the
# 48 pairs of the main trace are within 0.01% of 1/32 (worst pairs 0.9735-0.9806
# of the allowance), the synthetic fp8 2% delta is 0.9% smaller, bf16 2% the
# same, and one-thread diff CPU is the same within noise (1.41-1.54 s).
LEVEL_SCAN_BYTES = 1 / 128


def _scanned(counts: np.ndarray[Any, Any], levels: int) -> np.ndarray[Any, Any]:
    """Values the passes of 0 .. ``levels`` split levels scan (each scans those open)."""
    weights = counts.astype(np.float64)
    open_ = float(weights.sum()) - np.concatenate(([0.0], np.cumsum(weights[: levels - 1])))
    scanned: np.ndarray[Any, Any] = np.concatenate(([0.0], np.cumsum(open_[:levels])))
    return scanned


def _level_estimates(counts: np.ndarray[Any, Any], size: int, levels: int) -> np.ndarray[Any, Any]:
    """Estimated bytes of levels 1 .. ``levels``: split word, k, U and the Rice streams
    of c_j kept among n_j open values with geometric gaps (mean (n_j - c_j) / c_j),
    for the best k; k = 0 is exact (the mask itself, n_j bits at most)."""
    weights = counts.astype(np.float64)
    open_ = float(weights.sum()) - np.concatenate(([0.0], np.cumsum(weights[:levels])))
    n, kept = open_[:-1], open_[1:]
    scale = 2.0 ** -np.arange(21)
    quotients = np.maximum(0.0, np.outer(n - kept, scale) - np.outer(kept, (1 - scale) / 2))
    bits = quotients + np.outer(kept, np.arange(21) + 1)
    estimate: np.ndarray[Any, Any] = np.ceil(bits.min(axis=1) / 8) + size + 3
    return estimate


def encode_as(values: Words, levels: int, final: int) -> Coded:
    """The coded section with ``levels`` split levels (the most frequent words, at
    most as many as there are distinct words) and final coding ``final``: every
    form, for tests and measurements, where :func:`encode` picks the smallest."""
    return _build(values, _ranked(values)[0], levels, final)


def _build(values: Words, words: np.ndarray[Any, Any], levels: int, final: int) -> Coded:
    """The section splitting off ``words[:levels]`` in order, then ``final``."""
    chosen = []
    rest = values
    for j in range(min(levels, len(words), MAX_LEVELS)):
        chosen.append(_split(rest, words[j : j + 1].astype(values.dtype)))
        rest = chosen[-1].rest
    return _serialize(chosen, rest, final)


# Ranking the words and estimating what is left need only a histogram's
# shape: above this many values it is taken on an evenly strided sample and
# scaled to the count (sorting costs more per value than the exact level
# passes; the levels themselves are always exact).
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
    keep = np.flatnonzero(mask)
    if not len(keep):
        k, unary, rem, after = 0, b"", b"", rest[:0]
    elif len(keep) >= DENSE_KEEP * len(rest):
        # The stream ends with the byte of the last 1 bit: pack only up to it.
        unary = np.packbits(mask[: int(keep[-1]) + 1], bitorder="little").tobytes()
        k, rem, after = 0, b"", rest.take(keep)
    else:
        gaps = positions.gaps_of(keep)
        k = _geometric_rice_k(len(keep), len(rest))
        unary, rem = positions.rice_encode(gaps, k)
        after = rest.take(keep)
    head = bytes([k]) + leb128.encode(len(unary))
    return _Level(split, head + unary + rem, len(head) + len(unary), after)


def _geometric_rice_k(kept: int, n: int) -> int:
    """The Rice parameter for ``kept`` of ``n`` values scattered at random (geometric
    gaps, p = kept / n): of the k near log2(mean gap · ln 2), the one whose expected
    bits per gap, E[g >> k] + 1 + k with E[g >> k] = r / (1 - r), r = (1 - p)^(2^k),
    are fewest.  From the counts alone, where :func:`positions.best_rice_k` sums the
    actual gaps three times: on the real trace the deltas are the same to 0.01%."""
    p = kept / n

    def bits(k: int) -> float:
        r = (1 - p) ** (1 << k)
        return r / (1 - r) + 1 + k if r < 1 else math.inf

    return min(positions.rice_k_candidates((n - kept) / kept), key=bits)


def _histogram(values: Words) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(distinct words, their counts), words increasing.  A stable sort, which NumPy
    does by radix for 1- and 2-byte words: measured 0.21-0.32 ms on 32K-value
    samples of bf16 and fp8 steps, against 0.65-0.94 ms for np.unique's sort and
    0.34-0.40 ms for a 65536-bin bincount and its scan.  1-byte words are counted
    in 256 bins instead (fp8: 15 us against 60 us for a 20K-value sample)."""
    if values.dtype.itemsize == 1:
        bins = np.bincount(values, minlength=256)
        present = np.flatnonzero(bins)
        return present.astype(np.uint64), bins[present]
    ordered = np.sort(values, kind="stable")
    starts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    starts = np.concatenate(([0], starts)) if len(ordered) else starts
    counts = np.diff(np.append(starts, len(ordered)))
    return ordered[starts].astype(np.uint64), counts


# An estimate of what zstd's Huffman stage makes of a byte plane: each byte
# costs at least one bit (a Huffman code has at least one), a plane of one
# repeated byte is an RLE block, and a table costs some bytes.
_TABLE_BYTES = 16


def _suffix_estimates(
    words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], size: int, levels: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Estimated bytes of ``words[j:]`` (the first j split off) as compressed byte
    planes and as final Rice coding, for j = 0 .. ``levels`` at once."""
    weights = counts.astype(np.float64)
    left = float(weights.sum()) - np.concatenate(([0.0], np.cumsum(weights[:levels])))
    if size == 1:
        # One plane whose bytes are the (distinct) words: suffix j drops columns < j.
        hists = np.where(np.arange(len(words))[None, :] >= np.arange(levels + 1)[:, None],
                         weights[None, :], 0.0)  # fmt: skip
        return _plane_bytes(hists, left, None), _suffix_rice(words, weights, left, size, levels)
    # Every suffix (axis 0) and every (plane, byte) column that occurs (axis 1)
    # at once: small chunks are common (fp8 block scales: ~50 values), and
    # per-call overhead or 256 columns per plane would dominate.
    shifts = np.arange(0, 8 * size, 8, dtype=np.uint64)
    byte = ((words[None, :] >> shifts[:, None]) & np.uint64(255)).astype(np.intp)
    byte += 256 * np.arange(size)[:, None]
    # The columns that occur, in order, and each byte's column: np.unique's
    # sort costs more than this 256-per-plane table on the few words here.
    present = np.zeros(256 * size, dtype=bool)
    present[byte] = True
    cols = np.flatnonzero(present)
    inverse = (np.cumsum(present) - 1)[byte.ravel()]
    column = inverse.reshape(size, len(words))
    flat = np.bincount(inverse, weights=np.tile(weights, size), minlength=len(cols))
    top = np.zeros((levels + 1, len(cols)))
    top[np.arange(1, levels + 1)[None, :], column[:, :levels]] = weights[:levels][None, :]
    hists = flat[None, :] - np.cumsum(top, axis=0)
    starts = np.searchsorted(cols, 256 * np.arange(size))
    return _plane_bytes(hists, left, starts), _suffix_rice(words, weights, left, size, levels)


def _plane_bytes(
    hists: np.ndarray[Any, Any], left: np.ndarray[Any, Any], starts: np.ndarray[Any, Any] | None
) -> np.ndarray[Any, Any]:
    """Per suffix (row), the estimated bytes of the planes whose byte histograms are
    the columns of ``hists`` (plane p from column ``starts[p]``; None: one plane)."""
    present = hists > 0.5
    ratio = left[:, None] / np.where(present, hists, 1.0)
    bits = np.where(present, hists * np.maximum(1.0, np.log2(np.maximum(ratio, 1.0))), 0.0)
    if starts is None:
        total, distinct = bits.sum(axis=1)[:, None], present.sum(axis=1)[:, None]
    else:
        total = np.add.reduceat(bits, starts, axis=1)
        distinct = np.add.reduceat(present, starts, axis=1)
    estimate = np.minimum(total / 8 + _TABLE_BYTES, left[:, None])
    plane: np.ndarray[Any, Any] = np.ceil(np.where(distinct > 1, estimate, 0.0).sum(axis=1))
    return plane


def _suffix_rice(
    words: np.ndarray[Any, Any], weights: np.ndarray[Any, Any], left: np.ndarray[Any, Any],
    size: int, levels: int,
) -> np.ndarray[Any, Any]:  # fmt: skip
    """Bytes (with the coding and k bytes) of the final Rice coding of ``words[j:]``,
    k the best of three near log2(mean · ln 2) as for positions; inf where no word is left.
    Every candidate k of every suffix is costed in one (k, word) matrix."""
    value = words.astype(np.float64) * weights
    total = float(value.sum()) - np.concatenate(([0.0], np.cumsum(value[:levels])))
    mean = total / np.maximum(left, 1.0) * math.log(2)
    centre = np.where(mean >= 1, np.floor(np.log2(np.maximum(mean, 1.0))), 0.0).astype(np.int64)
    centre = np.minimum(centre, 8 * size - 1)
    near = {min(max(c + d, 0), 8 * size - 1) for c in centre.tolist() for d in (-1, 0, 1)}
    ks = np.array(sorted(near), dtype=np.int64)
    shifted = (words[None, :] >> ks.astype(np.uint64)[:, None]).astype(np.float64) * weights
    head = np.cumsum(shifted[:, :levels], axis=1)
    quotients = shifted.sum(axis=1)[:, None] - np.concatenate(
        (np.zeros((len(ks), 1)), head), axis=1
    )  # (k, suffix)
    cost = np.ceil((quotients + left) / 8) + np.ceil(np.outer(ks, left) / 8)
    cost[np.abs(centre[None, :] - ks[:, None]) > 1] = np.inf
    best = cost.min(axis=0) + leb128.MAX_BYTES + 2
    return np.where(left > 0.5, best, np.inf)


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
    candidates = positions.rice_k_candidates(mean, 8 * size - 1)
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
