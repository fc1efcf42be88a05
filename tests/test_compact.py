"""The compact header form (SPEC §4.11): what the writer records, and both forms read alike.

The reader's rules for the compact form are checked by the conformance
vectors (``*/compact/*``, ``*/invalid/compact-*``) and the broken
implementations of tests/test_conformance.py; here, the reference writer's
choices (canonical, same_as_base, verbatim; the v1 fallback) and the CLI.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from kit import RawTensor, safetensors_bytes, write_sharded
from test_cli import assert_error, assert_ok, run
from wdelta.format import header as header_module
from wdelta.format import inline_blobs, jsoncost

BASE = {"w": RawTensor("F32", (6,), np.arange(6, dtype="<f4").tobytes()),
        "b": RawTensor("I8", (3,), b"\x01\x02\x03")}  # fmt: skip
TARGET = {"w": RawTensor("F32", (6,), np.arange(1, 7, dtype="<f4").tobytes()),
          "b": RawTensor("I8", (3,), b"\x01\x02\x04")}  # fmt: skip


def _header(delta: Path) -> dict[str, Any]:
    data = delta.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 16)
    doc: dict[str, Any] = json.loads(data[64 : 64 + n])
    return doc


def _canonical(tensors: dict[str, RawTensor], metadata: dict[str, str] | None) -> bytes:
    """The file the safetensors serializer writes (the canonical header of §4.11)."""
    from wdelta.checkpoint.safetensors_header import build_header
    from wdelta.format.dtypes import DTYPES

    layout = build_header([(n, DTYPES[t.dtype], t.shape) for n, t in tensors.items()], metadata)
    header = layout.header_text.encode()
    data = bytearray(layout.data_length)
    for t in layout.tensors:
        data[t.begin : t.end] = tensors[t.name].data
    return struct.pack("<Q", len(header)) + header + bytes(data)


def _pair(tmp_path: Path, base: bytes, target: bytes) -> tuple[Path, Path]:
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    b.write_bytes(base)
    t.write_bytes(target)
    return b, t


def _round_trip(base: Path, target: Path, delta: Path, out: Path) -> None:
    wdelta.apply(base, delta, out)
    assert out.read_bytes() == target.read_bytes()
    wdelta.apply(target, delta, out, reverse=True, overwrite=True)
    assert out.read_bytes() == base.read_bytes()


def test_canonical_files_are_recorded_as_canonical_with_their_metadata(tmp_path: Path) -> None:
    meta = {"format": "pt", "note": 'caf\u00e9 "q"\n'}
    base, target = _pair(tmp_path, _canonical(BASE, meta), _canonical(TARGET, None))
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    doc = _header(delta)
    # Blobs of a few bytes go in the header (feature inline-blobs, SPEC §4.12).
    assert doc["required_features"] == ["inline-blobs", "compact-header"]
    assert all("i" in c and "h" not in c for e in doc["tensors"] for c in e["c"])
    assert doc["base"]["files"] == [{"path": "b.safetensors", "canonical": True, "metadata": meta}]
    assert doc["target"]["files"] == [{"path": "t.safetensors", "canonical": True}]
    assert all("offset" not in c and c.get("z") != "zstd" for e in doc["tensors"] for c in e["c"])
    _round_trip(base, target, delta, tmp_path / "out.safetensors")


def test_equal_non_canonical_headers_are_same_as_base(tmp_path: Path) -> None:
    base, target = _pair(tmp_path, safetensors_bytes(BASE, indent=1),
                         safetensors_bytes(TARGET, indent=1))  # fmt: skip
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    doc = _header(delta)
    assert "header" in doc["base"]["files"][0]
    assert doc["target"]["files"] == [{"path": "t.safetensors", "same_as_base": "b.safetensors"}]
    _round_trip(base, target, delta, tmp_path / "out.safetensors")


def test_different_non_canonical_headers_are_stored_verbatim(tmp_path: Path) -> None:
    base, target = _pair(tmp_path, safetensors_bytes(BASE, indent=1),
                         safetensors_bytes(TARGET, indent=2))  # fmt: skip
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    doc = _header(delta)
    assert doc["target"]["files"][0]["header"] != doc["base"]["files"][0]["header"]
    _round_trip(base, target, delta, tmp_path / "out.safetensors")


def test_an_equal_index_is_same_as_base(tmp_path: Path) -> None:
    write_sharded(tmp_path / "b", [{"w": BASE["w"]}, {"b": BASE["b"]}])
    write_sharded(tmp_path / "t", [{"w": TARGET["w"]}, {"b": TARGET["b"]}])
    delta = wdelta.diff(tmp_path / "b", tmp_path / "t", tmp_path / "d.wdelta")
    target = _header(delta)["target"]
    assert target["index"] == {"path": "model.safetensors.index.json", "same_as_base": True}
    wdelta.apply(tmp_path / "b", delta, tmp_path / "out")
    for f in (tmp_path / "t").iterdir():
        assert (tmp_path / "out" / f.name).read_bytes() == f.read_bytes()


def test_both_forms_expand_to_the_same_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compact form alone (no inline blobs, which --compat files do not have)."""
    monkeypatch.setattr(inline_blobs, "WRITE_MAX_BYTES", 0)
    base, target = _pair(tmp_path, safetensors_bytes(BASE, indent=1), _canonical(TARGET, None))
    small = wdelta.diff(base, target, tmp_path / "c.wdelta")
    v1 = wdelta.diff(base, target, tmp_path / "v1.wdelta", compact=False)
    assert _header(v1)["required_features"] == []
    assert v1.stat().st_size > small.stat().st_size
    with wdelta.open_delta(small) as c, wdelta.open_delta(v1) as f:
        assert (c.header.compact, f.header.compact) == (True, False)
        assert c.header.tensors == f.header.tensors
        assert {k: v for k, v in c.header_json().items() if k != "required_features"} == {
            k: v for k, v in f.header_json().items() if k != "required_features"
        }
        assert "tensors" not in c.header.raw  # kept once, as c.header.tensors


