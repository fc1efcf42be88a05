"""The compact header form, feature ``compact-header`` (SPEC §4.11).

The compact form says the same as the v1 form in about a third of the bytes:
side files whose safetensors header is what the serializer writes for their
tensors say ``"canonical": true`` instead of carrying the text, a target
file or index equal to the base's says ``"same_as_base": true``, digests are
base64url instead of hex (same 256 bits), blob offsets are implied by the
blob order (§4.7), ``codec`` defaults to ``zstd`` (with feature
``coded-values``, to ``none`` for a blob as long as its payload), and tensor
and chunk members have one-letter names (:data:`ENTRY_NAMES`, :data:`CHUNK_NAMES`).

The reader *expands* a compact header into the v1 form, in two steps so that
every v1 rule is then checked by the v1 code: :func:`expand_tensors` before
the tensor rules (entries, side digests), :func:`expand_layouts` after them
(file headers, which the canonical form builds from the validated entries).
The writer goes the other way with :func:`compact_header`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..checkpoint.safetensors_header import FileLayout, build_header, parse_header
from ..errors import CheckpointInvalidError, HeaderInvalidError
from . import inline_blobs, strictjson
from .dtypes import DType
from .names import Codec

FEATURE = "compact-header"
# With this feature too, a chunk without "z" whose l equals its r has codec
# none (C2): coded payloads are mostly stored raw, and "z":"none" cost 11
# header bytes per chunk (7 per tensor on the fp8 real trace).
CODED_VALUES = "coded-values"
ENTRY_NAMES = {"name": "n", "op": "o", "dtype": "d", "shape": "s", "base_digest": "b",
               "target_digest": "t", "chunks": "c"}  # fmt: skip
CHUNK_NAMES = {"encoding": "e", "changed": "k", "transform": "x", "codec": "z",
               "raw_length": "r", "length": "l", "checksum": "h", "inline": "i"}  # fmt: skip
_DIGESTS = ("base_digest", "target_digest")
# (name, dtype, shape) of the tensors of one side.
Listing = list[tuple[str, DType, tuple[int, ...]]]


def is_compact(raw: dict[str, Any]) -> bool:
    """Whether a header's ``required_features`` names the compact form."""
    features = raw.get("required_features")
    return isinstance(features, list) and FEATURE in features


def b64(hex_digest: str) -> str:
    """The 43-character unpadded base64url form of a 64-hex-digit digest."""
    return base64.urlsafe_b64encode(bytes.fromhex(hex_digest)).decode("ascii").rstrip("=")


def hex_digest(text: str) -> str:
    """The hex form of a schema-checked base64url digest (43 characters).

    The schema's pattern admits only the canonical encoding (the two unused
    low bits of the last character zero), so decoding is one-to-one.
    """
    try:
        return base64.urlsafe_b64decode(text + "=").hex()
    except (binascii.Error, ValueError) as exc:
        raise HeaderInvalidError(f"digest {text!r} is not base64url") from exc


def _default_codec(chunk: dict[str, Any], raw_by_default: bool, inline: bool) -> Codec:
    """The codec of a chunk without ``z`` (C2); ``inline``: the header lists
    ``inline-blobs``, so that an inline blob's size stands for ``l`` (§4.12)."""
    text = chunk.get("inline") if inline else None
    length = inline_blobs.length(text) if isinstance(text, str) else chunk.get("length")
    if raw_by_default and length == chunk.get("raw_length"):
        return "none"
    return "zstd"


