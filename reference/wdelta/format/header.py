"""The delta header: its JSON model, schema and semantic validation.

``parse_header`` turns the header bytes of a delta file into a
:class:`Header`, checking, in this order: UTF-8 JSON without duplicate keys,
the version, the required features, the JSON Schema, then every rule of
SPEC §4 (ops, chunk counts, blob contiguity, layouts, digests).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

from ..checkpoint.safetensors_header import FileLayout
from ..codec import coded_values
from ..codec.sparse import max_raw_length
from ..errors import (
    HeaderInvalidError,
    LimitExceededError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
)
from ..io import gc_pause
from ..limits import MAX_CHUNK_ELEMENTS, MAX_ELEMENTS
from . import compact, inline_blobs, schemas, strictjson
from .digest import EMPTY_DIGEST, TensorIdentity, checkpoint_digest
from .dtypes import DType, lookup
from .layout import SideLayout, parse_side_layout
from .names import CODECS, ENCODINGS, OPS, TRANSFORMS, Codec, Encoding, Op, Transform

FORMAT_VERSION = 1
KNOWN_FEATURES: frozenset[str] = frozenset(
    {compact.FEATURE, coded_values.FEATURE, inline_blobs.FEATURE}
)
_OP_RANK: dict[Op, int] = {"removed": 0, "unchanged": 1, "modified": 1, "added": 2}


@dataclass(frozen=True)
class Chunk:
    """One chunk of a tensor; blob fields are absent (0/"") when unchanged.

    ``inline`` holds the stored blob of a chunk that carries it in the header
    (feature ``inline-blobs``, SPEC §4.12): ``length`` is then its size, and
    ``offset`` and ``checksum`` are unused (the header digest covers it).
    """

    encoding: Encoding
    changed: int
    transform: Transform | None = None
    codec: Codec | Literal[""] = ""
    offset: int = 0
    length: int = 0
    raw_length: int = 0
    checksum: str = ""
    inline: bytes | None = None

    @property
    def in_data(self) -> bool:
        """Whether the chunk's blob is in the data section (§4.7): it has one, not inline."""
        return self.encoding != "unchanged" and self.inline is None


