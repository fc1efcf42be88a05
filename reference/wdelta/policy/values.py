"""The encoder's coded-values policy (SPEC §7.6.6): whether a sparse payload codes
its values, with how many split levels and which final coding.

Informative (SPEC §11.2): any choice :mod:`wdelta.codec.coded_values` can write is
valid.  Every number of levels is costed from a histogram of the values, and only
the levels of the cheapest total are built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec import coded_values, leb128, native, sparse
from ..codec.coded_values import MAX_LEVELS, PLANES, RICE, Coded
from . import fixedlog
from .rice import geometric_rice_k, words_rice_k

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]
Ints = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class Costs:
    """What :func:`encode` needs from a set of values, computed once: the distinct
    words by decreasing count (of a sample, scaled), and per number of split
    levels L = 0 .. ``len(plane) - 1`` the estimated bytes of the values left as
    byte planes and as final Rice (:data:`NEVER` where Rice is not costed), of L
    and the final coding, and the values the levels scan.  Costing a payload twice
    (before and after its v1 form is compressed) reuses them.  Every estimate is
    an integer computed in fixed point (:mod:`.fixedlog`), so that the kernel and
    NumPy give the same numbers."""

    values: Words
    words: np.ndarray[Any, Any]
    plane: list[int]
    rice: list[int]
    spent: list[int]
    scanned: list[int]


def costs(values: Words) -> Costs | None:
    """The :class:`Costs` of ``values``; None for no values."""
    words, counts = _ranked(values)
    if not len(words):
        return None
    size = values.dtype.itemsize
    most = min(MAX_LEVELS, len(words))
    if native.usable(values):
        table = fixedlog.table()
        estimates = native.value_costs(words, counts, size, most, table, ESTIMATE_CONSTANTS)
        return Costs(values, words, *estimates)
    plane, rice = _suffix_estimates(words, counts, size, most)
    # L and final-coding bytes, then the levels.
    spent = [2, *(2 + np.cumsum(_level_estimates(counts, size, most))).tolist()]
    return Costs(values, words, plane, rice, spent, _scanned(counts, most))


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
    v1 = plane[0]
    if planes_bytes is not None and planes_bytes > v1 > 0:
        # planes_bytes can also be below the estimate: the caller counts the
        # positions raw, and zstd may have shrunk them (Rice unary streams).
        plane = [-(-p * planes_bytes // v1) for p in plane]
        v1 = plane[0]
    totals = [s + min(p, r) for s, p, r in zip(found.spent, plane, rice, strict=True)]
    weighed = [t * LEVEL_SCAN_DIVISOR + v for t, v in zip(totals, found.scanned, strict=True)]
    best = weighed.index(min(weighed))
    final = RICE if rice[best] < plane[best] else PLANES
    if best == 0 and (final == PLANES or totals[0] >= v1):
        return None
    if totals[best] >= v1 * (1 - min_gain):
        return None
    return _build(found.values, found.words, best, final)


# What a level's pass over the values still open is worth in bytes, per value,
# is 1/LEVEL_SCAN_DIVISOR: the choice of the number of levels minimises estimated
# bytes plus the values scanned over this.  The estimates slightly overrate the third and later
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
LEVEL_SCAN_DIVISOR = 128


def _open(counts: Ints, levels: int) -> Ints:
    """Values still open after 0 .. ``levels`` split levels (the first words split off)."""
    out: Ints = int(counts.sum()) - np.concatenate(([0], np.cumsum(counts[:levels])))
    return out


def _scanned(counts: Ints, levels: int) -> list[int]:
    """Values the passes of 0 .. ``levels`` split levels scan (each scans those open)."""
    scanned: list[int] = np.concatenate(([0], np.cumsum(_open(counts, levels)[:levels]))).tolist()
    return scanned


# A level's bytes besides its split word and Rice streams: k, its share of L, U.
_LEVEL_EXTRA = 3
# A level's Rice quotient bits are estimated in units of 2^-LEVEL_FRACTION bits, for
# k = 0 .. LEVEL_MAX_K: exact integers for any k there (a level never needs more).
LEVEL_FRACTION = 21
LEVEL_MAX_K = LEVEL_FRACTION - 1


def _level_estimates(counts: Ints, size: int, levels: int) -> Ints:
    """Estimated bytes of levels 1 .. ``levels``: split word, k, U and the Rice streams
    of c_j kept among n_j open values with geometric gaps (mean (n_j - c_j) / c_j),
    for the best k: the quotients' expected bits max(0, (n_j - c_j) / 2^k - c_j (1 -
    2^-k) / 2), plus c_j (k + 1); k = 0 is exact (the mask itself, n_j bits at most)."""
    left = _open(counts, levels)
    n, kept = left[:-1, None], left[1:, None]
    k = np.arange(LEVEL_MAX_K + 1, dtype=np.int64)
    half = (1 << (LEVEL_FRACTION - 1)) - (1 << (LEVEL_FRACTION - 1 - k))
    quotients = np.maximum(0, ((n - kept) << (LEVEL_FRACTION - k)) - kept * half)
    bits = quotients + ((kept * (k + 1)) << LEVEL_FRACTION)
    estimate: Ints = _ceil_shift(bits.min(axis=1), LEVEL_FRACTION + 3) + size + _LEVEL_EXTRA
    return estimate


def _ceil_shift(x: Ints, shift: int) -> Ints:
    """ceil(x / 2^shift) of non-negative integers."""
    out: Ints = (x + ((1 << shift) - 1)) >> shift
    return out


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
    k = words_rice_k(*_histogram(rest), rest.dtype.itemsize) if final == RICE else 0
    return coded_values.serialize(chosen, rest, final, k)


# Ranking the words and estimating what is left need only a histogram's
# shape: above this many values it is taken on an evenly strided sample and
# scaled to the count (sorting costs more per value than the exact level
# passes; the levels themselves are always exact).
HISTOGRAM_SAMPLE = 1 << 15


def _ranked(values: Words) -> tuple[np.ndarray[Any, Any], Ints]:
    """(distinct words, counts) by decreasing count, then increasing word; counts of a
    sample scaled to ``len(values)`` (rounded down) above HISTOGRAM_SAMPLE values."""
    step = max(1, -(-len(values) // HISTOGRAM_SAMPLE))
    words, counts = _histogram(values, step)
    order = np.lexsort((words, -counts))
    words, counts = words[order], counts[order].astype(np.int64)
    if step > 1:
        counts = counts * len(values) // int(counts.sum())
    return words, counts


# From this share of open values that stay open on, k = 0 is the best Rice
# parameter (for geometric gaps, when (1 - p) + (1 - p)^2 <= 1), and the
# unary stream of k = 0 is the mask itself up to its last 1 bit: one packbits.
DENSE_KEEP = 0.382


def _split(rest: Words, split: Words) -> coded_values.Level:
    """The level that splits ``split`` off the open values ``rest``."""
    if native.usable(rest):
        return _split_native(rest, split)
    mask = rest != split[0]
    keep = np.flatnonzero(mask)
    return coded_values.encode_level(rest, split, mask, keep, _level_k(len(keep), len(rest)))


def _level_k(kept: int, n: int) -> int:
    """The Rice parameter of a level that keeps ``kept`` of ``n`` open values open."""
    if not kept or kept >= DENSE_KEEP * n:
        return 0
    return geometric_rice_k(kept, n)


def _split_native(rest: Words, split: Words) -> coded_values.Level:
    """:func:`_split` from one compiled pass over the open values (the words kept and
    their mask); for k > 0 one more over the mask codes the kept indices as positions."""
    kept, words, mask, used = native.split_mask(rest, int(split[0]))
    k = _level_k(kept, len(rest))
    if k == 0:  # the mask itself up to the byte of its last 1 bit (none if none kept)
        unary, rem = mask[:used].tobytes(), b""
    else:
        unary, rem = native.rice_mask(mask, len(rest), kept, k)
    return coded_values.level(split, k, unary, rem, words)


def _histogram(values: Words, step: int = 1) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(distinct words, their counts) of ``values[::step]``, words increasing.  A stable
    sort, which NumPy does by radix for 1- and 2-byte words: measured 0.21-0.32 ms on
    32K-value samples of bf16 and fp8 steps, against 0.65-0.94 ms for np.unique's sort
    and 0.34-0.40 ms for a 65536-bin bincount and its scan.  1-byte words are counted
    in 256 bins instead (fp8: 15 us against 60 us for a 20K-value sample).  The
    kernel counts 1- and 2-byte words in tables, exactly."""
    if (
        native.usable(values)
        and values.dtype.itemsize in native.HISTOGRAM_SIZES
        and len(values) < 1 << 32
    ):
        return native.histogram(values, step)
    values = values[::step]
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
# Final Rice coding is costed for words of up to this many bytes: their sums over a
# chunk stay below 2^58 (2^26 elements of 32 bits).  Wider words (float64) keep
# their final values as byte planes.
RICE_MAX_WORD_BYTES = 4
NEVER = 1 << 60  # the cost of a coding that is not costed
# The bytes a final Rice coding adds to its streams: coding byte, k, ULEB128 length.
_RICE_EXTRA = leb128.MAX_BYTES + 2
# What the kernel's estimates take from this module, in the order _kernels.c reads them.
ESTIMATE_CONSTANTS = (
    _TABLE_BYTES, _RICE_EXTRA, _LEVEL_EXTRA, RICE_MAX_WORD_BYTES, NEVER, fixedlog.LG_LN2,
    LEVEL_FRACTION,
)  # fmt: skip


