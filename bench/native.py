"""Native kernels against the NumPy path, zstd -3 of the XOR and the I/O floor, side by side.

    python bench/native.py                        # bf16 and fp8 E4M3 at 2%, 60 M elements
    python bench/native.py --elements 500000000   # the 1 GB bf16 share (and a 500 M fp8 model)
    python bench/native.py --pair BASE TARGET     # any pair of checkpoints (repeatable)
    python bench/native.py --trace                # and the real trace's series (bench/realtrace.py)

Flags:
  --dir DIR          data folder for the synthetic pairs (default /work/bench-data)
  --elements N       model size of the synthetic cases (default 60_000_000)
  --density D        their density of changed elements (default 0.02)
  --no-synthetic     only the --pair (and --trace) cases
  --publish-bytes B  time Publisher.publish and DistributedPublisher.publish (a gloo
                     group of one rank) for single-pair cases of B target bytes or more
                     (default 1e9: the 1 GB share)
  --trace            also each series of the real trace (one per dtype and learning rate:
                     every consecutive step pair, times summed over the series); takes
                     bench/realtrace.py's --trace-* flags, generates the trace if missing
  --threads T        threads of wdelta diff/apply and of the floor's hashing (default 2)
  --repeat R         rounds; in each every method runs once, one after another, and the
                     fastest run of each method counts (default 3)

Every method runs in this process, file to file (no interpreter start-up):
wdelta diff and apply with the NumPy path (``WDELTA_NATIVE=0``) and with the native
kernels; "XOR the files, zstd -3 the result" and its inverse (bench/peers.py); and the
floors: encode = read both inputs + BLAKE3 of both, decode = read the base + BLAKE3 of
the output + write it as apply does (O_DIRECT where possible, one fsync), on the same
number of threads.  MB/s count the target's
bytes; "x zstd -3" is speed over zstd's speed, "x floor" time over the floor's time
(wall clock, fastest round), "CPU x floor" the CPU seconds of all threads over the
floor's (least round): on a shared machine wall time follows the load, CPU time much
less.  Targets, judged on the native path's wall time: encode and decode >= 1.5x
zstd -3, and each within 1.5x of its floor; and a 1 GB share or more (one rank's part of a
model) published in at most half the NumPy path's time: for such a case (``--publish-bytes``,
default 1e9) ``chain.Publisher.publish`` of the target after the base is timed on both paths
(in-memory weights into a local chain, as bench/live.py does), and so is the multi-rank
publisher's (``DistributedPublisher``, in a gloo group of this process alone).
Each delta and rebuilt file is checked: both paths' deltas byte-identical, the rebuilt
file equal to the target.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import cases
import peers
import traceconfig

import wdelta
from wdelta.codec import native
from wdelta.io.output_file import OutputFile
from wdelta.testing import synthetic

BLOCK = 8 << 20
PEER_RATIO = 1.5  # encode and decode at least this many times zstd -3's speed
FLOOR_RATIO = 1.5  # and at most this many times their floor's time
PUBLISH_RATIO = 2.0  # a share of PUBLISH_BYTES or more: published this much faster than NumPy
PUBLISH_BYTES = 10**9


Times = tuple[float, float]  # (wall seconds, CPU seconds of this process: all threads)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(fn: Callable[[], Any]) -> Times:
    start, cpu = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - start, _cpu() - cpu


def _halves(path: Path, threads: int) -> list[tuple[int, int]]:
    size = path.stat().st_size
    step = -(-size // threads)
    return [(a, min(size, a + step)) for a in range(0, size, step)]


def _read_hash(path: Path, lo: int, hi: int) -> None:
    """Read bytes lo..hi of ``path`` in blocks and BLAKE3 them (one thread)."""
    hasher, buf = blake3.blake3(max_threads=1), bytearray(BLOCK)
    with open(path, "rb", buffering=0) as f:
        at = lo
        while at < hi:
            n = os.preadv(f.fileno(), [memoryview(buf)[: min(BLOCK, hi - at)]], at)
            hasher.update(memoryview(buf)[:n])
            at += n


def encode_floor(base: Path, target: Path, threads: int) -> Times:
    """Seconds to read both inputs and BLAKE3 them, on ``threads`` threads."""
    jobs = [(p, lo, hi) for p in (base, target) for lo, hi in _halves(p, max(1, threads // 2))]
    with ThreadPoolExecutor(threads) as pool:
        return _timed(lambda: list(pool.map(lambda j: _read_hash(*j), jobs)))


def decode_floor(base: Path, target: Path, out: Path, threads: int) -> Times:
    """Seconds to read the base and BLAKE3 the output (the target's bytes, in memory) on
    ``threads`` threads while this one writes it to ``out`` the way apply does (wdelta's
    OutputFile: O_DIRECT where possible, background flushes), then one fsync."""
    data = memoryview(target.read_bytes())

    def part(lo: int, hi: int) -> None:
        _read_hash(base, lo, min(hi, base.stat().st_size))
        blake3.blake3(data[lo:hi], max_threads=1).digest()

    def run() -> None:
        fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, len(data))
        writer = OutputFile(fd)
        try:
            with ThreadPoolExecutor(threads) as pool:
                hashed = [pool.submit(part, lo, hi) for lo, hi in _halves(target, threads)]
                for at in range(0, len(data), BLOCK):
                    writer.write(data[at : at + BLOCK], at)
                for future in hashed:
                    future.result()
            writer.finish()
            os.fsync(fd)
        finally:
            writer.close()
            os.close(fd)

    times = _timed(run)
    out.unlink()
    return times


def wdelta_round(base: Path, target: Path, work: Path, path: str, threads: int) -> dict[str, Any]:
    """diff and apply with the NumPy path or the native kernels; the rebuilt file checked."""
    os.environ[native.ENV] = "0" if path == "numpy" else "1"
    delta, rebuilt = work / f"{path}.wdelta", work / f"{path}.rebuilt"
    try:
        enc = _timed(lambda: wdelta.diff(base, target, delta, threads=threads, overwrite=True))
        dec = _timed(lambda: wdelta.apply(base, delta, rebuilt, threads=threads, overwrite=True))
    finally:
        os.environ.pop(native.ENV, None)
    if rebuilt.read_bytes() != target.read_bytes():
        raise AssertionError(f"{path} path: apply did not rebuild {target}")
    rebuilt.unlink()
    return {"encode": enc, "decode": dec, "bytes": delta.read_bytes()}


def measure(base: Path, target: Path, repeat: int, threads: int) -> dict[str, dict[str, Times]]:
    """The fastest (wall) and least (CPU) encode/decode seconds of every method over
    ``repeat`` rounds; the two paths swap places every round."""
    best: dict[str, dict[str, Times]] = {}

    def keep(name: str, op: str, times: Times) -> None:
        old = best.setdefault(name, {}).get(op, times)
        best[name][op] = (min(old[0], times[0]), min(old[1], times[1]))

    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        for r in range(repeat):
            order = ("numpy", "native") if r % 2 == 0 else ("native", "numpy")
            runs = {p: wdelta_round(base, target, work, p, threads) for p in order}
            if runs["numpy"]["bytes"] != runs["native"]["bytes"]:
                raise AssertionError(f"the two paths wrote different deltas for {target}")
            for name in ("numpy", "native"):
                keep(name, "encode", runs[name]["encode"])
                keep(name, "decode", runs[name]["decode"])
            for op, times in _zstd_round(base, target, work).items():
                keep("zstd -3 of XOR", op, times)
            keep("floor", "encode", encode_floor(base, target, threads))
            keep("floor", "decode", decode_floor(base, target, work / "floor.out", threads))
    return best


def _zstd_round(base: Path, target: Path, work: Path) -> dict[str, Times]:
    """Times of "XOR the files, zstd -3 the result" (bench/peers.py) and its inverse."""
    steps: list[Times] = []

    def timer(fn: Callable[[], Any]) -> tuple[None, float]:
        steps.append(_timed(fn))
        return None, steps[-1][0]

    peers.zstd_xor_files(base, target, work, timer=timer)
    return {"encode": steps[0], "decode": steps[1]}


def report(name: str, size: int, best: dict[str, dict[str, Times]]) -> list[str]:
    """Markdown rows of one case, and the targets judged on the native path (wall)."""
    z, floor = best["zstd -3 of XOR"], best["floor"]
    rows = []
    for method, t in best.items():
        cells = []
        for op in ("encode", "decode"):
            wall, cpu = t[op]
            cells += [f"{size / wall / 1e6:.0f}", f"{z[op][0] / wall:.2f}x",
                      f"{wall / floor[op][0]:.2f}x", f"{cpu / floor[op][1]:.2f}x"]  # fmt: skip
        rows.append(f"| {name} | {method} | {' | '.join(cells)} |")
    for op in ("encode", "decode"):
        peer, over = z[op][0] / best["native"][op][0], best["native"][op][0] / floor[op][0]
        verdict = "PASS" if peer >= PEER_RATIO and over <= FLOOR_RATIO else "MISS"
        rows.append(f"| {name} | **native {op}: {verdict}** | {peer:.2f}x zstd -3 "
                    f"(>= {PEER_RATIO}), {over:.2f}x floor (<= {FLOOR_RATIO}) |||||||")  # fmt: skip
    return [*rows, _against_numpy(name, best)]


def _against_numpy(name: str, best: dict[str, dict[str, Times]]) -> str:
    """The native path's speed-up over NumPy, wall and CPU."""
    numpy, ours = best["numpy"], best["native"]
    cells = [f"{numpy[op][i] / ours[op][i]:.2f}x" for op in ("encode", "decode") for i in (0, 1)]
    return (f"| {name} | native x NumPy | encode {cells[0]} wall, {cells[1]} CPU; "
            f"decode {cells[2]} wall, {cells[3]} CPU |||||||")  # fmt: skip


def measure_publish(
    base: Path, target: Path, repeat: int, threads: int
) -> dict[str, dict[str, Times]]:
    """Fastest ``publish(target)`` after ``publish(base)`` on each path, of a
    ``Publisher`` and of a ``DistributedPublisher`` in a gloo group of one rank (this
    process; the multi-rank publisher's own code: diff of the rank's share, part upload,
    agreement, commit): the weights in memory (torch), the previous copy the
    publisher's own, into a chain in a local folder (diff, upload with fsync, manifest;
    bench/live.py's measurement)."""
    import live  # torch: only for the publish measurement
    from safetensors.torch import load_file

    from wdelta.chain.live.distributed import DistributedPublisher

    weights = load_file(str(base)), load_file(str(target))
    publishers = {"Publisher": wdelta.chain.Publisher, "DistributedPublisher": DistributedPublisher}
    best: dict[str, dict[str, Times]] = {}
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp, _group_of_one():
        for r in range(repeat):
            for path in ("numpy", "native")[:: 1 if r % 2 == 0 else -1]:
                for name, make in publishers.items():
                    os.environ[native.ENV] = "0" if path == "numpy" else "1"
                    try:
                        folder = Path(tmp) / f"{path}{r}"
                        took, _ = live.time_publish(*weights, argparse.Namespace(threads=threads),
                                                    folder, make)  # fmt: skip
                    finally:
                        os.environ.pop(native.ENV, None)
                    old = best.setdefault(name, {}).get(path, (took.wall, took.cpu))
                    best[name][path] = (min(old[0], took.wall), min(old[1], took.cpu))
    return best


@contextlib.contextmanager
def _group_of_one() -> Iterator[None]:
    """A torch.distributed gloo group of this process alone (loopback TCP)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def publish_row(name: str, publisher: str, times: dict[str, Times]) -> str:
    """The publish target's row: NumPy and native times, the speed-up and the verdict."""
    (numpy_wall, numpy_cpu), (wall, cpu) = times["numpy"], times["native"]
    verdict = "PASS" if numpy_wall / wall >= PUBLISH_RATIO else "MISS"
    return (f"| {name} | **publish: {verdict}** | {publisher}.publish: NumPy {numpy_wall:.2f} "
            f"s, native {wall:.2f} s: {numpy_wall / wall:.2f}x (>= {PUBLISH_RATIO}), CPU "
            f"{numpy_cpu / cpu:.2f}x |||||||")  # fmt: skip


def measure_series(
    pairs: list[tuple[Path, Path]], repeat: int, threads: int
) -> dict[str, dict[str, Times]]:
    """:func:`measure` of every pair of a series, the times summed over the pairs."""
    total: dict[str, dict[str, Times]] = {}
    for base, target in pairs:
        for name, ops in measure(base, target, repeat, threads).items():
            for op, (wall, cpu) in ops.items():
                old = total.setdefault(name, {}).get(op, (0.0, 0.0))
                total[name][op] = (old[0] + wall, old[1] + cpu)
    return total


HEAD = (
    "| case | method | encode MB/s | x zstd -3 | x floor | CPU x floor "
    "| decode MB/s | x zstd -3 | x floor | CPU x floor |\n|---|---|---|---|---|---|---|---|---|---|"
)


Series = list[tuple[Path, Path]]  # (base, target) pairs whose times are summed


def _cases(args: argparse.Namespace) -> list[tuple[str, Series]]:
    out = [(f"{b.parent.name}/{b.name} -> {t.name}", [(b, t)]) for b, t in args.pair]
    if args.trace:
        out += _trace_series(args)
    if not args.no_synthetic:
        for fp8 in (False, True):
            spec = synthetic.spec_for_elements(args.elements, fp8=fp8)
            case = cases.prepare(Path(args.dir), "", spec, args.density, 0)
            label = (
                f"{'fp8 e4m3' if fp8 else 'bf16'} {args.density:.0%}, {spec.nbytes / 1e9:.2f} GB"
            )
            out.append((label, [(case.base, case.target)]))
    return out


def _trace_series(args: argparse.Namespace) -> list[tuple[str, Series]]:
    """The real trace's series, one per dtype and learning rate (generated if missing)."""
    import realtrace  # torch: only for --trace

    cfg, root = traceconfig.config_from(args), Path(args.trace_root)
    realtrace.trace(cfg, root)
    series: dict[str, Series] = {}
    for pair in realtrace.pairs(cfg, root):
        series.setdefault(f"real {pair.case}", []).append((pair.base, pair.target))
    return [(f"{name}, {len(s)} steps", s) for name, s in series.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default="/work/bench-data")
    p.add_argument("--elements", type=int, default=60_000_000)
    p.add_argument("--density", type=float, default=0.02)
    p.add_argument("--no-synthetic", action="store_true")
    p.add_argument("--pair", nargs=2, type=Path, action="append", default=[])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--trace", action="store_true")
    p.add_argument("--publish-bytes", type=int, default=PUBLISH_BYTES)
    p.add_argument("--seed", type=int, default=0, help="the real trace's seed")
    traceconfig.add_flags(p)
    args = p.parse_args(argv)
    if native.kernels() is None:
        print("the native kernels are not built (wdelta --version says the backend)")
        return 1
    print(f"{native.backend()} kernels; {args.threads} threads; fastest of {args.repeat} rounds\n")
    print(HEAD)
    for name, series in _cases(args):
        best = measure_series(series, args.repeat, args.threads)
        size = sum(target.stat().st_size for _, target in series)
        print("\n".join(report(name, size, best)), flush=True)
        if len(series) == 1 and size >= args.publish_bytes:
            publish = measure_publish(*series[0], args.repeat, args.threads)
            for publisher, times in publish.items():
                print(publish_row(name, publisher, times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
