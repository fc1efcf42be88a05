"""bench/device.py: a clear skip without CUDA, and the device path on CPU tensors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "device.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def test_skips_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = _run("--elements", "1000")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("skip: no CUDA device here")


def test_runs_the_device_path_on_cpu(tmp_path: Path) -> None:
    run = _run("--device", "cpu", "--elements", "300000", "--density", "0.01",
               "--dir", str(tmp_path))  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line for line in run.stdout.splitlines()[1:5]}
    assert list(rows) == ["copy", "changes", "diff", "apply"]
    assert "(200.0% of the model)" in rows["copy"]
    assert "apply rebuilt the target: True" in run.stdout
