"""Reference sizes for a base/target pair: the information bound and a dense-XOR sample.

Information bound (zeroth order, per chunk of ``chunk_elements`` of each
tensor, the delta's own chunking): ``m·H(c/m)`` bits for the positions of the
``c`` changed elements among ``m``, plus ``c`` times the empirical entropy of
the changed words' values under the better of xor and zigzag(sub) for that
chunk, over whole words (not bytes).  A coder that models each chunk on its
own with a static code cannot beat it, up to its table cost.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wdelta import open_checkpoint
from wdelta.codec import transform
from wdelta.ops.pipeline import ordered_map

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def binary_entropy(p: float) -> float:
    """H(p) in bits."""
    if p <= 0 or p >= 1:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def word_entropy(words: Words) -> float:
    """Empirical zeroth-order entropy in bits per word of whole words."""
    if len(words) == 0:
        return 0.0
    if words.dtype.itemsize <= 2:
        counts = np.bincount(words, minlength=1)
    else:
        counts = np.unique(words, return_counts=True)[1]
    p = counts[counts > 0] / len(words)
    return float(-(p * np.log2(p)).sum())


@dataclass
class Bound:
    """Bound parts in bits; ``sub_chunks`` counts chunks where sub beat xor."""

    position_bits: float = 0.0
    value_bits: float = 0.0
    changed: int = 0
    elements: int = 0
    chunks: int = 0
    sub_chunks: int = 0

    @property
    def bytes(self) -> float:
        return (self.position_bits + self.value_bits) / 8

    def add(self, other: Bound) -> None:
        self.position_bits += other.position_bits
        self.value_bits += other.value_bits
        self.changed += other.changed
        self.elements += other.elements
        self.chunks += other.chunks
        self.sub_chunks += other.sub_chunks


def chunk_bound(base: Words, target: Words) -> Bound:
    """The bound of one chunk."""
    m = len(base)
    pos = np.flatnonzero(base != target)
    c = len(pos)
    if c == 0:
        return Bound(elements=m, chunks=1)
    b, t = base[pos], target[pos]
    h_xor = word_entropy(np.bitwise_xor(b, t))
    h_sub = word_entropy(transform.encode("sub", b, t))
    return Bound(
        m * binary_entropy(c / m), c * min(h_xor, h_sub), c, m, 1, int(h_sub < h_xor)
    )  # fmt: skip


def information_bound(base: Path, target: Path, chunk_elements: int, threads: int = 2) -> Bound:
    """The bound summed over every chunk of every tensor (tensors must match)."""
    total = Bound()
    with open_checkpoint(base) as b, open_checkpoint(target) as t:
        if {n: (x.dtype, x.shape) for n, x in b.tensors.items()} != {
            n: (x.dtype, x.shape) for n, x in t.tensors.items()
        }:
            raise ValueError("base and target must hold the same tensors")
        work = [
            (name, start, min(chunk_elements, b.tensors[name].elements - start))
            for name in sorted(b.tensors)
            for start in range(0, b.tensors[name].elements, chunk_elements)
        ]

        def one(item: tuple[str, int, int]) -> Bound:
            name, start, count = item
            return chunk_bound(
                b.tensors[name].read(start, count), t.tensors[name].read(start, count)
            )

        for part in ordered_map(one, work, threads):
            total.add(part)
    return total


def _data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def xor_sample(base: Path, target: Path, sample_bytes: int, slices: int = 64) -> tuple[bytes, int]:
    """(sample, stream length): ``slices`` evenly spaced slices of the dense XOR stream.

    The stream is base XOR target over the safetensors data sections (both
    files must share one layout), i.e. what "XOR the files, then compress"
    would compress.  Slice starts are 8-byte aligned.
    """
    start = _data_start(base)
    if start != _data_start(target) or base.stat().st_size != target.stat().st_size:
        raise ValueError("base and target must share one safetensors layout")
    length = base.stat().st_size - start
    size = min(length, sample_bytes) // slices // 8 * 8 or min(length, sample_bytes)
    count = max(1, min(slices, length // max(size, 1)))
    parts = []
    with open(base, "rb") as fb, open(target, "rb") as ft:
        for i in range(count):
            offset = start + (i * (length - size) // max(count - 1, 1)) // 8 * 8
            a = np.frombuffer(os.pread(fb.fileno(), size, offset), dtype=np.uint8)
            b = np.frombuffer(os.pread(ft.fileno(), size, offset), dtype=np.uint8)
            parts.append(np.bitwise_xor(a, b).tobytes())
    return b"".join(parts), length
