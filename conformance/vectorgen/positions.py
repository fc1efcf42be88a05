"""Position codings at their edges: the bitmap/Rice boundary, the largest gaps, every k."""

from __future__ import annotations

import numpy as np

from . import checkpoints as ck
from .builder import ChunkPlan, build, uniform
from .common import Pair, add_valid
from .payload import BITMAP, RICE, best_k, gaps, rice_size
from .suite import Suite
from .values import base_words, update

GAP_N = 140_000  # > 2^17 elements: a 16-bit gap or a one-block zstd frame is not enough
RICE_RULE = (
    "gaps g_0 = p_0, g_i = p_i - p_(i-1) - 1 are Rice-coded with parameter k: q_i = g_i >> k "
    "in unary, r_i = g_i & (2^k - 1) in the remainder stream"
)


def _pair(name: str, dtype: str, n: int, positions: list[int], low_entropy: bool = False) -> Pair:
    mask = np.zeros(n, dtype=bool)
    mask[positions] = True
    words = base_words(name, dtype, n)
    if low_entropy:
        words &= 3
    b, t = update(name, dtype, words, mask)
    return Pair(name, ck.single([ck.tensor("w", dtype, (n,), b)]),
                ck.single([ck.tensor("w", dtype, (n,), t)]))  # fmt: skip


def boundary_count(m: int) -> int:
    """Evenly spread changes where Rice first costs as much as the bitmap."""
    for c in range(1, m + 1):
        pos = [i * m // c for i in range(c)]
        if rice_size(gaps(pos), best_k(gaps(pos))) >= (m + 7) // 8:
            return c
    raise AssertionError("no boundary")


def add_boundary(suite: Suite) -> None:
    m = 1024
    c = boundary_count(m)
    pair = _pair("pos-boundary", "U8", m, [i * m // c for i in range(c)])
    for coding, name in ((BITMAP, "bitmap"), (RICE, "rice")):
        plan = ChunkPlan("sparse", "xor", "none", coding)
        add_valid(
            suite, f"valid/positions/boundary-{name}", pair, build(pair.base, pair.target, m,
            uniform(plan)),
            f"{c} of {m} elements changed, where Rice-coded positions first cost as much "
            f"as the 128-byte bitmap: {name} coding", "§7.6.1",
            "position coding (u8): 0 = bitmap, 1 = Rice (an encoder MAY choose either, §11.1)",
        )  # fmt: skip


def add_gaps(suite: Suite) -> None:
    """A single change at the last (or first) element: the largest (smallest) gap."""
    last = _pair("pos-last", "U8", GAP_N, [GAP_N - 1], low_entropy=True)
    plans = {
        "last-rice-k0": ChunkPlan("sparse", "xor", "zstd", RICE, k=0),
        "last-rice-k17": ChunkPlan("sparse", "sub", "none", RICE, k=17),
        "last-rice-k31": ChunkPlan("sparse", "xor", "none", RICE, k=31),
        "last-bitmap": ChunkPlan("sparse", "sub", "zstd", BITMAP),
        "last-full-multiblock": ChunkPlan("full", None, "zstd", zstd_checksum=True),
    }
    for name, plan in plans.items():
        delta = build(last.base, last.target, GAP_N, uniform(plan))
        add_valid(
            suite, f"valid/positions/{name}", last, delta,
            f"one change at element {GAP_N - 1} of a {GAP_N}-element chunk (gap {GAP_N - 1}); "
            f"{name.removeprefix('last-')}",
            "§8" if "multiblock" in name else "§7.6.3",
            "zstd: exactly one frame (of any number of blocks) that passes its content checksum "
            "if it has one" if "multiblock" in name else RICE_RULE,
        )  # fmt: skip
    first = _pair("pos-first", "I16", 64, [0])
    for k in (0, 31):
        delta = build(first.base, first.target, 64,
                      uniform(ChunkPlan("sparse", "sub", "none", RICE, k=k)))  # fmt: skip
        add_valid(suite, f"valid/positions/first-rice-k{k}", first, delta,
                  f"one change at element 0 (gap 0) with Rice k = {k}", "§7.6.3",
                  RICE_RULE)  # fmt: skip


def add_rice_k(suite: Suite) -> None:
    """One chunk of scattered changes coded with many k (remainders crossing bytes)."""
    n = 256
    positions = sorted({(i * 37 + i * i) % n for i in range(45)})
    pair = _pair("pos-rice-k", "U32", n, positions)
    for k in (0, 1, 3, 7, 8, 13, 31):
        plan = ChunkPlan(
            "sparse", "sub" if k % 2 else "xor", "none" if k < 8 else "zstd", RICE, k=k
        )
        add_valid(
            suite, f"valid/positions/rice-k{k}", pair, build(pair.base, pair.target, n,
            uniform(plan)),
            f"{len(positions)} changes in 256 elements, Rice parameter k = {k}", "§7.6.3",
            RICE_RULE,
        )  # fmt: skip


def add_zstd_window(suite: Suite) -> None:
    """A frame that is not single-segment, with the largest window a decoder must accept."""
    from .invalid_payload import reheader

    pair = _pair("pos-window", "BF16", 512, list(range(0, 512, 3)))
    delta = build(pair.base, pair.target, 512, uniform(ChunkPlan("dense", "sub", "zstd")))
    chunk = delta.tensor("w")["chunks"][0]
    assert chunk["codec"] == "zstd"
    chunk["_stored"] = reheader(chunk["_stored"], chunk["raw_length"], window_log=27)
    add_valid(suite, "valid/codec/zstd-window-2-27", pair, delta,
              "a zstd frame with a window descriptor (not single-segment) of Window_Size 2^27",
              "§8", "a Window_Size of at most 2^27 bytes (128 MiB)")  # fmt: skip
