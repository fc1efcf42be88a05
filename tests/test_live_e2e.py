"""End to end: a real training loop publishes to S3, follower processes keep models in memory.

A small Llama-style model (bench/tinyllama.py, HF tensor names, 3.5 M
parameters) trains with AdamW on the standard library's sources; after every
step its bf16 copy and its fp8 E4M3 copy (128x128 F32 block scales) are
published to two chains on a loopback S3 server.  Three follower processes
(two on bf16, one on fp8) follow into memory.  After every version each
follower's weights have the trainer's published digest and its forward pass
the trainer's bit for bit.  One follower is killed and restarted and catches
up; a delta corrupted in storage leaves every follower at the previous
version with a checksum-mismatch report, never a mix, and they move on once
storage holds the right bytes again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("boto3")
pytest.importorskip("moto.server")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import tinyllama  # noqa: E402

from chainkit import S3Server  # noqa: E402
from live_follower import forward_digest  # noqa: E402
from wdelta import chain  # noqa: E402
from wdelta.chain.storage.s3 import S3Storage  # noqa: E402

CONFIG = {
    "model": {"dim": 256, "layers": 4, "heads": 4, "vocab": 256, "seed": 0},
    "tokens": [
        list(b"def follow(chain, weights):\n    ")[:32],
        list(b"import numpy as np\nfrom pathlib ")[:32],
    ],
}
STEPS, KILL_AT, RESTART_AT, CORRUPT_AT = 7, 2, 3, 5
FOLLOWER = Path(__file__).resolve().parent / "live_follower.py"


def wait_for(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Follower:
    def __init__(self, s3: S3Server, bucket: str, kind: str, out: Path) -> None:
        self.kind, self.out = kind, out
        out.mkdir(parents=True, exist_ok=True)
        self.args = [sys.executable, str(FOLLOWER), s3.endpoint, bucket, f"runs/{kind}",
                     str(out), json.dumps(CONFIG)]  # fmt: skip
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE)

    def has(self, version: int) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(self.proc.stderr.read().decode() if self.proc.stderr else "died")
        return (self.out / f"v{version}.json").exists()

    def errors(self) -> list[dict[str, Any]]:
        path = self.out / "errors.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)


def corrupt(client: Any, bucket: str, key: str) -> bytes:
    good = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x10
    client.put_object(Bucket=bucket, Key=key, Body=bytes(bad))
    return bytes(good)


def test_training_loop_to_followers(tmp_path: Path) -> None:
    s3 = S3Server()
    followers: list[Follower] = []
    try:
        _run(s3, tmp_path, followers)
    finally:
        for f in followers:
            if f.proc.poll() is None:
                f.proc.kill()
                f.proc.wait()
        s3.stop()


def _run(s3: S3Server, tmp: Path, followers: list[Follower]) -> None:
    torch.set_num_threads(1)
    bucket, client = s3.new_bucket(), s3.client()
    model = tinyllama.build_model(**CONFIG["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = tinyllama.text_batches(seq_len=64, batch=4, seed=0)
    infer = tinyllama.build_model(**CONFIG["model"]).eval()
    tokens = torch.tensor(CONFIG["tokens"], dtype=torch.long)
    chains = {
        k: chain.Chain(S3Storage(bucket, f"runs/{k}", client=client), cache=tmp / f"t-{k}")
        for k in ("bf16", "fp8")
    }
    pubs = {k: chain.Publisher(c) for k, c in chains.items()}
    expected: dict[str, list[tuple[str, str]]] = {"bf16": [], "fp8": []}

    def publish(step: int) -> None:
        copies = {"bf16": tinyllama.bf16_copy(model), "fp8": tinyllama.fp8_copy(model)}
        for k, w in copies.items():
            m = pubs[k].publish(w, step=step)
            assert m.head.number == step and m.head.digest == chain.weights_digest(w)
            expected[k].append((m.head.digest, forward_digest(infer, w, tokens)))

    publish(0)
    kinds = (("bf16", "a"), ("bf16", "b"), ("fp8", "c"))
    a, b, c = (Follower(s3, bucket, kind, tmp / name) for kind, name in kinds)
    followers += [a, b, c]
    for n in range(1, STEPS + 1):
        tinyllama.train_step(model, opt, next(batches))
        if n == KILL_AT:
            b.signal(signal.SIGKILL)
            b.proc.wait()
        if n == RESTART_AT:
            b.start()
        if n != CORRUPT_AT:
            publish(n)
        else:
            _publish_corrupted(publish, n, followers, chains, client, bucket)
        if n == RESTART_AT:
            wait_for(lambda: b.has(RESTART_AT), "the restarted follower to catch up")
    for f in followers:
        wait_for(lambda f=f: f.has(STEPS), f"follower {f.out.name} at the head")
        (f.out / "stop").touch()
    for f in followers:
        assert f.proc.wait(timeout=60) == 0
        _check(f, expected[f.kind])


def _publish_corrupted(
    publish: Callable[[int], None], n: int, followers: list[Follower],
    chains: dict[str, chain.Chain], client: Any, bucket: str,
) -> None:  # fmt: skip
    """Publish step ``n`` with its links corrupted in storage before any follower reads them,
    wait until every follower reported it, then restore the right bytes."""
    for f in followers:
        wait_for(lambda f=f: f.has(n - 1), f"follower {f.out.name} at version {n - 1}")
        f.signal(signal.SIGSTOP)
    publish(n)
    good = {}
    for k, c in chains.items():
        key = f"runs/{k}/{c.head().links[-1].key}"
        good[key] = corrupt(client, bucket, key)
    for f in followers:
        f.signal(signal.SIGCONT)
    for f in followers:
        wait_for(lambda f=f: any(e["at"] == n - 1 for e in f.errors()), "a checksum report")
    for key, data in good.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def _check(f: Follower, expected: list[tuple[str, str]]) -> None:
    """Every version the follower recorded: the trainer's digest and forward pass;
    every error: checksum-mismatch, weights exactly at the previous version."""
    recorded = sorted(int(p.stem[1:]) for p in f.out.glob("v*.json"))
    assert recorded and recorded[-1] == STEPS
    for v in recorded:
        doc = json.loads((f.out / f"v{v}.json").read_text())
        assert (doc["digest"], doc["forward"]) == expected[v], f"{f.out.name} v{v}"
    errors = f.errors()
    assert errors and all(e["category"] == "checksum-mismatch" for e in errors)
    assert all(e["at"] == CORRUPT_AT - 1 for e in errors)
    assert all(e["digest"] == expected[CORRUPT_AT - 1][0] for e in errors)
