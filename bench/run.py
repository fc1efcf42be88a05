"""wdelta benchmark: delta size and encode/apply speed on synthetic RL-like steps.

    python bench/run.py                 # bf16 at 0.1/2/10/30% + fp8 at 2%, >= 500 M elements
    python bench/run.py --memory        # one >= 8 GiB bf16 checkpoint (1 GiB largest tensor)
    python bench/run.py --real          # peer table: real AdamW trace + synthetic (bench extra)

Flags:
  --dir DIR            data folder (default /work/bench-data; never inside the repo)
  --elements N         model size of the default cases (default 500_000_000)
  --densities LIST     bf16 densities, comma-separated (default 0.001,0.02,0.1,0.3)
  --fp8-density D      density of the fp8 E4M3 block-scaled case (default 0.02; 0 skips it)
  --memory             run only the memory case (Llama-3-8B-shaped, 16 layers)
  --memory-layers L    layers of the memory case (default 16: 9.1 GB)
  --threads T          --threads passed to wdelta diff/apply (default 2)
  --repeat R           rounds of diff, zstd -3, apply and copy; the fastest of each counts
                       (default 3)
  --xor-sample-mib M   size of the dense-XOR sample compressed with zstd -19 (default 64)
  --seed S             generator seed (default 0)
  --regenerate         rewrite data files even when a matching one exists
  --keep               keep the .wdelta files
  --json PATH          JSON output (default bench/out/bench-<UTC time>.json)
  --real               the peer table instead (bench/realbench.py): a real tinyllama trace
                       (bench/realtrace.py, cached under --trace-root) and synthetic pairs of
                       --elements (default there 27_500_000) against zstd, TRL and ZipNN;
  --pair-stride K      --real measures every K-th step pair of the trace (default 3: steps
                       0-1, 3-4, 6-7, 9-10 of each run)
                       --trace-* flags set the trace (python bench/realtrace.py --help)

Every case: wdelta diff and apply run as child processes of the real CLI
(wall time, ru_maxrss from wait4); the rebuilt file is checked byte for byte
(SHA-256) against the target.  Baselines are measured in the same run.
Markdown goes to stdout; the exit status is 1 if any rebuilt file differs.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bound
import cases
import measure
import report
from traceconfig import add_flags as realtrace_flags

import wdelta
from wdelta.testing import synthetic

OUT = Path(__file__).resolve().parent / "out"


def _encodings(delta: Path) -> tuple[dict[str, int], int]:
    """Chunk counts by "encoding:transform", and the delta's chunk_elements."""
    with wdelta.open_delta(delta) as d:
        counts = Counter(
            f"{c.encoding}:{c.transform}" if c.transform else c.encoding
            for t in d.header.tensors for c in t.chunks
        )  # fmt: skip
        return dict(counts), d.header.chunk_elements


def _best(runs: list[Any]) -> dict[str, Any]:
    """The fastest of repeated runs (other work shares the machine), with every time kept."""
    fastest = min(runs, key=lambda r: r.seconds)
    out = {**asdict(fastest), "seconds": fastest.seconds, "all_seconds": [r.seconds for r in runs]}
    if hasattr(fastest, "max_rss"):
        out["max_rss"] = max(r.max_rss for r in runs)
    return out


def _paired(runs: list[Any], baselines: list[Any]) -> list[float]:
    """Per repeat, baseline seconds / wdelta seconds (> 1: wdelta was faster)."""
    return [b.seconds / r.seconds for r, b in zip(runs, baselines, strict=True)]


def _wdelta(case: cases.Case, args: argparse.Namespace) -> dict[str, Any]:
    """diff, zstd -3, apply and a file copy, side by side in each of ``args.repeat`` rounds.

    Interleaving puts each wdelta run next to its baseline, so that a slow
    spell of the (shared, virtual) disk or CPU hits both; every rebuilt file
    is checked against the target.
    """
    work = Path(args.dir)
    delta, rebuilt = work / f"{case.target.stem}.wdelta", work / "rebuilt.safetensors"
    expected = measure.sha256(case.target)  # also warms the page cache for every run below
    measure.sha256(case.base)
    t = ["--threads", str(args.threads), "-q"]
    diffs, zstds, applies, copies, identical = [], [], [], [], True
    for _ in range(args.repeat):
        # Like apply's output and the copy, a diff never replaces an earlier file: freeing its
        # blocks (with online discard) cost up to 0.05 s inside the rename.
        delta.unlink(missing_ok=True)
        diffs.append(
            measure.run_cli(["diff", str(case.base), str(case.target), "-o", str(delta), *t])
        )
        zstds.append(measure.zstd_file(case.target, 3, 0))
        applies.append(
            measure.run_cli(["apply", str(case.base), str(delta), "-o", str(rebuilt), *t])
        )
        identical = identical and measure.sha256(rebuilt) == expected
        rebuilt.unlink()
        copies.append(measure.copy_file(case.base, work / "copy.tmp"))
    counts, chunk_elements = _encodings(delta)
    size = delta.stat().st_size
    if not args.keep:
        delta.unlink()
    return {
        "delta_bytes": size, "diff": _best(diffs), "apply": _best(applies),
        "zstd3": _best(zstds), "copy": _best(copies),
        "diff_vs_zstd3": _paired(diffs, zstds), "apply_vs_copy": _paired(applies, copies),
        "identical": identical, "encodings": counts, "chunk_elements": chunk_elements,
        "encodings_text": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
    }  # fmt: skip


