"""Encoding and decoding of one chunk (SPEC.md "Encodings").

``encode_modified`` picks, per chunk, the transform and the encoding with the
smallest estimated size; ``decode`` turns a payload back into output words,
forwards (base -> target) or in reverse (target -> base).
"""

from __future__ import annotations

import functools
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
    coded: bool = False  # a sparse payload with coded values (feature coded-values)


def _store(
    fields: dict[str, Any], raw: bytes | memoryview, level: int | None, sections: list[int]
) -> Encoded:
    name, stored = codec.compress(raw, level, sections)
    return Encoded({**fields, "codec": name, "raw_length": len(raw), "length": len(stored)}, stored)


def encode_full(words: Words, level: int | None) -> Encoded:
    """A ``full`` chunk holding ``words`` verbatim."""
    return _store({"encoding": "full", "changed": len(words)}, words.tobytes(), level, [])


def _pick_transform(base: Words, target: Words, sampled: Positions) -> str:
    """The transform whose values at the positions ``sampled`` look cheaper."""
    b, t = base.take(sampled), target.take(sampled)
    xor_bits, sub_bits = estimate.value_bits_each(
        np.bitwise_xor(b, t), transform.encode("sub", b, t)
    )
    return "sub" if sub_bits < xor_bits else "xor"


# Measured on RL-like bf16 steps, sparse stays 20-40% smaller than dense up to
# a third of the elements changed: its positions sit within 1% of n·H(p) while
# dense planes pay zstd for every run of zeros.  Only above this density, where
# the two converge, or for chunks small enough that trying costs nothing, are
# both compressed and the smaller kept.
SPARSE_ONLY_DENSITY = 1 / 2
ALWAYS_TRY_BYTES = 1 << 16


# From this density on a zstd-compressed bitmap is as small as the Rice code
# (both within 2% of m·H(p), measured on random masks) and far cheaper to
# build: no gaps or bit scatter.
BITMAP_DENSITY = 1 / 5
# A bitmap chunk's values are produced this many elements at a time, so that
# each block's transform, positions and gather stay in cache rather than
# streaming the whole chunk through memory three times, and no chunk-sized
# transform array is held (measured: encoding a 4M-element bf16 chunk at 30%
# density takes 12.3 ms, 13.5 ms without blocks; 64K-element blocks 12.9 ms).
BLOCK_ELEMENTS = 1 << 18


def _bitmap_payload(
    base: Words, target: Words, mask: np.ndarray[Any, Any], count: int
) -> tuple[str, sparse.Parts]:
    """(transform, bitmap payload parts) for the ``count`` changed elements in ``mask``."""
    kind = _pick_transform(base, target, estimate.sample_mask(mask, count))
    payload = sparse.BitmapPayload(mask, count, base.dtype)
    for a in range(0, len(base), BLOCK_ELEMENTS):
        b = a + BLOCK_ELEMENTS
        # Transforming the whole block and gathering once costs about half
        # of gathering base and target apart at these densities.
        d = transform.difference(kind, base[a:b], target[a:b])
        payload.add(transform.code(kind, d.take(np.flatnonzero(mask[a:b]))))
    return kind, payload.finish()


def _sparse_payload(
    base: Words, target: Words, padded: np.ndarray[Any, Any], count: int
) -> tuple[str, sparse.Parts]:
    """(transform, sparse payload parts) for the ``count`` changed elements in the
    mask that starts ``padded`` (see :func:`_mask`)."""
    m = len(base)
    if count >= m * BITMAP_DENSITY:
        return _bitmap_payload(base, target, padded[:m], count)
    # Gathering through positions is several times faster than boolean indexing.
    return _positions_payload(base, target, _mask_positions(padded, m, count))


# NumPy's nonzero() of a boolean array runs a branchy loop when at most a tenth
# of the entries are set (fast on very sparse masks) and a branchless one above.
# From about 1/25 to 1/10 the branchy loop mispredicts so often that it costs up
# to three times the branchless one (4M elements: 3.5 against 2.4 ms at 5%, 6.6
# against 2.2 ms at 9.9%).  Masks in that band get set entries appended past
# their end, just enough to cross NumPy's threshold, and the positions past the
# end are dropped: the result is the same, only NumPy's choice of loop changes.
PAD_MIN_DENSITY = 1 / 25


