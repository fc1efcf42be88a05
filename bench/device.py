"""Device tensors: what crosses to the host per step, and how long, against a full copy.

    python bench/device.py                        # CUDA: 100 M bf16 elements at 2%
    python bench/device.py --device cpu --elements 2000000   # the code path, on CPU tensors
    python bench/device.py --dtype float8_e4m3fn --density 0.005

Flags:
  --device D     torch device (default cuda); without one this prints a skip line and exits 0
  --elements N   model size in elements, in tensors of at most 16 M (default 100_000_000)
  --density F    fraction of elements changed by the step (default 0.02)
  --dtype T      torch dtype name (default bfloat16)
  --dir DIR      where the delta is written (default: a temporary folder)

Rows: "copy" = base and target copied whole to the host (what a diff on the host
reads); "changes" = compare and gather on the device only (TorchSlot.changes
over every chunk); "diff" = wdelta.diff of the two device mappings (the base read to
the host once, of the target only changed positions and words); "apply" =
apply_inplace of that delta on a device copy of the base (sparse chunks gathered and
scattered on the device; the output digest still reads every tensor).  Host bytes
are counted where TorchSlot hands words to and from the host.  On CPU the device
path is forced (``tensors.DEVICE_PATH_ON_CPU``): it checks the path, its times say
nothing about a GPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import wdelta
from wdelta.ops import tensors
from wdelta.ops.encoder import DEFAULT_CHUNK_ELEMENTS

TENSOR_MAX = 1 << 24
_INT_DTYPES = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--elements", type=int, default=100_000_000)
    p.add_argument("--density", type=float, default=0.02)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dir", type=Path, default=None)
    return p.parse_args()


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Bytes TorchSlot moves between device and host while inside."""
    moved = [0]
    slot = tensors.TorchSlot
    saved = {n: getattr(slot, n) for n in ("read", "gather", "changes", "scatter", "write")}

    def returned(name: str) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any) -> Any:
            out = saved[name](self, *args)
            moved[0] += sum(a.nbytes for a in (out if isinstance(out, tuple) else (out,)))
            return out

        return wrapper

    def sent(name: str) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any) -> Any:
            moved[0] += args[-1].nbytes  # the words; scatter's index crosses too
            moved[0] += args[0].nbytes if name == "scatter" else 0
            return saved[name](self, *args)

        return wrapper

    for name in ("read", "gather", "changes"):
        setattr(slot, name, returned(name))
    for name in ("scatter", "write"):
        setattr(slot, name, sent(name))
    try:
        yield moved
    finally:
        for name, method in saved.items():
            setattr(slot, name, method)


def _model(torch: Any, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    dtype = getattr(torch, args.dtype)
    size = torch.empty(0, dtype=dtype).element_size()
    word = getattr(torch, _INT_DTYPES[size])
    base, target = {}, {}
    gen = torch.Generator(device=args.device).manual_seed(0)
    for i, start in enumerate(range(0, args.elements, TENSOR_MAX)):
        n = min(TENSOR_MAX, args.elements - start)
        info = torch.iinfo(word)
        bits = torch.randint(
            info.min, info.max, (n,), generator=gen, device=args.device, dtype=word
        )
        mask = torch.rand(n, generator=gen, device=args.device) < args.density
        step = bits.clone()
        step[mask] ^= 1  # the lowest bit: a changed stored word, never float math
        base[f"layer{i}.weight"], target[f"layer{i}.weight"] = bits.view(dtype), step.view(dtype)
    return base, target


def _host_copy(torch: Any, t: Any) -> Any:
    """A new host tensor with ``t``'s words (a copy on CPU too, unlike ``.to("cpu")``)."""
    return torch.empty_like(t, device="cpu").copy_(t)


def _timed(torch: Any, device: str, run: Callable[[], Any]) -> tuple[float, Any]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _changes_only(base: dict[str, Any], target: dict[str, Any]) -> int:
    found = 0
    for name, t in target.items():
        mine, theirs = tensors.TorchSlot(name, t), tensors.TorchSlot(name, base[name])
        for start in range(0, t.numel(), DEFAULT_CHUNK_ELEMENTS):
            count = min(DEFAULT_CHUNK_ELEMENTS, t.numel() - start)
            found += len(mine.changes(theirs, start, count)[0])
    return found


def _row(label: str, seconds: float, moved: int, total: int) -> None:
    print(f"{label:<8} {seconds:8.3f} s  {moved / 1e6:10.1f} MB to/from host  "
          f"({moved / total:6.1%} of the model)  {total / 1e6 / seconds:9.0f} MB/s")  # fmt: skip


def main() -> int:
    args = _args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"skip: no CUDA device here (torch {torch.__version__}); "
              "--device cpu runs the code path on CPU tensors")  # fmt: skip
        return 0
    tensors.DEVICE_PATH_ON_CPU = args.device == "cpu"
    base, target = _model(torch, args)
    total = sum(t.numel() * t.element_size() for t in target.values())
    print(f"{args.elements:,} {args.dtype} elements on {args.device}, {args.density:.2%} changed")
    both = [*base.values(), *target.values()]
    seconds, _ = _timed(torch, args.device, lambda: [_host_copy(torch, t) for t in both])
    _row("copy", seconds, 2 * total, total)
    with _counting() as moved:
        seconds, found = _timed(torch, args.device, lambda: _changes_only(base, target))
    _row("changes", seconds, moved[0], total)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        delta = Path(folder) / "step.wdelta"
        with _counting() as moved:
            seconds, _ = _timed(torch, args.device, lambda: wdelta.diff(base, target, delta))
        _row("diff", seconds, moved[0], total)
        live = {n: t.clone() for n, t in base.items()}
        with _counting() as moved:
            seconds, _ = _timed(torch, args.device, lambda: wdelta.apply_inplace(live, delta))
        _row("apply", seconds, moved[0], total)
        same = all(torch.equal(live[n].view(-1).view(torch.uint8),
                               target[n].view(-1).view(torch.uint8)) for n in target)  # fmt: skip
    print(f"{found:,} changed elements found; apply rebuilt the target: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    np.seterr(all="raise")
    raise SystemExit(main())