def _baselines(case: cases.Case, args: argparse.Namespace, chunk_elements: int) -> dict[str, Any]:
    """zstd -3 with 2 threads (fastest of repeats), zstd -19 of a dense-XOR sample, the bound."""
    zstd3_mt = _best([measure.zstd_file(case.target, 3, 2) for _ in range(args.repeat)])
    sample, stream = bound.xor_sample(case.base, case.target, args.xor_sample_mib << 20)
    z19 = measure.zstd_bytes(sample, 19)
    header = case.target.stat().st_size - stream
    info = bound.information_bound(case.base, case.target, chunk_elements)
    return {
        "zstd3_threads2": zstd3_mt,
        "xor_zstd19": {
            **asdict(z19), "stream_bytes": stream,
            "estimate_bytes": z19.output_bytes / z19.input_bytes * stream + header,
        },
        "bound": {**asdict(info), "bytes": info.bytes},
    }  # fmt: skip


def _xor_note(z19: dict[str, Any], sample_mib: int) -> str:
    """How zstd -19 of the dense XOR was obtained: the whole stream, or a sample's ratio."""
    speed = f"zstd -19 ran at {z19['input_bytes'] / z19['seconds'] / 1e6:.1f} MB/s on it"
    if z19["input_bytes"] >= 0.999 * z19["stream_bytes"]:
        return (
            "zstd -19 of the dense XOR is measured: base XOR target over the whole data "
            f"section (64 slices, one frame; {speed})."
        )
    return (
        f"zstd -19 of the dense XOR is an estimate: {sample_mib} MiB sampled in 64 evenly "
        f"spaced slices of base XOR target, compressed as one frame, ratio extrapolated ({speed})."
    )


def run_case(case: cases.Case, args: argparse.Namespace, headline: bool) -> dict[str, Any]:
    """Every measurement of one case, as a JSON-ready dict."""
    print(f"[bench] {case.name}: diff/apply ...", file=sys.stderr, flush=True)
    load = [os.getloadavg()[0]]
    result = _wdelta(case, args)
    load.append(os.getloadavg()[0])
    print(f"[bench] {case.name}: baselines ...", file=sys.stderr, flush=True)
    result |= _baselines(case, args, result["chunk_elements"])
    result["load_average_1min"] = [*load, os.getloadavg()[0]]
    return {
        "name": case.name, "headline": headline, "spec": asdict(case.spec),
        "requested_density": case.requested_density, "achieved_density": case.achieved_density,
        "lr": case.lr, "full_bytes": case.target.stat().st_size,
        "generate_seconds": case.generate_seconds, **result,
    }  # fmt: skip


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default="/work/bench-data")
    p.add_argument("--elements", type=int, default=500_000_000)
    p.add_argument("--densities", default="0.001,0.02,0.1,0.3")
    p.add_argument("--fp8-density", type=float, default=0.02)
    p.add_argument("--memory", action="store_true")
    p.add_argument("--memory-layers", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--xor-sample-mib", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--regenerate", action="store_true")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--real", action="store_true")
    p.add_argument("--pair-stride", type=int, default=3)
    realtrace_flags(p)
    args = p.parse_args(argv)
    if args.real and args.elements == p.get_default("elements"):
        args.elements = 27_500_000  # the real trace's size
    return args


def _plan(args: argparse.Namespace) -> list[tuple[str, synthetic.ModelSpec, float]]:
    if args.memory:
        spec = synthetic.ModelSpec(4096, args.memory_layers, 14336, 128256, 1024)
        return [(f"memory: bf16 {spec.nbytes / 1e9:.1f} GB, 2%", spec, 0.02)]
    spec = synthetic.spec_for_elements(args.elements)
    densities = [float(d) for d in args.densities.split(",")]
    plan = [(f"bf16 {d:.1%}", spec, d) for d in densities]
    if args.fp8_density > 0:
        fp8 = synthetic.spec_for_elements(args.elements, fp8=True)
        plan.append((f"fp8 e4m3 {args.fp8_density:.1%}", fp8, args.fp8_density))
    return plan


