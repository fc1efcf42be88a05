"""The valid delta every invalid case is derived from, and invalid-case registration.

Host tensors (chunk_elements 256):
- ``a`` F32 [596]: chunk 0 sparse Rice (k = 3) xor zstd with 41 changes of +-1
  (compressible, so that altered zstd frames stay smaller than raw_length),
  the last at element 255; chunk 1 unchanged; chunk 2 (m = 84: 11 bitmap
  bytes, 4 padding bits) sparse bitmap sub codec ``none`` with 5 changes, the
  last at element 83 of the chunk;
- ``b`` BF16 [4, 8]: one dense ``sub`` chunk;
- ``c`` I8 [5]: added (full, codec ``none``);
- ``d`` U16 [64] of zeros: removed and stored (full, zstd), so that the delta
  is reversible; its blob is the last one;
- ``e`` F16 [2]: unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import checkpoints as ck
from .builder import ChunkPlan, Delta, build
from .common import Pair, add_valid
from .edge import same
from .payload import BITMAP, RICE, gaps
from .suite import Suite, invalid
from .values import update, weights_like

CHUNK = 256
A_N = 596
A0 = tuple(sorted({(i * 97) % 250 for i in range(40)} | {255}))
A2 = (0, 9, 30, 61, 83)
M2 = A_N - 2 * CHUNK
RICE_K = 3
PLANS = {
    ("a", 0): ChunkPlan("sparse", "xor", "zstd", RICE, k=RICE_K),
    ("a", 2): ChunkPlan("sparse", "sub", "none", BITMAP),
    ("b", 0): ChunkPlan("dense", "sub", "zstd"),
}


def host_pair() -> Pair:
    words = weights_like("host/a", "F32", A_N)
    b0, t0 = update("host/a0", "F32", words[:CHUNK], _mask(CHUNK, A0), small=True)
    b2, t2 = update("host/a2", "F32", words[2 * CHUNK :], _mask(M2, A2))
    middle = words[CHUNK : 2 * CHUNK]
    a_b, a_t = np.concatenate([b0, middle, b2]), np.concatenate([t0, middle, t2])
    b_b, b_t = update("host/b", "BF16", weights_like("host/b", "BF16", 32), np.ones(32, bool))
    shared = [same("host", "e", "F16", (2,))]
    base = [ck.tensor("a", "F32", (A_N,), a_b), ck.tensor("b", "BF16", (4, 8), b_b),
            ck.tensor("d", "U16", (64,), np.zeros(64)), *shared]  # fmt: skip
    target = [ck.tensor("a", "F32", (A_N,), a_t), ck.tensor("b", "BF16", (4, 8), b_t),
              same("host", "c", "I8", (5,)), *shared]  # fmt: skip
    return Pair("host", ck.single(base), ck.single(target))


def _mask(m: int, positions: Sequence[int]) -> np.ndarray[Any, Any]:
    mask: np.ndarray[Any, Any] = np.zeros(m, dtype=bool)
    mask[list(positions)] = True
    return mask


def host_delta(pair: Pair) -> Delta:
    """The host delta (its layout is checked: the invalid cases rely on it)."""
    delta = build(pair.base, pair.target, CHUNK, lambda name, i: PLANS[(name, i)])
    codecs = [c["codec"] for c in delta.chunks()]
    assert codecs == ["zstd", "none", codecs[2], "none", "zstd"], codecs
    unary_bits = sum((g >> RICE_K) + 1 for g in gaps(A0))
    assert unary_bits % 8 and len(A0) * RICE_K % 8, "padding bits needed by the Rice cases"
    return delta


@dataclass
class Host:
    """The host pair, its registered paths, and invalid-case registration."""

    suite: Suite
    pair: Pair
    base: str
    target: str

    def delta(self) -> Delta:
        """A fresh, mutable copy of the host delta."""
        return host_delta(self.pair)

    def add(
        self, name: str, data: bytes, category: str, section: str, rule: str, what: str,
        profiles: Sequence[str] = ("reader", "decoder"), pair: tuple[str, str] | None = None,
        out: str | None = None,
    ) -> str:  # fmt: skip
        """Register an invalid delta for ``profiles``.

        Decoder and reverse cases get the host checkpoints, or the registered
        ``pair`` of (base, target) paths.
        """
        path = self.suite.blob(f"delta/invalid/{name}.wdelta", data)
        base, target = pair if pair is not None else (self.base, self.target)
        for profile in profiles:
            inputs = {"delta": path}
            if profile == "decoder":
                inputs["base"] = base
            if profile == "reverse":
                inputs["target"] = target
            self.suite.add(f"{profile}/invalid/{name}", profile, what, section, rule, inputs,
                           invalid(category), out)  # fmt: skip
        return path

    def mutated(
        self, name: str, mutate: Callable[[Delta], None], category: str, section: str,
        rule: str, what: str, profiles: Sequence[str] = ("reader", "decoder"),
    ) -> str:  # fmt: skip
        """Register the host delta changed by ``mutate`` (checksums recomputed)."""
        delta = self.delta()
        mutate(delta)
        return self.add(name, delta.to_bytes(), category, section, rule, what, profiles)


def make_host(suite: Suite) -> Host:
    pair = host_pair()
    base, target = pair.paths(suite)
    add_valid(suite, "valid/host", pair, host_delta(pair),
              "the delta every invalid case is derived from: sparse Rice, sparse bitmap, "
              "dense, unchanged chunk, added, removed and unchanged tensors", "§10.1",
              "a decoder reads an input checkpoint and writes an output checkpoint")  # fmt: skip
    return Host(suite, pair, base, target)