def _suffix_estimates(
    words: np.ndarray[Any, Any], counts: Ints, size: int, levels: int
) -> tuple[list[int], list[int]]:
    """Estimated bytes of ``words[j:]`` (the first j split off) as compressed byte
    planes and as final Rice coding, for j = 0 .. ``levels`` at once."""
    left = _open(counts, levels)
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
    # Float sums of integers below 2^53: exact.
    flat = np.bincount(inverse, weights=np.tile(counts, size), minlength=len(cols))
    top = np.zeros((levels + 1, len(cols)), dtype=np.int64)
    top[np.arange(1, levels + 1)[None, :], column[:, :levels]] = counts[:levels][None, :]
    hists = flat.astype(np.int64)[None, :] - np.cumsum(top, axis=0)
    starts = np.searchsorted(cols, 256 * np.arange(size))
    return _plane_bytes(hists, left, starts), _suffix_rice(words, counts, left, size, levels)


def _plane_bytes(hists: Ints, left: Ints, starts: Ints) -> list[int]:
    """Per suffix (row), the estimated bytes of the planes whose byte histograms are
    the columns of ``hists`` (plane p from column ``starts[p]``): each byte of count h
    among ``left`` costs max(1, log2(left / h)) bits, in fixed point."""
    present = hists > 0
    ratio = fixedlog.lg(np.maximum(left, 1))[:, None] - fixedlog.lg(np.maximum(hists, 1))
    bits = np.where(present, hists * np.maximum(fixedlog.ONE, ratio), 0)
    total = np.add.reduceat(bits, starts, axis=1)
    distinct = np.add.reduceat(present, starts, axis=1)
    estimate = np.minimum((total >> 3) + _TABLE_BYTES * fixedlog.ONE, left[:, None] * fixedlog.ONE)
    summed = np.where(distinct > 1, estimate, 0).sum(axis=1)
    plane: list[int] = _ceil_shift(summed, fixedlog.FRACTION_BITS).tolist()
    return plane


