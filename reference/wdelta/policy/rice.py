"""The Rice parameters the encoder picks, and a sparse payload's position coding.

Any k from 0 to 31 is valid for positions (SPEC §7.6.3) and any k below the
word width for final values (§7.6.6); these functions pick the k that codes
smallest (exactly, or by estimate), and between the bitmap and Rice coding of a
chunk's positions (§7.6.2, §7.6.3) the smaller.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..codec import leb128, native, positions
from ..codec.positions import MAX_RICE_K, Positions
from ..codec.sparse import BITMAP, RICE, PositionPlan

# best_rice_k judges the candidates on at most about this many gaps.
K_SAMPLE = 1 << 16


def rice_k_candidates(mean: float, top: int = MAX_RICE_K) -> range:
    """The Rice parameters worth trying for values (gaps or words) of mean ``mean``:
    the k near log2(mean · ln 2), best for geometric values, and its neighbours,
    within 0 .. ``top``."""
    scaled = mean * math.log(2)
    centre = min(top, int(math.log2(scaled))) if scaled >= 1 else 0
    return range(max(0, centre - 1), min(top, centre + 1) + 1)


def best_rice_k(gaps: Positions) -> int:
    """The k near log2(mean gap · ln 2) minimising size, judged on a sample of gaps."""
    step = max(1, len(gaps) // K_SAMPLE)
    sample = gaps[::step]
    mean = float(np.mean(sample)) if len(sample) else 0.0
    ks = rice_k_candidates(mean)
    # rice_bits of every candidate from one shift and sum (a 40-gap chunk: 3 us, not 16).
    shifted = sample >> np.arange(ks.start, ks.stop, dtype=np.int64)[:, None]
    sizes = [int(q) + len(sample) * (k + 1) for q, k in zip(shifted.sum(axis=1), ks, strict=True)]
    return ks[sizes.index(min(sizes))]


def plan_positions(pos: Positions, m: int) -> PositionPlan:
    """Compare the exact sizes of the bitmap and the best Rice coding."""
    if native.usable(pos):
        return _plan_positions_native(pos, m)
    bitmap = (m + 7) // 8
    gaps = positions.gaps_of(pos)
    k = best_rice_k(gaps)
    ones = positions.unary_ones(gaps, k)
    rice = 8 + int(ones[-1]) // 8 + 1 + (len(gaps) * k + 7) // 8
    if rice < bitmap:
        return PositionPlan(RICE, k, rice, gaps, ones)
    return PositionPlan(BITMAP, 0, bitmap, gaps, ones)


def _plan_positions_native(pos: Positions, m: int) -> PositionPlan:
    """:func:`plan_positions` from exact integer sums over the gaps, computed from the
    positions in one pass without a gaps array: the same k as :func:`best_rice_k` (the
    sample's mean is the same float: NumPy's float64 sum of integers is exact below 2^53,
    and gaps sum to less than a chunk), the same sizes."""
    n = len(pos)
    step = max(1, n // K_SAMPLE)
    sampled = len(range(0, n, step))
    # The gaps sum to p_last - (n - 1): the mean of an unsampled chunk needs no pass.
    total = int(pos[-1]) - (n - 1) if step == 1 else native.gap_quotients(pos, step, range(1))[0][0]
    ks = rice_k_candidates(total / sampled)
    sums, full = native.gap_quotients(pos, step, ks)
    sizes = [q + sampled * (k + 1) for q, k in zip(sums, ks, strict=True)]
    best = sizes.index(min(sizes))
    k = ks[best]
    quotients = full[best] if full else native.gap_quotients(pos, 1, range(k, k + 1))[0][0]
    unary = (quotients + n - 1) // 8 + 1  # bytes up to the last code's 1 bit
    rice = 8 + unary + (n * k + 7) // 8
    if rice < (m + 7) // 8:
        return PositionPlan(RICE, k, rice, unary_len=unary)
    return PositionPlan(BITMAP, 0, (m + 7) // 8)


def geometric_rice_k(kept: int, n: int) -> int:
    """The Rice parameter for ``kept`` of ``n`` values scattered at random (geometric
    gaps, p = kept / n): of the k near log2(mean gap · ln 2), the one whose expected
    bits per gap, E[g >> k] + 1 + k with E[g >> k] = r / (1 - r), r = (1 - p)^(2^k),
    are fewest.  From the counts alone, where :func:`best_rice_k` sums the
    actual gaps three times: on the real trace the deltas are the same to 0.01%."""
    p = kept / n

    def bits(k: int) -> float:
        r = (1 - p) ** (1 << k)
        return r / (1 - r) + 1 + k if r < 1 else math.inf

    return min(rice_k_candidates((n - kept) / kept), key=bits)


def _words_rice_bytes(words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], k: int) -> int:
    """Bytes of both Rice streams of the words (quotients summed in float: an estimate
    exact to well under a byte for any chunk)."""
    n = round(float(counts.sum()))
    quotients = float(np.dot((words >> np.uint64(k)).astype(np.float64), counts))
    return math.ceil((quotients + n) / 8) + (n * k + 7) // 8 + leb128.MAX_BYTES


def words_rice_k(words: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], size: int) -> int:
    """The k near log2(mean · ln 2) minimising the Rice size of the distinct ``words``
    (``size`` bytes each) of histogram ``counts``; 0 for no words."""
    n = round(float(counts.sum()))
    if not n:
        return 0
    mean = float(np.dot(words.astype(np.float64), counts)) / n
    candidates = rice_k_candidates(mean, 8 * size - 1)
    return min(candidates, key=lambda k: _words_rice_bytes(words, counts, k))
