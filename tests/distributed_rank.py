"""One rank of the distributed publishing test (run as a script, not collected).

    python distributed_rank.py ROLE RANK WORLD PORT ENDPOINT BUCKET PREFIX OUT CONFIG_JSON

``trainer``: ranks of a gloo group train the same small Llama-style model with
AdamW (same seeds, one thread: the replicas stay bit-identical, as after a
data-parallel all-reduce) and publish its bf16 copy, each rank its share
(``share_of``), through a ``DistributedPublisher`` on a group of its own, in
the background (``submit``).  Each rank writes OUT/t{RANK}-v{N}.json: its
share's tensor digests at version N.  CONFIG's ``fail`` makes rank 1 raise at
step ``fail`` (every rank must then fail that step and publish the next);
``snapshot`` stores the version of that step as a sharded snapshot too;
``kill`` makes rank 1 exit mid-publish at step ``kill`` (after uploading its
part): the survivors record the error in OUT/t{RANK}-error.json and exit 3.

``follower``: the ranks of another gloo group (one inference node) follow the chain
into memory together (``follow_in_group``), each holding only its share of the
tensors, until the version of step CONFIG["steps"]; each writes OUT/f{RANK}-v{N}.json
with its tensors' digests at every version the group reached.  Rank 1 fails once
applying a link to version CONFIG["follower_fail"]: every rank must report the
poll (OUT/f{RANK}-errors.jsonl) and stay at its version, and retry.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import tinyllama

from wdelta import chain
from wdelta.chain.live import distributed, group_follow
from wdelta.chain.storage.s3 import S3Storage
from wdelta.errors import StorageError, WdeltaError
from wdelta.ops import tensors


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def digests(weights: dict[str, Any]) -> dict[str, str]:
    return {n: tensors.slot(n, v).digest() for n, v in weights.items()}


def open_chain(endpoint: str, bucket: str, prefix: str, cache: Path) -> chain.Chain:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    return chain.Chain(S3Storage(bucket, prefix, client=client), cache=cache)


def trainer(rank: int, world: int, c: chain.Chain, out: Path, cfg: dict[str, Any]) -> int:
    model = tinyllama.build_model(**cfg["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = tinyllama.text_batches(seq_len=32, batch=2, seed=0)
    pub = distributed.DistributedPublisher(c, group=dist.new_group(backend="gloo"))
    if rank == 1:
        _inject(pub, cfg)
    version = 0
    for step in range(cfg["steps"] + 1):
        if step:
            tinyllama.train_step(model, opt, next(batches))
        share = distributed.share_of(tinyllama.bf16_copy(model), rank, world)
        try:
            m = pub.submit(share, step=step, snapshot=step == cfg.get("snapshot")).result()
        except WdeltaError as exc:
            write_json(out / f"t{rank}-error-{step}.json", {"category": exc.category,
                                                             "message": str(exc)})  # fmt: skip
            if step == cfg.get("kill"):
                return 3
            continue
        assert m.head.number == version, (m.head.number, version)
        write_json(out / f"t{rank}-v{version}.json", digests(share))
        version += 1
    pub.close()
    return 0


def _inject(pub: distributed.DistributedPublisher, cfg: dict[str, Any]) -> None:
    """Rank 1 fails (an exception) at step ``fail`` and dies at step ``kill``."""
    upload, steps = pub._upload_part, iter(range(1, 1 << 30))

    def failing(*args: Any) -> Any:
        step = next(steps)
        if step == cfg.get("fail"):
            raise StorageError("injected upload failure")
        result = upload(*args)
        if step == cfg.get("kill"):
            os._exit(9)  # mid-publish: part stored, the others waiting for it
        return result

    pub._upload_part = failing  # type: ignore[method-assign]


def follower(rank: int, world: int, c: chain.Chain, out: Path, cfg: dict[str, Any]) -> int:
    names = sorted(tinyllama.bf16_copy(tinyllama.build_model(**cfg["model"])))
    mine = ",".join(n for i, n in enumerate(names) if i % world == rank)
    while not c.revisions():  # the trainers have not published version 0 yet
        time.sleep(0.1)
    weights, version = chain.load(c, to=0, tensors=mine)
    write_json(out / f"f{rank}-v{version.number}.json", digests(weights))
    if version.step == cfg["steps"]:
        return 0
    if rank == 1:
        _fail_once(cfg["follower_fail"])

    def report(exc: WdeltaError, failures: int) -> None:
        with open(out / f"f{rank}-errors.jsonl", "a") as f:
            f.write(json.dumps({"category": exc.category, "message": str(exc)}) + "\n")

    follow = group_follow.follow_in_group(c, weights, at=version.number, tensors=mine,
                                          interval=0.1, backoff=(0.1, 0.5), on_error=report)
    for v in follow:
        write_json(out / f"f{rank}-v{v.number}.json", digests(weights))
        if v.step == cfg["steps"]:  # the last step (a failed step has no version)
            return 0
    return 1


def _fail_once(version: int) -> None:
    """The first application of a link to ``version`` raises (after the others applied)."""
    apply, failed = group_follow.apply_link, []

    def failing(chain_: Any, m: Any, link: Any, *args: Any) -> Any:
        if link.target == version and not args[1] and not failed:
            failed.append(True)
            raise StorageError("injected download failure")
        return apply(chain_, m, link, *args)

    group_follow.apply_link = failing  # type: ignore[assignment]


def main() -> int:
    role, rank, world, port, endpoint, bucket, prefix, out, config = sys.argv[1:10]
    cfg = json.loads(config)
    torch.set_num_threads(1)
    c = open_chain(endpoint, bucket, prefix, Path(out) / f"cache-{role}-{rank}")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=int(rank), world_size=int(world),
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    run = follower if role == "follower" else trainer
    code = run(int(rank), int(world), c, Path(out), cfg)
    if code != 0:
        os._exit(code)  # a peer died: the group cannot be torn down collectively
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
