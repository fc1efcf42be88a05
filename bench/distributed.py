"""Distributed publish benchmark: one step published by 1 and by 2 ranks, and a paper model.

    python bench/distributed.py                      # 1 G bf16 elements (2 GB), 2% step, ~4 min
    python bench/distributed.py --elements 128000000 --steps 3   # a quick look

Measured: a synthetic bf16 model (Llama-like tensor shapes, ``--elements`` in all,
words from a seeded generator) is split into shares by ``assign_by_bytes``; each rank
is a process of a gloo group on loopback and publishes its share with
``DistributedPublisher`` into a chain in a local folder (upload = copy, fsync, rename,
read back and hashed, as WR-1 asks).  Version 0 is published untimed; then each step
changes ``--density`` of every tensor's words in place (the low bits of random
elements, as an optimizer step at a small learning rate does) and every rank times its
``publish`` call, the whole collective step: encode, upload, gather, rank 0's
commit, and bringing the previous copy forward.  Runs: 1 rank (1 thread), 2 ranks
(1 thread each), and 1 rank with 2 threads.  Each rank also times its phases
(encode, upload, commit, advance) to give per-core rates and its CPU time per step
(``time.process_time``: on a loaded machine the wall time of 2 ranks also measures how much
of the 2 cores the other work left them), and reports the growth of
its peak RSS from before version 0 (the peak reset once the share is built) to the
last step, divided by its share's bytes (the
previous copy plus scratch; the share itself is the trainer's memory).

Paper model: a 1T-parameter fp8 step (1024 GiB of weights, 20 GiB of delta) over R
ranks, 8 ranks per node, ``--cores-per-rank`` host cores each, at 10 to 100 Gbit/s per
node: encode and advance at the measured per-core rates over the rank's share; upload
and read-back of its part through the node's link shared by its 8 ranks; rank 0 reads
R part headers (32 at a time, ``--latency`` each) and writes the manifest.

The machine is shared: other work slows every figure, so the 1-minute load average is
reported before and after.  Markdown to stdout, JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

GiB = 1 << 30
SHAPES = [(4, 4), (4, 1), (4, 11), (11, 4), (1, 64)]  # relative (rows, cols) of a layer


def model_names(elements: int) -> dict[str, tuple[int, ...]]:
    """Llama-like shapes: 16 layers of q, o, up, down, norm (relative sizes), summing to
    about ``elements``."""
    unit = sum(a * b for a, b in SHAPES[:4]) * 16
    side = max(8, int((elements / unit) ** 0.5) // 8 * 8)
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(16):
        for kind, (a, b) in zip(("q", "o", "up", "down"), SHAPES[:4], strict=True):
            shapes[f"model.layers.{layer}.{kind}.weight"] = (a * side, b * side)
        shapes[f"model.layers.{layer}.norm.weight"] = (4 * side,)
    return shapes


def fill(name: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    seed = int.from_bytes(name.encode()[-8:].rjust(8, b"\0"), "little") % (1 << 32)
    words = np.random.default_rng(seed).integers(0x3C00, 0x3F80, size=shape, dtype=np.uint16)
    return words


def step(share: dict[str, np.ndarray[Any, Any]], k: int, density: float) -> None:
    """Change ``density`` of every tensor's words in place (their lowest 3 bits)."""
    for name, words in share.items():
        rng = np.random.default_rng(k * 1_000_003 + len(name))
        flat = words.reshape(-1)
        idx = rng.choice(flat.size, max(1, int(flat.size * density)), replace=False)
        flat[idx] ^= rng.integers(1, 8, size=idx.size, dtype=np.uint16)


