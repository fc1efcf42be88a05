"""The peer table: wdelta against zstd, the TRL layout and ZipNN on real and synthetic pairs.

    python bench/run.py --real          # real trace (bench/realtrace.py) + synthetic cases

Each pair is measured in one process, rounds interleaved (every method once
per round; the fastest round of each counts): wdelta diff and apply through
the Python API (files in the page cache, ``--threads``), zstd and ZipNN in
memory.  wdelta's peak RSS comes from one CLI run of diff and apply per pair
(a child process), whose rebuilt file is checked too.  Sizes are summed over
the pairs of a case; "/ bound" divides by the zeroth-order information bound
(bench/bound.py) over the same pairs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bound
import cases
import headersize
import measure
import peers
import realfigure
import realreport
import realtrace
import traceconfig
from headerpairs import header_json_bytes

import wdelta
from wdelta.format import inline_blobs
from wdelta.testing import synthetic

Row = dict[str, Any]
REFERENCE = realreport.REFERENCE


def _bounds(loaded: peers.Loaded, chunk_elements: int) -> dict[str, float]:
    """Bound in bytes: all tensors, the F32 scale tensors, and changed/element counts."""
    total, scales = bound.Bound(), bound.Bound()
    for name, (_, b, t) in loaded.tensors.items():
        for lo in range(0, len(b), chunk_elements):
            part = bound.chunk_bound(b[lo : lo + chunk_elements], t[lo : lo + chunk_elements])
            total.add(part)
            if name.endswith("_scale_inv"):
                scales.add(part)
    return {"bytes": total.bytes, "scale_bytes": scales.bytes, "changed": total.changed,
            "elements": total.elements}  # fmt: skip


def _delta_parts(delta: Path) -> dict[str, Any]:
    """Header (with prefix and padding; and its JSON text alone) and blob bytes, tensor
    count and scale-tensor blob bytes of a delta.  ``data_bytes`` counts every stored blob,
    the data section's and the inline ones of SPEC §4.12 (their bytes, not their base64
    text): the data-section target measures coding, not where a blob is kept.
    ``inline_text_bytes`` is that base64 text, which the header JSON holds."""
    with wdelta.open_delta(delta) as d:
        scale = sum(c.length for t in d.header.tensors if t.name.endswith("_scale_inv")
                    for c in t.chunks)  # fmt: skip
        inline = [c.inline for t in d.header.tensors for c in t.chunks if c.inline]
        stored = sum(len(b) for b in inline)
        return {"header_bytes": d.data_start, "header_json_bytes": header_json_bytes(delta),
                "inline_text_bytes": sum(len(inline_blobs.encode(b)) for b in inline),
                "data_bytes": d.data_length + stored, "inline_bytes": stored,
                "tensors": len(d.header.tensors), "scale_bytes": scale,
                "chunk_elements": d.header.chunk_elements,
                "compaction": headersize.compaction(d.header_json())}  # fmt: skip


def _wdelta_round(pair: tuple[Path, Path], work: Path, threads: int, target: bytes) -> Row:
    delta, rebuilt = work / "pair.wdelta", work / "rebuilt.safetensors"
    delta.unlink(missing_ok=True)
    _, enc = peers._timed(lambda: wdelta.diff(*pair, delta, threads=threads))
    _, dec = peers._timed(lambda: wdelta.apply(pair[0], delta, rebuilt, threads=threads))
    if rebuilt.read_bytes() != target:
        raise AssertionError(f"wdelta apply did not rebuild {pair[1]}")
    rebuilt.unlink()
    return {"bytes": delta.stat().st_size, "encode": enc, "decode": dec}


def _rss(pair: tuple[Path, Path], work: Path, threads: int, target: bytes) -> dict[str, int]:
    """Peak RSS of the CLI's diff and apply (child processes); the rebuilt file is checked."""
    delta, rebuilt = work / "cli.wdelta", work / "cli.safetensors"
    t = ["--threads", str(threads), "-q"]
    d = measure.run_cli(["diff", str(pair[0]), str(pair[1]), "-o", str(delta), *t])
    a = measure.run_cli(["apply", str(pair[0]), str(delta), "-o", str(rebuilt), *t])
    if rebuilt.read_bytes() != target:
        raise AssertionError(f"wdelta CLI apply did not rebuild {pair[1]}")
    delta.unlink()
    rebuilt.unlink()
    return {"diff_rss": d.max_rss, "apply_rss": a.max_rss}


