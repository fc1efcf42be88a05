"""Crafted delta files: problems that checksums would otherwise hide.

Each case edits one thing in a valid delta (a header field, a blob payload)
and re-serialises it with a fresh header digest, contiguous offsets and fresh
blob checksums, so the reader must find that exact problem and report its
category.  Payload problems must also be found by ``verify`` without a base.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from kit import (
    Delta,
    RawTensor,
    encodings_used,
    expect_refusal,
    parse_sparse,
    random_words,
    ref_sparse,
    rle_zstd_frame,
    safetensors_bytes,
    zstd_frame,
)
from wdelta.format.container import pack_prefix

# Not a multiple of 8, so that full chunks have bitmap padding bits; F32 chunks
# of this size are over 64 KiB, so that the encoder's choices below hold for any
# encoder minimising the stored size (changed values are noise).
CHUNK = 32765
CHUNK_FIELD = b'"chunk_elements":%d' % CHUNK
RICE_AT = [7, 100, 2300, 2301, 20000]


@dataclass(frozen=True)
class Case:
    base: Path
    target: Path
    delta: Path


def _noise(rng: np.random.Generator, words: Any, where: Any) -> None:
    words[where] ^= random_words(rng, words.dtype.itemsize, len(words[where])) | words.dtype.type(1)


def _tensors(changed: bool) -> dict[str, RawTensor]:
    """rice: 5 changes in chunk 0 (Rice), none in chunk 1 (unchanged); bitmap: 45%
    changed (a bitmap); dense: all changed; new (added, zeros: zstd); gone (removed)."""
    rng = np.random.default_rng(21)
    rice = random_words(rng, 4, 40000)
    bitmap = random_words(rng, 4, CHUNK)
    dense = random_words(rng, 1, 100)
    out = {"same": RawTensor("F16", (7,), bytes(range(14))), "void": RawTensor("F32", (0, 3), b"")}
    if changed:
        _noise(rng, rice, RICE_AT)
        _noise(rng, bitmap, rng.random(CHUNK) < 0.45)
        _noise(rng, dense, slice(None))
        out["new"] = RawTensor("F16", (200,), bytes(400))
    else:
        out["gone"] = RawTensor("I32", (5,), bytes(range(20)))
    out["rice"] = RawTensor("F32", (40000,), rice.tobytes())
    out["bitmap"] = RawTensor("F32", (CHUNK,), bitmap.tobytes())
    out["dense"] = RawTensor("U8", (100,), dense.tobytes())
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    folder = tmp_path_factory.mktemp("crafted")
    base, target = folder / "base.safetensors", folder / "target.safetensors"
    base.write_bytes(safetensors_bytes(_tensors(False)))
    target.write_bytes(safetensors_bytes(_tensors(True)))
    # The v1 header form, which the editor below reads (the compact form: test_compact.py).
    delta = wdelta.diff(base, target, folder / "d.wdelta", chunk_elements=CHUNK, compact=False)
    assert encodings_used(delta) == {"sparse-rice", "sparse-bitmap", "dense", "full", "unchanged"}
    return Case(base, target, delta)


def test_rewriting_an_unmodified_delta_is_byte_identical(case: Case, tmp_path: Path) -> None:
    """The editor used below changes nothing by itself."""
    again = Delta.read(case.delta).write(tmp_path / "same.wdelta")
    assert again.read_bytes() == case.delta.read_bytes()


def test_unknown_keys_everywhere_are_ignored(case: Case, tmp_path: Path) -> None:
    d = Delta.read(case.delta)
    d.header["x-future"] = {"anything": [1, 2]}
    d.header["base"]["x-note"] = "ignored"
    d.header["base"]["files"][0]["x-mtime"] = 0
    for t in d.header["tensors"]:
        t["x-comment"] = t["name"]
        for c in t.get("chunks", []):
            c["x-hint"] = None
    path = d.write(tmp_path / "extended.wdelta")
    out = tmp_path / "out.safetensors"
    wdelta.apply(case.base, path, out)
    assert out.read_bytes() == case.target.read_bytes()


# ---------------------------------------------------------------- edits

Edit = Callable[[Delta], None]


def _set(path: str, value: Any) -> Edit:
    """Set a header field by a slash path like ``tensors/0/op``."""

    def edit(d: Delta) -> None:
        node: Any = d.header
        *parents, last = path.split("/")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value

    return edit


def _tensor_field(name: str, field: str, value: Any, op: str | None = None) -> Edit:
    def edit(d: Delta) -> None:
        d.tensor(name, op)[field] = value

    return edit


def _chunk_field(name: str, field: str, value: Any, chunk: int = 0) -> Edit:
    def edit(d: Delta) -> None:
        d.tensor(name)["chunks"][chunk][field] = value

    return edit


def _del_chunk_field(name: str, field: str) -> Edit:
    def edit(d: Delta) -> None:
        del d.tensor(name)["chunks"][0][field]

    return edit


def _payload(name: str, change: Callable[[bytes], bytes], codec: str = "none") -> Edit:
    def edit(d: Delta) -> None:
        i = d.blob_index(name)
        d.set_payload(i, change(d.payload(i)), codec)

    return edit


def _sparse(name: str, size: int, m: int, change: Callable[[list[int], list[int]], Any]) -> Edit:
    """Rewrite a sparse payload from edited positions/values, same coding and k."""

    def edit(d: Delta) -> None:
        i = d.blob_index(name)
        payload = d.payload(i)
        pos, values, k = parse_sparse(payload, m, size)
        change(pos, values)
        d.set_payload(i, ref_sparse(pos, values, size, m, payload[0], k))

    return edit


def _flip_at(offset: int, mask: int = 1) -> Callable[[bytes], bytes]:
    def change(payload: bytes) -> bytes:
        out = bytearray(payload)
        out[offset % len(out)] ^= mask
        return bytes(out)

    return change


def _swap_first_two_tensors(d: Delta) -> None:
    t = d.header["tensors"]
    t[0], t[1] = t[1], t[0]


def _duplicate_tensor(d: Delta) -> None:
    same = d.tensor("same")
    d.header["tensors"].insert(d.header["tensors"].index(same), dict(same))


def _extra_chunk(d: Delta) -> None:
    d.tensor("rice")["chunks"].append({"encoding": "unchanged", "changed": 0})


def _gap_between_blobs(d: Delta) -> None:
    d.layout()
    for _, c in d.chunks()[1:]:
        c["offset"] += 1  # one unreferenced byte after the first blob
    d.blobs[0] += b"\x00"


def _swapped_offsets(d: Delta) -> None:
    d.layout()
    (_, a), (_, b) = d.chunks()[:2]
    a["offset"], b["offset"] = b["offset"], a["offset"]


def _unreferenced_tail(d: Delta) -> None:
    d.layout()
    d.blobs[-1] += b"\x00\x00"


def _codec_none_length(d: Delta) -> None:
    i = d.blob_index("bitmap")
    d.set_payload(i, d.payload(i), "none")
    d.layout()
    d.blobs[i] += b"\x00"
    d.chunks()[i][1]["length"] += 1
    for _, c in d.chunks()[i + 1 :]:
        c["offset"] += 1


def _without_tensors(d: Delta) -> None:
    d.layout()
    del d.header["tensors"]


def _unchanged_chunk_in_added(d: Delta) -> None:
    i = d.blob_index("new")
    del d.blobs[i]
    d.tensor("new")["chunks"][0] = {"encoding": "unchanged", "changed": 0}


def _drop_from_base_layout(d: Delta) -> None:
    f = d.header["base"]["files"][0]
    doc = json.loads(f["header"])
    del doc["same"]
    f["header"] = json.dumps(doc)


def _wrong_tensor_digest(side: str, name: str) -> Edit:
    def edit(d: Delta) -> None:
        d.tensor(name)[f"{side}_digest"] = "ab" * 32
        if d.tensor(name)["op"] == "unchanged":
            d.tensor(name)["base_digest"] = d.tensor(name)["target_digest"] = "ab" * 32
        d.refresh_side_digests()

    return edit


def _zstd(
    name: str, *, extra: bytes = b"", content_size: bool = True, tail: bytes = b"",
    content: bytes = b"",
) -> Edit:  # fmt: skip
    """Store chunk ``name`` as a zstd frame of its payload (first bytes replaced by
    ``content``) plus ``extra`` bytes, followed by ``tail``."""

    def edit(d: Delta) -> None:
        i = d.blob_index(name)
        payload = d.payload(i)
        payload = content + payload[len(content) :]
        d.set_payload(i, payload)
        d.chunks()[i][1]["codec"] = "zstd"
        d.blobs[i] = zstd_frame(payload + extra, content_size=content_size) + tail

    return edit


def _zstd_not_smaller(d: Delta) -> None:
    i = d.blob_index("rice")  # a small payload of noise: its frame is not shorter
    payload = d.payload(i)
    d.set_payload(i, payload)
    d.chunks()[i][1]["codec"] = "zstd"
    d.blobs[i] = zstd_frame(payload)
    assert len(d.blobs[i]) >= len(payload)


def _modified_with_only_unchanged_chunks(d: Delta) -> None:
    rice = d.tensor("rice")
    i = d.blob_index("rice")
    del d.blobs[i]
    rice["chunks"][0] = {"encoding": "unchanged", "changed": 0}


def _replace_value(index: int, value: int) -> Callable[[list[int], list[int]], None]:
    def change(pos: list[int], values: list[int]) -> None:
        values[index] = value

    return change


def _move_last_position(to: int) -> Callable[[list[int], list[int]], None]:
    def change(pos: list[int], values: list[int]) -> None:
        pos[-1] = to

    return change


def _drop_one(pos: list[int], values: list[int]) -> None:
    del pos[0], values[0]


def _rice_padding_bit(payload: bytes) -> bytes:
    """Set the last bit of the Rice remainder stream (padding for 5·k bits)."""
    (u,) = struct.unpack_from("<Q", payload, 16)
    k, c = payload[1], struct.unpack_from("<Q", payload, 8)[0]
    assert (c * k) % 8, "the case needs padding bits in the remainder stream"
    last = 24 + u + (c * k + 7) // 8 - 1
    return payload[:last] + bytes([payload[last] | 0x80]) + payload[last + 1 :]


def _bitmap_trailing_bit(payload: bytes) -> bytes:
    """Set the last padding bit of the bitmap (m = CHUNK is not a multiple of 8)."""
    last = 16 + (CHUNK + 7) // 8 - 1
    return payload[:last] + bytes([payload[last] | 0x80]) + payload[last + 1 :]


def _second_file_without_index(d: Delta) -> None:
    d.header["target"]["files"].append({"path": "other.safetensors", "header": "{}"})


def _same_file_twice(d: Delta) -> None:
    files = d.header["target"]["files"]
    files.append(dict(files[0]))
    d.header["target"]["index"] = _index(d, {})


def _index(d: Delta, weight_map: dict[str, str]) -> dict[str, str]:
    return {"path": "model.safetensors.index.json", "text": json.dumps({"weight_map": weight_map})}


def _target_index(wrong: bool) -> Edit:
    def edit(d: Delta) -> None:
        names = [t["name"] for t in d.header["tensors"] if t["op"] != "removed"]
        wmap = {n: "target.safetensors" for n in names}
        if wrong:
            wmap[names[0]] = "elsewhere.safetensors"
        d.header["target"]["index"] = _index(d, wmap)

    return edit


def _layout_tensor(side: str, info: dict[str, Any]) -> Edit:
    """Add a tensor to a side's recorded safetensors header."""

    def edit(d: Delta) -> None:
        f = d.header[side]["files"][0]
        doc = json.loads(f["header"])
        end = max(v["data_offsets"][1] for k, v in doc.items() if k != "__metadata__")
        fields = dict(info)
        nbytes = fields.pop("nbytes", 0)
        doc["extra"] = {**fields, "data_offsets": [end, end + nbytes]}
        f["header"] = json.dumps(doc)

    return edit


