"""Deterministic pseudo-random data from labels (BLAKE3 in XOF mode).

NumPy's generators do not promise the same stream across versions; BLAKE3's
extendable output is fixed by its specification, so every vector is the same
on every machine and every run.
"""

from __future__ import annotations

from typing import Any

import blake3
import numpy as np

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def random_bytes(label: str, n: int) -> bytes:
    """``n`` bytes determined by ``label`` alone."""
    return bytes(blake3.blake3(label.encode("utf-8")).digest(length=n)) if n else b""


def random_words(label: str, n: int, size: int) -> Words:
    """``n`` writable little-endian unsigned words of ``size`` bytes."""
    words: Words = np.frombuffer(random_bytes(label, n * size), dtype=f"<u{size}").copy()
    return words


def random_mask(label: str, n: int, density: float) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """A boolean mask of length ``n`` with about ``density * n`` True values."""
    draws = np.frombuffer(random_bytes(label, 2 * n), dtype="<u2")
    mask: np.ndarray[Any, np.dtype[np.bool_]] = draws < int(density * 65536)
    return mask
