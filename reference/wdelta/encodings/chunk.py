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


@dataclass(frozen=True)
class Encoded:
    """A chunk's header fields (without offset/checksum) and its stored blob."""

    fields: dict[str, Any]
    blob: bytes | None


def _store(fields: dict[str, Any], raw: bytes, level: int) -> Encoded:
    name, stored = codec.compress(raw, level)
    return Encoded({**fields, "codec": name, "raw_length": len(raw), "length": len(stored)}, stored)


def encode_full(words: Words, level: int) -> Encoded:
    """A ``full`` chunk holding ``words`` verbatim."""
    return _store({"encoding": "full", "changed": len(words)}, words.tobytes(), level)


def _pick_transform(base_at: Words, target_at: Words) -> tuple[str, Words]:
    """The transform whose values look cheaper, and the values at the positions."""
    b, t = estimate.sample(base_at), estimate.sample(target_at)
    xor_bits = estimate.value_bits(np.bitwise_xor(b, t))
    sub_bits = estimate.value_bits(transform.encode("sub", b, t))
    kind = "sub" if sub_bits < xor_bits else "xor"
    return kind, transform.encode(kind, base_at, target_at)


# Below this density the sparse coding is within a few percent of the position
# bound while dense planes pay for every run of zeros, so sparse is chosen
# without trying dense; above it both are compressed and the smaller is kept.
SPARSE_ONLY_DENSITY = 1 / 16


def encode_modified(base: Words, target: Words, level: int, allow_full: bool) -> Encoded:
    """The smallest encoding of a chunk that exists on both sides."""
    pos = np.flatnonzero(base != target)
    m, c = len(base), len(pos)
    if c == 0:
        return Encoded({"encoding": "unchanged", "changed": 0}, None)
    kind, values = _pick_transform(base[pos], target[pos])
    fields = {"encoding": "sparse", "changed": c, "transform": kind}
    plan = sparse.plan_positions(pos, m)
    candidates = [_store(fields, sparse.encode(pos, values, m, plan), level)]
    if c > m * SPARSE_ONLY_DENSITY:
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
    source[pos] = invert(kind, source[pos], values)
    return source