def _empty_tensor_digest(d: Delta) -> None:
    void = d.tensor("void")
    void["base_digest"] = void["target_digest"] = "ab" * 32
    d.refresh_side_digests()


def _handmade_zstd(**frame: Any) -> Edit:
    def edit(d: Delta) -> None:
        i = d.blob_index("new")
        assert d.payload(i) == bytes(400)
        d.set_payload(i, bytes(400))
        d.chunks()[i][1]["codec"] = "zstd"
        d.blobs[i] = rle_zstd_frame(400, 0, **frame)

    return edit


# name -> (edit, category, scope); scope "header": refused on open, "payload":
# also refused by verify without a base, "apply": only when applying.
CRAFTED: dict[str, tuple[Edit, str, str]] = {
    # header: features, versions, enumerations
    "unknown-required-feature": (
        _set("required_features", ["x-future"]),
        "unsupported-feature",
        "header",
    ),
    "header-version-2": (_set("version", 2), "unsupported-version", "header"),
    "unknown-encoding": (
        _chunk_field("rice", "encoding", "sparse2"),
        "unsupported-feature",
        "header",
    ),
    "unknown-transform": (
        _chunk_field("rice", "transform", "rot"),
        "unsupported-feature",
        "header",
    ),
    "unknown-codec": (_chunk_field("dense", "codec", "lz4"), "unsupported-feature", "header"),
    "unknown-op": (_tensor_field("same", "op", "renamed"), "unsupported-feature", "header"),
    "unknown-dtype": (_tensor_field("dense", "dtype", "U7"), "unsupported-feature", "header"),
    "sub-byte-dtype": (_tensor_field("dense", "dtype", "F4"), "unsupported-feature", "header"),
    # header: limits and schema
    "chunk-elements-over-limit": (_set("chunk_elements", 2**26 + 1), "limit-exceeded", "header"),
    "chunk-elements-huge": (_set("chunk_elements", 2**62), "limit-exceeded", "header"),
    "chunk-elements-zero": (_set("chunk_elements", 0), "header-invalid", "header"),
    "huge-shape": (_tensor_field("same", "shape", [2**40, 2**40]), "limit-exceeded", "header"),
    "negative-shape": (_tensor_field("same", "shape", [-7]), "header-invalid", "header"),
    "missing-tensors": (_without_tensors, "header-invalid", "header"),
    "digest-not-hex": (_tensor_field("same", "base_digest", "zz" * 32), "header-invalid", "header"),
    "bad-file-name": (_set("base/files/0/path", "../evil.safetensors"), "header-invalid", "header"),
    # header: semantics
    "wrong-base-digest": (_set("base/digest", "00" * 32), "header-invalid", "header"),
    "wrong-target-digest": (_set("target/digest", "11" * 32), "header-invalid", "header"),
    "reversible-flag-lies": (_set("reversible", False), "header-invalid", "header"),
    "tensors-unsorted": (_swap_first_two_tensors, "header-invalid", "header"),
    "tensor-listed-twice": (_duplicate_tensor, "header-invalid", "header"),
    "wrong-chunk-count": (_extra_chunk, "header-invalid", "header"),
    "unchanged-digests-differ": (
        _tensor_field("same", "target_digest", "cd" * 32),
        "header-invalid",
        "header",
    ),
    "added-without-digest": (
        lambda d: d.tensor("new").pop("target_digest"),
        "header-invalid",
        "header",
    ),
    "added-with-base-digest": (
        _tensor_field("new", "base_digest", "cd" * 32),
        "header-invalid",
        "header",
    ),
    "unchanged-with-chunks": (_tensor_field("same", "chunks", []), "header-invalid", "header"),
    "modified-changes-nothing": (_modified_with_only_unchanged_chunks, "header-invalid", "header"),
    "sparse-changed-zero": (_chunk_field("rice", "changed", 0), "header-invalid", "header"),
    "sparse-changed-over-m": (
        _chunk_field("bitmap", "changed", CHUNK + 1),
        "header-invalid",
        "header",
    ),
    "added-dense-chunk": (_chunk_field("new", "encoding", "dense"), "header-invalid", "header"),
    "added-changed-not-m": (_chunk_field("new", "changed", 3), "header-invalid", "header"),
    "unchanged-chunk-in-added": (_unchanged_chunk_in_added, "header-invalid", "header"),
    "sparse-missing-transform": (_del_chunk_field("rice", "transform"), "header-invalid", "header"),
    "dense-raw-length": (_chunk_field("dense", "raw_length", 99), "header-invalid", "header"),
    "sparse-raw-length-over-bound": (
        _chunk_field("rice", "raw_length", 24 + CHUNK * 9 + 1),
        "limit-exceeded",
        "header",
    ),
    "codec-none-length": (_codec_none_length, "header-invalid", "header"),
    "data-past-last-blob": (_unreferenced_tail, "header-invalid", "header"),
    "blobs-not-contiguous": (_gap_between_blobs, "header-invalid", "header"),
    "blob-offsets-swapped": (_swapped_offsets, "header-invalid", "header"),
    "layout-lacks-tensor": (_drop_from_base_layout, "header-invalid", "header"),
    "layout-not-safetensors": (_set("target/files/0/header", "{"), "header-invalid", "header"),
    "index-without-weight-map": (
        _set("target/index", {"path": "model.safetensors.index.json", "text": "{}"}),
        "header-invalid",
        "header",
    ),
    "index-not-json": (
        _set("target/index", {"path": "model.safetensors.index.json", "text": "{"}),
        "header-invalid",
        "header",
    ),
    "index-bad-path": (
        _set("target/index", {"path": "m.json", "text": "{}"}),
        "header-invalid",
        "header",
    ),
    "index-maps-wrong-file": (_target_index(wrong=True), "header-invalid", "header"),
    "two-files-no-index": (_second_file_without_index, "header-invalid", "header"),
    "same-file-twice": (_same_file_twice, "header-invalid", "header"),
    "layout-sub-byte-dtype": (
        _layout_tensor("base", {"dtype": "F4", "shape": [2], "nbytes": 1}),
        "unsupported-feature",
        "header",
    ),
    "layout-unknown-dtype": (
        _layout_tensor("base", {"dtype": "Q7", "shape": [2], "nbytes": 2}),
        "header-invalid",
        "header",
    ),
    "layout-huge-shape": (
        _layout_tensor("target", {"dtype": "U8", "shape": [2**30, 2**30]}),
        "limit-exceeded",
        "header",
    ),
    "layout-extra-tensor": (
        _layout_tensor("target", {"dtype": "U8", "shape": [1], "nbytes": 1}),
        "header-invalid",
        "header",
    ),
    "empty-tensor-digest": (_empty_tensor_digest, "header-invalid", "header"),
    # payloads (checksums recomputed)
    "rice-position-past-chunk": (
        _sparse("rice", 4, CHUNK, _move_last_position(CHUNK)),
        "index-out-of-range",
        "payload",
    ),
    "rice-position-far-past-chunk": (
        _sparse("rice", 4, CHUNK, _move_last_position(10**6)),
        "index-out-of-range",
        "payload",
    ),
    "bitmap-trailing-bit": (
        _payload("bitmap", _bitmap_trailing_bit),
        "index-out-of-range",
        "payload",
    ),
    "rice-remainder-padding": (_payload("rice", _rice_padding_bit), "encoding-invalid", "payload"),
    "sparse-count-mismatch": (_sparse("rice", 4, CHUNK, _drop_one), "encoding-invalid", "payload"),
    "sparse-reserved-byte": (_payload("rice", _flip_at(4)), "encoding-invalid", "payload"),
    "sparse-unknown-coding": (_payload("bitmap", _flip_at(0, 0x02)), "encoding-invalid", "payload"),
    "sparse-trailing-byte": (
        _payload("bitmap", lambda p: p + b"\x00"),
        "encoding-invalid",
        "payload",
    ),
    "zstd-wrong-content-size": (_zstd("new", extra=b"\x00"), "encoding-invalid", "payload"),
    "zstd-no-content-size": (_zstd("new", content_size=False), "encoding-invalid", "payload"),
    "zstd-trailing-bytes": (_zstd("new", tail=b"\x00\x00"), "encoding-invalid", "payload"),
    "zstd-two-frames": (_zstd("new", tail=zstd_frame(b"")), "encoding-invalid", "payload"),
    "zstd-not-smaller": (_zstd_not_smaller, "header-invalid", "header"),
    "zstd-dictionary": (_handmade_zstd(dict_id=9), "encoding-invalid", "payload"),
    # digests: the payload parses but decodes to other bytes
    "dense-value-changed": (_payload("dense", _flip_at(50)), "checksum-mismatch", "apply"),
    "sparse-value-changed": (
        _sparse("rice", 4, CHUNK, _replace_value(2, 0x20)),
        "checksum-mismatch",
        "apply",
    ),
    "sparse-value-zero": (
        _sparse("bitmap", 4, CHUNK, _replace_value(0, 0)),
        "checksum-mismatch",
        "apply",
    ),
    "sparse-position-moved": (
        _sparse("rice", 4, CHUNK, _move_last_position(CHUNK - 1)),
        "checksum-mismatch",
        "apply",
    ),
    "full-added-changed": (_payload("new", _flip_at(0)), "checksum-mismatch", "apply"),
    "full-added-zstd-changed": (
        _zstd("new", extra=b"", tail=b"", content=b"\x01"),
        "checksum-mismatch",
        "apply",
    ),
    "wrong-target-tensor-digest": (
        _wrong_tensor_digest("target", "dense"),
        "checksum-mismatch",
        "apply",
    ),
    "wrong-base-tensor-digest": (_wrong_tensor_digest("base", "dense"), "base-mismatch", "apply"),
    "wrong-unchanged-digest": (_wrong_tensor_digest("base", "same"), "base-mismatch", "apply"),
}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_delta_refused(case: Case, name: str, tmp_path: Path) -> None:
    edit, category, scope = CRAFTED[name]
    d = Delta.read(case.delta)
    edit(d)
    path = d.write(tmp_path / "crafted.wdelta")
    (tmp_path / "out").mkdir()
    expect_refusal(case.base, path, tmp_path / "out" / "r.safetensors", category)
    if scope in ("header", "payload"):
        with pytest.raises(wdelta.WdeltaError) as info:
            wdelta.verify(path)
        assert info.value.category == category


