"""Where diff's CPU time goes: the encoder's per-chunk steps, timed one by one.

    python bench/stages.py BASE.safetensors TARGET.safetensors [--chunk-elements N]

Runs the steps of ``wdelta.policy.chunk.encode_modified`` (sparse path) on
every chunk of every tensor the two files share, on one thread, and prints
seconds, share and nanoseconds per element of each step.  Dense and full
candidates (tried above 1/2 density only), the header and the output file are
not included.  The sum is the single-thread CPU cost that ``wdelta diff``
spreads over its threads; each step is one or a few NumPy, BLAKE3 or zstd
calls, so the table shows how far each is from its library's own speed.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from wdelta.checkpoint.source import open_checkpoint
from wdelta.codec import blob, sparse, transform
from wdelta.format.digest import new_hasher
from wdelta.io.malloc_tuning import keep_chunk_buffers
from wdelta.ops.encoder import DEFAULT_CHUNK_ELEMENTS
from wdelta.policy import chunk as chunk_policy
from wdelta.policy import rice
from wdelta.policy import transform as transform_policy

R = TypeVar("R")


class Clock:
    """Accumulated seconds per step."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def __call__(self, step: str, fn: Callable[..., R], *args: Any) -> R:
        start = time.perf_counter()
        out = fn(*args)
        self.seconds[step] += time.perf_counter() - start
        return out


def encode_chunk(clock: Clock, b: np.ndarray[Any, Any], t: np.ndarray[Any, Any]) -> None:
    """The encoder's sparse path for one chunk, step by step."""
    h = new_hasher(2, b.nbytes)  # as the encoder's two workers hash: single-threaded
    clock("BLAKE3 of base and target", h.update, b.data.cast("B"))
    clock("BLAKE3 of base and target", h.update, t.data.cast("B"))
    padded = clock("mask (base != target)", chunk_policy._mask, b, t)
    mask = padded[: len(b)]
    count = int(clock("mask (base != target)", np.count_nonzero, mask))
    if count == 0:
        return
    if count >= len(b) * chunk_policy.BITMAP_DENSITY:
        payload = bitmap_chunk(clock, b, t, mask, count)
    else:
        pos = clock("positions (flatnonzero)", chunk_policy._mask_positions, padded, len(b), count)
        sampled = clock("transform pick (sample)", transform_policy.sample, pos)
        kind = clock("transform pick (sample)", transform_policy.pick, b, t, sampled)
        bv = clock("values (gather + transform)", b.take, pos)
        tv = clock("values (gather + transform)", t.take, pos)
        values = clock("values (gather + transform)", transform.encode, kind, bv, tv)
        plan = clock("payload (Rice + planes)", rice.plan_positions, pos, len(b))
        parts = clock("payload (Rice + planes)", sparse.parts, pos, values, len(b), plan)
        payload, _ = clock("payload (Rice + planes)", parts.v1)
    clock("zstd (auto parameters)", blob.compress, payload, None)


def bitmap_chunk(
    clock: Clock, b: np.ndarray[Any, Any], t: np.ndarray[Any, Any], mask: Any, count: int
) -> memoryview:
    """``chunk_policy._bitmap_payload`` step by step (its block loop unrolled here)."""
    sampled = clock("transform pick (sample)", transform_policy.sample_mask, mask, count)
    kind = clock("transform pick (sample)", transform_policy.pick, b, t, sampled)
    payload = clock("payload (bitmap + planes)", sparse.BitmapPayload, mask, count, b.dtype)
    for lo in range(0, len(b), chunk_policy.BLOCK_ELEMENTS):
        hi = lo + chunk_policy.BLOCK_ELEMENTS
        pos = clock("positions (flatnonzero)", np.flatnonzero, mask[lo:hi])
        d = clock("values (gather + transform)", transform.difference, kind, b[lo:hi], t[lo:hi])
        values = clock("values (gather + transform)", d.take, pos)
        clock("values (gather + transform)", transform.code, kind, values)
        clock("payload (bitmap + planes)", payload.add, values)
    payload, _ = clock("payload (bitmap + planes)", payload.finish().v1)
    return payload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("base")
    p.add_argument("target")
    p.add_argument("--chunk-elements", type=int, default=DEFAULT_CHUNK_ELEMENTS)
    args = p.parse_args()
    keep_chunk_buffers()
    clock, elements = Clock(), 0
    with open_checkpoint(args.base) as base, open_checkpoint(args.target) as target:
        for name, bt in base.tensors.items():
            tt = target.tensors.get(name)
            if tt is None or (tt.dtype, tt.shape) != (bt.dtype, bt.shape):
                continue
            for start in range(0, bt.elements, args.chunk_elements):
                count = min(args.chunk_elements, bt.elements - start)
                b = clock("read (pread of both)", bt.read, start, count)
                t = clock("read (pread of both)", tt.read, start, count)
                encode_chunk(clock, b, t)
                elements += count
    total = sum(clock.seconds.values())
    print(f"{elements:,} elements, {total:.2f} s on one thread\n")
    print("| step | seconds | share | ns per element |\n|---|---|---|---|")
    for step, seconds in clock.seconds.most_common():
        per = seconds / elements * 1e9
        print(f"| {step} | {seconds:.3f} | {seconds / total:.0%} | {per:.2f} |")


if __name__ == "__main__":
    main()
