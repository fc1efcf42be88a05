"""Distributed publishing: trainer ranks of a gloo group publish one model, followers apply it.

Two trainer processes (a gloo group on loopback) train a small Llama-style
model with AdamW and publish each step's bf16 copy to a loopback S3 server,
each rank its share as one part of a multi-part link; two partial follower
processes (ranks of one node's gloo group) follow the chain into memory together, one
injected failure making both stay at their version and retry.  Every tensor each follower holds at
every version is the trainer's, bit for bit.  A rank that raises makes that
step fail on every rank (no revision), and the next step publishes; a rank
killed mid-publish leaves no revision.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")
pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from chainkit import S3Server, free_port
from wdelta import chain
from wdelta.chain.storage.s3 import S3Storage
from wdelta.chain.writing.append import check_files

RANK = Path(__file__).resolve().parent / "distributed_rank.py"
MODEL = {"dim": 128, "layers": 2, "heads": 4, "vocab": 256, "seed": 0}



def _spawn(role: str, world: int, s3: S3Server, bucket: str, prefix: str, out: Path,
           cfg: dict[str, Any]) -> list[subprocess.Popen[bytes]]:  # fmt: skip
    port = str(free_port())
    args = [s3.endpoint, bucket, prefix, str(out), json.dumps(cfg)]
    return [
        subprocess.Popen([sys.executable, str(RANK), role, str(r), str(world), port, *args],
                         stderr=subprocess.PIPE)
        for r in range(world)
    ]


def _wait(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    codes = []
    for p in procs:
        try:
            p.wait(timeout=150)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        codes.append(p.returncode)
    return codes


def _errors(procs: list[subprocess.Popen[bytes]]) -> str:
    return "\n".join(p.stderr.read().decode()[-3000:] for p in procs if p.stderr)


def _published(out: Path, rank: int, version: int) -> dict[str, str]:
    doc: dict[str, str] = json.loads((out / f"t{rank}-v{version}.json").read_text())
    return doc


def test_two_ranks_publish_two_followers_apply(s3: S3Server, tmp_path: Path) -> None:
    bucket, steps = s3.new_bucket(), 5
    cfg = {"model": MODEL, "steps": steps, "fail": 2, "follower_fail": 2, "snapshot": 4}
    trainers = _spawn("trainer", 2, s3, bucket, "runs/d", tmp_path, cfg)
    followers = _spawn("follower", 2, s3, bucket, "runs/d", tmp_path, cfg)
    assert _wait(trainers) == [0, 0], _errors(trainers)
    assert _wait(followers) == [0, 0], _errors(followers)
    c = chain.Chain(S3Storage(bucket, "runs/d", client=s3.client()))
    m = c.head()
    # Step 2 failed on rank 1, so on both: versions 0..4 hold steps 0, 1, 3, 4, 5.
    assert [v.step for v in m.versions] == [0, 1, 3, 4, 5] and m.revision == 5
    assert all(len(k.parts) == 2 for k in m.links)
    names = [[f.name for f in s.files] for s in m.snapshots]
    assert [s.version for s in m.snapshots] == [0, 3] and names[0] == names[1] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]  # fmt: skip
    check_files(chain.Chain(c.storage, cache=tmp_path / "check"), m)  # every file, every part
    for rank in (0, 1):
        error = json.loads((tmp_path / f"t{rank}-error-2.json").read_text())
        assert error["category"] == "io-error", error
    # The group yields the head each poll reached: the same versions on both ranks, the last one.
    reached = [sorted(int(p.stem.split("-v")[1]) for p in tmp_path.glob(f"f{f}-v*.json"))
               for f in (0, 1)]  # fmt: skip
    assert reached[0] == reached[1] and reached[0][-1] == len(m.versions) - 1, reached
    for version in reached[0]:
        trained = _published(tmp_path, 0, version) | _published(tmp_path, 1, version)
        held: dict[str, str] = {}
        for f in (0, 1):
            got = json.loads((tmp_path / f"f{f}-v{version}.json").read_text())
            assert not held.keys() & got.keys()
            held |= got
        assert held == trained, f"version {version}"
    for f in (0, 1):  # the injected failure on follower rank 1 failed that poll on both
        errors = [json.loads(x) for x in (tmp_path / f"f{f}-errors.jsonl").read_text().splitlines()]
        assert any("injected" in e["message"] for e in errors), errors


def test_rank_killed_mid_publish_leaves_no_revision(s3: S3Server, tmp_path: Path) -> None:
    bucket = s3.new_bucket()
    cfg = {"model": MODEL, "steps": 3, "kill": 2}
    trainers = _spawn("trainer", 2, s3, bucket, "runs/k", tmp_path, cfg)
    codes = _wait(trainers)
    assert codes == [3, 9], _errors(trainers)
    error = json.loads((tmp_path / "t0-error-2.json").read_text())
    assert error["category"] == "io-error", error
    c = chain.Chain(S3Storage(bucket, "runs/k", client=s3.client()))
    m = c.head()
    assert m.revision == 2 and [v.step for v in m.versions] == [0, 1]
    stored = {o.key for o in c.storage.list("deltas/")}
    listed = {f.key for k in m.links for f in k.files}
    assert stored > listed  # rank 1's part of step 2 is stored, referenced by no revision
