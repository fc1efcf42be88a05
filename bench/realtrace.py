"""A real optimizer trace: tinyllama pretrained briefly, then fine-tuned step by step.

    python bench/realtrace.py [--dim 512 --layers 8 ...]   # generate (or reuse) and list

The model (bench/tinyllama.py, fp32 master weights, AdamW) is pretrained for
``pretrain_steps`` at ``pretrain_lr``; from that state each fine-tuning run
(one per learning rate, a fresh AdamW) takes ``steps`` steps.  After every
step (and once before the first) the bf16 copy and the fp8 E4M3 copy with
128x128 F32 block scales are saved as safetensors:

    ROOT/<key>/lr<LR>/<bf16|fp8>/step-<k>.safetensors

Consecutive steps form the pairs a trainer would ship to inference.  A trace
is reused when ``trace.json`` (written last) records the same configuration,
the same tinyllama.py and the same torch version; it is deterministic for a
seed on one machine (one torch thread count).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tinyllama
import torch
from safetensors.torch import save_file
from traceconfig import TRACE_ROOT, TraceConfig, add_flags, config_from

OUT = TRACE_ROOT
DTYPES = ("bf16", "fp8")


def key(cfg: TraceConfig) -> str:
    """A short hash of the configuration, the generator's code and the torch version."""
    code = inspect.getsource(_generate) + inspect.getsource(_save)
    source = Path(tinyllama.__file__).read_bytes() + code.encode()
    text = json.dumps([asdict(cfg), torch.__version__, hashlib.sha256(source).hexdigest()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Pair:
    """Two consecutive steps of one fine-tuning run in one dtype."""

    lr: float
    dtype: str
    step: int
    base: Path
    target: Path

    @property
    def case(self) -> str:
        return f"{self.dtype} lr{self.lr:g}"


def _path(folder: Path, lr: float, dtype: str, step: int) -> Path:
    return folder / f"lr{lr:g}" / dtype / f"step-{step:03d}.safetensors"


def _save(model: torch.nn.Module, folder: Path, lr: float, step: int) -> None:
    for dtype, weights in (("bf16", tinyllama.bf16_copy), ("fp8", tinyllama.fp8_copy)):
        path = _path(folder, lr, dtype, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(weights(model), str(path))


def _log(message: str) -> None:
    print(f"[realtrace] {message}", file=sys.stderr, flush=True)


def _generate(cfg: TraceConfig, folder: Path) -> dict[str, Any]:
    """Train and save every step; returns the record written to trace.json."""
    start = time.perf_counter()
    model = tinyllama.build_model(cfg.dim, cfg.layers, cfg.heads, 256, cfg.seed)
    batches = tinyllama.text_batches(cfg.seq_len, cfg.batch, cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr)
    losses: dict[str, list[float]] = {"pretrain": []}
    for i in range(cfg.pretrain_steps):
        losses["pretrain"].append(tinyllama.train_step(model, opt, next(batches)))
        if i % 10 == 9:
            _log(f"pretrain step {i + 1}/{cfg.pretrain_steps}: loss {losses['pretrain'][-1]:.3f}")
    pretrained = copy.deepcopy(model.state_dict())
    for lr in cfg.lrs:
        model.load_state_dict(pretrained)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        tune = tinyllama.text_batches(cfg.seq_len, cfg.batch, cfg.seed + 1)
        _save(model, folder, lr, 0)
        losses[f"lr{lr:g}"] = []
        for step in range(1, cfg.steps + 1):
            losses[f"lr{lr:g}"].append(tinyllama.train_step(model, opt, next(tune)))
            _save(model, folder, lr, step)
        _log(f"fine-tuned {cfg.steps} steps at lr {lr:g}")
    params = sum(p.numel() for p in model.parameters())
    return {"config": asdict(cfg), "parameters": params, "losses": losses,
            "seconds": time.perf_counter() - start, "torch": torch.__version__,
            "threads": torch.get_num_threads()}  # fmt: skip


def trace(cfg: TraceConfig, root: Path = OUT, regenerate: bool = False) -> dict[str, Any]:
    """The trace's record (generating it under ``root`` unless a matching one exists)."""
    folder = root / key(cfg)
    record_path = folder / "trace.json"
    if record_path.exists() and not regenerate:
        record: dict[str, Any] = json.loads(record_path.read_text())
        return record
    _log(f"generating {folder} ...")
    record = _generate(cfg, folder)
    record_path.write_text(json.dumps(record, indent=2))
    return record


def pairs(cfg: TraceConfig, root: Path = OUT) -> list[Pair]:
    """Every (step k, step k+1) pair, grouped by dtype then learning rate."""
    folder = root / key(cfg)
    return [
        Pair(lr, dtype, k, _path(folder, lr, dtype, k), _path(folder, lr, dtype, k + 1))
        for dtype in DTYPES for lr in cfg.lrs for k in range(cfg.steps)
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_flags(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--regenerate", action="store_true")
    args = p.parse_args(argv)
    cfg = config_from(args)
    record = trace(cfg, Path(args.trace_root), args.regenerate)
    print(json.dumps({k: v for k, v in record.items() if k != "losses"}, indent=2))
    for pair in pairs(cfg, Path(args.trace_root))[:1]:
        print(f"first pair: {pair.base} -> {pair.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
