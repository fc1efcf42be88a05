"""What a more compact delta header would save: a measurement, not a format.

    python bench/headersize.py DELTA.wdelta [...]

Applies candidate compactions cumulatively to a real header in its v1 form
(the parsed JSON, expanded if the file holds the compact form of SPEC §4.11,
re-serialised compactly) and prints the bytes per tensor entry after each.
They were weighed for the compact form: it takes steps 1-4, 6 (as
``canonical`` layouts that keep dtype and shape in the entries) and 7, and
leaves 5 and 8 out (SPEC §4.11, rationale).  Each step is one that keeps all the
information a reader needs, or says what it gives up:

1. target layout "as the base" when a target file's stored safetensors header
   text equals the base file's (only the path is kept);
2. no dtype and shape in tensor entries (the side layouts hold them);
3. no blob offset (blobs are stored in entry order: offsets are cumulative
   lengths) and no codec member when it is "zstd";
4. 256-bit digests and checksums in base64url (43 characters) instead of hex;
5. blob checksums truncated to 128 bits (corruption is still caught by the
   256-bit tensor digests after decoding, but later);
6. a base file header that is exactly what the safetensors serializer writes
   for the entries (``build_header``) stored as ``"canonical": true``;
7. ``op`` omitted when "modified", and one-or-two-letter member names;
8. no per-tensor base digest: the base is checked by one whole-checkpoint
   digest instead (a mismatch can no longer name the tensor).
"""

from __future__ import annotations

import base64
import copy
import json
import sys
from collections.abc import Callable
from typing import Any

import wdelta
from wdelta.checkpoint.safetensors_header import build_header, parse_header

Header = dict[str, Any]


def size(doc: Header) -> int:
    """UTF-8 bytes of ``doc`` as compact JSON (the encoder's serialisation, unpadded)."""
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())


def _same_layout(doc: Header) -> None:
    for b, t in zip(doc["base"].get("files", []), doc["target"].get("files", []), strict=False):
        if b.get("header") == t.get("header"):
            t.pop("header", None)


def _no_dtype_shape(doc: Header) -> None:
    for e in doc["tensors"]:
        e.pop("dtype", None)
        e.pop("shape", None)


def _no_offset_codec(doc: Header) -> None:
    for e in doc["tensors"]:
        for c in e.get("chunks", []):
            c.pop("offset", None)
            if c.get("codec") == "zstd":
                c.pop("codec")


def _b64(hex_text: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(hex_text)).decode().rstrip("=")


def _base64_digests(doc: Header) -> None:
    for side in ("base", "target"):
        doc[side]["digest"] = _b64(doc[side]["digest"])
    for e in doc["tensors"]:
        for key in ("base_digest", "target_digest"):
            if isinstance(e.get(key), str):
                e[key] = _b64(e[key])
        for c in e.get("chunks", []):
            if "checksum" in c:
                c["checksum"] = _b64(c["checksum"])


def _short_checksums(doc: Header) -> None:
    for e in doc["tensors"]:
        for c in e.get("chunks", []):
            if "checksum" in c:
                c["checksum"] = c["checksum"][:22]  # 128 bits of base64url


def _canonical_base(doc: Header) -> None:
    entries = {e["name"]: e for e in doc["tensors"]}
    for f in doc["base"].get("files", []):
        layout = parse_header(f["header"].encode())
        rebuilt = build_header([(t.name, t.dtype, t.shape) for t in layout.tensors],
                               layout.metadata)  # fmt: skip
        if rebuilt.header_text == f["header"] and all(t.name in entries for t in layout.tensors):
            f.pop("header")
            f["canonical"] = True


SHORT = {"name": "n", "base_digest": "b", "target_digest": "t", "chunks": "c",
         "encoding": "e", "changed": "k", "transform": "x", "raw_length": "r", "length": "l",
         "checksum": "h"}  # fmt: skip


def _short_names(doc: Header) -> None:
    entries = []
    for e in doc["tensors"]:
        if e.get("op") == "modified":
            e.pop("op")
        e["chunks"] = [{SHORT.get(k, k): v for k, v in c.items()} for c in e.get("chunks", [])]
        entries.append({SHORT.get(k, k): v for k, v in e.items()})
    doc["tensors"] = entries


def _no_base_digests(doc: Header) -> None:
    for e in doc["tensors"]:
        e.pop("b", None)


STEPS: list[tuple[str, Callable[[Header], None]]] = [
    ("target layout 'as base'", _same_layout),
    ("no dtype/shape in entries", _no_dtype_shape),
    ("no blob offset, default codec", _no_offset_codec),
    ("base64url digests", _base64_digests),
    ("128-bit blob checksums", _short_checksums),
    ("canonical base layout", _canonical_base),
    ("short member names", _short_names),
    ("no per-tensor base digest", _no_base_digests),
]


def compaction(raw: Header) -> list[tuple[str, int]]:
    """[(step, header bytes after it)], starting with ("v1 form", its bytes)."""
    doc = copy.deepcopy(raw)
    out = [("v1 form", size(doc))]
    for name, step in STEPS:
        step(doc)
        out.append((name, size(doc)))
    return out


def main(paths: list[str]) -> int:
    for path in paths:
        with wdelta.open_delta(path) as d:
            n = len(d.header.tensors)
            form = "compact" if d.header.compact else "v1"
            print(f"{path}: {n} tensors, header {d.header_length} bytes stored ({form} form)")
            for name, nbytes in compaction(d.header_json()):
                print(f"  {name:32} {nbytes:>9,} bytes  {nbytes / n:6.0f} per tensor")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
