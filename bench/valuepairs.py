"""Data section over the information bound, coded values against byte planes, per pair.

    python bench/valuepairs.py BASE TARGET [BASE TARGET ...]

For each pair, writes the delta with coded values (the default, SPEC §7.6.6,
feature ``coded-values``) and with byte-plane values (the encoder's
``DiffOptions(coded_values=False)``; both with the compact header) and
prints each one's data section (blobs only, no header) over the
zeroth-order information bound of bench/bound.py (per chunk of the delta's
chunking), the encode and decode CPU times of the process (fastest of
``--rounds``, default 3, interleaved; threads=1, files in the page cache)
and the fp8 scale tensors (names ending ``scale_inv``) over their own bound.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bound import Bound, chunk_bound, information_bound

import wdelta
from wdelta import open_checkpoint
from wdelta.ops.encoder import DiffOptions, diff_checkpoints
from wdelta.ops.summary import summarize


def tensor_bound(base: Path, target: Path, chunk_elements: int, suffix: str) -> float:
    """The bound, in bytes, of the tensors whose name ends with ``suffix``."""
    total = Bound()
    with open_checkpoint(base) as b, open_checkpoint(target) as t:
        for name in sorted(n for n in b.tensors if n.endswith(suffix)):
            n = b.tensors[name].elements
            for start in range(0, n, chunk_elements):
                m = min(chunk_elements, n - start)
                total.add(
                    chunk_bound(b.tensors[name].read(start, m), t.tensors[name].read(start, m))
                )
    return total.bytes


def _stored(delta: Path, suffix: str) -> tuple[int, int]:
    """(bytes of every blob, inline ones of SPEC §4.12 included; bytes of the blobs of
    tensors named ``*suffix``)."""
    with wdelta.open_delta(delta) as d:
        part = sum(c.length for t in d.header.tensors if t.name.endswith(suffix) for c in t.chunks)
        return summarize(d).stored_bytes, part


def _timed(fn: Callable[..., object], rounds: list[float], *args: object, **kw: object) -> None:
    start = time.process_time()
    fn(*args, **kw)
    rounds.append(time.process_time() - start)


def _diff(base: Path, target: Path, out: Path, coded: bool) -> None:
    opts = DiffOptions(threads=1, coded_values=coded)
    with open_checkpoint(base) as b, open_checkpoint(target) as t:
        diff_checkpoints(b, t, out, opts, overwrite=True)


def measure(base: Path, target: Path, folder: Path, rounds: int) -> str:
    bound = information_bound(base, target, 1 << 22).bytes
    scales = tensor_bound(base, target, 1 << 22, "scale_inv")
    times: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    for _ in range(rounds):
        for coded in (True, False):
            delta, out = folder / f"{coded}.wdelta", folder / f"{coded}.safetensors"
            enc, dec = times[coded]
            _timed(_diff, enc, base, target, delta, coded)
            _timed(wdelta.apply, dec, base, delta, out, overwrite=True, threads=1)
            if out.read_bytes() != target.read_bytes():
                raise SystemExit(f"round trip differs: {delta}")
    cells = []
    for coded, label in ((True, "coded"), (False, "planes")):
        data, part = _stored(folder / f"{coded}.wdelta", "scale_inv")
        enc, dec = (min(t) * 1e3 for t in times[coded])
        scale = f", scales {part / scales:.2f}x" if scales else ""
        cells.append(
            f"{label} {data / bound:.3f}x bound{scale}, enc {enc:.0f} ms, dec {dec:.0f} ms"
        )
    name = f"{target.parent.parent.name}/{target.parent.name} {base.stem}->{target.stem}"
    return f"{name} (bound {bound:,.0f} B): " + "; ".join(cells)


def main(args: list[str]) -> int:
    rounds = 3
    if args[:1] == ["--rounds"]:
        rounds, args = int(args[1]), args[2:]
    if not args or len(args) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for base, target in zip(args[::2], args[1::2], strict=True):
            print(measure(Path(base), Path(target), Path(tmp), rounds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
