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
        # 1-D uint8 arrays: their .data is a flat byte view even when empty.
        return np.ascontiguousarray(words).view(np.uint8).data
    out = np.empty(len(words) * s, dtype=np.uint8)
    split_into(words, out.reshape(s, -1))
    return out.data


def split_into(words: Words, rows: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
    """Write byte j of every word into ``rows[j]`` (an s x len(words) byte array)."""
    cols = np.ascontiguousarray(words).view(np.uint8).reshape(-1, words.dtype.itemsize)
    # One strided copy per plane is 1.2-5x faster than transposing the matrix.
    for j in range(words.dtype.itemsize):
        rows[j] = cols[:, j]


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
