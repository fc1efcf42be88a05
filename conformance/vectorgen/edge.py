"""Valid edge cases: shapes, ops, special values, position codings, layouts."""

from __future__ import annotations

import numpy as np

from . import checkpoints as ck
from .builder import Chooser, ChunkPlan, build, full_chunks, uniform
from .common import Pair, add_valid
from .payload import BITMAP, RICE
from .suite import Suite
from .values import base_words, mask_with, update

RICE_XOR = ChunkPlan("sparse", "xor", "zstd", RICE)
RICE_SUB = ChunkPlan("sparse", "sub", "none", RICE)
BITMAP_XOR = ChunkPlan("sparse", "xor", "none", BITMAP)
BITMAP_SUB = ChunkPlan("sparse", "sub", "zstd", BITMAP)
DENSE_XOR = ChunkPlan("dense", "xor", "zstd")
DENSE_SUB = ChunkPlan("dense", "sub", "none")
CYCLE = (RICE_XOR, BITMAP_SUB, DENSE_XOR, RICE_SUB, BITMAP_XOR, DENSE_SUB)


def cycling(name: str, index: int) -> ChunkPlan:
    """A different plan for consecutive chunks."""
    return CYCLE[index % len(CYCLE)]


def changed(label: str, name: str, dtype: str, shape: tuple[int, ...], density: float,
            always: tuple[int, ...] = ()) -> tuple[ck.TensorData, ck.TensorData]:  # fmt: skip
    """(base, target) versions of one tensor with about ``density`` changed."""
    n = int(np.prod(shape, dtype=np.int64))
    mask = mask_with(f"{label}/{name}/mask", n, density, always)
    b, t = update(f"{label}/{name}", dtype, base_words(f"{label}/{name}", dtype, n), mask)
    return ck.tensor(name, dtype, shape, b), ck.tensor(name, dtype, shape, t)


def same(label: str, name: str, dtype: str, shape: tuple[int, ...]) -> ck.TensorData:
    n = int(np.prod(shape, dtype=np.int64))
    return ck.tensor(name, dtype, shape, base_words(f"{label}/{name}", dtype, n))


def _add(suite: Suite, name: str, pair: Pair, chunk: int, choose: Chooser, what: str,
         section: str, rule: str, keep_removed: bool = True) -> None:  # fmt: skip
    delta = build(pair.base, pair.target, chunk, choose, keep_removed=keep_removed)
    add_valid(suite, f"valid/edge/{name}", pair, delta, what, section, rule)


def add_shapes(suite: Suite) -> None:
    """Empty tensors, 0-d tensors, single elements."""
    shapes = (("e0", "F32", (0,)), ("e1", "F16", (0, 3)), ("e2", "I8", (3, 0)))
    empty = [ck.tensor(n, d, s, np.zeros(0)) for n, d, s in shapes]
    s_b, s_t = changed("empty", "w", "BF16", (4,), 0.5, (0,))
    pair = Pair("edge-empty", ck.single([empty[0], empty[1], s_b]),
                ck.single([empty[0], empty[2], s_t]))  # fmt: skip
    _add(
        suite,
        "empty-tensors",
        pair,
        4,
        uniform(RICE_SUB),
        "tensors with 0 elements: unchanged (shape [0]), removed ([0,3]), added ([3,0])",
        "§4.4",
        "an absent chunks member counts as an empty array; ceil(0 / C) = 0",
    )
    bare = build(pair.base, pair.target, 4, uniform(RICE_SUB))
    for op in ("removed", "added"):
        del bare.tensor("e1" if op == "removed" else "e2", op)["chunks"]
    add_valid(suite, "valid/edge/empty-tensors-no-chunks", pair, bare,
              "an added and a removed tensor of 0 elements without a chunks member (the "
              "delta stays reversible: the removed tensor has n = 0)", "§4.4",
              "an absent chunks member counts as an empty array; ceil(0 / C) = 0")  # fmt: skip
    a_b, a_t = changed("scalar", "s", "F32", (), 1.0)
    b_b, b_t = changed("scalar", "t", "F64", (), 1.0)
    new, gone = same("scalar", "new", "BF16", ()), same("scalar", "gone", "I64", ())
    pair = Pair("edge-scalar", ck.single([a_b, b_b, gone]), ck.single([a_t, b_t, new]))
    _add(
        suite,
        "scalar-0d",
        pair,
        3,
        cycling,
        "0-d tensors (shape []): modified with sparse and dense chunks, added, removed",
        "§7.1",
        "n = product of the shape (1 for shape []); K = ceil(n / C) chunks",
    )
    one_b, one_t = changed("single", "x", "U16", (1,), 1.0)
    two_b, two_t = changed("single", "y", "I32", (1, 1, 1), 1.0)
    pair = Pair("edge-single", ck.single([one_b, two_b]), ck.single([one_t, two_t]))
    _add(
        suite,
        "single-element",
        pair,
        8,
        lambda n, i: BITMAP_XOR if n == "x" else RICE_SUB,
        "one-element tensors (shapes [1] and [1,1,1]), each a sparse chunk of m = 1",
        "§7.6.1",
        "c (u64): number of positions, 1 ≤ c ≤ m",
    )


