"""Live-weights benchmark: in-memory apply and trainer-side publish against full checkpoints.

    python bench/live.py                  # the bench's 1 GB bf16 case (500 M elements), 2% step

Side by side in one run, on torch bf16 tensors in this process:

- reload:   ``safetensors.torch.load_file(target)`` + ``copy_`` into the live tensors;
- apply:    ``wdelta.apply_inplace(live, delta)`` (default: every output digest checked,
            which proves the inputs of sparse/dense tensors; the others hashed first),
            with ``verify_input=True`` (every input hashed before the first write too:
            two passes over the weights) and with ``verify_output=False`` (inputs only);
- save:     ``safetensors.torch.save_file`` of the full bf16 target (the trainer's baseline),
            and that file then stored in a local folder as a chain stores a file (copy,
            fsync, rename): a full checkpoint published the way ``publish`` publishes;
- publish:  ``chain.Publisher.publish(target)`` with the base as the previous published copy
            in host memory, into a chain in a local folder (diff + upload + manifest).

Targets (issue 14): apply >= 5x faster than reload at 2% change, publish >= 2x faster than
save.  Every timed write starts after ``os.sync()``, so that no fsync flushes an earlier
step's gigabyte (ext4 commits other files' dirty data with a file's fsync).  Each is timed
``--repeat`` times, alternately forward and back for apply; the fastest round counts and
every round is reported, with the 1-minute load average before and after (other work on the
machine slows every figure).  Files live in ``--dir`` (page cache warm: each file is read once
before timing).  Markdown to stdout, JSON to ``--json``.

Flags:
  --dir DIR          data folder (default /work/bench-data; shared with bench/run.py)
  --elements N       model size (default 500_000_000)
  --density D        changed fraction of the step (default 0.02)
  --threads T        threads for wdelta (default 2)
  --repeat R         rounds of each measurement (default 3)
  --json PATH        JSON output (default bench/out/live-<UTC time>.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cases
import torch
from safetensors.torch import load_file, save_file

import wdelta
from wdelta import chain, synthetic

OUT = Path(__file__).resolve().parent / "out"


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default="/work/bench-data")
    p.add_argument("--elements", type=int, default=500_000_000)
    p.add_argument("--density", type=float, default=0.02)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _rounds(values: list[float]) -> dict[str, Any]:
    return {"best": min(values), "rounds": values}


def measure_apply(case: cases.Case, delta: Path, args: argparse.Namespace) -> dict[str, Any]:
    """reload (load_file + copy_) vs apply_inplace, on the same live tensors."""
    live = load_file(str(case.base))
    reload_s, apply_s, full_s, fast_s = [], [], [], []

    def reload() -> None:
        for k, v in load_file(str(case.target)).items():
            live[k].copy_(v)

    for r in range(args.repeat):
        # Each round starts and ends with the live tensors at the base.
        reload_s.append(timed(reload))
        for k, v in load_file(str(case.base)).items():
            live[k].copy_(v)
        apply_s.append(timed(lambda: wdelta.apply_inplace(live, delta, threads=args.threads)))
        back = timed(lambda: wdelta.apply_inplace(live, delta, reverse=True, threads=args.threads))
        full_s.append(timed(lambda: wdelta.apply_inplace(
            live, delta, verify_input=True, threads=args.threads)))  # fmt: skip
        wdelta.apply_inplace(live, delta, reverse=True, threads=args.threads)
        fast_s.append(timed(lambda: wdelta.apply_inplace(
            live, delta, verify_output=False, threads=args.threads)))  # fmt: skip
        if r == 0:
            wdelta.verify_weights(live, delta)  # the apply is bit-exact, once per run
        wdelta.apply_inplace(live, delta, reverse=True, threads=args.threads)
        print(f"[live] round {r}: reload {reload_s[-1]:.2f}s apply {apply_s[-1]:.2f}s (back "
              f"{back:.2f}s, verify_input {full_s[-1]:.2f}s, unverified output "
              f"{fast_s[-1]:.2f}s)", file=sys.stderr)  # fmt: skip
    return {"reload": _rounds(reload_s), "apply": _rounds(apply_s),
            "apply_verify_input": _rounds(full_s),
            "apply_unverified_output": _rounds(fast_s)}  # fmt: skip


def measure_publish(case: cases.Case, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """save_file of the full target vs Publisher.publish(target) after the base."""
    base, target = load_file(str(case.base)), load_file(str(case.target))
    save_s, stored_s, publish_s, sizes = [], [], [], []
    out = tmp / "full.safetensors"
    for r in range(args.repeat):
        os.sync()  # no earlier round's dirty pages to flush in this one's fsync
        save_s.append(timed(lambda: save_file(target, str(out))))
        full = chain.open_storage(str(tmp / "full-store"))
        os.sync()
        stored_s.append(save_s[-1] + timed(lambda s=full: s.put_file("full.safetensors", out)))
        out.unlink()
        shutil.rmtree(tmp / "full-store")
        store = tmp / f"chain{r}"
        c = chain.Chain(chain.open_storage(str(store)), cache=tmp / f"cache{r}")
        opts = chain.AppendOptions(threads=args.threads)
        pub = chain.Publisher(c, options=opts)
        pub.publish(base, step=0)
        os.sync()  # the 1 GB version 0 written just now would be flushed by the timed fsync
        start = time.perf_counter()
        m = pub.publish(target, step=1)
        publish_s.append(time.perf_counter() - start)
        sizes.append(m.links[-1].size)
        shutil.rmtree(store)
        shutil.rmtree(tmp / f"cache{r}", ignore_errors=True)  # made only if a pull ran
        print(f"[live] round {r}: save_file {save_s[-1]:.2f}s (+ stored {stored_s[-1]:.2f}s) "
              f"publish {publish_s[-1]:.2f}s", file=sys.stderr)  # fmt: skip
    return {"save_file": _rounds(save_s), "save_and_store": _rounds(stored_s),
            "publish": _rounds(publish_s), "delta_bytes": sizes[0]}  # fmt: skip


def markdown(case: cases.Case, res: dict[str, Any]) -> str:
    a, p = res["apply"], res["publish"]
    ra = a["reload"]["best"] / a["apply"]["best"]
    rp = p["save_file"]["best"] / p["publish"]["best"]

    def row(name: str, entry: dict[str, Any]) -> str:
        rounds = ", ".join(f"{s:.2f}" for s in entry["rounds"])
        return f"| {name} | {entry['best']:.2f} s | {rounds} |"

    return "\n".join([
        f"Case: {case.name}, {case.spec.elements / 1e6:.0f} M elements, "
        f"{case.spec.nbytes / 1e9:.2f} GB bf16, achieved density {case.achieved_density:.2%}, "
        f"delta {p['delta_bytes'] / 1e6:.1f} MB",
        "",
        "| measurement | best | rounds |",
        "|---|---|---|",
        row("reload: load_file + copy_", a["reload"]),
        row("apply_inplace (default: outputs hashed, inputs implied)", a["apply"]),
        row("apply_inplace (verify_input=True: inputs hashed first too)", a["apply_verify_input"]),
        row("apply_inplace (verify_output=False: inputs only)", a["apply_unverified_output"]),
        row("save_file of the full bf16 copy", p["save_file"]),
        row("save_file + stored in a local folder (copy, fsync)", p["save_and_store"]),
        row("Publisher.publish (diff + local chain)", p["publish"]),
        "",
        f"apply vs reload: {ra:.2f}x faster (target 5x: {'PASS' if ra >= 5 else 'FAIL'}); "
        f"publish vs save_file: {rp:.2f}x faster (target 2x: {'PASS' if rp >= 2 else 'FAIL'})",
        f"publish vs save_file + storing the file: "
        f"{p['save_and_store']['best'] / p['publish']['best']:.2f}x faster (no target)",
        "",
        f"1-minute load average: {res['load'][0]:.1f} before, {res['load'][1]:.1f} after "
        f"(2 CPUs; above ~2 other work shared the machine)",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    spec = synthetic.spec_for_elements(args.elements)
    name = f"bf16 {args.density:.1%}"
    print(f"[live] {name}: preparing data in {args.dir} ...", file=sys.stderr, flush=True)
    case = cases.prepare(Path(args.dir), name, spec, args.density, 0)
    with tempfile.TemporaryDirectory(prefix="wdelta-live-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        delta = tmp / "step.wdelta"
        wdelta.diff(case.base, case.target, delta, threads=args.threads)
        load = os.getloadavg()[0]
        res = {"apply": measure_apply(case, delta, args),
               "publish": measure_publish(case, args, tmp)}  # fmt: skip
        res["load"] = [load, os.getloadavg()[0]]
    text = markdown(case, res)
    print(text)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.json) if args.json else OUT / f"live-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv, "date": stamp, "case": case.name,
                               "results": res, "markdown": text}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