def _keep_fastest(best: dict[str, Row], name: str, r: peers.Result | Row) -> None:
    row = asdict(r) if isinstance(r, peers.Result) else r
    old = best.setdefault(name, row)
    for key in ("encode", "decode"):
        if row.get(key) is not None and old.get(key) is not None:
            old[key] = min(old[key], row[key])


def measure_pair(base: Path, target: Path, args: argparse.Namespace, slow: bool) -> Row:
    """Every method on one pair; ``slow`` adds zstd -19 of the XOR and of the target.

    zstd -19 runs at 1-4 MB/s here (minutes per pair on the 55 MB files), so
    it is measured on the last pair of each case only.
    """
    loaded = peers.load(base, target)
    work = Path(args.dir)
    best: dict[str, Row] = {}
    dtype = peers.zipnn_dtype(loaded)
    for _ in range(args.repeat):
        _keep_fastest(best, "wdelta", _wdelta_round((base, target), work, args.threads,
                                                    loaded.target))  # fmt: skip
        _keep_fastest(best, REFERENCE, peers.zstd_xor_files(base, target, work))
        _keep_fastest(best, "zstd -3 of XOR", peers.zstd(loaded.xor, 3))
        _keep_fastest(best, "zstd -3 of target", peers.zstd(loaded.target, 3))
        raw, packed = peers.trl(loaded)
        _keep_fastest(best, "TRL gaps + values", raw)
        _keep_fastest(best, "TRL gaps + values, zstd -3", packed)
        _keep_fastest(best, "ZipNN of XOR", peers.zipnn(loaded.xor, dtype))
        _keep_fastest(best, "ZipNN of target", peers.zipnn(loaded.target, dtype))
    if slow:
        best["zstd -19 of XOR"] = asdict(peers.zstd(loaded.xor, 19, decode=False))
        best["zstd -19 of target"] = asdict(peers.zstd(loaded.target, 19, decode=False))
    row: Row = {"base": str(base), "target": str(target), "full": len(loaded.target),
                "methods": best}  # fmt: skip
    delta = work / "parts.wdelta"
    wdelta.diff(base, target, delta, threads=args.threads)
    row["wdelta"] = _delta_parts(delta) | _rss((base, target), work, args.threads, loaded.target)
    delta.unlink()
    row["bound"] = _bounds(loaded, row["wdelta"]["chunk_elements"])
    return row


def _real_cases(args: argparse.Namespace) -> list[tuple[str, list[tuple[Path, Path]]]]:
    cfg = traceconfig.config_from(args)
    root = Path(args.trace_root)
    record = realtrace.trace(cfg, root)
    print(f"[bench] real trace: {record['parameters']:,} parameters", file=sys.stderr)
    grouped: dict[str, list[tuple[Path, Path]]] = {}
    for p in realtrace.pairs(cfg, root)[:: args.pair_stride]:
        grouped.setdefault(f"real {p.case}", []).append((p.base, p.target))
    return list(grouped.items())


def _synthetic_cases(args: argparse.Namespace) -> list[tuple[str, list[tuple[Path, Path]]]]:
    out = []
    root = Path(args.dir)
    for d in [float(x) for x in args.densities.split(",")] if args.densities else []:
        spec = synthetic.spec_for_elements(args.elements)
        case = cases.prepare(root, f"bf16 {d:.1%}", spec, d, args.seed)
        out.append((f"synthetic bf16 {d:.1%}", [(case.base, case.target)]))
    if args.fp8_density > 0:
        spec = synthetic.spec_for_elements(args.elements, fp8=True)
        case = cases.prepare(root, "fp8", spec, args.fp8_density, args.seed)
        out.append((f"synthetic fp8 {args.fp8_density:.1%}", [(case.base, case.target)]))
    return out


def main(args: argparse.Namespace) -> int:
    """Measure every case, print the tables, write the JSON and the figure."""
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    results = []
    for name, pair_list in _real_cases(args) + _synthetic_cases(args):
        rows = []
        for i, (base, target) in enumerate(pair_list):
            print(f"[bench] {name}: pair {i + 1}/{len(pair_list)}", file=sys.stderr, flush=True)
            rows.append(measure_pair(base, target, args, slow=i == len(pair_list) - 1))
        results.append({"name": name, "pairs": rows})
    text = realreport.markdown(results, args)
    print(text)
    out = realreport.write_json(results, text, args)
    figure = realfigure.plot(results, out.with_suffix(".png"))
    print(f"[bench] JSON {out}, figure {figure}", file=sys.stderr)
    return 0
