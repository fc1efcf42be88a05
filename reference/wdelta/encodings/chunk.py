"""Encoding and decoding of one chunk (SPEC.md "Encodings").

``encode_modified`` picks, per chunk, the transform and the encoding with the
smallest estimated size; ``decode`` turns a payload back into output words,
forwards (base -> target) or in reverse (target -> base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError
from . import codec, estimate, planes, sparse, transform

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]
Positions = sparse.Positions


@dataclass(frozen=True)
class Encoded:
    """A chunk's header fields (without offset/checksum) and its stored blob."""

    fields: dict[str, Any]
    blob: bytes | memoryview | None


def _store(fields: dict[str, Any], raw: bytes | memoryview, level: int | None) -> Encoded:
    name, stored = codec.compress(raw, level)
    return Encoded({**fields, "codec": name, "raw_length": len(raw), "length": len(stored)}, stored)


def encode_full(words: Words, level: int | None) -> Encoded:
    """A ``full`` chunk holding ``words`` verbatim."""
    return _store({"encoding": "full", "changed": len(words)}, words.tobytes(), level)


def _pick_transform(base: Words, target: Words, pos: Positions) -> str:
    """The transform whose values at ``pos`` look cheaper, judged on a sample."""
    sampled = estimate.sample(pos)
    b, t = base.take(sampled), target.take(sampled)
    xor_bits = estimate.value_bits(np.bitwise_xor(b, t))
    sub_bits = estimate.value_bits(transform.encode("sub", b, t))
    return "sub" if sub_bits < xor_bits else "xor"


# From this density on, transforming the whole chunk and gathering once is
# cheaper than gathering base and target apart (measured on 4M-element bf16
# chunks: a full-chunk subtract costs about half a 30% gather).
WHOLE_CHUNK_DENSITY = 1 / 5


def _values(kind: str, base: Words, target: Words, pos: Positions) -> Words:
    """Transformed words at the changed positions ``pos``."""
    if len(pos) < len(base) * WHOLE_CHUNK_DENSITY:
        return transform.encode(kind, base.take(pos), target.take(pos))
    raw = np.subtract(target, base) if kind == "sub" else np.bitwise_xor(target, base)
    at = raw.take(pos)
    return transform.zigzag(at) if kind == "sub" else at


# Measured on RL-like bf16 steps, sparse stays 20-40% smaller than dense up to
# a third of the elements changed: its positions sit within 1% of n·H(p) while
# dense planes pay zstd for every run of zeros.  Only above this density, where
# the two converge, or for chunks small enough that trying costs nothing, are
# both compressed and the smaller kept.
SPARSE_ONLY_DENSITY = 1 / 2
ALWAYS_TRY_BYTES = 1 << 16


# From this density on a zstd-compressed bitmap is as small as the Rice code
# (both within 2% of m·H(p), measured on random masks) and far cheaper to
# build: no positions, gaps or bit scatter.
BITMAP_DENSITY = 1 / 5


def _sparse_payload(
    base: Words, target: Words, mask: np.ndarray[Any, Any], pos: Positions
) -> tuple[str, bytes]:
    """(transform, sparse payload) for the changed elements marked in ``mask``."""
    m = len(base)
    kind = _pick_transform(base, target, pos)
    values = _values(kind, base, target, pos)
    if len(pos) >= m * BITMAP_DENSITY:
        return kind, sparse.encode_mask(mask, values)
    return kind, sparse.encode(pos, values, m, sparse.plan_positions(pos, m))


def encode_modified(base: Words, target: Words, level: int | None, allow_full: bool) -> Encoded:
    """The smallest encoding of a chunk that exists on both sides."""
    mask = base != target
    # Gathering through positions is several times faster than boolean
    # indexing; flatnonzero counts first, so an unchanged chunk costs a count.
    pos = np.flatnonzero(mask)
    m, c = len(base), len(pos)
    if c == 0:
        return Encoded({"encoding": "unchanged", "changed": 0}, None)
    kind, payload = _sparse_payload(base, target, mask, pos)
    fields = {"encoding": "sparse", "changed": c, "transform": kind}
    candidates = [_store(fields, payload, level)]
    if c > m * SPARSE_ONLY_DENSITY or base.nbytes <= ALWAYS_TRY_BYTES:
        dense = planes.split(transform.encode(kind, base, target))
        candidates.append(_store({**fields, "encoding": "dense"}, dense, level))
        if allow_full:
            candidates.append(_store({"encoding": "full", "changed": c}, target.tobytes(), level))
    return min(candidates, key=lambda e: e.fields["length"])


def decode(
    encoding: str, kind: str | None, payload: bytes, source: Words | None, m: int,
    word: np.dtype[Any], reverse: bool, changed: int,
) -> Words:  # fmt: skip
    """Output words of a chunk from its payload and the input words.

    ``source`` is the base (forwards) or the target (``reverse``); it is None
    for ``full`` chunks, which need no input.  ``kind`` is the transform.
    A sparse chunk is decoded in place: ``source`` is modified and returned.
    """
    if encoding == "full":
        full: Words = np.frombuffer(payload, dtype=word, count=m)
        return full
    assert source is not None and kind is not None
    invert = transform.to_base if reverse else transform.to_target
    if encoding == "dense":
        return invert(kind, source, planes.join(payload, m, word))
    pos, values = sparse.decode(payload, m, word)
    if len(pos) != changed:
        raise EncodingInvalidError(f"sparse payload holds {len(pos)} positions, header {changed}")
    # take() gathers faster than fancy indexing; values are fresh and consumed.
    source[pos] = invert(kind, source.take(pos), values)
    return source
