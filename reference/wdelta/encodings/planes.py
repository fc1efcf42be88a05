"""Byte planes: s-byte words stored as s planes, least significant byte first.

Exponent and mantissa bytes have very different statistics; separating them
lets the entropy coder see each distribution on its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def split(words: Words) -> bytes:
    """Plane j (j = 0 least significant) holds byte j of every word, in order."""
    s = words.dtype.itemsize
    if s == 1:
        return words.tobytes()
    return np.ascontiguousarray(words.view(np.uint8).reshape(-1, s).T).tobytes()


def join(data: bytes | memoryview, count: int, word: np.dtype[Any]) -> Words:
    """Inverse of :func:`split`: ``count`` words of dtype ``word`` from planes."""
    s = word.itemsize
    planes = np.frombuffer(data, dtype=np.uint8, count=count * s)
    if s == 1:
        single: Words = planes.copy()
        return single
    out: Words = np.ascontiguousarray(planes.reshape(s, count).T).view(word).reshape(-1)
    return out
