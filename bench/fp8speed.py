"""wdelta against "zstd -3 of the XOR, file to file" on the real trace's pairs of one dtype.

    python bench/fp8speed.py --trace-root bench/out/realtrace [--rounds 5] [--dtype fp8]

The quick loop for issue 15's fp8 speed target (encode >= 1.5x, decode >=
1.2x the reference on every pair), a few minutes instead of ``bench/run.py
--real``'s hour: the same pairs (every third step pair), the same reference
(``peers.zstd_xor_files``) and wdelta through the API with 2 threads, rounds
interleaved, the fastest round of each method per pair.  The reference
hashes nothing, whereas a diff must hash both sides and an apply its input
and output (BLAKE3, per tensor); so a second, fairer reference adds the time
of hashing two such files (BLAKE3 of the bytes of the base and the target,
one thread, not counting the reading, which the reference does anyway) to
each of its times.  Besides wall-clock ratios it prints each method's CPU
time (user + system of this process, the fastest round): on a machine shared
with other work the wall clock of a two-thread program says more about the
load than about the code.  Also the data section against the information
bound (bench/bound.py).  The trace must exist (``bench/realtrace.py``);
nothing is trained here.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import bound
import peers
import realtrace
import traceconfig

import wdelta
from wdelta.ops.summary import summarize

Times = tuple[float, float]  # (wall, cpu) seconds


def _timed(fn: Callable[[], object]) -> Times:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def _wdelta(base: Path, target: Path, work: Path, threads: int) -> tuple[Times, Times]:
    delta, rebuilt = work / "pair.wdelta", work / "rebuilt.safetensors"
    delta.unlink(missing_ok=True)
    enc = _timed(lambda: wdelta.diff(base, target, delta, threads=threads))
    dec = _timed(lambda: wdelta.apply(base, delta, rebuilt, threads=threads))
    if rebuilt.read_bytes() != target.read_bytes():
        raise AssertionError(f"wdelta apply did not rebuild {target}")
    rebuilt.unlink()
    return enc, dec


def _reference(base: Path, target: Path, work: Path) -> tuple[Times, Times]:
    """peers.zstd_xor_files, timed the same way (its encode, then its decode)."""
    times: list[Times] = []

    def timer(fn: Callable[[], object]) -> tuple[object, float]:
        times.append(_timed(fn))
        return None, times[-1][0]

    peers.zstd_xor_files(base, target, work, timer=timer)
    return times[0], times[1]


def _hash_both(base: Path, target: Path) -> Times:
    """BLAKE3 of both files' bytes, one thread: what verifying adds to a file-to-file
    tool, which reads the files anyway (so the reading is not timed)."""
    data = [p.read_bytes() for p in (base, target)]
    return _timed(lambda: [blake3.blake3(d, max_threads=1).digest() for d in data])


def _best(rounds: list[Times]) -> Times:
    return min(r[0] for r in rounds), min(r[1] for r in rounds)


def measure(base: Path, target: Path, work: Path, args: argparse.Namespace) -> str:
    """One table row: wall ratios, CPU ms of both, data section over the bound."""
    ours: dict[str, list[Times]] = {"enc": [], "dec": []}
    ref: dict[str, list[Times]] = {"enc": [], "dec": []}
    hashing: list[Times] = []
    for _ in range(args.rounds):
        for side, (enc, dec) in ((ours, _wdelta(base, target, work, args.threads)),
                                 (ref, _reference(base, target, work))):  # fmt: skip
            side["enc"].append(enc)
            side["dec"].append(dec)
        hashing.append(_hash_both(base, target))
    delta = work / "pair.wdelta"
    wdelta.diff(base, target, delta, threads=args.threads, overwrite=True)
    with wdelta.open_delta(delta) as d:  # every blob: the data section's and inline ones
        data = summarize(d).stored_bytes
    b = bound.information_bound(base, target, d.header.chunk_elements)
    (we, wc), (wd, wdc) = _best(ours["enc"]), _best(ours["dec"])
    (ze, zc), (zd, zdc) = _best(ref["enc"]), _best(ref["dec"])
    h = _best(hashing)[0]
    return (f"| {base.parent.parent.name} {base.stem}-{target.stem} | {ze / we:.3g} | "
            f"{zd / wd:.3g} | {we * 1e3:.0f} / {wd * 1e3:.0f} | {ze * 1e3:.0f} / {zd * 1e3:.0f} | "
            f"{wc * 1e3:.0f} / {wdc * 1e3:.0f} | {zc * 1e3:.0f} / {zdc * 1e3:.0f} | "
            f"{data:,} | {data / b.bytes:.3f} | {(ze + h) / we:.3g} | {(zd + h) / wd:.3g} | "
            f"{h * 1e3:.3g} |")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    traceconfig.add_flags(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pair-stride", type=int, default=3)
    p.add_argument("--dtype", default="fp8", choices=realtrace.DTYPES)
    p.add_argument("--dir", default=None, help="work folder (default: the system temporary one)")
    args = p.parse_args()
    cfg = traceconfig.config_from(args)
    pairs = [q for q in realtrace.pairs(cfg, Path(args.trace_root)) if q.dtype == args.dtype]
    print(
        "| pair | encode x ref | decode x ref | wdelta enc / dec ms | ref enc / dec ms "
        "| wdelta CPU enc / dec ms | ref CPU enc / dec ms | data B | data / bound "
        "| encode x ref+BLAKE3 | decode x ref+BLAKE3 | BLAKE3 both files ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for q in pairs:
            if q.step % args.pair_stride == 0:
                print(measure(q.base, q.target, Path(tmp), args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
