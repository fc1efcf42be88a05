"""The encoder's choice of a modified chunk's encoding (SPEC §7), and its thresholds.

Informative (SPEC §11.2): :func:`encode_modified` finds the changed elements,
picks the transform (:mod:`.transform`), the position coding (:mod:`.rice`) and
whether to code the values (:mod:`.values`), and keeps the smallest of the
candidate chunks that :mod:`wdelta.codec.chunk` writes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ..codec import blob, native, sparse, transform
from ..codec.chunk import Encoded, encode_dense, encode_full, store
from ..codec.positions import bitmap_encode
from ..format.names import Transform
from . import transform as transform_policy
from .rice import plan_positions
from .values import SparseValues

Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]
Positions = sparse.Positions

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
) -> tuple[Transform, sparse.Parts]:
    """(transform, bitmap payload parts) for the ``count`` changed elements in ``mask``."""
    kind = transform_policy.pick(base, target, transform_policy.sample_mask(mask, count))
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
) -> tuple[Transform, sparse.Parts]:
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


def _positions_payload(
    base: Words, target: Words, pos: Positions
) -> tuple[Transform, sparse.Parts]:
    """(transform, sparse payload parts) for the changed elements at ``pos`` (fewer than a
    bitmap's)."""
    m = len(base)
    kind = transform_policy.pick(base, target, transform_policy.sample(pos))
    values = transform.encode(kind, base.take(pos), target.take(pos))
    return kind, sparse.parts(pos, values, m, plan_positions(pos, m))


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


Found = tuple[int, Transform, sparse.Parts, bool]


def _changes(base: Words, target: Words, advance: Words | None) -> Found | None:
    """(changed count, transform, sparse payload parts, whether the compiled pass brought
    ``advance`` to the target as it found the changes), or None if nothing changed."""
    if native.usable(base, target) and not _dense(base, target):
        found = native.changes(base, target, len(base) // NATIVE_MAX_SHARE, advance)
        if found is not None:
            return (*_native_changes(base, *found), advance is not None) if len(found[0]) else None
    pos = _sparse_positions(base, target)
    if pos is not None:
        return (len(pos), *_positions_payload(base, target, pos), False) if len(pos) else None
    padded = _mask(base, target)
    c = int(np.count_nonzero(padded[: len(base)]))
    return (c, *_sparse_payload(base, target, padded, c), False) if c else None


# The compiled pass finds each changed element on its own, which beats NumPy's mask and
# gathers while changes are sparse but loses to its blocked bitmap path at the bitmap
# density (measured on 4M-element bf16 chunks: 5.7 against 6.2 ms at 2%, 20.8 against
# 21.3 ms at 17%, 21.3 against 15.1 ms at 30%).  Both give the same bytes; the elements
# of the WIDE_WINDOWS runs that _wide_sample spreads over the chunk decide which runs.
def _dense(base: Words, target: Words) -> bool:
    """True if the sampled runs of elements differ at the bitmap density or more."""
    idx = _wide_sample(len(base))
    differ = int(np.count_nonzero(base.take(idx) != target.take(idx)))
    return differ >= len(idx) * BITMAP_DENSITY


# The compiled pass keeps room for at most 1/NATIVE_MAX_SHARE of a chunk's elements changed
# (a position and both transforms' words, 12 bytes for bf16: 6 MB for a 4M-element chunk
# at 1/8, near the NumPy path's 4.4 MB mask); a chunk with more changes is done by NumPy
# (the sample of _dense sends most of them there first).  Room for every element raised
# the peak RSS of a 1 GB bf16 diff from 96 to 121 MB; with this, 98 MB (fp8: 112 -> 99 MB).
NATIVE_MAX_SHARE = 8


def _native_changes(
    base: Words, pos: Positions, words: dict[str, Words]
) -> tuple[int, Transform, sparse.Parts]:
    """:func:`_changes` from what the compiled pass found: the positions and the words
    of both transforms there; the same parts follow from them (a bitmap's transform
    sample is the changes in the windows :func:`sample_mask` reads)."""
    m = len(base)
    c = len(pos)
    rice = c < m * BITMAP_DENSITY
    idx = transform_policy.sample_index(c) if rice else transform_policy.window_index(pos, m)
    # The sampled words of both transforms are at hand: no gathers from the chunk.
    xor, sub = (
        (words["xor"], words["sub"]) if idx is None else (words["xor"][idx], words["sub"][idx])
    )
    kind = transform_policy.pick_words(xor, sub)
    if rice:
        return c, kind, sparse.parts(pos, words[kind], m, plan_positions(pos, m))
    return c, kind, sparse.Parts(sparse.BITMAP, 0, 0, bitmap_encode(pos, m), words[kind])


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
    values = SparseValues(found)
    if coded and len(found.streams) + len(found.values) * size >= blob.AUTO_SMALL_BYTES:
        sure = values.coded(m, None, SURE_GAIN)
        if sure is not None:
            stored = store(fields, sure[0], level, sure[1])
            return [Encoded(stored.fields, stored.blob, True)]
    payload, sections = found.v1()
    candidates = [store(fields, payload, level, sections)]
    if coded:
        # Kept only when its stored blob is smaller: never worse than the v1 payload.
        recoded = values.coded(m, candidates[0].fields["length"])
        if recoded is not None:
            alt = store(fields, recoded[0], level, recoded[1])
            candidates.append(Encoded(alt.fields, alt.blob, True))
    return candidates


def encode_modified(
    base: Words, target: Words, level: int | None, allow_full: bool, coded: bool = False,
    advance: Words | None = None,
) -> Encoded:  # fmt: skip
    """The smallest encoding of a chunk that exists on both sides.

    ``coded`` lets a sparse payload code its values (feature ``coded-values``);
    ``Encoded.coded`` then says whether this one does.  ``advance`` (words equal to
    ``base``, or ``base`` itself) is brought to ``target`` where the compiled change
    pass can do that as it goes (``Encoded.advanced``), else left as it was.
    """
    m = len(base)
    # The dense and full candidates read the base after the change pass: only chunks
    # small enough to try them always, or changed above SPARSE_ONLY_DENSITY (which the
    # compiled pass never takes: it stops at 1/NATIVE_MAX_SHARE), are left unadvanced.
    found = _changes(base, target, advance if base.nbytes > ALWAYS_TRY_BYTES else None)
    if found is None:
        return Encoded({"encoding": "unchanged", "changed": 0}, None)
    c, kind, parts, advanced = found
    assert not advanced or c <= m * SPARSE_ONLY_DENSITY
    fields = {"encoding": "sparse", "changed": c, "transform": kind}
    candidates = _sparse_candidates(fields, parts, m, level, coded)
    if c > m * SPARSE_ONLY_DENSITY or base.nbytes <= ALWAYS_TRY_BYTES:
        candidates.append(encode_dense(c, kind, base, target, level))
        if allow_full:
            candidates.append(encode_full(target, level, c))
    best = min(candidates, key=lambda e: e.fields["length"])
    return dataclasses.replace(best, advanced=True) if advanced else best