@dataclass(frozen=True)
class TensorEntry:
    """One tensor operation of the delta."""

    name: str
    op: Op
    dtype: DType
    shape: tuple[int, ...]
    base_digest: str | None
    target_digest: str | None
    chunks: tuple[Chunk, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.size

    def identity(self, side: str) -> TensorIdentity:
        digest = self.base_digest if side == "base" else self.target_digest
        assert digest is not None
        return TensorIdentity(self.name, self.dtype.name, self.shape, digest)


@dataclass(frozen=True)
class Header:
    """A validated delta header.

    ``raw`` is the parsed JSON object in the v1 form (a compact header,
    ``compact`` True, SPEC §4.11, is expanded, so it reads like any other)
    without its ``tensors`` list: the entries are ``tensors``, and holding
    their JSON as well took 30% of a large header's memory (300,000 entries:
    393 against 273 MiB).  :func:`entries_json` gives them from the header bytes.
    """

    chunk_elements: int
    reversible: bool
    base: SideLayout
    target: SideLayout
    tensors: tuple[TensorEntry, ...]
    raw: dict[str, Any]
    compact: bool = False

    @property
    def coded_values(self) -> bool:
        """Whether ``required_features`` names ``coded-values`` (SPEC §7.6.6): only
        then may a sparse payload code its values."""
        features = self.raw.get("required_features")
        return isinstance(features, list) and coded_values.FEATURE in features

    @property
    def part(self) -> tuple[int, int, str, str] | None:
        """(index, count, whole base digest, whole target digest) of a delta that is
        one part of a multi-part link (SPEC §4.13), or None."""
        p = self.raw.get("part")
        return None if p is None else (p["index"], p["count"], p["base"], p["target"])

    def side_tensors(self, side: str) -> list[TensorEntry]:
        """Tensors present in the base (``"base"``) or target (``"target"``)."""
        absent = "added" if side == "base" else "removed"
        return [t for t in self.tensors if t.op != absent]

    def chunk_span(self, tensor: TensorEntry, index: int) -> tuple[int, int]:
        """(first element, element count) of chunk ``index`` of ``tensor``."""
        start = index * self.chunk_elements
        return start, min(self.chunk_elements, tensor.elements - start)


def load_json(data: bytes) -> dict[str, Any]:
    """Decode header bytes (JSON then trailing whitespace) into a dict."""
    raw = strictjson.loads(data, HeaderInvalidError, "header")
    if not isinstance(raw, dict):
        raise HeaderInvalidError("header must be a JSON object")
    return raw


def parse_header(data: bytes, data_length: int) -> Header:
    """Validate header bytes against a data section of ``data_length`` bytes."""
    with gc_pause.paused():
        return _parse_header(data, data_length)


def _parse_header(data: bytes, data_length: int) -> Header:
    raw = load_json(data)
    version = raw.get("version")
    if isinstance(version, float):
        # §4.1 (step 1) forbids a fraction or exponent in an integer field.
        raise HeaderInvalidError(f"header version {version!r} is not written as an integer")
    if type(version) is not int or version != FORMAT_VERSION:
        raise UnsupportedVersionError(f"header version {version!r}; this reader implements 1")
    features = raw.get("required_features")
    if isinstance(features, list):
        unknown = sorted(f for f in features if isinstance(f, str) and f not in KNOWN_FEATURES)
        if unknown:
            raise UnsupportedFeatureError(f"unknown required features: {', '.join(unknown)}")
    compact_form = compact.is_compact(raw)
    _validate_schema(raw, compact_form)
    inline = _lists_inline(raw)
    if compact_form:
        raw = compact.expand_tensors(raw, inline)
    raw_tensors = raw.pop("tensors")
    chunk_elements = raw["chunk_elements"]
    if chunk_elements > MAX_CHUNK_ELEMENTS:
        raise LimitExceededError(f"chunk_elements {chunk_elements} exceeds {MAX_CHUNK_ELEMENTS}")
    tensors = tuple(_parse_tensor(t, chunk_elements, inline) for t in raw_tensors)
    del raw_tensors
    _check_order(tensors)
    _check_blobs(tensors, data_length)
    reversible = all(_tensor_reversible(t) for t in tensors)
    if raw["reversible"] != reversible:
        raise HeaderInvalidError(
            f"header says reversible={raw['reversible']}, chunks imply {reversible}"
        )
    layouts: dict[str, FileLayout] = {}  # by header text: each is parsed or built once
    if compact_form:
        raw = compact.expand_layouts(raw, _listings(tensors), layouts)
    header = Header(
        chunk_elements, reversible, parse_side_layout(raw["base"], "base", layouts),
        parse_side_layout(raw["target"], "target", layouts), tensors, raw, compact_form,
    )  # fmt: skip
    part = raw.get("part")
    if part is not None and part["index"] >= part["count"]:
        raise HeaderInvalidError(f"part index {part['index']} is not below its count")
    for side, layout in (("base", header.base), ("target", header.target)):
        entries = header.side_tensors(side)
        layout.check_tensors({t.name: (t.dtype, t.shape) for t in entries})
        if checkpoint_digest(t.identity(side) for t in entries) != raw[side]["digest"]:
            raise HeaderInvalidError(f"{side} digest does not match its tensor digests")
    return header


def entries_json(data: bytes) -> list[dict[str, Any]]:
    """The JSON tensor entries of a header :func:`parse_header` accepted, in the v1
    form (a compact header's expanded as in parsing): what ``Header.raw`` leaves out."""
    raw = load_json(data)
    if compact.is_compact(raw):
        raw = compact.expand_tensors(raw, _lists_inline(raw))
    entries: list[dict[str, Any]] = raw["tensors"]
    return entries


def _lists_inline(raw: dict[str, Any]) -> bool:
    """Whether the header's ``required_features`` names ``inline-blobs`` (SPEC §4.12)."""
    features = raw.get("required_features")
    return isinstance(features, list) and inline_blobs.FEATURE in features


def _listings(tensors: tuple[TensorEntry, ...]) -> dict[str, compact.Listing]:
    """Each side's (name, dtype, shape), for the canonical layouts of §4.11."""
    out: dict[str, compact.Listing] = {"base": [], "target": []}
    for t in tensors:
        for side, absent in (("base", "added"), ("target", "removed")):
            if t.op != absent:
                out[side].append((t.name, t.dtype, t.shape))
    return out


def _validate_schema(raw: dict[str, Any], compact_form: bool) -> None:
    """Apply schema/delta-header.schema.json; tensor entries by the compiled checker.

    jsonschema costs 0.1-0.3 ms per tensor or chunk entry, minutes for a
    1T-parameter model, so the tensor list is lifted out and checked against
    the same ``$defs/tensor`` (``$defs/compact_tensor`` for the compact form)
    by :class:`schemas.CompiledChecker`.
    """
    tensors = raw.get("tensors")
    stripped = {**raw, "tensors": []} if isinstance(tensors, list) else raw
    error = schemas.violation("delta-header", stripped)
    if error is not None:
        raise HeaderInvalidError(f"schema violation {error}")
    if not isinstance(tensors, list):
        return
    definition = "compact_tensor" if compact_form else "tensor"
    checker = schemas.compiled_checker("delta-header", definition)
    for i, tensor in enumerate(tensors):
        found = checker.errors(tensor)
        if found is not None:
            path, message = found
            where = f"tensors/{i}/{path}" if path else f"tensors/{i}"
            raise HeaderInvalidError(f"schema violation at {where}: {message}")


def _tensor_reversible(t: TensorEntry) -> bool:
    if t.op == "removed":
        return bool(t.chunks) or t.elements == 0
    return t.op != "modified" or all(c.encoding != "full" for c in t.chunks)


def _check_order(tensors: tuple[TensorEntry, ...]) -> None:
    keys = [(t.name.encode("utf-8"), _OP_RANK[t.op]) for t in tensors]
    for prev, cur in itertools.pairwise(keys):
        if cur <= prev:
            raise HeaderInvalidError(f"tensors not sorted or duplicated at {cur[0]!r}")
    for prev_t, cur_t in itertools.pairwise(tensors):
        if prev_t.name == cur_t.name and (prev_t.op, cur_t.op) != ("removed", "added"):
            raise HeaderInvalidError(f"tensor {cur_t.name!r} listed twice")


def _check_blobs(tensors: tuple[TensorEntry, ...], data_length: int) -> None:
    cursor = 0
    for t in tensors:
        for i, c in enumerate(t.chunks):
            if not c.in_data:
                continue
            if c.offset != cursor:
                raise HeaderInvalidError(
                    f"{t.name!r} chunk {i}: blob at {c.offset}, expected {cursor} "
                    "(blobs must be contiguous, in header order)"
                )
            cursor += c.length
    if cursor != data_length:
        raise HeaderInvalidError(f"blobs cover {cursor} bytes, data section has {data_length}")


def _parse_tensor(raw: dict[str, Any], chunk_elements: int, inline: bool) -> TensorEntry:
    """``inline``: the header lists feature ``inline-blobs``."""
    name, op = raw["name"], raw["op"]
    if op not in OPS:
        raise UnsupportedFeatureError(f"tensor {name!r}: unknown op {op!r}")
    dtype = lookup(raw["dtype"])
    shape = tuple(raw["shape"])
    entry = TensorEntry(
        name, op, dtype, shape, raw.get("base_digest"), raw.get("target_digest"),
        tuple(_parse_chunk(c, inline) for c in raw.get("chunks", ())),
    )  # fmt: skip
    if entry.elements > MAX_ELEMENTS or any(dim > MAX_ELEMENTS for dim in shape):
        raise LimitExceededError(
            f"tensor {name!r}: {entry.elements} elements exceeds {MAX_ELEMENTS}"
        )
    _check_digests(entry, raw)
    expected_chunks = -(-entry.elements // chunk_elements)
    wants_chunks = op in ("modified", "added") or (op == "removed" and "chunks" in raw)
    if wants_chunks and len(entry.chunks) != expected_chunks:
        raise HeaderInvalidError(
            f"tensor {name!r}: {len(entry.chunks)} chunks, {expected_chunks} expected"
        )
    if not wants_chunks and "chunks" in raw:
        raise HeaderInvalidError(f"tensor {name!r}: op {op} carries no chunks")
    for i, chunk in enumerate(entry.chunks):
        start = i * chunk_elements
        _check_chunk(entry, i, chunk, min(chunk_elements, entry.elements - start))
    return entry


def _check_digests(entry: TensorEntry, raw: dict[str, Any]) -> None:
    needs_base = entry.op != "added"
    needs_target = entry.op != "removed"
    if ("base_digest" in raw) != needs_base or ("target_digest" in raw) != needs_target:
        raise HeaderInvalidError(f"tensor {entry.name!r}: wrong digests for op {entry.op}")
    if entry.op == "unchanged" and entry.base_digest != entry.target_digest:
        raise HeaderInvalidError(f"tensor {entry.name!r}: unchanged but digests differ")
    if entry.elements == 0 and {entry.base_digest, entry.target_digest} - {None, EMPTY_DIGEST}:
        raise HeaderInvalidError(f"tensor {entry.name!r}: an empty tensor's digest is BLAKE3('')")
    if entry.op == "modified" and (
        entry.base_digest == entry.target_digest
        or all(c.encoding == "unchanged" for c in entry.chunks)
    ):
        raise HeaderInvalidError(f"tensor {entry.name!r}: modified but nothing changes")


def _parse_chunk(raw: dict[str, Any], inline_feature: bool) -> Chunk:
    encoding = raw["encoding"]
    if encoding not in ENCODINGS:
        raise UnsupportedFeatureError(f"unknown encoding {encoding!r}")
    if encoding == "unchanged":
        return Chunk("unchanged", raw["changed"])
    # Without the feature, "inline" is an ignored member (§4.12): the blob
    # members are then required as in any v1 file.
    inline = raw.get("inline") if inline_feature else None
    blob = {"offset", "length", "checksum"} if inline is None else set()
    missing = ({"codec", "raw_length"} | blob) - set(raw)
    if encoding in ("sparse", "dense"):
        missing |= {"transform"} - set(raw)
    if missing:
        raise HeaderInvalidError(f"{encoding} chunk lacks {', '.join(sorted(missing))}")
    transform = raw.get("transform") if encoding != "full" else None
    if transform is not None and transform not in TRANSFORMS:
        raise UnsupportedFeatureError(f"unknown transform {transform!r}")
    if raw["codec"] not in CODECS:
        raise UnsupportedFeatureError(f"unknown codec {raw['codec']!r}")
    if inline is not None:
        stored = inline_blobs.decode(inline)
        return Chunk(
            encoding, raw["changed"], transform, raw["codec"], 0, len(stored), raw["raw_length"],
            inline=stored,
        )  # fmt: skip
    return Chunk(
        encoding, raw["changed"], transform, raw["codec"], raw["offset"], raw["length"],
        raw["raw_length"], raw["checksum"],
    )  # fmt: skip


def _check_chunk(t: TensorEntry, i: int, c: Chunk, m: int) -> None:
    where = f"tensor {t.name!r} chunk {i}"
    if c.encoding == "unchanged":
        if t.op != "modified" or c.changed != 0:
            raise HeaderInvalidError(f"{where}: unchanged chunk outside a modified tensor")
        return
    if t.op in ("added", "removed") and (c.encoding != "full" or c.changed != m):
        raise HeaderInvalidError(f"{where}: {t.op} tensors hold full chunks with changed = m")
    if not 1 <= c.changed <= m:
        raise HeaderInvalidError(f"{where}: changed {c.changed} outside 1..{m}")
    limit = max_raw_length(m, t.dtype.size) if c.encoding == "sparse" else m * t.dtype.size
    if c.encoding == "sparse" and c.raw_length > limit:
        raise LimitExceededError(f"{where}: raw_length {c.raw_length} exceeds {limit}")
    if c.encoding != "sparse" and c.raw_length != limit:
        raise HeaderInvalidError(f"{where}: raw_length {c.raw_length}, expected {limit}")
    if c.codec == "none" and c.length != c.raw_length:
        raise HeaderInvalidError(f"{where}: codec none with length != raw_length")
    # Encoders store a payload that zstd does not shrink with codec none, which
    # bounds every stored blob by its raw_length (and so by the chunk size).
    if c.codec == "zstd" and c.length >= c.raw_length:
        raise HeaderInvalidError(f"{where}: zstd blob not smaller than its raw_length")
