"""The encoder's coded-values policy (SPEC §7.6.6): whether a sparse payload codes
its values, with how many split levels and which final coding.

Informative (SPEC §11.2): any choice :mod:`wdelta.codec.coded_values` can write is
valid.  Every number of levels is costed from a histogram of the values, and only
the levels of the cheapest total are built.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codec import coded_values, leb128, native, sparse
from ..codec.coded_values import MAX_LEVELS, PLANES, RICE, Coded
from .rice import geometric_rice_k, words_rice_k

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


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
    k = words_rice_k(*_histogram(rest), rest.dtype.itemsize) if final == RICE else 0
    return coded_values.serialize(chosen, rest, final, k)


# Ranking the words and estimating what is left need only a histogram's
# shape: above this many values it is taken on an evenly strided sample and
# scaled to the count (sorting costs more per value than the exact level
# passes; the levels themselves are always exact).
HISTOGRAM_SAMPLE = 1 << 15


def _ranked(values: Words) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(distinct words, counts) by decreasing count, then increasing word; counts
    of a sample scaled to ``len(values)`` (floats) above HISTOGRAM_SAMPLE values."""
    step = max(1, -(-len(values) // HISTOGRAM_SAMPLE))
    words, counts = _histogram(values, step)
    if step > 1:
        counts = counts * (len(values) / counts.sum())
    order = np.lexsort((words, -counts))
    return words[order], counts[order]


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
