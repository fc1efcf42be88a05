"""Tensor contents: random words, realistic updates and special bit patterns."""

from __future__ import annotations

from typing import Any

import numpy as np

from wdelta.format.dtypes import DTYPES

from .rand import random_bytes, random_mask, random_words

Words = np.ndarray[Any, Any]

# Stored bit patterns a decoder must carry through untouched: NaNs with
# payloads and signs, signalling NaNs, infinities, -0.0, subnormals, and the
# special encodings of the fp8 formats (FNUZ: 0x80 is the only NaN, no -0).
SPECIALS: dict[str, tuple[int, ...]] = {
    "F16": (0x7E00, 0x7E01, 0xFE00, 0x7C01, 0x7FFF, 0xFFFF, 0x7C00, 0xFC00, 0x8000, 0x0000,
            0x0001, 0x83FF, 0x7BFF, 0x0400),
    "BF16": (0x7FC0, 0x7FC1, 0xFFC0, 0x7F81, 0x7FFF, 0xFFFF, 0x7F80, 0xFF80, 0x8000, 0x0000,
             0x0001, 0x807F, 0x7F7F, 0x0080),
    "F32": (0x7FC00000, 0x7FC00001, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF,
            0x7F800000, 0xFF800000, 0x80000000, 0x00000000, 0x00000001, 0x807FFFFF,
            0x7F7FFFFF, 0x00800000),
    "F64": (0x7FF8000000000000, 0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001,
            0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
            0x8000000000000000, 0x0000000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF),
    "C64": (0x7FC0000180000000, 0x000000007FC00001, 0xFFC00000FFC00000, 0x7F8000017F800001,
            0x8000000080000000, 0x0000000180000000, 0x7F800000FF800000, 0x0000000000000000),
    "F8_E4M3": (0x7F, 0xFF, 0x80, 0x00, 0x01, 0x87, 0x7E, 0xFE, 0x08),
    "F8_E5M2": (0x7C, 0xFC, 0x7D, 0x7E, 0x7F, 0xFD, 0xFF, 0x80, 0x00, 0x01, 0x83, 0x7B),
    "F8_E8M0": (0xFF, 0x00, 0x7F, 0x80, 0xFE, 0x01),
    "F8_E4M3FNUZ": (0x80, 0x00, 0x01, 0x81, 0x7F, 0xFF, 0x08),
    "F8_E5M2FNUZ": (0x80, 0x00, 0x01, 0x81, 0x7F, 0xFF, 0x04),
}  # fmt: skip


def base_words(label: str, dtype: str, n: int) -> Words:
    """Random words of ``dtype`` (BOOL: 0 or 1, the only bytes a bool stores)."""
    size = DTYPES[dtype].size
    words = random_words(label, n, size)
    if dtype == "BOOL":
        words &= 1
    return words


def weights_like(label: str, dtype: str, n: int) -> Words:
    """Compressible words (zstd shrinks even a ``full`` chunk of them).

    1-byte dtypes get 4 random bits (BOOL one); wider ones 12 random low bits
    under a top byte from {0x3C..0x3F}, like the exponents of similar weights.
    """
    size = DTYPES[dtype].size
    words = random_words(label, n, size)
    if dtype == "BOOL":
        return words & 1
    if size == 1:
        return words & 0x0F
    top = (0x3C + (words >> (8 * size - 2))) << (8 * (size - 1))
    out: Words = (words & 0xFFF) | top.astype(words.dtype)
    return out


def _nudge(word: int, pick: int, bits: int, noise: int, small: bool) -> int:
    """A different word: +-1 when ``small``, else +-small, a flipped low byte or random."""
    mask = (1 << bits) - 1
    choice = pick % 4
    if small:
        new = word + 1 if pick % 2 else word - 1
    elif choice == 0:
        new = word + 1 + pick % 3
    elif choice == 1:
        new = word - 1 - pick % 5
    elif choice == 2:
        new = word ^ (1 + noise % 255)
    else:
        new = noise
    new &= mask
    return new if new != word else word ^ 1


def update(
    label: str,
    dtype: str,
    words: Words,
    mask: np.ndarray[Any, Any],
    small: bool = False,
) -> tuple[Words, Words]:
    """(base, target): ``words`` with every masked element changed in the target.

    The first two changes wrap around (max -> 0 and 0 -> max, written into
    the base) so that ``sub`` decoders are checked for modular arithmetic.
    ``small`` limits the changes to steps of +-1 (compressible values).
    """
    base, target = words.copy(), words.copy()
    positions = [int(p) for p in np.flatnonzero(mask)]
    if dtype == "BOOL":
        target[positions] ^= 1
        return base, target
    bits = 8 * DTYPES[dtype].size
    picks = random_bytes(label + "/pick", len(positions))
    noise = random_words(label + "/noise", len(positions), DTYPES[dtype].size)
    for i, p in enumerate(positions):
        target[p] = _nudge(int(base[p]), picks[i], bits, int(noise[i]), small)
    top = (1 << bits) - 1
    for p, (b, t) in zip(positions, ((top, 0), (0, top)), strict=False):
        base[p], target[p] = b, t
    return base, target


def mask_with(
    label: str, n: int, density: float, always: tuple[int, ...] = ()
) -> np.ndarray[Any, Any]:
    """A random change mask that also includes the ``always`` positions."""
    mask: np.ndarray[Any, Any] = random_mask(label, n, density).copy()
    mask[list(always)] = True
    return mask