def test_cli_compat_writes_the_v1_form_and_inspect_shows_both_alike(tmp_path: Path) -> None:
    base, target = _pair(tmp_path, _canonical(BASE, None), _canonical(TARGET, None))
    for name, extra in (("c.wdelta", []), ("v1.wdelta", ["--compat"])):
        assert_ok(run("diff", base, target, "-o", tmp_path / name, "-q", *extra))
    assert _header(tmp_path / "c.wdelta")["required_features"] == ["inline-blobs",
                                                                   "compact-header"]
    assert _header(tmp_path / "v1.wdelta")["required_features"] == []
    views = []
    for name in ("c.wdelta", "v1.wdelta"):
        result = run("inspect", "--json", tmp_path / name)
        assert_ok(result)
        view = json.loads(result.stdout)
        view.pop("file_bytes", None)
        view.pop("ratio", None)
        view.pop("required_features", None)
        views.append(view)
    assert views[0] == views[1]


def test_a_reader_without_the_feature_refuses_a_compact_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, target = _pair(tmp_path, _canonical(BASE, None), _canonical(TARGET, None))
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    monkeypatch.setattr(header_module, "KNOWN_FEATURES", frozenset())
    with pytest.raises(wdelta.UnsupportedFeatureError, match="compact-header"):
        wdelta.verify(delta)


def test_a_compact_header_over_the_parse_budget_is_written_in_the_v1_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchanged chunks (24 bytes each compact, 37 in v1) cost more parse memory per byte
    than the budget of §13 when they fill a header; the writer then keeps the v1 form."""
    words = np.zeros(3000, dtype="<u2")
    changed = words.copy()
    changed[7] = 1
    base = {"m": RawTensor("BF16", (3000,), words.tobytes())}
    target = {"m": RawTensor("BF16", (3000,), changed.tobytes())}
    b, t = _pair(tmp_path, _canonical(base, None), _canonical(target, None))
    assert _header(wdelta.diff(b, t, tmp_path / "c.wdelta", chunk_elements=1))[
        "required_features"] == ["inline-blobs", "compact-header"]  # fmt: skip
    monkeypatch.setattr(jsoncost, "JSON_FIXED_BYTES", 1 << 16)  # 64 KiB: ~10 bytes per header byte
    delta = wdelta.diff(b, t, tmp_path / "v1.wdelta", chunk_elements=1)
    # The v1 form, with its one tiny blob still inline (§4.12 applies to both forms).
    doc = _header(delta)
    assert doc["required_features"] == ["inline-blobs"]
    # its 2 bytes: the dense XOR 0x0001 of the changed word, byte plane by byte plane
    assert [c["inline"] for c in doc["tensors"][0]["chunks"] if "inline" in c] == ["AQA"]
    wdelta.verify(delta)  # and the reader, under the same budget, reads it


def test_cli_verify_names_a_compact_rule(tmp_path: Path) -> None:
    """C3 through the CLI: a base file that says same_as_base."""
    from wdelta.format.container import pack_prefix

    base, target = _pair(tmp_path, _canonical(BASE, None), _canonical(TARGET, None))
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    data = delta.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 16)
    doc = json.loads(data[64 : 64 + n])
    doc["base"]["files"] = [{"path": "b.safetensors", "same_as_base": "b.safetensors"}]
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    body = data[64 + n :]
    bad = tmp_path / "bad.wdelta"
    bad.write_bytes(pack_prefix(text, len(body)) + text + body)
    assert_error(run("verify", bad), "header-invalid")