# ---------------------------------------------------------------- reverse direction


@pytest.mark.parametrize(
    ("edit", "category"),
    [
        (_payload("gone", _flip_at(3)), "checksum-mismatch"),
        (_payload("dense", _flip_at(7)), "checksum-mismatch"),
        (_sparse("rice", 4, CHUNK, _replace_value(0, 0x11)), "checksum-mismatch"),
        (_wrong_tensor_digest("target", "rice"), "base-mismatch"),
    ],
)
def test_crafted_delta_refused_in_reverse(
    case: Case, edit: Edit, category: str, tmp_path: Path
) -> None:
    d = Delta.read(case.delta)
    edit(d)
    path = d.write(tmp_path / "crafted.wdelta")
    expect_refusal(case.target, path, tmp_path / "r.safetensors", category, reverse=True)


# ---------------------------------------------------------------- raw header text


def _with_header_text(case: Case, text: bytes, tmp_path: Path) -> Path:
    d = Delta.read(case.delta)
    header = text + b" " * (-len(text) % 8)
    data = b"".join(d.blobs)
    path = tmp_path / "raw.wdelta"
    path.write_bytes(pack_prefix(header, len(data)) + header + data)
    return path


def _header_text(case: Case) -> bytes:
    return Delta.read(case.delta).header_bytes().rstrip(b" ")


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace(b'{"version":1,', b'{"version":1,"version":1,', 1),  # duplicate key
        lambda t: t[:-1],  # cut JSON
        lambda t: t + b"x",  # trailing garbage
        lambda t: b"[" + t + b"]",  # not an object
        lambda t: t.replace(b'"generator":"', b'"generator":"\xff', 1),  # invalid UTF-8
        lambda t: t.replace(b'"reversible":true', b'"reversible":1', 1),  # wrong type
        lambda t: b"\x00" * 8 + t,
        lambda t: b"\xef\xbb\xbf" + t,  # byte-order mark
        lambda t: t.replace(CHUNK_FIELD, CHUNK_FIELD + b".0", 1),
        lambda t: t.replace(CHUNK_FIELD, b'"chunk_elements":3.2765e4', 1),
        lambda t: t.replace(b'{"version":1,', b'{"x":NaN,"version":1,', 1),
        lambda t: t.replace(b'{"version":1,', b'{"x":-Infinity,"version":1,', 1),
        lambda t: t.replace(
            b'{"version":1,', b'{"x":' + b"[" * 70 + b"]" * 70 + b',"version":1,', 1
        ),
        lambda t: t.replace(b'{"version":1,', b'{"x":"\\ud800","version":1,', 1),
        lambda t: t.replace(b'"generator":"', b'"generator":"\\ud800', 1),
        lambda t: t.replace(CHUNK_FIELD, b'"chunk_elements":true', 1),
    ],
    ids=[
        "duplicate-key",
        "cut",
        "trailing",
        "array",
        "utf8",
        "type",
        "nul",
        "bom",
        "fraction",
        "exponent",
        "nan",
        "infinity",
        "deep",
        "unknown-surrogate",
        "surrogate",
        "bool-int",
    ],
)
def test_malformed_header_text(
    case: Case, change: Callable[[bytes], bytes], tmp_path: Path
) -> None:
    path = _with_header_text(case, change(_header_text(case)), tmp_path)
    (tmp_path / "out").mkdir()
    expect_refusal(case.base, path, tmp_path / "out" / "r.safetensors", "header-invalid")


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t + b"\n\t\r" * 3,  # any RFC 8259 whitespace as padding
        lambda t: t + b" " * 24,  # more padding than a writer emits
        lambda t: b"\n  " + t,  # leading whitespace
        lambda t: t.replace(b'{"version":1,', b'{ "version" : 1 ,\n', 1),
        lambda t: t.replace(
            b'{"version":1,', b'{"x":' + b"[" * 40 + b"]" * 40 + b',"version":1,', 1
        ),
        lambda t: t.replace(b'"generator":"wdelta', b'"generator":"\\u0077delta', 1),
    ],
    ids=["padding", "long-padding", "leading", "spacing", "nested-unknown", "escaped"],
)
def test_header_text_variants_accepted(
    case: Case, change: Callable[[bytes], bytes], tmp_path: Path
) -> None:
    """SPEC §4.1: a reader accepts any JSON whitespace; padding binds writers only."""
    path = _with_header_text(case, change(_header_text(case)), tmp_path)
    out = tmp_path / "out.safetensors"
    wdelta.apply(case.base, path, out)
    assert out.read_bytes() == case.target.read_bytes()


def test_single_file_side_with_index_writes_a_folder(case: Case, tmp_path: Path) -> None:
    """SPEC §4.9: a single-file checkpoint may have an index; its output is a folder."""
    d = Delta.read(case.delta)
    _target_index(wrong=False)(d)
    path = d.write(tmp_path / "indexed.wdelta")
    out = tmp_path / "out"
    wdelta.apply(case.base, path, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "model.safetensors.index.json", "target.safetensors",
    ]  # fmt: skip
    assert (out / "target.safetensors").read_bytes() == case.target.read_bytes()
    index = d.header["target"]["index"]["text"]
    assert (out / "model.safetensors.index.json").read_text(encoding="utf-8") == index
