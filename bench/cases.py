"""Benchmark inputs: synthetic base/target checkpoints, generated once and reused.

Each file gets a JSON sidecar recording what produced it (model spec, seed,
lr, a hash of ``wdelta/testing/synthetic.py``); a file is reused only when its sidecar
matches, so edits to the generator invalidate old data.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wdelta.testing import synthetic

GENERATOR_HASH = hashlib.sha256(Path(synthetic.__file__).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Case:
    """One benchmark pair; ``generate_seconds`` is 0 when reused from disk."""

    name: str
    spec: synthetic.ModelSpec
    requested_density: float
    lr: float
    achieved_density: float
    base: Path
    target: Path
    generate_seconds: float


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _cached(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    side = _sidecar(path)
    if not path.exists() or not side.exists():
        return None
    record: dict[str, Any] = json.loads(side.read_text())
    return record if record.get("key") == key else None


def _generate(
    path: Path, spec: synthetic.ModelSpec, lr: float | None, seed: int, regenerate: bool
) -> tuple[float, float]:
    """(achieved density, seconds spent) for ``path``, generating it if needed."""
    key = {"spec": asdict(spec), "seed": seed, "lr": lr, "generator": GENERATOR_HASH}
    record = None if regenerate else _cached(path, key)
    if record is not None:
        return float(record["density"]), 0.0
    start = time.perf_counter()
    report = synthetic.write_checkpoint(path, spec, lr=lr, seed=seed)
    seconds = time.perf_counter() - start
    _sidecar(path).write_text(json.dumps({"key": key, "density": report.density}))
    return report.density, seconds


def prepare(
    root: Path, name: str, spec: synthetic.ModelSpec, density: float, seed: int,
    regenerate: bool = False,
) -> Case:  # fmt: skip
    """The pair for ``spec`` at about ``density``, under ``root`` (base shared per spec)."""
    folder = root / f"{'fp8' if spec.fp8 else 'bf16'}-{spec.elements}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    lr = synthetic.calibrate_lr(spec, density, seed=seed).lr
    base, target = folder / "base.safetensors", folder / f"target-{density:g}.safetensors"
    _, base_seconds = _generate(base, spec, None, seed, regenerate)
    achieved, target_seconds = _generate(target, spec, lr, seed, regenerate)
    return Case(name, spec, density, lr, achieved, base, target, base_seconds + target_seconds)