def _source_hash() -> str:
    """SHA-256 over the wdelta sources measured (the tree may be uncommitted)."""
    h = hashlib.sha256()
    root = Path(wdelta.__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _git_head() -> str:
    """HEAD of the repository wdelta was imported from ("+dirty" if reference/ differs)."""
    repo = Path(__file__).resolve().parent.parent
    if not Path(wdelta.__file__).resolve().is_relative_to(repo):
        return f"none (wdelta imported from {Path(wdelta.__file__).parent.parent})"
    try:
        git = ["git", "-C", str(repo)]
        rev = [*git, "rev-parse", "--short", "HEAD"]
        head = subprocess.run(rev, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "reference"])
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.returncode else "")


def _notes(
    args: argparse.Namespace, results: list[dict[str, Any]], startup: list[float], floor: int,
    sources: list[str],
) -> list[str]:  # fmt: skip
    r0 = results[0]
    spec = r0["spec"]
    z19 = r0["xor_zstd19"]
    loads = [x for r in results for x in r["load_average_1min"]]
    return [
        f"Model: {spec['layers']} layers, hidden {spec['hidden']}, vocab {spec['vocab']}; "
        f"target file {r0['full_bytes'] / 1e9:.2f} GB. Synthetic AdamW step "
        "(wdelta.testing.synthetic), density = changed elements / all elements.",
        "Throughput = target checkpoint bytes / wall seconds of the child process "
        f"(python start-up included), `--threads {args.threads}`, fastest of {args.repeat} "
        "rounds; each round runs diff, zstd -3 (1 thread), apply and a copy of the base one "
        "after another, so a slow spell of the shared disk or CPU hits a run and its baseline "
        'alike. "rounds" in the targets are the per-round ratios (baseline time / wdelta '
        "time for diff, copy time / apply time for apply). GB = 1e9 bytes. Peak RSS is the "
        "largest of the runs. zstd -3 runs inside the bench process (python-zstandard "
        "streaming the file; its output is counted, not written), while diff and apply "
        "write, fsync and rename their output, to a path that no earlier file occupies.",
        f"CLI start-up (`wdelta --version`: interpreter + imports) took "
        f"{min(startup):.2f}-{max(startup):.2f} s in this run; it is inside every diff/apply time. "
        "The CLI runs from compiled bytecode, as an installed wdelta does (the bench keeps "
        "it in bench/out/pycache when wdelta is imported from a source tree).",
        "Peak RSS is ru_maxrss of the CLI process, forked by a small helper (Linux carries "
        f"peak RSS across fork+exec); the helper's floor is {floor / 2**20:.0f} MiB.",
        "Every file was read just before timing (page cache warm where RAM allows); "
        "cold-cache numbers are not measured (dropping the page cache is not possible here).",
        _xor_note(z19, args.xor_sample_mib),
        "Information bound: per chunk of the delta's chunk_elements, m*H(c/m) bits for "
        "positions + c * zeroth-order entropy of the changed words (better of xor / sub).",
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"wdelta {wdelta.__version__}, git {_git_head()}, sources {sources[0]}"
        + ("" if sources[0] == sources[-1] else " **changed during the run**")
        + ". "
        "1-minute load average around the cases: "
        f"{min(loads):.1f}-{max(loads):.1f} (this benchmark alone keeps it near 1-2; "
        "more means other work shared the machine and the speeds are pessimistic).",
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.real:
        import realbench

        args.provenance = f"git {_git_head()}, sources {_source_hash()}"
        return realbench.main(args)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    sources = [_source_hash()]
    measure.warm_up()
    startup = [measure.run_cli(["--version"]).seconds for _ in range(3)]
    floor = measure.helper_floor().max_rss
    results = []
    for name, spec, density in _plan(args):
        print(f"[bench] {name}: preparing data in {root} ...", file=sys.stderr, flush=True)
        case = cases.prepare(root, name, spec, density, args.seed, args.regenerate)
        results.append(run_case(case, args, headline=density == 0.02 and not spec.fp8))
    sources.append(_source_hash())
    notes = _notes(args, results, startup, floor, sources)
    text = report.markdown(results, notes)
    print(text)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = (
        Path(args.json)
        if args.json
        else OUT / f"bench-{'memory-' if args.memory else ''}{stamp}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"argv": sys.argv, "date": stamp, "results": results,
           "wdelta_sources": sources, "cli_startup_seconds": startup,
           "rss_floor": floor, "notes": notes, "markdown": text}  # fmt: skip
    out.write_text(json.dumps(doc, indent=2))
    print(f"[bench] JSON written to {out}", file=sys.stderr)
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
