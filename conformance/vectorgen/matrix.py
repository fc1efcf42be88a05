"""Every encoding x transform x dtype, one delta each.

Per dtype one base/target pair: a tensor ``w`` of shape (6, 101) in chunks of
256 elements (256, 256 and a last partial chunk of 94, whose bitmap has 2
padding bits).  Chunk 0 has many small changes (steps of 1 to 5, two of them
wrapping around) including its first and last element; chunk 1 none, so every
delta also carries an ``unchanged`` chunk; chunk 2 scattered arbitrary
changes including the tensor's last element.  Chunk 0 is stored with zstd
(the values compress; the generator checks it), chunk 2 with codec ``none``;
the ``sub`` deltas add zstd's frame checksum, which readers must accept.
"""

from __future__ import annotations

import numpy as np

from wdelta.format.dtypes import DTYPES

from . import checkpoints as ck
from .builder import ChunkPlan, build
from .common import Pair, add_valid
from .payload import BITMAP, RICE
from .suite import Suite
from .values import mask_with, update, weights_like

CHUNK = 256
SHAPE = (6, 101)

COMBOS: dict[str, tuple[str, str | None, int]] = {
    "sparse-rice-xor": ("sparse", "xor", RICE),
    "sparse-rice-sub": ("sparse", "sub", RICE),
    "sparse-bitmap-xor": ("sparse", "xor", BITMAP),
    "sparse-bitmap-sub": ("sparse", "sub", BITMAP),
    "dense-xor": ("dense", "xor", RICE),
    "dense-sub": ("dense", "sub", RICE),
    "full": ("full", None, RICE),
}

SECTIONS = {"sparse": "§7.6", "dense": "§7.5", "full": "§7.4"}
RULES = {
    "sparse": "the payload lists the positions of the c changed elements of the chunk and "
    "their transformed words",
    "dense": "the payload is the byte planes of the m transformed words, one per element",
    "full": "the payload is the m·s bytes of the output chunk exactly as they are stored in "
    "the tensor's data (not byte planes)",
}


def matrix_pair(dtype: str) -> Pair:
    """The base/target pair shared by every combination of one dtype."""
    label = f"matrix/{dtype}"
    n = SHAPE[0] * SHAPE[1]
    words = weights_like(label, dtype, n)
    head = mask_with(label + "/mask0", CHUNK, 0.4, always=(0, CHUNK - 1))
    tail = mask_with(label + "/mask2", n - 2 * CHUNK, 0.15, always=(n - 2 * CHUNK - 1,))
    b0, t0 = update(label + "/0", dtype, words[:CHUNK], head, small=True)
    b2, t2 = update(label + "/2", dtype, words[2 * CHUNK :], tail)
    middle = words[CHUNK : 2 * CHUNK]
    return Pair(
        f"matrix-{dtype}",
        ck.single([ck.tensor("w", dtype, SHAPE, np.concatenate([b0, middle, b2]))]),
        ck.single([ck.tensor("w", dtype, SHAPE, np.concatenate([t0, middle, t2]))]),
    )


def add_matrix(suite: Suite) -> None:
    """7 deltas per dtype, 19 dtypes."""
    for dtype in DTYPES:
        pair = matrix_pair(dtype)
        for combo, (encoding, transform, coding) in COMBOS.items():

            def choose(name: str, index: int, e: str = encoding, t: str | None = transform,
                       c: int = coding) -> ChunkPlan:  # fmt: skip
                codec = "zstd" if index == 0 else "none"
                return ChunkPlan(e, t, codec, c, zstd_checksum=t == "sub")

            delta = build(pair.base, pair.target, CHUNK, choose)
            chunks = delta.tensor("w")["chunks"]
            assert [c["codec"] for c in chunks if "codec" in c] == ["zstd", "none"], (dtype, combo)
            what = f"{combo} chunks of {dtype} ({DTYPES[dtype].size}-byte words)"
            add_valid(
                suite, f"valid/matrix/{dtype}/{combo}", pair, delta,
                f"{what}: zstd and none codecs, an unchanged middle chunk, a last partial chunk",
                SECTIONS[encoding], RULES[encoding],
            )  # fmt: skip