def rss() -> int:
    """Peak RSS of this process in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    """Current RSS in bytes, after resetting the peak (Linux's clear_refs 5), so that the
    transients of building the share do not hide what publishing adds."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from wdelta import chain
    from wdelta.chain.live import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=600))  # fmt: skip
    shapes = model_names(args.elements)
    sizes = {n: int(np.prod(s)) * 2 for n, s in shapes.items()}
    mine = distributed.assign_by_bytes(sizes, args.world)[args.rank]
    share = {n: torch.from_numpy(fill(n, shapes[n])).view(torch.bfloat16) for n in mine}
    words = {n: t.view(torch.int16).numpy().view(np.uint16) for n, t in share.items()}
    c = chain.Chain(chain.open_storage(args.store), cache=Path(args.store + "-cache"))
    pub = distributed.DistributedPublisher(c, options=chain.AppendOptions(threads=args.threads))
    phases = _instrument(pub)
    before, times, cpu = rss_now(), [], []  # the share is the trainer's; publishing's counts
    pub.publish(share, step=0)
    for k in range(1, args.steps + 1):
        step(words, k, args.density)
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        m = pub.publish(share, step=k)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    share_bytes = sum(sizes[n] for n in mine)
    out = {"rank": args.rank, "times": times, "cpu": cpu, "phases": phases,
           "share_bytes": share_bytes,
           "rss_growth": rss() - before, "link_bytes": m.links[-1].size,
           "parts": len(m.links[-1].files)}  # fmt: skip
    Path(args.result).write_text(json.dumps(out))
    dist.destroy_process_group()


def _instrument(pub: Any) -> dict[str, list[float]]:
    """Time the publisher's phases (per call) by wrapping its methods."""
    phases: dict[str, list[float]] = {}
    targets = [(pub._local, "_diff", "encode"), (pub, "_upload_part", "upload"),
               (pub, "_commit", "commit"), (pub._local, "_advance", "advance"),
               (pub.group, "gather", "gather"), (pub.group, "from_rank0", "broadcast")]  # fmt: skip
    for obj, attr, label in targets:
        fn = getattr(obj, attr)

        def timed(*a: Any, _fn: Any = fn, _label: str = label, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                phases.setdefault(_label, []).append(time.perf_counter() - start)

        setattr(obj, attr, timed)
    return phases


def run(world: int, threads: int, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    from chainkit import free_port

    store = tmp / f"chain-{world}-{threads}"
    port = free_port()
    procs, results = [], []
    for r in range(world):
        result = tmp / f"r{world}-{threads}-{r}.json"
        results.append(result)
        procs.append(subprocess.Popen([
            sys.executable, __file__, "--rank", str(r), "--world", str(world), "--port", str(port),
            "--store", str(store), "--result", str(result), "--threads", str(threads),
            "--elements", str(args.elements), "--density", str(args.density),
            "--steps", str(args.steps)]))  # fmt: skip
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"rank process failed with {p.returncode}")
    return [json.loads(r.read_text()) for r in results]


def summarize(name: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    per_step = [max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))]
    share = max(r["share_bytes"] for r in ranks)
    enc = min(min(r["phases"]["encode"]) for r in ranks)
    adv = min(min(r["phases"]["advance"]) for r in ranks)
    up = min(min(r["phases"]["upload"]) for r in ranks)
    cpu = min(max(r["cpu"][i] for r in ranks) for i in range(len(ranks[0]["cpu"])))
    return {"run": name, "step_seconds": per_step, "best": min(per_step), "cpu": cpu,
            "share_bytes": share, "encode_gbps": share / enc / 1e9,
            "advance_gbps": share / adv / 1e9, "upload_seconds": up,
            "commit_seconds": min(min(r["phases"].get("commit", [0.0])) for r in ranks[:1]),
            "ram_ratio": max(r["rss_growth"] / r["share_bytes"] for r in ranks),
            "link_bytes": ranks[0]["link_bytes"], "parts": ranks[0]["parts"]}  # fmt: skip


