"""The compact header form (SPEC §4.11), written from SPEC alone for the vectors.

:func:`to_compact` turns a builder header (v1 form, offsets and hex digests
filled in) into the compact form; the file records default to what SPEC
§11.2 says the reference writes, and a case may force any of them.  The
canonical header is built here from the four steps of §4.11, not by the
reference's serializer, so that the vectors check the reference too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from wdelta.format.dtypes import DTYPES

FEATURE = "compact-header"
ENTRY = {"name": "n", "op": "o", "dtype": "d", "shape": "s", "base_digest": "b",
         "target_digest": "t", "chunks": "c"}  # fmt: skip
CHUNK = {"encoding": "e", "changed": "k", "transform": "x", "codec": "z", "raw_length": "r",
         "length": "l", "checksum": "h", "inline": "i"}  # fmt: skip
# A side's file records: "canonical", "same" (same_as_base the base file of the same
# path, else of the same header text) or "text", by path.
Records = dict[str, str]
Form = Callable[[dict[str, Any]], dict[str, Any]]


def b64(hex_digest: str) -> str:
    """43 characters of unpadded base64url."""
    return base64.urlsafe_b64encode(bytes.fromhex(hex_digest)).decode().rstrip("=")


def canonical_text(tensors: list[tuple[str, str, list[int]]], metadata: Any) -> str:
    """§4.11 steps 1-4: order by (element size descending, UTF-8 name), offsets, JSON, pad."""
    ordered = sorted(tensors, key=lambda t: (-DTYPES[t[1]].size, t[0].encode("utf-8")))
    doc: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    begin = 0
    for name, dtype, shape in ordered:
        n = 1
        for dim in shape:
            n *= dim
        end = begin + n * DTYPES[dtype].size
        doc[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        begin = end
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text + " " * (-len(text.encode("utf-8")) % 8)


def _listing(header: str) -> tuple[list[tuple[str, str, list[int]]], Any]:
    doc = json.loads(header)
    metadata = doc.pop("__metadata__", None)
    return [(n, v["dtype"], v["shape"]) for n, v in doc.items()], metadata


def is_canonical(header: str) -> bool:
    try:
        tensors, metadata = _listing(header)
    except (ValueError, KeyError, TypeError):
        return False
    return canonical_text(tensors, metadata) == header


def default_record(header: str, base_headers: list[str]) -> str:
    """The reference's choice (§11.2): canonical, else same as a base file's, else the text."""
    if is_canonical(header):
        return "canonical"
    return "same" if header in base_headers else "text"


def _file(f: dict[str, Any], record: str, base_files: dict[str, str]) -> dict[str, Any]:
    if record == "canonical":
        _, metadata = _listing(f["header"])
        out: dict[str, Any] = {"path": f["path"], "canonical": True}
        if metadata is not None:
            out["metadata"] = metadata
        return out
    if record == "same":
        if f["path"] in base_files:
            return {"path": f["path"], "same_as_base": f["path"]}
        source = next(p for p, text in base_files.items() if text == f["header"])
        return {"path": f["path"], "same_as_base": source}
    return {"path": f["path"], "header": f["header"]}


def _side(side: dict[str, Any], base: dict[str, Any] | None, records: Records) -> dict[str, Any]:
    base_files = {f["path"]: f["header"] for f in base["files"]} if base else {}
    files = [
        _file(f, records.get(f["path"]) or default_record(f["header"], list(base_files.values())),
              base_files)
        for f in side["files"]
    ]  # fmt: skip
    index = side["index"]
    if base is not None and index is not None and base["index"] is not None and (
        index["text"] == base["index"]["text"]
    ):
        index = {"path": index["path"], "same_as_base": True}
    return {**side, "digest": b64(side["digest"]), "files": files, "index": index}


def _implied_codec(c: dict[str, Any], coded: bool) -> str:
    """C2: without z, none when the delta lists coded-values and l = r, else zstd; an
    inline blob's l is the number of bytes its text encodes (§4.12)."""
    length = len(c["inline"]) * 3 // 4 if "inline" in c else c.get("length")
    return "none" if coded and length == c.get("raw_length") else "zstd"


def _chunk(c: dict[str, Any], coded: bool) -> dict[str, Any]:
    out = {}
    for long, short in CHUNK.items():
        if long in c and not (long == "codec" and c[long] == _implied_codec(c, coded)):
            out[short] = b64(c[long]) if long == "checksum" else c[long]
    return out


def _entry(e: dict[str, Any], coded: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for long, short in ENTRY.items():
        if long == "chunks" and "chunks" in e:
            out["c"] = [_chunk(c, coded) for c in e["chunks"]]
        elif long in e:
            out[short] = b64(e[long]) if long.endswith("_digest") else e[long]
    return out


def to_compact(
    doc: dict[str, Any], base_records: Records | None = None, target_records: Records | None = None
) -> dict[str, Any]:
    """The compact form of a v1 header; records force a file's form by path."""
    coded = "coded-values" in doc["required_features"]
    return {
        **doc,
        "required_features": [*doc["required_features"], FEATURE],
        "base": _side(doc["base"], None, base_records or {}),
        "target": _side(doc["target"], doc["base"], target_records or {}),
        "tensors": [_entry(e, coded) for e in doc["tensors"]],
    }


def form(
    edit: Callable[[dict[str, Any]], None] | None = None, *, base: Records | None = None,
    target: Records | None = None,
) -> Form:  # fmt: skip
    """A builder ``form``: the compact header, then ``edit`` (an invalid case's one defect)."""

    def convert(doc: dict[str, Any]) -> dict[str, Any]:
        out = to_compact(doc, base, target)
        if edit is not None:
            edit(out)
        return out

    return convert
