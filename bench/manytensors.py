"""Costs per tensor, and whether they stay constant, on checkpoints of very many small tensors.

    python bench/manytensors.py [--tensors 5000] [--scale 4] [--rounds 3] [--dir DIR]

A mixture-of-experts model has 10^4 to 10^5 tensors (a 1T-parameter fp8 MoE
with 384 experts per layer: about 140,000 with the block-scale tensors), so a
cost per tensor that grows with the tensor count turns a diff into minutes.
This bench builds two pairs of single-file checkpoints, N and ``scale``·N
tensors of 32 x 64 bf16 (2% of the elements changed by one ULP), MoE names,
and times on each pair, rounds interleaved, the fastest round (wall clock,
``threads=2``, in this process): ``wdelta.diff``, ``wdelta.open_delta``
(header parse and validation alone), ``wdelta.apply`` to a file and
``wdelta.verify`` without a base.  It prints microseconds per tensor for both
sizes and their ratio: 1.0 means that the cost per tensor does not depend on
the tensor count (linear time); the target is at most 1.25 for every
operation.  The checkpoints are kept in ``--dir`` (default bench/out/many).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

import wdelta

SHAPE = (32, 64)
DENSITY = 0.02


def tensor_names(n: int) -> list[str]:
    """MoE-style names: 3 projections per expert, 128 experts per layer."""
    return [
        f"model.layers.{i // 384}.mlp.experts.{i % 384 // 3}."
        f"{('gate_proj', 'up_proj', 'down_proj')[i % 3]}.weight"
        for i in range(n)
    ]


def make_pair(folder: Path, n: int) -> tuple[Path, Path]:
    """base/target checkpoints of ``n`` tensors in ``folder`` (made once, then reused)."""
    base, target = folder / f"base-{n}.safetensors", folder / f"target-{n}.safetensors"
    if base.exists() and target.exists():
        return base, target
    rng = np.random.default_rng(n)
    words = rng.integers(0, 1 << 16, (n, *SHAPE), dtype=np.uint16)
    changed = words.copy()
    changed[rng.random(words.shape) < DENSITY] ^= 1
    names = tensor_names(n)
    folder.mkdir(parents=True, exist_ok=True)
    for path, block in ((base, words), (target, changed)):
        save_file({k: block[i].view(ml_dtypes.bfloat16) for i, k in enumerate(names)}, str(path))
    return base, target


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def operations(base: Path, target: Path, work: Path) -> dict[str, Callable[[], object]]:
    delta, out = work / f"{base.stem}.wdelta", work / f"{base.stem}.out.safetensors"

    def open_only() -> None:
        with wdelta.open_delta(delta):
            pass

    return {
        "diff": lambda: wdelta.diff(base, target, delta, overwrite=True),
        "open_delta (parse)": open_only,
        "apply": lambda: wdelta.apply(base, delta, out, overwrite=True),
        "verify (no base)": lambda: wdelta.verify(delta),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tensors", type=int, default=5000)
    p.add_argument("--scale", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path(__file__).parent / "out" / "many")
    args = p.parse_args()
    sizes = (args.tensors, args.tensors * args.scale)
    pairs = {n: make_pair(args.dir, n) for n in sizes}
    best: dict[tuple[int, str], float] = {}
    for _ in range(args.rounds):
        for n in sizes:
            for op, fn in operations(*pairs[n], args.dir).items():
                t = timed(fn)
                best[n, op] = min(best.get((n, op), t), t)
    small, large = sizes
    print(f"| operation | us/tensor at {small:,} | us/tensor at {large:,} | ratio | target |")
    print("|---|---|---|---|---|")
    for op in operations(*pairs[small], args.dir):
        a, b = best[small, op] / small * 1e6, best[large, op] / large * 1e6
        verdict = "PASS" if b / a <= 1.25 else "**FAIL**"
        print(f"| {op} | {a:.0f} | {b:.0f} | {b / a:.2f} | <= 1.25: {verdict} |")
    delta = args.dir / f"{pairs[large][0].stem}.wdelta"
    with wdelta.open_delta(delta) as d:
        head, size = d.data_start, delta.stat().st_size
    print(f"\nheader of the {large:,}-tensor delta: {head:,} bytes "
          f"({head / large:.0f} per tensor), "
          f"file {size:,} bytes")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
