"""Inline blobs (feature ``inline-blobs``, SPEC §4.12): what the encoder puts in the header,
how readers take it, and every way a crafted inline member is refused."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wdelta
from kit import RawTensor, leftovers, random_words, safetensors_bytes
from test_cli import assert_error, run
from wdelta.format import header as header_module
from wdelta.format import inline_blobs, schemas
from wdelta.format.container import pack_prefix
from wdelta.limits import MAX_INLINE_BYTES

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _pair(tmp_path: Path, sizes: dict[str, int]) -> tuple[Path, Path]:
    """F32 tensors of the given element counts, every word replaced by a random one:
    each is one dense (or full) chunk of 4 bytes per element that zstd cannot shrink."""
    base = {n: RawTensor("F32", (k,), random_words(np.random.default_rng(k), 4, k).tobytes())
            for n, k in sizes.items()}  # fmt: skip
    rng = np.random.default_rng(99)
    target = {n: RawTensor("F32", t.shape, (np.frombuffer(t.data, "<u4") ^ rng.integers(
        1, 1 << 32, t.shape[0], dtype=np.uint32)).tobytes()) for n, t in base.items()}  # fmt: skip
    b, t = tmp_path / "base.safetensors", tmp_path / "target.safetensors"
    b.write_bytes(safetensors_bytes(base))
    t.write_bytes(safetensors_bytes(target))
    return b, t


def _parts(delta: Path) -> tuple[bytes, dict[str, Any], bytes]:
    data = delta.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 16)
    return data[:64], json.loads(data[64 : 64 + n]), data[64 + n :]


def _rewrite(delta: Path, doc: dict[str, Any], data: bytes) -> None:
    """``delta`` with header ``doc``: a crafted file whose header digest is right."""
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    delta.write_bytes(pack_prefix(text, len(data)) + text + data)


def test_blobs_of_at_most_128_bytes_go_in_the_header(tmp_path: Path) -> None:
    base, target = _pair(tmp_path, {"a32": 32, "b33": 33, "c4": 4})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    _, doc, data = _parts(delta)
    assert doc["required_features"] == ["inline-blobs", "compact-header"]
    chunks = {e["n"]: e["c"][0] for e in doc["tensors"]}
    assert set(chunks["a32"]) >= {"i"} and not {"l", "h"} & set(chunks["a32"])
    assert len(base64.urlsafe_b64decode(chunks["a32"]["i"] + "=" * 3)[:128]) == 128
    assert "i" not in chunks["b33"] and chunks["b33"]["l"] == 132 == len(data)
    assert "i" in chunks["c4"]
    with wdelta.open_delta(delta) as d:
        stored = {t.name: t.chunks[0] for t in d.header.tensors}
        assert stored["a32"].inline is not None and len(stored["a32"].inline) == 128
        assert stored["b33"].inline is None and d.data_length == 132
    out = tmp_path / "out.safetensors"
    wdelta.apply(base, delta, out)
    assert out.read_bytes() == target.read_bytes()
    wdelta.apply(target, delta, out, reverse=True, overwrite=True)
    assert out.read_bytes() == base.read_bytes()


def test_compat_files_keep_every_blob_in_the_data_section(tmp_path: Path) -> None:
    base, target = _pair(tmp_path, {"a": 4, "b": 40})
    _, doc, data = _parts(wdelta.diff(base, target, tmp_path / "d.wdelta", compact=False))
    assert doc["required_features"] == []
    assert all("inline" not in c and "checksum" in c for e in doc["tensors"] for c in e["chunks"])
    assert len(data) == 4 * 4 + 40 * 4


def test_every_blob_inline_leaves_an_empty_data_section(tmp_path: Path) -> None:
    base, target = _pair(tmp_path, {"a": 4, "b": 8})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    prefix, _, data = _parts(delta)
    assert data == b"" and struct.unpack_from("<Q", prefix, 56) == (0,)
    wdelta.verify(delta)
    changes = list(wdelta.changes(delta))  # the engine-facing stream reads them too
    assert [(c.name, c.count, len(c.values)) for c in changes] == [("a", 4, 4), ("b", 8, 8)]


def test_a_flipped_inline_byte_is_a_header_digest_mismatch(tmp_path: Path) -> None:
    """The header digest covers inline blobs: one line naming the file, no output."""
    base, target = _pair(tmp_path, {"a": 8})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    raw = bytearray(delta.read_bytes())
    at = raw.index(b'"i":"') + 8
    raw[at] = ord("B") if raw[at] != ord("B") else ord("C")
    delta.write_bytes(bytes(raw))
    out = tmp_path / "out.safetensors"
    result = run("apply", base, delta, "-o", out)
    assert_error(result, "checksum-mismatch")
    assert "header digest" in result.stderr and str(delta) in result.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_crafted_inline_bytes_are_caught_by_the_output_digest(tmp_path: Path) -> None:
    """A header re-signed around other inline bytes: the dense payload still decodes, to
    the wrong words; file and in-place apply refuse it and change nothing."""
    base, target = _pair(tmp_path, {"a": 8})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    _, doc, data = _parts(delta)
    chunk = doc["tensors"][0]["c"][0]
    blob = bytearray(base64.urlsafe_b64decode(chunk["i"] + "=" * (-len(chunk["i"]) % 4)))
    blob[3] ^= 0x10
    chunk["i"] = inline_blobs.encode(bytes(blob))
    _rewrite(delta, doc, data)
    out = tmp_path / "out.safetensors"
    assert_error(run("apply", base, delta, "-o", out), "checksum-mismatch")
    assert not out.exists() and leftovers(tmp_path) == []
    live = {"a": np.frombuffer(base.read_bytes()[-32:], "<f4").copy()}
    before = live["a"].tobytes()
    with pytest.raises(wdelta.ChecksumMismatchError):
        wdelta.apply_inplace(live, delta)
    assert live["a"].tobytes() == before


@pytest.mark.parametrize(
    ("edit", "category"),
    [
        (lambda c: c.update(l=8), "header-invalid"),  # I1: i with l
        (lambda c: c.update(h="A" * 43), "header-invalid"),  # I1: i with h
        (lambda c: c.update(i=c["i"] + "=="), "header-invalid"),  # padded
        (lambda c: c.update(i=c["i"][:-1]), "header-invalid"),  # a length of 1 mod 4 (41)
        (lambda c: c.update(i="A" * 260), "header-invalid"),  # 195 bytes: over the cap
        (lambda c: c.update(i=c["i"][:-2]), "header-invalid"),  # 30 bytes, codec none r 32 (K9)
    ],
)
def test_crafted_inline_members_are_refused(tmp_path: Path, edit: Any, category: str) -> None:
    base, target = _pair(tmp_path, {"a": 8})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    _, doc, data = _parts(delta)
    assert len(doc["tensors"][0]["c"][0]["i"]) == 43  # 32 bytes
    edit(doc["tensors"][0]["c"][0])
    _rewrite(delta, doc, data)
    assert_error(run("verify", delta), category)
    assert_error(run("apply", base, delta, "-o", tmp_path / "out.safetensors"), category)
    assert leftovers(tmp_path) == []


def test_without_the_feature_inline_is_ignored_and_the_blob_members_are_missing(
    tmp_path: Path,
) -> None:
    base, target = _pair(tmp_path, {"a": 8})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    _, doc, data = _parts(delta)
    doc["required_features"].remove("inline-blobs")
    _rewrite(delta, doc, data)
    with pytest.raises(wdelta.HeaderInvalidError, match="lacks checksum, length"):
        wdelta.verify(delta)


def test_a_reader_without_the_feature_refuses_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, target = _pair(tmp_path, {"a": 8})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    monkeypatch.setattr(header_module, "KNOWN_FEATURES", frozenset({"compact-header"}))
    with pytest.raises(wdelta.UnsupportedFeatureError, match="inline-blobs"):
        wdelta.verify(delta)


@given(st.binary(min_size=1, max_size=MAX_INLINE_BYTES))
def test_every_blob_has_one_spelling_that_the_schema_accepts(blob: bytes) -> None:
    text = inline_blobs.encode(blob)
    checker = schemas.compiled_checker("delta-header", "compact_chunk")
    assert checker.errors({"e": "dense", "k": 1, "i": text}) is None
    assert inline_blobs.decode(text) == blob and inline_blobs.length(text) == len(blob)


@given(st.text(alphabet=ALPHABET + "=+/", min_size=0, max_size=300))
def test_the_schema_accepts_exactly_the_canonical_texts(text: str) -> None:
    """Accepted iff the text is the encoding of the bytes it decodes to, 1 to 192 bytes."""
    checker = schemas.compiled_checker("delta-header", "chunk")
    accepted = checker.errors({"encoding": "dense", "changed": 1, "inline": text}) is None
    canonical = False
    if text and len(text) % 4 != 1 and all(ch in ALPHABET for ch in text):
        blob = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        canonical = inline_blobs.encode(blob) == text and 1 <= len(blob) <= 192
    assert accepted == canonical


def test_the_header_digest_covers_inline_blobs(tmp_path: Path) -> None:
    """The prefix's BLAKE3 is over the header text, inline blobs included (§9.2)."""
    base, target = _pair(tmp_path, {"a": 8})
    prefix, _, _ = _parts(wdelta.diff(base, target, tmp_path / "d.wdelta"))
    (n,) = struct.unpack_from("<Q", prefix, 16)
    header = (tmp_path / "d.wdelta").read_bytes()[64 : 64 + n]
    assert b'"i":"' in header and blake3.blake3(header).digest() == prefix[24:56]


def test_verify_progress_counts_the_data_section_only(tmp_path: Path) -> None:
    """verify's progress total is D (the CLI bar's): inline blobs add nothing to it."""
    base, target = _pair(tmp_path, {"a": 8, "b": 40})
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    seen: list[int] = []
    wdelta.verify(delta, progress=seen.append)
    with wdelta.open_delta(delta) as d:
        assert any(c.inline for t in d.header.tensors for c in t.chunks)
        assert sum(seen) == d.data_length == 160
