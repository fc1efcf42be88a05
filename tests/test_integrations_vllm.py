"""The ``wdelta`` vLLM weight-transfer backend on a real vLLM model class, on the CPU.

Needs vLLM (``pip install --no-deps vllm`` and its pure-Python dependencies,
see scripts/engines-requirements.txt); skipped without it.  Each worker is a process of
its own (vLLM's process group is global), built as vLLM builds one:
``initialize_model`` of a tiny Qwen2ForCausalLM, the backend found through
the ``vllm.general_plugins`` entry point and ``WeightTransferEngineFactory``.
After every update the served model's parameters must equal, bit for bit,
those of a model that loaded the version's whole checkpoint with
``load_weights``; a tampered link and a link of another base must be refused
with the model untouched.  At TP=1 the worker also takes an update through
vLLM's RL routes (its own router under a test client) and its HTTP weight-sync
client.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wdelta import chain
from wdelta.testing import vllm_cpu as vllmkit

HEAD = 5  # the versions the workers follow; HEAD + 1 is the one made bad
HERE = Path(__file__).parent


def published(root: Path) -> tuple[Path, Path, Path]:
    """An honest chain of HEAD + 2 versions, and two copies whose last link is bad:
    one with a byte flipped, one holding the link of another base."""
    good = root / "chain"
    publisher = chain.Publisher(chain.Chain(good))
    weights = vllmkit.first_weights()
    for step in range(HEAD + 2):
        if step:
            vllmkit.rl_step(weights, step)
        manifest = publisher.publish(weights, step=step)
    links = {k.target: k for k in manifest.links}
    last, other = links[HEAD + 1], links[HEAD]
    tampered, wrong_base = root / "tampered", root / "wrong-base"
    for copy in (tampered, wrong_base):
        shutil.copytree(good, copy)
    obj = tampered / last.key
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))
    shutil.copyfile(good / other.key, wrong_base / last.key)
    return good, tampered, wrong_base


def run_workers(tmp_path: Path, tp: int) -> None:
    pytest.importorskip("vllm")
    good, tampered, wrong_base = published(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(HERE), VLLM_TARGET_DEVICE="cpu")
    procs = []
    for rank in range(tp):
        folder = tmp_path / f"model{rank}"
        folder.mkdir()
        args = [good, tampered, wrong_base, tmp_path / "cache", folder, tp, rank,
                tmp_path / "rendezvous", HEAD]  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "vllm_worker.py"), *map(str, args)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))  # fmt: skip
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0 and f"rank {rank}: ok" in out, out[-4000:]


def test_vllm_backend_tp1(tmp_path: Path) -> None:
    run_workers(tmp_path, 1)


def test_vllm_backend_tp2(tmp_path: Path) -> None:
    run_workers(tmp_path, 2)


def test_engines_bench_smoke(tmp_path: Path) -> None:
    """bench/engines.py on the tiny model: both paths timed, bytes counted, checked."""
    pytest.importorskip("vllm")
    out = tmp_path / "bench.json"
    tiny = ["--hidden", "64", "--heads", "4", "--kv-heads", "2", "--inter", "128",
            "--vocab", "256", "--layers", "2", "--steps", "1"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(HERE.parent / "bench" / "engines.py"), *tiny, "--json", str(out),
         "--dir", str(tmp_path / "data")],
        env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "update / full" in done.stdout and "Extrapolated, not measured" in done.stdout
    (row,) = json.loads(out.read_text())["steps"]
    assert 0 < row["link_bytes"] < row["full_device_bytes"]
    assert 0 < row["update_device_bytes"] <= row["full_device_bytes"]
    assert 0 < row["patch_device_bytes"] < row["update_device_bytes"]
