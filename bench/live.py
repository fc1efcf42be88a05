"""Live-weights benchmark: in-memory apply and trainer-side publish against full checkpoints.

    python bench/live.py                  # the bench's 1 GB bf16 case (500 M elements), 2% step

Side by side in one run, on torch bf16 tensors in this process, every measurement once per
round, rounds interleaved:

- reload:   ``safetensors.torch.load_file(target)`` + ``copy_`` into the live tensors, three
            ways: the file in the page cache (read just before); the file evicted from the
            page cache first (``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``, no root
            needed: the reload reads the disk); and in the page cache followed by the
            checkpoint digest of the reloaded tensors compared with the target's (the check
            ``apply_inplace`` makes by default); and that digest alone (the floor of any
            checked apply, and of a publish, which must hash the new weights);
- apply:    ``wdelta.apply_inplace(live, delta)`` (default: every output digest checked,
            which proves the inputs of sparse/dense tensors; the others hashed first),
            with ``verify_input=True`` (every input hashed before the first write too:
            two passes over the weights) and with ``verify_output=False`` (inputs only);
            each timed from the base and undone untimed;
- save:     ``safetensors.torch.save_file`` of the full bf16 target (the trainer's baseline):
            into the page cache; followed by ``fsync`` (durable); and then stored in a local
            folder as a chain stores a file (copy, fsync, rename);
- publish:  ``chain.Publisher.publish(target)`` with the base as the previous published copy
            in host memory, into a chain in a local folder (diff + upload with fsync +
            manifest + the copy brought to the target).

Targets (issue 14): apply >= 5x faster than reload (page cache) at 2% change, publish >= 2x
faster than save_file.  The two saves alternate in order from round to round.  Every timed
write starts after ``os.sync()``, so that no fsync flushes an earlier step's gigabyte (ext4
commits other files' dirty data with a file's fsync).  The fastest round counts and every
round is reported, with the 1-minute load average before and after (other work on the
machine slows every figure); ratios have 3 significant digits.  Files live in ``--dir``.
Markdown to stdout, JSON to ``--json``.

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
import functools
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import cases
import torch
from safetensors.torch import load_file, save_file

import wdelta
from wdelta import chain
from wdelta.testing import synthetic

OUT = Path(__file__).resolve().parent / "out"


class Time(NamedTuple):
    """Wall seconds and this process's CPU seconds (user + system, all threads)."""

    wall: float
    cpu: float

    def __add__(self, other: object) -> Time:
        assert isinstance(other, Time)
        return Time(self.wall + other.wall, self.cpu + other.cpu)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], Any]) -> Time:
    cpu, start = _cpu(), time.perf_counter()
    fn()
    return Time(time.perf_counter() - start, _cpu() - cpu)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default="/work/bench-data")
    p.add_argument("--elements", type=int, default=500_000_000)
    p.add_argument("--density", type=float, default=0.02)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _rounds(values: list[Time]) -> dict[str, Any]:
    walls, cpus = [v.wall for v in values], [v.cpu for v in values]
    return {"best": min(walls), "rounds": walls, "best_cpu": min(cpus), "cpu_rounds": cpus}


def evict(path: Path) -> None:
    """Drop ``path`` from the page cache (no root needed): its dirty pages written out
    first, then ``POSIX_FADVISE_DONTNEED`` over the whole file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_apply(case: cases.Case, delta: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Reloads (page cache warm, cold, with a digest check) vs apply_inplace, on the
    same live tensors, interleaved round by round."""
    live = load_file(str(case.base))
    with wdelta.open_delta(delta) as d:
        target_digest = d.header.raw["target"]["digest"]
    names = ("reload", "reload_cold", "reload_verified", "digest", "apply",
             "apply_verify_input", "apply_unverified_output")  # fmt: skip
    times: dict[str, list[Time]] = {n: [] for n in names}

    def reload() -> None:
        for k, v in load_file(str(case.target)).items():
            live[k].copy_(v)

    def reload_verified() -> None:
        reload()
        if chain.weights_digest(live) != target_digest:
            raise AssertionError("the reloaded weights are not the target")

    def to_base() -> None:
        for k, v in load_file(str(case.base)).items():
            live[k].copy_(v)

    for r in range(args.repeat):
        # Each round starts and ends with the live tensors at the base.
        evict(case.target)
        times["reload_cold"].append(timed(reload))
        times["reload"].append(timed(reload))  # the cold reload left the file cached
        times["reload_verified"].append(timed(reload_verified))
        times["digest"].append(timed(lambda: chain.weights_digest(live)))
        to_base()
        _time_applies(live, delta, args, times)
        if r == 0:
            wdelta.apply_inplace(live, delta, threads=args.threads)
            wdelta.verify_weights(live, delta)  # the apply is bit-exact, once per run
            wdelta.apply_inplace(live, delta, reverse=True, threads=args.threads)
        print(f"[live] round {r}: " + ", ".join(f"{n} {times[n][-1].wall:.3f}s" for n in names),
              file=sys.stderr)  # fmt: skip
    return {n: _rounds(times[n]) for n in names}


def _time_applies(
    live: dict[str, Any], delta: Path, args: argparse.Namespace, times: dict[str, list[Time]]
) -> None:
    """The three applies, each timed forward from the base and undone untimed."""
    variants = {"apply": {}, "apply_verify_input": {"verify_input": True},
                "apply_unverified_output": {"verify_output": False}}  # fmt: skip
    for name, flags in variants.items():
        run = functools.partial(wdelta.apply_inplace, live, delta, threads=args.threads, **flags)
        times[name].append(timed(run))
        wdelta.apply_inplace(live, delta, reverse=True, threads=args.threads)


def _save(target: dict[str, Any], out: Path) -> None:
    save_file(target, str(out))


