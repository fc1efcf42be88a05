"""Base-2 logarithms of integers in fixed point, from integer operations only.

The encoder's size estimates (the transform pick, the coded-values costs) take
logarithms.  NumPy's float ``log2`` and its pairwise sums cannot be reproduced
bit for bit in C, so estimates in floats would let the compiled kernels and the
NumPy reference choose differently.  In fixed point every step is an integer
operation, exact in any order: both paths reach the same numbers, hence the
same choices and the same bytes, on any platform.

:func:`lg` is ``e + log2(1 + f / 1024)`` in units of 2^-16 bits, where 2^e is the
leading bit of x and f the next 10 bits below it: within 0.0015 bits of
log2(x) (the fraction's truncation) and never above it; monotone in x.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

FRACTION_BITS = 16
ONE = 1 << FRACTION_BITS  # 1 bit, in the unit of lg
INDEX_BITS = 10
# log2(ln 2) = -0.52877 bits, rounded down in the unit of lg (the Rice parameters'
# centre is log2(mean · ln 2)).
LG_LN2 = -34654

Ints = np.ndarray[Any, np.dtype[np.int64]]


def _log2_fraction(i: int) -> int:
    """floor(log2(1 + i / 2^INDEX_BITS) · ONE), by repeated squaring in 2^-60 units."""
    unit = 1 << 60
    y = (((1 << INDEX_BITS) + i) << 60) >> INDEX_BITS  # in [1, 2)
    bits = 0
    for _ in range(FRACTION_BITS):
        y = y * y >> 60
        bits <<= 1
        if y >= 2 * unit:
            y >>= 1
            bits |= 1
    return bits


@functools.cache
def table() -> np.ndarray[Any, np.dtype[np.int32]]:
    """The 1024 fractions lg adds (int32, increasing from 0): what the kernels receive."""
    return np.array([_log2_fraction(i) for i in range(1 << INDEX_BITS)], dtype=np.int32)


def lg(x: np.ndarray[Any, Any]) -> Ints:
    """lg of each integer of ``x`` (1 <= x < 2^63), int64 in units of 2^-16 bits."""
    wide = x.astype(np.uint64)
    # frexp of the float gives the leading bit, one too high where rounding to 53 bits
    # carried into the next power of two; the shift test corrects that exactly.
    exponent = np.frexp(wide.astype(np.float64))[1].astype(np.uint64) - np.uint64(1)
    exponent -= (wide >> exponent) == 0
    top = (wide << (np.uint64(63) - exponent)) >> np.uint64(63 - INDEX_BITS)
    fraction = table()[(top & np.uint64((1 << INDEX_BITS) - 1)).astype(np.intp)]
    out: Ints = exponent.astype(np.int64) * ONE + fraction
    return out
