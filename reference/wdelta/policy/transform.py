"""The encoder's pick of a chunk's value transform (SPEC §6), and the size
estimates it rests on.

Informative (SPEC §11.2): either transform is valid for any chunk.  Zeroth-order
entropy of each byte plane is what zstd's Huffman stage can reach on plane-split
values, so it predicts which transform stores smaller without compressing twice.
Estimates run on a sample of the changed elements, in fixed point
(:mod:`.fixedlog`): the kernels and NumPy pick alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codec import native, transform
from ..format.names import Transform
from . import fixedlog

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]
# 16384 values estimate each plane's 256-bin entropy to well under the gap
# between xor and sub seen on real steps (2.8 vs 1.9 bits per value), at a
# quarter of the cost of 65536 (the pick was ~10% of diff time at 30%).
SAMPLE = 1 << 14
# The sample is taken as this many evenly spaced runs of neighbouring changed
# elements: gathering runs touches few cache lines, where a strided sample of
# a multi-megabyte chunk misses the cache on almost every value (measured:
# 0.56 against 0.94 ms per 4M-element bf16 chunk at 30% density).
WINDOWS = 8


def _starts(n: int, length: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Starts of WINDOWS evenly spaced windows of ``length`` in ``range(n)``."""
    return (np.arange(WINDOWS, dtype=np.int64) * (n - length)) // (WINDOWS - 1)


def sample(positions: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """At most SAMPLE of the sorted ``positions``: all of them, or WINDOWS runs."""
    idx = sample_index(len(positions))
    return positions if idx is None else positions.take(idx)


def sample_index(n: int) -> np.ndarray[Any, Any] | None:
    """Where :func:`sample` takes its runs among ``n`` positions (None: all of them)."""
    run = SAMPLE // WINDOWS
    if n <= SAMPLE:
        return None
    return (_starts(n, run)[:, None] + np.arange(run)).reshape(-1)


def sample_mask(mask: np.ndarray[Any, np.dtype[np.bool_]], count: int) -> np.ndarray[Any, Any]:
    """Positions of changed elements in WINDOWS windows of ``mask`` (``count`` set).

    The windows are sized to hold about SAMPLE changed elements in all, so
    the sample is of that size at any density; all positions when that would
    cover the whole mask.
    """
    m = len(mask)
    length = -(-SAMPLE * m // (count * WINDOWS)) if count else m
    if length * WINDOWS >= m:
        return np.flatnonzero(mask)
    return np.concatenate(
        [np.flatnonzero(mask[a : a + length]) + a for a in _starts(m, length).tolist()]
    )


def window_index(positions: np.ndarray[Any, Any], m: int) -> np.ndarray[Any, Any] | None:
    """Where, among the sorted ``positions`` of the changed elements of a chunk of ``m``,
    are those :func:`sample_mask` samples (None: all of them); the windows do not overlap."""
    count = len(positions)
    length = -(-SAMPLE * m // (count * WINDOWS)) if count else m
    if length * WINDOWS >= m:
        return None
    starts = _starts(m, length)
    lo, hi = np.searchsorted(positions, starts), np.searchsorted(positions, starts + length)
    return np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)])


def pick(base: Words, target: Words, sampled: np.ndarray[Any, Any]) -> Transform:
    """The transform whose values at the positions ``sampled`` look cheaper."""
    b, t = base.take(sampled), target.take(sampled)
    return pick_words(np.bitwise_xor(b, t), transform.encode("sub", b, t))


def pick_words(xor: Words, sub: Words) -> Transform:
    """:func:`pick` from the sampled words of both transforms (``sub`` zigzag-coded):
    the one whose byte planes have fewer bits of entropy, by :func:`plane_score`."""
    return "sub" if plane_score(sub) > plane_score(xor) else "xor"


def plane_score(words: Words) -> int:
    """The sum over the byte planes' 256-bin histograms of h · lg(h) (fixed point).

    n words over s planes have n·s·log2(n) minus this many bits of summed plane
    entropy (:func:`value_bits` times n): of two arrays of the same length and dtype,
    the one of higher score has fewer.  Integers, exact in any order.
    """
    if native.usable(words):
        return native.plane_score(words, fixedlog.table())
    counts = _plane_counts((words,), words.dtype.itemsize)
    seen = counts[counts > 0]
    return int((seen * fixedlog.lg(seen)).sum())


def entropy_bits(counts: np.ndarray[Any, Any]) -> float:
    """Shannon entropy in bits per symbol of a histogram."""
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def plane_histograms(words: Words) -> list[np.ndarray[Any, Any]]:
    """One 256-bin histogram per byte plane of ``words``."""
    s = words.dtype.itemsize
    planes = words.view(np.uint8).reshape(-1, s)
    return [np.bincount(planes[:, j], minlength=256) for j in range(s)]


def value_bits(words: Words) -> float:
    """Estimated bits per word when stored as separately coded byte planes (a
    measure for reports; the pick compares :func:`plane_score`).

    The sum over planes of :func:`entropy_bits` of each plane's histogram,
    to the last bit: the same terms are summed in the same order, but every
    plane is counted by one ``bincount`` and its logarithms taken in one call,
    which costs a third of per-plane calls on the small chunks of scale tensors.
    """
    return value_bits_each(words)[0]


def value_bits_each(*arrays: Words) -> list[float]:
    """:func:`value_bits` of each of ``arrays`` (same length and dtype), bit for bit,
    from one histogram of all their planes: the fixed cost of the NumPy calls is
    paid once (the transform pick on a 2,048-element chunk: 2 x 26 us before)."""
    s, n = arrays[0].dtype.itemsize, len(arrays[0])
    if n == 0:
        return [0.0] * len(arrays)
    planes = len(arrays) * s
    counts = _plane_counts(arrays, s)
    seen = counts > 0
    p = counts[seen] / float(n)
    terms = p * np.log2(p)
    ends = np.cumsum(np.count_nonzero(seen.reshape(planes, 256), axis=1)).tolist()
    starts = [0, *ends[:-1]]
    per_plane = [float(-terms[a:b].sum()) for a, b in zip(starts, ends, strict=True)]
    out = []
    for i in range(len(arrays)):
        bits = 0.0
        for plane_bits in per_plane[i * s : (i + 1) * s]:
            bits += plane_bits
        out.append(bits)
    return out


def _plane_counts(arrays: tuple[Words, ...], s: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The 256-bin histograms of every byte plane of each of ``arrays``, one after another."""
    planes = len(arrays) * s
    if native.usable(*arrays):
        counts = np.zeros(256 * planes, dtype=np.int64)
        for i, words in enumerate(arrays):
            native.plane_counts(words, counts[i * 256 * s : (i + 1) * 256 * s])
        return counts
    offsets = np.arange(0, 256 * planes, 256, dtype=np.uint16).reshape(len(arrays), 1, s)
    stacked = np.stack([a.view(np.uint8).reshape(-1, s) for a in arrays])
    found: np.ndarray[Any, np.dtype[np.int64]] = np.bincount(
        (stacked + offsets).reshape(-1), minlength=256 * planes
    )
    return found