def paper(enc_gbps: float, adv_gbps: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Seconds per phase of a 1T fp8 step (1024 GiB, 20 GiB delta) over R ranks."""
    rows = []
    for ranks in (64, 256, 1024):
        share = 1024 * GiB / ranks
        part = 20 * GiB / ranks
        cores = args.cores_per_rank
        for gbit in (10, 25, 100):
            node = gbit * 1e9 / 8
            encode = share / (enc_gbps * 1e9 * cores)
            advance = share / (adv_gbps * 1e9 * cores)
            upload = 2 * 8 * part / node  # the part, then its read-back (WR-1)
            commit = -(-ranks // 32) * args.latency + 2 * args.latency
            total = encode + upload + commit + advance
            rows.append({"ranks": ranks, "gbit": gbit, "share_gib": share / GiB,
                         "encode": encode, "upload": upload, "commit": commit,
                         "advance": advance, "total": total})  # fmt: skip
    return rows


def markdown(runs: list[dict[str, Any]], model: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"Model {meta['elements'] / 1e6:.0f} M bf16 elements ({meta['elements'] * 2 / 1e6:.0f}"
             f" MB), {meta['density']:.0%} of the words changed per step, {meta['steps']} steps; "
             f"load average {meta['load_before']:.1f} before, {meta['load_after']:.1f} after "
             f"({os.cpu_count()} cores).", "",
             "| run | best step (s) | steps (s) | CPU s per step, busiest rank "
             "| encode GB/s per rank | advance GB/s per rank "
             "| upload (s) | commit (s) | link bytes (parts) | publisher RAM / share |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        steps = ", ".join(f"{t:.2f}" for t in r["step_seconds"])
        lines.append(f"| {r['run']} | {r['best']:.2f} | {steps} | {r['cpu']:.2f} | "
                     f"{r['encode_gbps']:.2f} | "
                     f"{r['advance_gbps']:.2f} | {r['upload_seconds']:.2f} | "
                     f"{r['commit_seconds']:.2f} | {r['link_bytes']:,} ({r['parts']}) | "
                     f"{r['ram_ratio']:.2f} |")  # fmt: skip
    one, two = runs[0]["best"], runs[1]["best"]
    cpu = runs[0]["cpu"] / runs[1]["cpu"]
    lines += ["", f"Speed-up of 2 ranks over 1 rank (1 thread each): {one / two:.2f}x in wall "
              f"time, {cpu:.2f}x in CPU time of the busiest rank.", "",
              "| ranks | Gbit/s per node | share (GiB) | encode (s) | upload + read-back (s) "
              "| commit (s) | advance (s) | total (s) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for m in model:
        lines.append(f"| {m['ranks']} | {m['gbit']} | {m['share_gib']:.1f} | {m['encode']:.1f} "
                     f"| {m['upload']:.1f} | {m['commit']:.1f} | {m['advance']:.1f} | "
                     f"{m['total']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 1 G elements: 1 GB shares on 2 ranks, where a rank's fixed costs (a step's exchange,
    # 50-100 MB of scratch) no longer dominate, as they would not at 1T scale.
    p.add_argument("--elements", type=int, default=1_024_000_000)
    p.add_argument("--density", type=float, default=0.02)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--cores-per-rank", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.03, help="seconds per storage request")
    p.add_argument("--json", type=Path, default=None)
    for flag, kind in (("--rank", int), ("--world", int), ("--port", int), ("--threads", int),
                       ("--store", str), ("--result", str)):  # fmt: skip
        p.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.rank is not None:
        rank_main(args)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="wdelta-bench-dist-") as tmp:
        runs = [summarize(name, run(w, t, args, Path(tmp)))
                for name, w, t in (("1 rank, 1 thread", 1, 1), ("2 ranks, 1 thread each", 2, 1),
                                   ("1 rank, 2 threads", 1, 2))]  # fmt: skip
    meta = {"elements": sum(int(np.prod(s)) for s in model_names(args.elements).values()),
            "density": args.density, "steps": args.steps, "load_before": load_before,
            "load_after": os.getloadavg()[0]}  # fmt: skip
    model = paper(runs[0]["encode_gbps"], runs[0]["advance_gbps"], args)
    print(markdown(runs, model, meta))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.json or Path(__file__).resolve().parent / "out" / f"distributed-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs, "paper": model}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
