"""One chunk (SPEC §7): its stored blob from a chosen encoding, and decoding.

The writers here lay out what the encoder chose (:mod:`wdelta.policy.chunk`
chooses); :func:`decode` dispatches on the chunk's encoding (``unchanged``
chunks have no payload and never reach it) and turns a payload back into output
words, forwards (base -> target) or in reverse (target -> base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError
from ..format.names import Encoding, Transform
from . import blob, native, planes, sparse, transform

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


@dataclass(frozen=True)
class Encoded:
    """A chunk's header fields (without offset/checksum) and its stored blob.

    ``advanced``: the encoder's change pass also brought the caller's copy of the
    base to the target (``encode_modified``'s ``advance``).
    """

    fields: dict[str, Any]
    blob: bytes | memoryview | None
    coded: bool = False  # a sparse payload with coded values (feature coded-values)
    advanced: bool = False


def store(
    fields: dict[str, Any], raw: bytes | memoryview, level: int | None, sections: list[int]
) -> Encoded:
    """The chunk with header ``fields`` whose payload is ``raw`` (zstd blocks ending at
    ``sections``, see :func:`blob.compress`), with its codec and lengths."""
    name, stored = blob.compress(raw, level, sections)
    return Encoded({**fields, "codec": name, "raw_length": len(raw), "length": len(stored)}, stored)


def encode_full(words: Words, level: int | None, changed: int | None = None) -> Encoded:
    """A ``full`` chunk (§7.4) holding ``words`` verbatim; ``changed`` defaults to all."""
    fields = {"encoding": "full", "changed": len(words) if changed is None else changed}
    return store(fields, words.tobytes(), level, [])


def encode_dense(
    changed: int, kind: Transform, base: Words, target: Words, level: int | None
) -> Encoded:
    """A ``dense`` chunk (§7.5) of ``changed`` changed elements: the byte planes of
    every word transformed by ``kind``, a zstd block per plane."""
    m, size = len(base), base.dtype.itemsize
    dense = planes.split(transform.encode(kind, base, target))
    fields = {"encoding": "dense", "changed": changed, "transform": kind}
    return store(fields, dense, level, [j * m for j in range(size)])


def decode(
    encoding: Encoding, kind: Transform | None, payload: bytes, source: Words | None, m: int,
    word: np.dtype[Any], reverse: bool, changed: int, coded: bool = False,
) -> Words:  # fmt: skip
    """Output words of a chunk from its payload and the input words.

    ``source`` is the base (forwards) or the target (``reverse``); it is None
    for ``full`` chunks, which need no input.  ``kind`` is the transform.
    A sparse chunk is decoded in place: ``source`` is modified and returned.
    ``coded``: the header requires ``coded-values`` (see :func:`sparse.decode`).
    """
    if encoding == "full":
        full: Words = np.frombuffer(payload, dtype=word, count=m)
        return full
    assert source is not None and kind is not None
    invert = transform.to_base if reverse else transform.to_target
    if encoding == "dense":
        return invert(kind, source, planes.join(payload, m, word))
    pos, values = sparse.decode(payload, m, word, coded, changed)
    if len(pos) != changed:
        raise EncodingInvalidError(f"sparse payload holds {len(pos)} positions, header {changed}")
    # The kernel writes into ``source`` as the NumPy line below does (which refuses a
    # read-only array): only a writable one reaches it.
    if (
        native.usable(source, pos, values)
        and values.dtype == source.dtype
        and source.flags.writeable
    ):
        transform.check(kind)
        native.apply(kind == "sub", reverse, source, pos, values)
        return source
    # take() gathers faster than fancy indexing; values are fresh and consumed.
    source[pos] = invert(kind, source.take(pos), values)
    return source