def add_densities(suite: Suite) -> None:
    """All elements changed, none changed, one chunk of many changed."""
    b, t = changed("all", "w", "U16", (100,), 1.0)
    pair = Pair("edge-all-changed", ck.single([b]), ck.single([t]))
    for plan, name in ((BITMAP_XOR, "bitmap"), (RICE_SUB, "rice"), (DENSE_SUB, "dense")):
        _add(
            suite,
            f"all-changed-{name}",
            pair,
            64,
            uniform(plan),
            f"every element changed (c = m), {name} chunks of 64 and 36",
            "§7.6",
            "c = m is allowed; Rice gaps of 0 are a single 1 bit each",
        )
    tensors = [same("none", "a", "F32", (3, 5)), same("none", "b", "BF16", (7,))]
    pair = Pair("edge-none-changed", ck.single(tensors), ck.single(tensors))
    _add(
        suite,
        "none-changed",
        pair,
        4,
        cycling,
        "identical checkpoints: every tensor unchanged, a data section of 0 bytes",
        "§4.7",
        "D = 0 if and only if there is no blob",
    )
    b, t = changed("middle", "w", "F16", (100,), 0.0, (50, 55))
    pair = Pair("edge-one-chunk", ck.single([b]), ck.single([t]))
    _add(
        suite,
        "one-changed-chunk",
        pair,
        10,
        uniform(RICE_SUB),
        "10 chunks of which only chunk 5 changed: nine unchanged chunks",
        "§7.3",
        "unchanged: no blob; the chunk's output words equal its input words",
    )


def add_ops(suite: Suite) -> None:
    """Added and removed tensors, dtype and shape changes."""
    keep = same("ops", "keep", "F32", (6,))
    old = [same("ops", "old", "F16", (3, 3)), same("ops", "gone0", "U8", ())]
    new = [same("ops", "new", "BF16", (2, 5)), same("ops", "zz-new", "I64", (3,))]
    pair = Pair("edge-add-remove", ck.single([keep, *old]), ck.single([keep, *new]))
    for rev, name in ((True, "reversible"), (False, "not-reversible")):
        _add(suite, f"added-removed-{name}", pair, 4, cycling,
             f"tensors added and removed ({'removed stored' if rev else 'removed dropped'})",
             "§10.1", "added: output = payloads of its chunks; removed: input verified, no output",
             keep_removed=rev)  # fmt: skip
    f32 = same("retype", "w", "F32", (4, 4))
    bf16 = same("retype", "w2", "BF16", (4, 4))
    f16 = same("retype", "h", "F16", (3,))
    shaped = same("retype", "s", "I32", (4, 4))
    as_bf16 = ck.TensorData("h", "BF16", (3,), f16.data)
    reshaped = ck.TensorData("s", "I32", (16,), shaped.data)
    pair = Pair(
        "edge-retype",
        ck.single([f32, f16, shaped]),
        ck.single([ck.TensorData("w", "BF16", (4, 4), bf16.data), as_bf16, reshaped]),
    )
    _add(
        suite,
        "dtype-shape-change",
        pair,
        8,
        cycling,
        "dtype changes (F32 -> BF16; F16 -> BF16 with identical bytes) and a reshape "
        "[4,4] -> [16] with identical bytes: each a removal then an addition of the name",
        "§4.4",
        "a tensor whose dtype or shape differs between the sides is recorded as a "
        "removed entry followed by an added entry with the same name",
    )


def add_reader_latitude(suite: Suite) -> None:
    """Valid forms an encoder would not write but a reader must accept."""
    b, t = changed("latitude", "w", "F32", (12,), 0.0, (0, 11))
    pair = Pair("edge-latitude", ck.single([b]), ck.single([t]))
    split = build(pair.base, pair.target, 4, cycling)
    entry = {k: v for k, v in split.tensor("w").items() if k not in ("op", "chunks")}
    removed = {**entry, "op": "removed", "chunks": full_chunks(b, 4, ChunkPlan("full"))}
    added = {**entry, "op": "added", "chunks": full_chunks(t, 4, ChunkPlan("full"))}
    del removed["target_digest"], added["base_digest"]
    split.doc["tensors"] = [removed, added]
    add_valid(suite, "valid/edge/removed-added-same-shape", pair, split,
              "a tensor with the same dtype and shape on both sides recorded as removed + added",
              "§4.4", "readers MUST accept the removed-then-added form for it too")  # fmt: skip
    new = same("latitude", "v", "U8", (6,))
    pair = Pair("edge-ignored", ck.single([b]), ck.single([t, new]))
    ignored = build(pair.base, pair.target, 4, cycling)
    for tensor in ignored.doc["tensors"]:
        for c in tensor["chunks"]:
            if c["encoding"] == "unchanged":
                c.update(transform="xor", codec="zstd", offset=0, length=1, raw_length=0,
                         checksum="0" * 64)  # fmt: skip
            elif c["encoding"] == "full":
                c["transform"] = "sub"
    add_valid(suite, "valid/edge/ignored-members", pair, ignored,
              "members marked ignored: unchanged chunks with transform, codec, offset, length, "
              "raw_length and checksum; full chunks with transform", "§4.6",
              "members marked ignored are treated like unknown members (still validated by "
              "the schema); an unchanged chunk has no blob")  # fmt: skip