def _mask(base: Words, target: Words) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """A buffer whose first ``len(base)`` entries are the mask ``base != target``,
    with room after them for :func:`_mask_positions`' padding."""
    m = len(base)
    padded = np.empty(m + m // 9 + 64, dtype=np.bool_)
    np.not_equal(base, target, out=padded[:m])
    return padded


def _mask_positions(padded: np.ndarray[Any, Any], m: int, count: int) -> Positions:
    """Sorted positions of the ``count`` set entries of the mask ``padded[:m]``."""
    if count < m * PAD_MIN_DENSITY or count * 10 > m:
        return np.flatnonzero(padded[:m])
    # (count + pad) / (m + pad) > 1/10, with a margin for NumPy's float division.
    pad = (m - 10 * count) // 9 + 64
    padded[m : m + pad] = True
    positions: Positions = np.flatnonzero(padded[: m + pad])[:count]
    return positions


def _positions_payload(base: Words, target: Words, pos: Positions) -> tuple[str, sparse.Parts]:
    """(transform, sparse payload parts) for the changed elements at ``pos`` (fewer than a
    bitmap's)."""
    m = len(base)
    kind = _pick_transform(base, target, estimate.sample(pos))
    values = transform.encode(kind, base.take(pos), target.take(pos))
    return kind, sparse.parts(pos, values, m, sparse.plan_positions(pos, m))


# From this size on, changed elements are first looked for 8 bytes at a time:
# comparing and scanning u64 words touches an eighth of the mask entries, and
# only the words that differ are compared element by element.  That costs
# about 35 ns per differing word against 15 ns per changed element for the
# element mask, so it pays only while few words differ: up to 1 in
# WIDE_MAX_DIFFERING, judged on WIDE_WINDOWS runs of WIDE_RUN words spread
# over the chunk (neighbouring words, so the sample reads few cache lines).
# Measured on the real fp8 trace (58 chunks of 0.13-0.79 MB, thread CPU per
# diff): 1.7% of the words differ at lr 1e-6, 8.4-8.6 -> 6.5-6.7 ms with the
# sample; 11.8% at lr 1e-5, where the wide scan took 17.3 ms against the
# mask's 13.4 ms, and the sample now costs 0.4 ms before the mask is built.
WIDE_MIN_BYTES = 1 << 12
WIDE_MAX_DIFFERING = 32
WIDE_WINDOWS = 8
WIDE_RUN = 128


def _few_words_differ(wide_base: Words, wide_target: Words) -> bool:
    """True if the sampled runs of words differ in at most 1 word in WIDE_MAX_DIFFERING."""
    idx = _wide_sample(len(wide_base))
    differ = int(np.count_nonzero(wide_base.take(idx) != wide_target.take(idx)))
    return differ * WIDE_MAX_DIFFERING <= len(idx)


@functools.lru_cache(maxsize=64)
def _wide_sample(n: int) -> Positions:
    """Indices of WIDE_WINDOWS evenly spread runs of WIDE_RUN words (all words if fewer)."""
    run = min(WIDE_RUN, n // WIDE_WINDOWS)
    if run == 0:
        return np.arange(n)
    starts = np.arange(WIDE_WINDOWS) * (n - run) // (WIDE_WINDOWS - 1)
    return np.add.outer(starts, np.arange(run)).reshape(-1)


def _sparse_positions(base: Words, target: Words) -> Positions | None:
    """Sorted positions of the changed elements if they are few.

    None when the wide-word scan does not apply or would be slower, or finds
    changes at the bitmap density or more (the caller then builds the
    element mask).
    """
    if (
        base.nbytes < WIDE_MIN_BYTES
        or base.nbytes % 8
        or not (base.flags.c_contiguous and target.flags.c_contiguous)
    ):
        return None
    per = 8 // base.dtype.itemsize
    wide_base, wide_target = base.view(np.uint64), target.view(np.uint64)
    if not _few_words_differ(wide_base, wide_target):
        return None
    words = np.flatnonzero(wide_base != wide_target)
    if len(words) * per >= len(base) * BITMAP_DENSITY:
        return None
    # Which elements of each differing word differ: its XOR's nonzero elements.
    xor = np.bitwise_xor(wide_base.take(words), wide_target.take(words))
    row, col = np.nonzero(xor.view(base.dtype).reshape(len(words), per))
    pos: Positions = words[row] * per + col
    return pos


def _changes(base: Words, target: Words) -> tuple[int, str, sparse.Parts] | None:
    """(changed count, transform, sparse payload parts), or None if nothing changed."""
    pos = _sparse_positions(base, target)
    if pos is not None:
        return (len(pos), *_positions_payload(base, target, pos)) if len(pos) else None
    padded = _mask(base, target)
    c = int(np.count_nonzero(padded[: len(base)]))
    return (c, *_sparse_payload(base, target, padded, c)) if c else None


# A payload of 64 KiB or more whose values the histogram says coding shrinks by
# this share or more of the byte planes' estimate is coded without compressing
# its v1 form first (a second zstd pass over the whole payload: a fifth of the
# encode CPU of a bf16 chunk at 30% density).  On the bench's default cases
# (bf16 0.1-30%, fp8 2%) the deltas are byte-identical to those of the measured
# choice: both forms' planes are estimated alike, and the gain is far above the
# estimate's error there.  Small payloads are cheap to compress twice and need
# the measured size: with estimates only, fp8 deltas of the real trace grow by 6%.
SURE_GAIN = 0.1


def _sparse_candidates(
    fields: dict[str, Any], found: sparse.Parts, m: int, level: int | None, coded: bool
) -> list[Encoded]:
    """The stored sparse payload: v1, coded values, or both to keep the smaller."""
    size = found.values.dtype.itemsize
    if coded and len(found.streams) + len(found.values) * size >= codec.AUTO_SMALL_BYTES:
        sure = found.coded(m, None, SURE_GAIN)
        if sure is not None:
            stored = _store(fields, sure[0], level, sure[1])
            return [Encoded(stored.fields, stored.blob, True)]
    payload, sections = found.v1()
    candidates = [_store(fields, payload, level, sections)]
    if coded:
        # Kept only when its stored blob is smaller: never worse than the v1 payload.
        recoded = found.coded(m, candidates[0].fields["length"])
        if recoded is not None:
            alt = _store(fields, recoded[0], level, recoded[1])
            candidates.append(Encoded(alt.fields, alt.blob, True))
    return candidates


def encode_modified(
    base: Words, target: Words, level: int | None, allow_full: bool, coded: bool = False
) -> Encoded:
    """The smallest encoding of a chunk that exists on both sides.

    ``coded`` lets a sparse payload code its values (feature ``coded-values``);
    ``Encoded.coded`` then says whether this one does.
    """
    m = len(base)
    found = _changes(base, target)
    if found is None:
        return Encoded({"encoding": "unchanged", "changed": 0}, None)
    c, kind, parts = found
    fields = {"encoding": "sparse", "changed": c, "transform": kind}
    size = base.dtype.itemsize
    candidates = _sparse_candidates(fields, parts, m, level, coded)
    if c > m * SPARSE_ONLY_DENSITY or base.nbytes <= ALWAYS_TRY_BYTES:
        dense = planes.split(transform.encode(kind, base, target))
        dense_planes = [j * m for j in range(size)]
        candidates.append(_store({**fields, "encoding": "dense"}, dense, level, dense_planes))
        if allow_full:
            full = target.tobytes()
            candidates.append(_store({"encoding": "full", "changed": c}, full, level, []))
    return min(candidates, key=lambda e: e.fields["length"])


def decode(
    encoding: str, kind: str | None, payload: bytes, source: Words | None, m: int,
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
    # take() gathers faster than fancy indexing; values are fresh and consumed.
    source[pos] = invert(kind, source.take(pos), values)
    return source
