"""The real trace's configuration and its command-line flags (no torch needed to parse them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

TRACE_ROOT = Path(__file__).resolve().parent / "out" / "realtrace"


@dataclass(frozen=True)
class TraceConfig:
    """What a trace is made of; the defaults give a 27.5 M-parameter model, ~4 min here."""

    dim: int = 512
    layers: int = 8
    heads: int = 8
    seq_len: int = 129
    batch: int = 4
    pretrain_steps: int = 40
    pretrain_lr: float = 1e-3
    lrs: tuple[float, ...] = (1e-6, 1e-5)
    steps: int = 12
    seed: int = 0


def add_flags(p: argparse.ArgumentParser) -> None:
    """The trace's configuration flags (defaults: TraceConfig's)."""
    d = TraceConfig()
    p.add_argument("--trace-dim", type=int, default=d.dim)
    p.add_argument("--trace-layers", type=int, default=d.layers)
    p.add_argument("--trace-heads", type=int, default=d.heads)
    p.add_argument("--trace-seq", type=int, default=d.seq_len)
    p.add_argument("--trace-batch", type=int, default=d.batch)
    p.add_argument("--trace-pretrain", type=int, default=d.pretrain_steps)
    p.add_argument("--trace-pretrain-lr", type=float, default=d.pretrain_lr)
    p.add_argument("--trace-lrs", default=",".join(f"{x:g}" for x in d.lrs))
    p.add_argument("--trace-steps", type=int, default=d.steps)
    p.add_argument("--trace-root", default=str(TRACE_ROOT))


def config_from(args: argparse.Namespace) -> TraceConfig:
    """A TraceConfig from the flags added by ``add_flags`` (and ``--seed``)."""
    lrs = tuple(float(x) for x in args.trace_lrs.split(","))
    return TraceConfig(args.trace_dim, args.trace_layers, args.trace_heads, args.trace_seq,
                       args.trace_batch, args.trace_pretrain, args.trace_pretrain_lr, lrs,
                       args.trace_steps, args.seed)  # fmt: skip
