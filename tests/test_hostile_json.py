"""Hostile JSON in every reader (issue 12, findings 3 and 4).

A JSON integer of more than 4300 digits (Python's int conversion limit) must
be refused with the reader's own category, never a ``ValueError`` traceback;
headers whose parsed objects would cost far more memory than their bytes are
refused with ``limit-exceeded`` before they are built.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

import wdelta
from kit import Delta, RawTensor, safetensors_bytes, write_sharded
from test_cli import assert_error, run
from wdelta.chain.errors import ManifestInvalidError
from wdelta.chain.manifest import parse_manifest
from wdelta.container import pack_prefix

HUGE = b"7" * 5000
TENSORS = {"a": RawTensor("F32", (4,), bytes(16))}
CHANGED = {"a": RawTensor("F32", (4,), bytes(15) + b"x")}


def rewrite_header(delta: Path, out: Path, edit: dict[str, object], raw: bytes) -> Path:
    """``delta`` with ``edit`` merged into its header, the string "@@" replaced by
    ``raw`` JSON text, and a fresh header digest."""
    d = Delta.read(delta)
    d.layout()
    d.header.update(edit)
    text = d.header_bytes().rstrip(b" ").replace(b'"@@"', raw)
    header = text + b" " * (-len(text) % 8)
    data = b"".join(d.blobs)
    out.write_bytes(pack_prefix(header, len(data)) + header + data)
    return out


@pytest.fixture(scope="module")
def delta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("json")
    base, target = folder / "b.safetensors", folder / "t.safetensors"
    base.write_bytes(safetensors_bytes(TENSORS))
    target.write_bytes(safetensors_bytes(CHANGED))
    return wdelta.diff(base, target, folder / "d.wdelta")


def test_a_huge_integer_in_a_delta_header_is_header_invalid(delta: Path, tmp_path: Path) -> None:
    bad = rewrite_header(delta, tmp_path / "bad.wdelta", {"extra": "@@"}, HUGE)
    assert_error(run("inspect", bad), "header-invalid")
    with pytest.raises(wdelta.WdeltaError) as info:
        wdelta.open_delta(bad)
    assert info.value.category == "header-invalid"


def test_a_huge_integer_in_a_recorded_index_is_header_invalid(delta: Path, tmp_path: Path) -> None:
    d = Delta.read(delta)
    text = json.dumps({"metadata": {"n": "@@"}, "weight_map": {"a": "model.safetensors"}})
    index = {"path": "model.safetensors.index.json", "text": text.replace('"@@"', "7" * 5000)}
    bad = rewrite_header(delta, tmp_path / "bad.wdelta", {"target": {**d.header["target"],
                         "index": index}}, b"")  # fmt: skip
    assert_error(run("inspect", bad), "header-invalid")


def _safetensors_with_huge_shape() -> bytes:
    text = b'{"a":{"dtype":"F32","shape":[' + HUGE + b'],"data_offsets":[0,16]}}'
    return struct.pack("<Q", len(text)) + text + bytes(16)


def test_a_huge_integer_in_a_safetensors_header_is_checkpoint_invalid(
    delta: Path, tmp_path: Path
) -> None:
    base = tmp_path / "b.safetensors"
    base.write_bytes(_safetensors_with_huge_shape())
    assert_error(run("diff", base, base, "-o", tmp_path / "d.wdelta"), "checkpoint-invalid")
    assert_error(run("apply", base, delta, "-o", tmp_path / "o.safetensors"), "checkpoint-invalid")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors"]


def test_a_huge_integer_in_a_shard_index_is_checkpoint_invalid(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    write_sharded(folder, [TENSORS])
    index = folder / "model.safetensors.index.json"
    index.write_bytes(index.read_bytes().replace(b'"total_size": 16', b'"total_size": ' + HUGE))
    assert HUGE in index.read_bytes()
    assert_error(run("diff", folder, folder, "-o", tmp_path / "d.wdelta"), "checkpoint-invalid")


def test_a_huge_integer_in_a_chain_manifest_is_manifest_invalid() -> None:
    with pytest.raises(ManifestInvalidError):
        parse_manifest(b'{"format": "wdelta-chain", "revision": ' + HUGE + b"}")
