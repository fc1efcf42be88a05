"""Whole-file delta sizes over every step pair of a real trace, per case.

    python bench/tracesizes.py TRACE_DIR      # e.g. bench/out/realtrace/72dda021cade

For each case (``lr*/bf16``, ``lr*/fp8``) it diffs every consecutive step pair
(``diff`` defaults, threads=1, files in the page cache) and prints the summed
size over the summed information bound (bench/bound.py), the worst pair over
issue 15's allowance (1.05 x bound + 300 B per tensor) and the CPU time of the
diffs.  The quick check for an encoder change that trades size for speed: it
covers the held-out pairs that ``bench/run.py --real`` skips.  Bounds are
cached in TRACE_DIR/bounds.json.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from bound import information_bound

import wdelta


def case_line(case: Path, bounds: dict[str, float], folder: Path) -> str:
    steps = sorted(case.glob("step-*.safetensors"))
    total = bound_total = 0.0
    worst, cpu = 0.0, 0.0
    for base, target in itertools.pairwise(steps):
        key = f"{base}->{target}"
        if key not in bounds:
            bounds[key] = information_bound(base, target, 1 << 22).bytes
        start = time.process_time()
        delta = wdelta.diff(base, target, folder / "d.wdelta", overwrite=True, threads=1)
        cpu += time.process_time() - start
        with wdelta.open_delta(delta) as d:
            tensors = len(d.header.tensors)
        size = delta.stat().st_size
        total += size
        bound_total += bounds[key]
        worst = max(worst, size / (1.05 * bounds[key] + 300 * tensors))
    name = f"{case.parent.name}/{case.name}"
    return (f"{name:14s} {len(steps) - 1} pairs: {total:>12,.0f} B = {total / bound_total:.4f} x "
            f"bound; worst pair {worst:.4f} x allowance; diff CPU {cpu:.2f} s")  # fmt: skip


def main(args: list[str]) -> int:
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(args[0])
    cases = sorted(p.parent for p in root.glob("lr*/*/step-000.safetensors"))
    if not cases:
        print(f"error: {root}: no trace cases (lr*/<dtype>/step-000.safetensors) here; pass a "
              "folder bench/realtrace.py wrote, e.g. bench/out/realtrace/<key>", file=sys.stderr)
        return 2
    cache = root / "bounds.json"
    bounds = json.loads(cache.read_text()) if cache.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            print(case_line(case, bounds, Path(tmp)), flush=True)
    cache.write_text(json.dumps(bounds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
