"""A follower process for the live end-to-end test (run as a script, not collected).

    python live_follower.py ENDPOINT BUCKET PREFIX OUT_DIR CONFIG_JSON

Loads the chain's head into memory, then follows it until OUT_DIR/stop
exists.  After each version it writes OUT_DIR/v{N}.json with the weights'
checkpoint digest and the BLAKE3 of its forward pass on fixed tokens; every
reported error is appended to OUT_DIR/errors.jsonl with the weights' digest
at that moment (which must still be the previous version's).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import blake3
import boto3
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import tinyllama

from wdelta import chain
from wdelta.chain.storage.s3 import S3Storage
from wdelta.errors import WdeltaError


def forward_digest(model: torch.nn.Module, weights: dict[str, Any], tokens: torch.Tensor) -> str:
    """BLAKE3 of the logits of ``model`` run with ``weights``: the bf16 (or fp8 times its
    block scales) values widened to float32, as tinyllama computes in float32."""
    params = {}
    for name, w in weights.items():
        if name.endswith("_scale_inv"):
            continue
        scale = weights.get(name + "_scale_inv")
        if scale is not None:
            rows, cols = w.shape
            s = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
            w = w.float() * s
        params[name] = w.float()
    with torch.no_grad():
        logits = torch.func.functional_call(model, params, (tokens,))
    return str(blake3.blake3(logits.float().contiguous().numpy().tobytes()).hexdigest())


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def main() -> None:
    endpoint, bucket, prefix, out, config = sys.argv[1:6]
    cfg = json.loads(config)
    torch.set_num_threads(1)
    out_dir = Path(out)
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    node = chain.Chain(S3Storage(bucket, prefix, client=client), cache=out_dir / "cache")
    model = tinyllama.build_model(**cfg["model"]).eval()
    tokens = torch.tensor(cfg["tokens"], dtype=torch.long)
    weights, start = chain.load(node, device="cpu")
    at = start.number

    def record(v: chain.Version) -> None:
        doc = {
            "digest": chain.weights_digest(weights),
            "forward": forward_digest(model, weights, tokens),
        }
        write_json(out_dir / f"v{v.number}.json", doc)

    def report(exc: WdeltaError, failures: int) -> None:
        with (out_dir / "errors.jsonl").open("a") as f:
            f.write(json.dumps({"category": exc.category, "at": at,
                                "digest": chain.weights_digest(weights)}) + "\n")  # fmt: skip

    record(start)
    while not (out_dir / "stop").exists():
        for version in chain.follow_weights(
            node, weights, at=at, interval=0, max_polls=1, backoff=(0.05, 0.2), on_error=report,
        ):  # fmt: skip
            at = version.number
            record(version)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