def _suffix_rice(
    words: np.ndarray[Any, Any], counts: Ints, left: Ints, size: int, levels: int
) -> list[int]:
    """Bytes (with the coding and k bytes) of the final Rice coding of ``words[j:]``,
    k the best of three near log2(mean · ln 2) as for positions; NEVER where no word
    is left or words are wider than RICE_MAX_WORD_BYTES.  Every candidate k of every
    suffix is costed in one (k, word) matrix."""
    if size > RICE_MAX_WORD_BYTES:
        return [NEVER] * (levels + 1)
    value = words.astype(np.int64) * counts
    total = int(value.sum()) - np.concatenate(([0], np.cumsum(value[:levels])))
    scaled = fixedlog.lg(np.maximum(total, 1)) - fixedlog.lg(np.maximum(left, 1)) + fixedlog.LG_LN2
    centre = np.where((total > 0) & (scaled >= fixedlog.ONE), scaled >> fixedlog.FRACTION_BITS, 0)
    centre = np.minimum(centre, 8 * size - 1)
    near = {min(max(c + d, 0), 8 * size - 1) for c in centre.tolist() for d in (-1, 0, 1)}
    ks = np.array(sorted(near), dtype=np.int64)
    shifted = (words[None, :] >> ks.astype(np.uint64)[:, None]).astype(np.int64) * counts
    head = np.cumsum(shifted[:, :levels], axis=1)
    quotients = shifted.sum(axis=1)[:, None] - np.concatenate(
        (np.zeros((len(ks), 1), dtype=np.int64), head), axis=1
    )  # (k, suffix)
    cost = _ceil_shift(quotients + left, 3) + _ceil_shift(ks[:, None] * left, 3)
    cost[np.abs(centre[None, :] - ks[:, None]) > 1] = NEVER
    best = cost.min(axis=0) + _RICE_EXTRA
    rice: list[int] = np.where(left > 0, best, NEVER).tolist()
    return rice


