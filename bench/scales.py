"""fp8 block-scale tensors: what each encoder choice SPEC allows would store, against the bound.

    python bench/scales.py BASE.safetensors TARGET.safetensors

For every ``*_scale_inv`` tensor of the pair (F32, 99-100% of elements change
each step) this encodes the one chunk each way the format allows (dense byte
planes or the encoder's own choice, xor or sub values, zstd level 3, 19 or
22, stored raw when that is smaller) and prints total stored bytes next to the
encoder's current choice, the zeroth-order bound (bench/bound.py, per chunk)
and the entropy of the values' byte planes pooled over all scale tensors.  Blob
sizes only: each chunk also costs its header entry.
"""

from __future__ import annotations

import sys
from pathlib import Path

import bound
import numpy as np
import peers
import zstandard

from wdelta.codec import planes, transform
from wdelta.policy import chunk as chunk_policy
from wdelta.policy import transform as transform_policy


def _dense(kind: str, b: peers.Array, t: peers.Array, level: int) -> int:
    raw = planes.split(transform.encode(kind, b, t))
    packed = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)
    return min(len(packed), len(raw))


def pooled_plane_bytes(loaded: peers.Loaded) -> float:
    """Zeroth-order entropy of the sub values' byte planes, all scale tensors as one stream.

    What a byte-plane coder with one table per plane for the whole file could
    reach; the per-chunk bound fits a table to each 16-48 values, so it sits
    near log2(elements) bits per element whatever the values are.
    """
    values = [transform.encode("sub", b, t) for name, (_, b, t) in loaded.tensors.items()
              if name.endswith("_scale_inv")]  # fmt: skip
    if not values:
        return 0.0
    words = np.concatenate(values)
    return transform_policy.value_bits(words) * len(words) / 8


def sizes(loaded: peers.Loaded) -> dict[str, float]:
    """Total bytes of the scale tensors' blobs per choice, the bounds and the element count."""
    out: dict[str, float] = {"pooled byte-plane entropy": pooled_plane_bytes(loaded)}
    for name, (_, b, t) in loaded.tensors.items():
        if not name.endswith("_scale_inv"):
            continue
        chosen = chunk_policy.encode_modified(b.copy(), t.copy(), None, False)
        choices = {
            "encoder's choice": chosen.fields["length"],
            "information bound": bound.chunk_bound(b, t).bytes,
            "elements": len(b),
            "raw F32 words": b.nbytes,
        }
        for kind in ("xor", "sub"):
            for level in (3, 19, 22):
                choices[f"dense {kind}, zstd {level}"] = _dense(kind, b, t, level)
        for key, value in choices.items():
            out[key] = out.get(key, 0) + value
    return out


def main(argv: list[str]) -> int:
    found = sizes(peers.load(Path(argv[0]), Path(argv[1])))
    n = found.pop("elements")
    for key, value in sorted(found.items(), key=lambda kv: kv[1]):
        print(f"{key:26} {value:>9,.0f} bytes  {value / n:5.2f} per element")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