def _long(obj: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The members of ``obj`` known under their short names, renamed to the long ones.

    Other members are unknown in the compact form and ignored (§4.2).
    """
    return {long: obj[short] for long, short in names.items() if short in obj}


def _expand_chunk(
    raw: dict[str, Any], offset: int, unchanged: dict[str, Any], raw_by_default: bool,
    inline: bool,
) -> tuple[dict[str, Any], int]:  # fmt: skip
    chunk = _long(raw, CHUNK_NAMES)
    if chunk == unchanged:
        # Shared: 24 header bytes each, the densest legal content, must not
        # cost a dict apiece twice (parsed and expanded).
        return unchanged, offset
    if chunk["encoding"] == "unchanged":
        return chunk, offset
    if "codec" not in chunk:
        chunk["codec"] = _default_codec(chunk, raw_by_default, inline)
    if "checksum" in chunk:
        chunk["checksum"] = hex_digest(chunk["checksum"])
    if inline and "inline" in chunk:
        return chunk, offset  # in the header, not the data section (§4.12)
    chunk["offset"] = offset
    length = chunk.get("length")
    return chunk, offset + (length if isinstance(length, int) else 0)


def expand_tensors(raw: dict[str, Any], inline: bool) -> dict[str, Any]:
    """A schema-valid compact header with v1 tensor entries and hex side digests.

    Blob offsets are the running sum of the lengths of the blobs before, in
    header order (§4.7); the sides' ``files`` and ``index`` are left compact.
    Entries are replaced in place, so that the compact and the expanded form
    of the tensor list are never both held whole; every unchanged chunk
    (``changed`` 0, no other member) expands to one shared object.
    ``inline``: the header lists ``inline-blobs`` (§4.12); its inline chunks
    take no offset.
    """
    offset = 0
    unchanged = {"encoding": "unchanged", "changed": 0}
    raw_by_default = CODED_VALUES in raw["required_features"]
    tensors = raw["tensors"]
    for i, entry in enumerate(tensors):
        out = _long(entry, ENTRY_NAMES)
        for key in _DIGESTS:
            if key in out:
                out[key] = hex_digest(out[key])
        if "chunks" in out:
            chunks = []
            for c in out["chunks"]:
                chunk, offset = _expand_chunk(c, offset, unchanged, raw_by_default, inline)
                chunks.append(chunk)
            out["chunks"] = chunks
        tensors[i] = out
    sides = {s: {**raw[s], "digest": hex_digest(raw[s]["digest"])} for s in ("base", "target")}
    return {**raw, **sides, "tensors": tensors}


def expand_layouts(
    raw: dict[str, Any], listings: dict[str, Listing], built: dict[str, FileLayout]
) -> dict[str, Any]:
    """``raw`` with both sides' files and index in the v1 form (§4.11, C1 to C3).

    ``listings`` holds each side's validated tensors; a canonical file is
    rebuilt from those its side assigns to it, and its layout added to
    ``built`` under its header text, so that it is not parsed again.
    """
    base = _expand_side(raw["base"], None, listings["base"], "base", built)
    target = _expand_side(raw["target"], base, listings["target"], "target", built)
    return {**raw, "base": base, "target": target}


def _expand_side(
    side: dict[str, Any], base: dict[str, Any] | None, listing: Listing, name: str,
    built: dict[str, FileLayout],
) -> dict[str, Any]:  # fmt: skip
    index = side["index"]
    if isinstance(index, dict) and index.get("same_as_base") is True:
        index = {"path": index["path"], "text": _base_index(base, index["path"], name)}
    owner = _file_of(index)
    by_file: dict[object, Listing] = {}
    for t in listing:
        by_file.setdefault(None if owner is None else owner.get(t[0]), []).append(t)
    files = []
    for f in side["files"]:
        path = f["path"]
        if "same_as_base" in f:
            text = _base_file(base, f["same_as_base"], name)
        elif f.get("canonical") is True:
            mine = by_file.get(None if owner is None else path, [])
            try:
                layout = build_header(mine, f.get("metadata"))
            except CheckpointInvalidError as exc:
                # L1: the canonical header of these tensors is no safetensors header (a
                # tensor named __metadata__); a delta is refused as a delta, not an input.
                raise HeaderInvalidError(f"{name} canonical file {path}: {exc}") from exc
            text = layout.header_text
            built[text] = layout
        else:
            text = f["header"]
        files.append({"path": path, "header": text})
    return {**side, "files": files, "index": index}


def _base_file(base: dict[str, Any] | None, path: str, side: str) -> str:
    if base is None:
        raise HeaderInvalidError(f"a base file says same_as_base {path}: for the target only")
    found = [f["header"] for f in base["files"] if f["path"] == path]
    if not found:
        raise HeaderInvalidError(f"{side} file: same_as_base {path}, but the base has no such file")
    text: str = found[0]
    return text


def _base_index(base: dict[str, Any] | None, path: str, side: str) -> str:
    if base is None:
        raise HeaderInvalidError(f"base index {path}: same_as_base is for the target side only")
    index = base["index"]
    if not isinstance(index, dict):
        raise HeaderInvalidError(f"{side} index {path}: same_as_base, but the base has no index")
    text: str = index["text"]
    return text


def _file_of(index: dict[str, Any] | None) -> dict[str, Any] | None:
    """The index's ``weight_map`` (tensor name -> file), None without an index."""
    if index is None:
        return None
    doc = strictjson.loads(index["text"], HeaderInvalidError, f"index {index['path']}")
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict):
        raise HeaderInvalidError(f"index {index['path']} has no weight_map")
    return wmap


