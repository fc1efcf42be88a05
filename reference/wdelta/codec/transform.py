"""Value transforms on stored words, never on float values (SPEC §6).

``xor``: v = t ^ b.  ``sub``: d = (t - b) mod 2^w, stored zigzag-coded so that
a small signed step (the common case for a bf16 update) has zero high bytes.
Both are bijections for a fixed base, so every transformed chunk can be
applied forwards (base -> target) and backwards (target -> base).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UnsupportedFeatureError
from ..format.names import TRANSFORMS, Transform

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def check(kind: str) -> None:
    if kind not in TRANSFORMS:
        raise UnsupportedFeatureError(f"unknown transform {kind!r}")


def zigzag(d: Words) -> Words:
    """Map a two's-complement word to its zigzag code, in place."""
    w = d.dtype.itemsize * 8
    sign = d.view(d.dtype.str.replace("u", "i")) >> (w - 1)
    d <<= 1
    d ^= sign.view(d.dtype)
    return d


def unzigzag(v: Words) -> Words:
    """Inverse of :func:`zigzag`, in place."""
    w = v.dtype.itemsize * 8
    sign = (v << (w - 1)).view(v.dtype.str.replace("u", "i")) >> (w - 1)
    v >>= 1
    v ^= sign.view(v.dtype)
    return v


def difference(kind: Transform, base: Words, target: Words) -> Words:
    """``t ^ b`` or ``(t - b) mod 2^w``: the transform before :func:`code`."""
    check(kind)
    if kind == "xor":
        return np.bitwise_xor(target, base)
    return np.subtract(target, base)


def code(kind: Transform, d: Words) -> Words:
    """Finish :func:`difference` words into stored values, in place (zigzag for ``sub``).

    Done apart so that an encoder can gather the changed words first and
    zigzag only those.
    """
    return zigzag(d) if kind == "sub" else d


def encode(kind: Transform, base: Words, target: Words) -> Words:
    """Transformed words v for base and target words of equal length."""
    return code(kind, difference(kind, base, target))


def to_target(kind: Transform, base: Words, v: Words) -> Words:
    """Recover target words from base words and transformed words ``v``.

    ``v`` is consumed: it holds the result (or scratch) afterwards.
    """
    check(kind)
    if kind == "xor":
        return np.bitwise_xor(base, v, out=v)
    return np.add(base, unzigzag(v), out=v)


def to_base(kind: Transform, target: Words, v: Words) -> Words:
    """Recover base words from target words and transformed words ``v`` (reverse).

    ``v`` is consumed: it holds the result (or scratch) afterwards.
    """
    check(kind)
    if kind == "xor":
        return np.bitwise_xor(target, v, out=v)
    return np.subtract(target, unzigzag(v), out=v)
