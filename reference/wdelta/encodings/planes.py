"""Byte planes: s-byte words stored as s planes, least significant byte first.

Exponent and mantissa bytes have very different statistics; separating them
lets the entropy coder see each distribution on its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def split(words: Words) -> memoryview:
    """Plane j (j = 0 least significant) holds byte j of every word, in order.

    The result is a byte view of a new buffer (of ``words`` itself for
    one-byte words), ready to be joined without another copy.
    """
    s = words.dtype.itemsize
    if s == 1:
        return np.ascontiguousarray(words).data.cast("B")
    # One strided copy per plane is 1.2-5x faster than transposing the matrix.
    by_byte = np.ascontiguousarray(words).view(np.uint8).reshape(-1, s)
    out = np.empty((s, len(by_byte)), dtype=np.uint8)
    for j in range(s):
        out[j] = by_byte[:, j]
    return out.data.cast("B")


def join(data: bytes | memoryview, count: int, word: np.dtype[Any]) -> Words:
    """Inverse of :func:`split`: ``count`` words of dtype ``word`` from planes."""
    s = word.itemsize
    planes = np.frombuffer(data, dtype=np.uint8, count=count * s)
    if s == 1:
        single: Words = planes.copy()
        return single
    out: Words = np.empty(count, dtype=word)
    by_byte = out.view(np.uint8).reshape(count, s)
    for j in range(s):
        by_byte[:, j] = planes[j * count : (j + 1) * count]
    return out