def compact_header(doc: dict[str, Any]) -> dict[str, Any]:
    """The compact form of a v1 header ``doc`` that the writer built (hex digests)."""
    features = [*doc["required_features"], FEATURE]
    base = _compact_side(doc["base"], None)
    target = _compact_side(doc["target"], doc["base"])
    raw_by_default = CODED_VALUES in features
    inline = inline_blobs.FEATURE in features
    tensors = [_compact_entry(e, raw_by_default, inline) for e in doc["tensors"]]
    return {**doc, "required_features": features, "base": base, "target": target,
            "tensors": tensors}  # fmt: skip


def _compact_entry(entry: dict[str, Any], raw_by_default: bool, inline: bool) -> dict[str, Any]:
    out = {}
    for long, short in ENTRY_NAMES.items():
        if long in entry:
            value = entry[long]
            out[short] = b64(value) if long in _DIGESTS else value
    if "chunks" in entry:
        out["c"] = [_compact_chunk(c, raw_by_default, inline) for c in entry["chunks"]]
    return out


def _compact_chunk(chunk: dict[str, Any], raw_by_default: bool, inline: bool) -> dict[str, Any]:
    out = {}
    implied = _default_codec(chunk, raw_by_default, inline)
    for long, short in CHUNK_NAMES.items():
        if long in chunk and not (long == "codec" and chunk[long] == implied):
            out[short] = b64(chunk[long]) if long == "checksum" else chunk[long]
    return out


def _compact_side(side: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    base_files = [(f["path"], f["header"]) for f in base["files"]] if base else []
    files = [_compact_file(f["path"], f["header"], base_files) for f in side["files"]]
    index = side["index"]
    base_index = base["index"] if base else None
    if index is not None and base_index is not None and base_index["text"] == index["text"]:
        index = {"path": index["path"], "same_as_base": True}
    return {**side, "digest": b64(side["digest"]), "files": files, "index": index}


def _compact_file(path: str, text: str, base_files: list[tuple[str, str]]) -> dict[str, Any]:
    """A file's compact record: canonical, else same as a base file's (the one of the same
    path first), else the text."""
    layout = parse_header(text.encode("utf-8"))
    listing = [(t.name, t.dtype, t.shape) for t in layout.tensors]
    try:
        rebuilt = build_header(listing, layout.metadata).header_text
    except CheckpointInvalidError:
        rebuilt = None
    if rebuilt == text:
        out: dict[str, Any] = {"path": path, "canonical": True}
        if layout.metadata is not None:
            out["metadata"] = layout.metadata
        return out
    same = sorted((p != path, p) for p, t in base_files if t == text)
    if same:
        return {"path": path, "same_as_base": same[0][1]}
    return {"path": path, "header": text}