# Values that the codec stores in fewer bytes than this are not worth a try:
# the per-chunk cost of counting and costing words is fixed, the gain small.
# It was 128 until a held-out trace at lr 1e-7 (bench/realtrace.py --seed 4
# --trace-lrs 1e-7,3e-6,1e-4) missed issue 15's whole-file allowance on fp8
# (worst pair 1.0203): about 220 changes per weight tensor leave 60-80 bytes
# of zstd'ed values per chunk, which coding brings to about 45.  At 32 that
# pair is at 0.9633 and the main trace's fp8 deltas are 0.2% (lr 1e-5) and 0.6%
# (lr 1e-6) smaller, for 6-10% more diff CPU on those small files
# (bench/tracesizes.py); at 0 the gain over 32 is 0.1%.
CODED_MIN_BYTES = 32


class SparseValues:
    """A sparse payload's parts, and its values' :class:`Costs` computed once: the
    encoder may cost a large payload before and after compressing its v1 form."""

    def __init__(self, parts: sparse.Parts) -> None:
        self.parts = parts

    @functools.cached_property
    def value_costs(self) -> Costs | None:
        return costs(self.parts.values)

    def coded(
        self, m: int, stored: int | None, min_gain: float = 0.0
    ) -> tuple[bytes, list[int]] | None:
        """The payload with the short head and coded values (value coding 1), and
        where its sections start; None when coding the values would not make the
        payload smaller.  ``stored`` is the v1 payload's stored (compressed) length;
        its part past the positions, which are counted raw, is taken as the
        values' cost.  None: not compressed; the values' cost is then estimated
        from their histogram, and they are coded only if that saves ``min_gain``
        of it (see :func:`choose`)."""
        values, values_start = self.parts.values, self.parts.values_start
        count, size = len(values), values.dtype.itemsize
        planes_bytes = count * size if stored is None else max(0, stored - values_start)
        if planes_bytes < CODED_MIN_BYTES:
            return None
        known = None if stored is None else planes_bytes
        found_costs = self.value_costs
        found = None if found_costs is None else choose(found_costs, known, min_gain)
        if found is None or values_start + len(found.data) > sparse.max_raw_length(m, size):
            return None
        return self.parts.short_form(found)
