"""Fuzz targets shared by tests/test_fuzz.py (Hypothesis) and fuzz/atheris_fuzz.py.

Each target takes mutated bytes and checks the promise of SPEC.md §2.1 and
§15: the right result or a :class:`wdelta.WdeltaError` of a documented
category; never another exception, an output left after a refusal, or a
modified input.  Seeds are small valid inputs built from the spec's own
writers in kit.py.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

import wdelta
from kit import Delta, RawTensor, leftovers, safetensors_bytes, write_sharded
from wdelta.chain.errors import CHAIN_CATEGORIES
from wdelta.chain.model.manifest import parse_manifest
from wdelta.checkpoint.source import open_checkpoint
from wdelta.errors import CATEGORIES
from wdelta.format.container import pack_prefix

# The chain's categories come on top of the format's (SPEC.md §17).
DOCUMENTED = frozenset(CATEGORIES) | set(CHAIN_CATEGORIES)


def _tensors(changed: bool) -> dict[str, RawTensor]:
    rng = np.random.default_rng(5)
    sparse = rng.integers(0, 2**32, 300, dtype=np.uint32)
    dense = rng.integers(0, 256, 64, dtype=np.uint8)
    # Random new words at 150 of 600 places: a blob of ~700 bytes in the data section,
    # where the others (at most 128 bytes) are inline in the header (SPEC §4.12).
    wide = rng.integers(0, 2**32, 600, dtype=np.uint32)
    out = {"same": RawTensor("F16", (3,), bytes(range(6))), "empty": RawTensor("F32", (0,), b"")}
    if changed:
        sparse[[3, 70, 200]] ^= 0x10001
        dense ^= rng.integers(1, 256, 64, dtype=np.uint8)
        wide[rng.choice(600, 150, replace=False)] ^= rng.integers(1, 2**32, 150, dtype=np.uint32)
        out["new"] = RawTensor("BF16", (4,), bytes(8))
    else:
        out["gone"] = RawTensor("I32", (2,), bytes(range(8)))
    out["sparse"] = RawTensor("F32", (300,), sparse.tobytes())
    out["dense"] = RawTensor("U8", (64,), dense.tobytes())
    out["wide"] = RawTensor("F32", (600,), wide.tobytes())
    return out


class Seeds:
    """Valid inputs in ``folder``: a base, a target, the delta and its parts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.base = folder / "base.safetensors"
        self.base.write_bytes(safetensors_bytes(_tensors(False), {"format": "pt"}))
        target = folder / "target.safetensors"
        target.write_bytes(safetensors_bytes(_tensors(True)))
        wdelta.diff(self.base, target, folder / "d.wdelta", chunk_elements=128)
        self.delta_bytes = (folder / "d.wdelta").read_bytes()
        # The v1 header form, for edits through kit.Delta.
        wdelta.diff(self.base, target, folder / "v1.wdelta", chunk_elements=128, compact=False)
        self.v1_bytes = (folder / "v1.wdelta").read_bytes()
        (n,) = struct.unpack_from("<Q", self.delta_bytes, 16)
        self.header = json.loads(self.delta_bytes[64 : 64 + n])
        self.safetensors = self.base.read_bytes()
        shards = folder / "shards"
        write_sharded(
            shards, [{"a": RawTensor("U8", (2,), b"ab")}, {"b": RawTensor("U8", (1,), b"c")}]
        )
        self.shards = shards
        self.index = (shards / "model.safetensors.index.json").read_bytes()
        self.manifest = _manifest_bytes()


def _manifest_bytes() -> bytes:
    digest = "ab" * 32
    version = {"number": 0, "digest": digest, "time": "2026-01-01T00:00:00Z"}
    doc = {
        "format": "wdelta-chain", "version": 1, "required_features": [], "revision": 1,
        "parent": None, "created": "2026-01-01T00:00:00Z", "versions": [version],
        "snapshots": [{"version": 0, "files": [{"name": "model.safetensors", "size": 8,
                                                "digest": digest}]}],
        "links": [],
    }  # fmt: skip
    return json.dumps(doc).encode()


def with_header(delta: bytes, header: dict[str, Any] | bytes) -> bytes:
    """``delta`` with its header replaced (fresh header digest, same data section)."""
    n = struct.unpack_from("<Q", delta, 16)[0]
    data = delta[64 + n :]
    text = header if isinstance(header, bytes) else json.dumps(header, ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return pack_prefix(text, len(data)) + text + data


def _refusal(exc: BaseException) -> None:
    assert isinstance(exc, wdelta.WdeltaError), f"{type(exc).__name__}: {exc}"
    assert exc.category in DOCUMENTED, exc.category


def check_delta(seeds: Seeds, data: bytes, work: Path) -> None:
    """inspect, verify and apply a mutated delta; apply's output is all or nothing."""
    delta = work / "m.wdelta"
    delta.write_bytes(data)
    base_before = seeds.base.read_bytes()
    out = work / "out.safetensors"
    try:
        with wdelta.open_delta(delta) as d:
            wdelta.summarize(d)
        wdelta.verify(delta)
        wdelta.apply(seeds.base, delta, out, threads=1)
    except Exception as exc:
        _refusal(exc)
        assert not out.exists()
    else:
        # apply checked every output tensor against the header's target digests.
        assert out.is_file()
        out.unlink()
    assert delta.read_bytes() == data
    assert seeds.base.read_bytes() == base_before
    assert leftovers(work) == []
    delta.unlink()


def check_safetensors(data: bytes, work: Path) -> None:
    path = work / "m.safetensors"
    path.write_bytes(data)
    try:
        with open_checkpoint(path) as ckpt:
            for t in ckpt.tensors.values():
                t.read(0, min(t.elements, 16))
    except Exception as exc:
        _refusal(exc)
    assert path.read_bytes() == data
    path.unlink()


def check_index(seeds: Seeds, data: bytes) -> None:
    index = seeds.shards / "model.safetensors.index.json"
    index.write_bytes(data)
    try:
        with open_checkpoint(seeds.shards):
            pass
    except Exception as exc:
        _refusal(exc)
    finally:
        index.write_bytes(seeds.index)


def check_manifest(data: bytes) -> None:
    try:
        parse_manifest(data)
    except Exception as exc:
        _refusal(exc)


def work_folder(root: Path) -> Path:
    folder = root / f"w{os.getpid()}"
    folder.mkdir(exist_ok=True)
    return folder


def blob_edited(seeds: Seeds, data: st.DataObject, work: Path) -> Path:
    """The seed delta with one blob's payload flipped or cut, re-stored with a fresh
    checksum (so the edit reaches the decoder), written to ``work``."""
    (work / "seed.wdelta").write_bytes(seeds.v1_bytes)
    d = Delta.read(work / "seed.wdelta")
    i = data.draw(st.integers(0, len(d.blobs) - 1))
    payload = bytearray(d.payload(i))
    if payload and data.draw(st.booleans()):
        payload[data.draw(st.integers(0, len(payload) - 1))] ^= data.draw(st.integers(1, 255))
    else:
        payload = payload[: data.draw(st.integers(0, len(payload)))]
    d.set_payload(i, bytes(payload), data.draw(st.sampled_from(["none", "zstd"])))
    return d.write(work / "edited.wdelta")
