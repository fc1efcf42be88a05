"""Special bit patterns (NaN payloads, -0.0, subnormals, fp8 specials) per float dtype.

Tensor ``x`` has three chunks of L elements (L = number of specials of the
dtype).  Chunk 0: every special becomes the next one (sparse Rice, ``sub``);
chunk 1: a third of them change, the rest stay as stored (sparse bitmap,
``xor``); chunk 2: a rotation becomes the specials (dense, ``sub``).  +0.0
and -0.0 trade places, which a decoder comparing floats would miss.
"""

from __future__ import annotations

import numpy as np

from wdelta.format.dtypes import DTYPES

from . import checkpoints as ck
from .builder import ChunkPlan, build
from .common import Pair, add_valid
from .payload import BITMAP, RICE
from .suite import Suite
from .values import SPECIALS

PLANS = (
    ChunkPlan("sparse", "sub", "zstd", RICE),
    ChunkPlan("sparse", "xor", "none", BITMAP),
    ChunkPlan("dense", "sub", "none"),
)


def special_pair(dtype: str) -> Pair:
    words = np.array(SPECIALS[dtype], dtype=f"<u{DTYPES[dtype].size}")
    rolled = np.roll(words, 1)
    keep = np.arange(len(words)) % 3 != 0
    base = np.concatenate([words, words, np.roll(words, 3)])
    target = np.concatenate([rolled, np.where(keep, words, rolled), words])
    shape = (3, len(words))
    return Pair(
        f"special-{dtype}",
        ck.single([ck.tensor("x", dtype, shape, base)]),
        ck.single([ck.tensor("x", dtype, shape, target)]),
    )


def add_specials(suite: Suite) -> None:
    for dtype in SPECIALS:
        pair = special_pair(dtype)
        delta = build(pair.base, pair.target, len(SPECIALS[dtype]), lambda n, i: PLANS[i])
        add_valid(
            suite, f"valid/special/{dtype}", pair, delta,
            f"{dtype} NaN payloads, signalling NaNs, infinities, +-0.0, subnormals and "
            "format specials, changed and unchanged, through sparse and dense chunks",
            "§5.2",
            "wdelta compares, transforms, hashes and stores words only: -0.0 differs from +0.0, "
            "NaNs with different payloads differ",
        )  # fmt: skip