def _save_durable(target: dict[str, Any], out: Path) -> None:
    _save(target, out)
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def measure_publish(case: cases.Case, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """save_file of the full target (plain, fsynced, stored as a chain stores a file)
    vs Publisher.publish(target) after the base, interleaved round by round."""
    base, target = load_file(str(case.base)), load_file(str(case.target))
    names = ("save_file", "save_file_fsync", "save_and_store", "publish")
    times: dict[str, list[Time]] = {n: [] for n in names}
    sizes = []
    out = tmp / "full.safetensors"
    for r in range(args.repeat):
        # Alternated: the second save of a round measured faster, whichever it was.
        for name in ("save_file", "save_file_fsync")[:: 1 if r % 2 == 0 else -1]:
            out.unlink(missing_ok=True)
            os.sync()  # no earlier write's dirty pages to flush in this one's fsync
            save = _save_durable if name == "save_file_fsync" else _save
            times[name].append(timed(lambda f=save: f(target, out)))
        full = chain.open_storage(str(tmp / "full-store"))
        os.sync()
        stored = timed(lambda s=full: s.put_file("full.safetensors", out))
        times["save_and_store"].append(times["save_file"][-1] + stored)
        out.unlink()
        shutil.rmtree(tmp / "full-store")
        took, size = time_publish(base, target, args, tmp / f"chain{r}")
        times["publish"].append(took)
        sizes.append(size)
        print(f"[live] round {r}: " + ", ".join(f"{n} {times[n][-1].wall:.3f}s" for n in names),
              file=sys.stderr)  # fmt: skip
    return {**{n: _rounds(times[n]) for n in names}, "delta_bytes": sizes[0]}


def time_publish(
    base: dict[str, Any], target: dict[str, Any], args: argparse.Namespace, folder: Path,
    publisher: Callable[..., Any] = chain.Publisher,
) -> tuple[Time, int]:  # fmt: skip
    """Time of ``publish(target)`` after an untimed ``publish(base)``; link bytes.
    ``publisher``: the class (``chain.Publisher``, or ``DistributedPublisher`` where a
    process group is initialized), called with the chain and ``options=``."""
    c = chain.Chain(chain.open_storage(str(folder / "store")), cache=folder / "cache")
    pub = publisher(c, options=chain.AppendOptions(threads=args.threads))
    pub.publish(base, step=0)
    os.sync()  # the 1 GB version 0 written just now would be flushed by the timed fsync
    took = timed(lambda: pub.publish(target, step=1))
    size = c.head().links[-1].size
    shutil.rmtree(folder)
    return took, size


ROWS = [
    ("apply", "reload", "reload: load_file + copy_ (file in the page cache)"),
    ("apply", "reload_cold", "reload, file evicted from the page cache first"),
    ("apply", "reload_verified", "reload (page cache) + checkpoint digest of the result"),
    ("apply", "digest", "checkpoint digest alone (BLAKE3 of every byte, in memory)"),
    ("apply", "apply", "apply_inplace (default: outputs hashed, inputs implied)"),
    ("apply", "apply_verify_input", "apply_inplace (verify_input=True: inputs hashed first too)"),
    ("apply", "apply_unverified_output", "apply_inplace (verify_output=False: inputs only)"),
    ("publish", "save_file", "save_file of the full bf16 copy (page cache)"),
    ("publish", "save_file_fsync", "save_file + fsync (durable)"),
    ("publish", "save_and_store", "save_file + stored in a local folder (copy, fsync)"),
    ("publish", "publish", "Publisher.publish (diff + local chain, fsync)"),
]
# (part, baseline, measured, label, target ratio or None)
RATIOS = [
    ("apply", "reload", "apply", "apply vs reload (page cache)", 5.0),
    ("apply", "reload_cold", "apply", "apply vs reload (not in the page cache)", None),
    ("apply", "reload_verified", "apply", "apply vs reload + digest check", None),
    ("publish", "save_file", "publish", "publish vs save_file", 2.0),
    ("publish", "save_file_fsync", "publish", "publish vs save_file + fsync", None),
    ("publish", "save_and_store", "publish", "publish vs save_file + stored (copy, fsync)", None),
]


def markdown(case: cases.Case, res: dict[str, Any]) -> str:
    def row(part: str, key: str, label: str) -> str:
        entry = res[part][key]
        rounds = ", ".join(f"{s:.3f}" for s in entry["rounds"])
        return f"| {label} | {entry['best']:.3f} s | {rounds} | {entry['best_cpu']:.3f} s |"

    def ratio(part: str, base: str, what: str, label: str, goal: float | None) -> str:
        x = res[part][base]["best"] / res[part][what]["best"]
        cpu = res[part][base]["best_cpu"] / res[part][what]["best_cpu"]
        verdict = "" if goal is None else f" (target {goal:g}x: {'PASS' if x >= goal else 'FAIL'})"
        return f"- {label}: {x:#.3g}x{verdict}; CPU time {cpu:#.3g}x"

    return "\n".join([
        f"Case: {case.name}, {case.spec.elements / 1e6:.0f} M elements, "
        f"{case.spec.nbytes / 1e9:.2f} GB bf16, achieved density {case.achieved_density:.2%}, "
        f"delta {res['publish']['delta_bytes'] / 1e6:.1f} MB",
        "",
        "| measurement | best (wall) | rounds (wall) | best CPU time |",
        "|---|---|---|---|",
        *(row(*r) for r in ROWS),
        "",
        "Ratios: baseline's best time / wdelta's best time (above 1: wdelta faster). CPU time",
        "is this process's user + system time, all threads: less disturbed by other work on",
        "the machine than wall time, but blind to waiting for the disk (fsync, cold reads).",
        "",
        *(ratio(*r) for r in RATIOS),
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
