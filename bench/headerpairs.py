"""Header bytes per tensor and whole-file size against the issue-15 allowance, per pair.

    python bench/headerpairs.py BASE TARGET [BASE TARGET ...]

For each pair, writes the delta with the compact header (the default, SPEC
§4.11) and with the v1 form (``compact=False``) into a temporary folder and
prints, for each: the header's JSON bytes per tensor entry (padding not
counted), the whole file, and the whole file over the allowance of issue 15,
``1.05 x information bound + 300 B x tensors`` (bench/bound.py, per chunk of
the delta's chunking).  A cheap check of a few pairs of the real trace, where
``bench/run.py --real`` takes most of an hour.
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

from bound import information_bound

import wdelta


def header_json_bytes(delta: Path) -> int:
    """Bytes of the header's JSON text, without the padding spaces."""
    with delta.open("rb") as f:
        prefix = f.read(64)
        (n,) = struct.unpack_from("<Q", prefix, 16)
        return len(f.read(n).rstrip(b" "))


def measure(base: Path, target: Path, folder: Path) -> str:
    bound = information_bound(base, target, 1 << 22).bytes
    cells = []
    for label, compact in (("compact", True), ("v1", False)):
        delta = wdelta.diff(base, target, folder / f"{label}.wdelta", compact=compact,
                            overwrite=True)  # fmt: skip
        with wdelta.open_delta(delta) as d:
            tensors = len(d.header.tensors)
        size = delta.stat().st_size
        allowance = 1.05 * bound + 300 * tensors
        cells.append(f"{label}: {header_json_bytes(delta) / tensors:5.0f} B/tensor, "
                     f"{size:>9,} B = {size / allowance:.3f} x allowance")  # fmt: skip
    return f"{target.parent.parent.name}/{target.parent.name} {base.stem}->{target.stem} " + (
        f"({tensors} tensors, bound {bound:,.0f} B): " + "; ".join(cells)
    )


def main(args: list[str]) -> int:
    if not args or len(args) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for base, target in zip(args[::2], args[1::2], strict=True):
            print(measure(Path(base), Path(target), Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
