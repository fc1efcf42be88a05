"""The worked examples of SPEC.md, byte for byte.

Each example is checked twice where possible: against the reference library
and against the suite's independent reading of the spec (kit.ref_*), so that
a drift between SPEC.md, the library and the tests shows up here first.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import wdelta
from kit import checkpoint_digest, ref_planes, ref_sparse, ref_transform, tensor_digest
from wdelta.codec import planes, sparse, transform
from wdelta.format.digest import TensorIdentity
from wdelta.format.digest import checkpoint_digest as library_digest
from wdelta.policy import rice


@pytest.mark.parametrize(
    ("b", "t", "xor_v", "sub_v"),
    [
        (0x3F80, 0x3F81, 0x0001, 0x0002),
        (0x3F80, 0x3F7F, 0x00FF, 0x0001),
        (0x3F80, 0xBF80, 0x8000, 0xFFFF),
    ],
)
def test_transform_table_6_3(b: int, t: int, xor_v: int, sub_v: int) -> None:
    assert ref_transform("xor", b, t, 16) == xor_v
    assert ref_transform("sub", b, t, 16) == sub_v
    base, target = np.array([b], np.uint16), np.array([t], np.uint16)
    assert int(transform.encode("xor", base, target)[0]) == xor_v
    assert int(transform.encode("sub", base, target)[0]) == sub_v


def test_byte_planes_7_2() -> None:
    words = np.array([0x1234, 0xABCD, 0x00FF], np.uint16)
    expected = bytes.fromhex("34CDFF12AB00")
    assert planes.split(words) == expected == ref_planes([int(w) for w in words], 2)


def test_rice_example_7_7() -> None:
    expected = bytes.fromhex(
        "0103000000000000" "0400000000000000" "0100000000000000" "47" "430B" "0201040300000000"
    )  # fmt: skip
    assert len(expected) == 35
    pos = np.array([3, 4, 10, 40], np.int64)
    values = np.array([2, 1, 4, 3], np.uint16)
    assert sparse.encode(pos, values, 1024, sparse.PositionPlan(sparse.RICE, 3, 0)) == expected
    assert ref_sparse([3, 4, 10, 40], [2, 1, 4, 3], 2, 1024, 1, 3) == expected
    plan = rice.plan_positions(pos, 1024)
    assert (plan.coding, plan.k) == (sparse.RICE, 3)
    # The same chunk end to end: base all 1.0 (0x3F80), four changed words.
    base = np.full(1024, 0x3F80, np.uint16)
    target = base.copy()
    target[pos] = [0x3F81, 0x3F7F, 0x3F82, 0x3F7E]
    assert transform.encode("sub", base[pos], target[pos]).tolist() == [2, 1, 4, 3]
    got_pos, got_values = sparse.decode(expected, 1024, np.dtype(np.uint16))
    assert got_pos.tolist() == [3, 4, 10, 40] and got_values.tolist() == [2, 1, 4, 3]
    bitmap_size = len(sparse.encode(pos, values, 1024, sparse.PositionPlan(sparse.BITMAP, 0, 0)))
    assert bitmap_size == 152


def test_bitmap_example_7_7() -> None:
    expected = bytes.fromhex("000000000000000003000000000000000203010203000000")
    assert len(expected) == 24
    pos = np.array([1, 8, 9], np.int64)
    values = np.array([1, 2, 3], np.uint16)
    assert sparse.encode(pos, values, 16, sparse.PositionPlan(sparse.BITMAP, 0, 0)) == expected
    assert ref_sparse([1, 8, 9], [1, 2, 3], 2, 16, 0, 0) == expected


def test_checkpoint_digest_example_9_4() -> None:
    bias = bytes.fromhex("803F00C0")
    w = bytes.fromhex("0000003F00000080")
    assert tensor_digest(bias) == "72d68fd4b9ce550da040b90d45be51936afd1eeb26921aa9edc0441dabde791e"
    assert tensor_digest(w) == "c4c55ce47745f22a98921a36c5c7a7f343644374430845cdb3084632692f33ed"
    expected = "94cf8a74213b43a5f146a10d09473e43ef2e9e659c9382167f3ab420ba01cb73"
    # Entry order must not matter.
    entries = [("w", "F32", (2, 1), tensor_digest(w)), ("bias", "BF16", (2,), tensor_digest(bias))]
    assert checkpoint_digest(entries) == expected
    assert library_digest(TensorIdentity(*e) for e in entries) == expected


def test_empty_tensor_digest_9_3() -> None:
    assert tensor_digest(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


def test_appendix_a_example_file(tmp_path: Path) -> None:
    delta = wdelta.diff(
        {"w": np.array([1, 2, 3, 4], np.float32), "old": np.array([7], np.int8)},
        {"w": np.array([1, 2, -3, 4], np.float32), "new": np.array([0.5], np.float16)},
        tmp_path / "ex.wdelta",
        chunk_elements=2,
        compact=False,
    )
    data = delta.read_bytes()
    assert len(data) == 1843
    prefix = bytes.fromhex(
        "89 57 44 45 4c 54 41 0a 01 00 00 00 00 00 00 00 e8 06 00 00 00 00 00 00"
        " 9a 5d df 3e 00 27 17 8b 5e de 15 56 31 bc a3 b2 19 e3 a1 a7 c9 fa 13 07"
        " 1d e7 a5 d2 14 4c 83 f3 0b 00 00 00 00 00 00 00"
    )
    assert data[:64] == prefix
    n, d = struct.unpack_from("<Q", data, 16)[0], struct.unpack_from("<Q", data, 56)[0]
    assert (n, d) == (1768, 11)
    header = json.loads(data[64 : 64 + n])
    assert header["base"]["digest"] == (
        "34cdd0bc825af5f1fe48e4aa0d63403f87b2ac7d05ce8b21c3b6e3f07973b259"
    )
    assert header["target"]["digest"] == (
        "a08cf02cf929b2ffe85811fa437619d2eab7ef30077f175976da8cb3e62096ea"
    )
    assert [(t["name"], t["op"]) for t in header["tensors"]] == [
        ("new", "added"), ("old", "removed"), ("w", "modified"),
    ]  # fmt: skip
    assert data[64 + n :] == bytes.fromhex("0038070000000000008000")
    out = tmp_path / "target.safetensors"
    wdelta.apply(
        {"w": np.array([1, 2, 3, 4], np.float32), "old": np.array([7], np.int8)}, delta, out
    )
    rebuilt = out.read_bytes()
    assert rebuilt[:8] == struct.pack("<Q", 112)
    assert rebuilt[120:] == bytes.fromhex("0000803F00000040000040C0000080400038")


def _appendix_a_compact_header() -> str:
    """The compact header printed at the end of SPEC Appendix A (line breaks removed)."""
    text = (Path(__file__).resolve().parents[1] / "SPEC.md").read_text(encoding="utf-8")
    appendix = text.split("## Appendix A")[1]
    block = appendix.split("Without `compact=False`")[1].split("```")[1]
    return "".join(block.split())


def test_appendix_a_compact_form(tmp_path: Path) -> None:
    base = {"w": np.array([1, 2, 3, 4], np.float32), "old": np.array([7], np.int8)}
    target = {"w": np.array([1, 2, -3, 4], np.float32), "new": np.array([0.5], np.float16)}
    delta = wdelta.diff(base, target, tmp_path / "ex.wdelta", chunk_elements=2)
    data = delta.read_bytes()
    n, d = struct.unpack_from("<Q", data, 16)[0], struct.unpack_from("<Q", data, 56)[0]
    assert (len(data), n, d) == (1024, 960, 0)
    assert data[64 : 64 + n].decode() == _appendix_a_compact_header()
    v1 = wdelta.diff(base, target, tmp_path / "v1.wdelta", chunk_elements=2, compact=False)
    placement = ("offset", "length", "checksum", "inline")
    with wdelta.open_delta(delta) as c, wdelta.open_delta(v1) as f:
        assert (c.header.raw["base"], c.header.raw["target"]) == (
            f.header.raw["base"], f.header.raw["target"],
        )  # fmt: skip
        compact_chunks = [ch for t in c.header.tensors for ch in t.chunks]
        v1_chunks = [ch for t in f.header.tensors for ch in t.chunks]
        # The v1 form's data section holds, blob by blob, the compact form's inline bytes.
        inline = b"".join(ch.inline or b"" for ch in compact_chunks)
        assert inline == v1.read_bytes()[-11:] == bytes.fromhex("0038070000000000008000")
        pairs = zip(c.header_json()["tensors"], f.header_json()["tensors"], strict=True)
        for a, b in pairs:
            strip = [{k: v for k, v in ch.items() if k not in placement}
                     for ch in a.get("chunks", [])]  # fmt: skip
            assert strip == [{k: v for k, v in ch.items() if k not in placement}
                             for ch in b.get("chunks", [])]  # fmt: skip
    assert len(compact_chunks) == len(v1_chunks) == 4
