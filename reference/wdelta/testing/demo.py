"""``python -m wdelta.testing.demo``: one RL-like step, diffed and applied through the CLI.

Generates a bf16 base/target pair (about 64 M elements, 2% of them changed)
in a temporary folder, runs ``wdelta diff`` and ``wdelta apply``, checks that
the rebuilt file is byte-identical (SHA-256) to the target, and prints sizes,
the delta/full ratio and timings.  Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from .. import cli
from ..format.digest import file_sha256
from . import synthetic

T = TypeVar("T")


def _timed(label: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    result = fn()
    print(f"  {label:<28} {time.perf_counter() - start:6.2f} s")
    return result


def _cli(argv: list[str]) -> None:
    status = cli.run(argv)
    if status != 0:
        raise SystemExit(f"demo: `wdelta {' '.join(argv)}` exited with status {status}")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m wdelta.testing.demo", description=__doc__.split("\n")[0]
    )
    p.add_argument("--elements", type=int, default=64_000_000, help="model size (default 64 M)")
    p.add_argument("--density", type=float, default=0.02, help="changed fraction (default 0.02)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=None, help="work folder (default: a temporary folder)")
    return p.parse_args(argv)


def _run(args: argparse.Namespace, root: Path) -> int:
    spec = synthetic.spec_for_elements(args.elements)
    print(f"model: {spec.elements / 1e6:.1f} M bf16 elements ({spec.layers} layers, "
          f"hidden {spec.hidden}); step changing ~{args.density:.1%} of them")  # fmt: skip
    pair = _timed(
        "generate base + target",
        lambda: synthetic.make_pair(root, spec, args.density, seed=args.seed),
    )
    delta, rebuilt = root / "step.wdelta", root / "rebuilt.safetensors"
    _timed(
        "wdelta diff",
        lambda: _cli(["diff", str(pair.base), str(pair.target), "-o", str(delta), "-q"]),
    )
    _timed(
        "wdelta apply",
        lambda: _cli(["apply", str(pair.base), str(delta), "-o", str(rebuilt), "-q"]),
    )
    same = file_sha256(rebuilt) == file_sha256(pair.target)
    full, size = pair.target.stat().st_size, delta.stat().st_size
    print(f"  changed elements             {pair.achieved_density:.3%} (lr {pair.lr:.3g})")
    print(f"  target checkpoint            {full:>13,} bytes")
    print(f"  delta                        {size:>13,} bytes  = {size / full:.3%} of the target")
    print(f"  rebuilt == target (sha256)   {'yes' if same else 'NO'}")
    return 0 if same else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when the rebuilt checkpoint is byte-identical."""
    args = _parse(argv)
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
        return _run(args, Path(args.dir))
    with tempfile.TemporaryDirectory(prefix="wdelta-demo-") as tmp:
        return _run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
