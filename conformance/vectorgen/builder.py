"""Assembling delta files from chosen per-chunk encodings.

The reference encoder picks encodings by size, so it never writes most of the
(encoding, transform, codec) combinations a decoder must read.  :func:`build`
writes a delta whose every chunk uses the :class:`ChunkPlan` a chooser gives
it.  The header is kept as a dict whose chunk objects carry their payload
under private ``_raw``/``_stored`` keys, so that invalid cases can change one
thing and then :meth:`Delta.to_bytes` recomputes every offset, checksum and
digest that the case is not about.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import blake3
import zstandard

from wdelta.format.container import pack_prefix
from wdelta.format.digest import TensorIdentity, checkpoint_digest

from . import payload
from .checkpoints import Checkpoint, TensorData

GENERATOR = "wdelta-conformance/1"
INLINE_FEATURE = "inline-blobs"


@dataclass(frozen=True)
class ChunkPlan:
    """How to store one chunk that has changes.

    ``coding`` and ``k`` apply to ``sparse`` only; ``k`` None picks the
    smallest Rice streams.  ``zstd_checksum`` adds zstd's own frame checksum.
    """

    encoding: str
    transform: str | None = None
    codec: str = "zstd"
    coding: int = payload.RICE
    k: int | None = None
    zstd_checksum: bool = False


Chooser = Callable[[str, int], ChunkPlan]


def uniform(plan: ChunkPlan) -> Chooser:
    """The same plan for every changed chunk."""
    return lambda name, index: plan


def zstd_frame(raw: bytes, *, checksum: bool = False, content_size: bool = True) -> bytes:
    """One zstd frame (level 3) of ``raw``."""
    cctx = zstandard.ZstdCompressor(
        level=3, write_content_size=content_size, write_checksum=checksum
    )
    return bytes(cctx.compress(raw))


def store(raw: bytes, codec: str, checksum: bool = False) -> tuple[str, bytes]:
    """(codec, stored bytes): zstd only when its frame is smaller (SPEC K11), else none."""
    if codec == "zstd":
        frame = zstd_frame(raw, checksum=checksum)
        if len(frame) < len(raw):
            return "zstd", frame
    return "none", raw


def chunk_payload(plan: ChunkPlan, base: list[int], target: list[int], size: int) -> bytes:
    """The raw payload of a changed chunk (``base`` unused for ``full``)."""
    if plan.encoding == "full":
        return _le_bytes(target, size)
    assert plan.transform is not None
    values = payload.transformed(plan.transform, base, target, size)
    if plan.encoding == "dense":
        return payload.planes(values, size)
    pos = [i for i, (b, t) in enumerate(zip(base, target, strict=True)) if b != t]
    changed = [values[i] for i in pos]
    k = 0 if plan.coding == payload.BITMAP else plan.k
    if k is None:
        k = payload.best_k(payload.gaps(pos))
    return payload.sparse(pos, changed, len(base), size, plan.coding, k)


def _le_bytes(words: list[int], size: int) -> bytes:
    return b"".join(w.to_bytes(size, "little") for w in words)


def new_chunk(plan: ChunkPlan, raw: bytes, changed: int) -> dict[str, Any]:
    """A chunk object for a payload (offset, length and checksum filled later).

    The plan's codec ``zstd`` falls back to ``none`` when zstd does not shrink.
    """
    chunk: dict[str, Any] = {"encoding": plan.encoding, "changed": changed}
    if plan.encoding != "full":
        chunk["transform"] = plan.transform
    chunk["codec"], chunk["_stored"] = store(raw, plan.codec, plan.zstd_checksum)
    chunk["raw_length"] = len(raw)
    chunk["_raw"] = raw
    return chunk


def inline_text(stored: bytes) -> str:
    """SPEC §4.12: unpadded base64url of a blob's stored bytes."""
    return base64.urlsafe_b64encode(stored).decode("ascii").rstrip("=")


def set_inline(delta: Delta, chunks: list[dict[str, Any]]) -> None:
    """Carry ``chunks``' blobs in the header (§4.12) and list feature inline-blobs."""
    for c in chunks:
        c["_inline"] = True
    if INLINE_FEATURE not in delta.doc["required_features"]:
        delta.doc["required_features"].append(INLINE_FEATURE)


def set_stored(chunk: dict[str, Any], stored: bytes) -> None:
    """Replace a chunk's stored bytes (length and checksum follow)."""
    chunk["_stored"] = stored


def set_raw(chunk: dict[str, Any], raw: bytes, codec: str | None = None) -> None:
    """Replace a chunk's payload, update raw_length, store it (zstd if it shrinks)."""
    chunk["_raw"] = raw
    chunk["raw_length"] = len(raw)
    chunk["codec"], chunk["_stored"] = store(raw, codec or chunk["codec"])


@dataclass
class Delta:
    """A delta under construction: the header dict plus layout overrides.

    ``relayout`` False keeps hand-set offsets/lengths; ``sign`` False keeps
    hand-set side digests; ``data`` replaces the data section (normally the
    blobs in header order); ``extra_data`` is appended to it; ``form``
    rewrites the finished header object (the compact form, SPEC §4.11).
    """

    doc: dict[str, Any]
    relayout: bool = True
    sign: bool = True
    data: bytes | None = None
    extra_data: bytes = b""
    header_hook: Callable[[bytes], bytes] | None = None
    form: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    prefix_hook: Callable[[bytes], bytes] | None = None
    file_hook: Callable[[bytes], bytes] | None = None

    def chunks(self) -> list[dict[str, Any]]:
        """Every chunk object holding a blob, in header order."""
        return [c for t in self.doc["tensors"] for c in t.get("chunks", []) if "_stored" in c]

    def data_chunks(self) -> list[dict[str, Any]]:
        """The chunks whose blob is in the data section: not marked ``_inline`` (§4.12)."""
        return [c for c in self.chunks() if not c.get("_inline")]

    def tensor(self, name: str, op: str | None = None) -> dict[str, Any]:
        """The tensor entry ``name`` (with ``op`` when a name appears twice)."""
        found: list[dict[str, Any]] = [
            t for t in self.doc["tensors"] if t["name"] == name and op in (None, t["op"])
        ]
        assert len(found) == 1, (name, op, len(found))
        return found[0]

    def copy(self) -> Delta:
        return copy.deepcopy(self)

    def _layout(self) -> bytes:
        """Fill offsets, lengths, checksums and side digests; return the data section."""
        if self.relayout:
            cursor = 0
            for c in self.chunks():
                if c.get("_inline"):
                    for member in ("offset", "length", "checksum"):
                        c.pop(member, None)
                    c["inline"] = inline_text(c["_stored"])
                    continue
                c["offset"], c["length"] = cursor, len(c["_stored"])
                c["checksum"] = blake3.blake3(c["_stored"]).hexdigest()
                cursor += len(c["_stored"])
        if self.sign:
            sign_sides(self.doc)
        data = self.data
        if data is None:
            data = b"".join(c["_stored"] for c in self.data_chunks())
        return data + self.extra_data

    def freeze(self) -> None:
        """Fix offsets, checksums, digests and data as they are now.

        Later edits of the header then change nothing else, which schema
        cases need (a broken field may make recomputation impossible).
        """
        self.data = self._layout()
        self.relayout = self.sign = False

    def header_bytes(self) -> bytes:
        """The header JSON (after ``header_hook``), without padding."""
        self._layout()
        doc = public(self.doc)
        if self.form is not None:
            doc = self.form(doc)
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        header = text.encode("utf-8")
        return self.header_hook(header) if self.header_hook is not None else header

    def to_bytes(self) -> bytes:
        """The delta file: checksums, offsets and digests recomputed unless overridden."""
        data = self._layout()
        header = self.header_bytes()
        header += b" " * (-len(header) % 8)
        prefix = pack_prefix(header, len(data))
        if self.prefix_hook is not None:
            prefix = self.prefix_hook(prefix)
        out = prefix + header + data
        return self.file_hook(out) if self.file_hook is not None else out


def public(value: Any) -> Any:
    """A deep copy of a header value without the private ``_`` keys."""
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [public(v) for v in value]
    return value


def sign_sides(doc: dict[str, Any]) -> None:
    """Recompute ``base.digest``/``target.digest`` from the tensor entries."""
    for side, absent in (("base", "added"), ("target", "removed")):
        ids = [
            TensorIdentity(t["name"], t["dtype"], tuple(t["shape"]), t[f"{side}_digest"])
            for t in doc["tensors"] if t["op"] != absent and f"{side}_digest" in t
        ]  # fmt: skip
        doc[side]["digest"] = checkpoint_digest(ids)


def tensor_digest(t: TensorData) -> str:
    return str(blake3.blake3(t.data).hexdigest())


def side_json(ckpt: Checkpoint) -> dict[str, Any]:
    """The layout of one side (digest filled in by :func:`sign_sides`)."""
    files = [{"path": p, "header": text} for p, text in ckpt.files]
    index = None if ckpt.index is None else {"path": ckpt.index[0], "text": ckpt.index[1]}
    return {"digest": "", "files": files, "index": index}


def _words(t: TensorData, start: int, count: int) -> list[int]:
    return [int(w) for w in t.words()[start : start + count]]


def _spans(t: TensorData, chunk_elements: int) -> list[tuple[int, int]]:
    n = t.elements
    return [(s, min(chunk_elements, n - s)) for s in range(0, n, chunk_elements)]


def _entry(t: TensorData, op: str) -> dict[str, Any]:
    return {"name": t.name, "op": op, "dtype": t.dtype, "shape": list(t.shape)}


def _modified(b: TensorData, t: TensorData, chunk_elements: int, choose: Chooser) -> dict[str, Any]:
    digests = {"base_digest": tensor_digest(b), "target_digest": tensor_digest(t)}
    if b.data == t.data:
        return {**_entry(t, "unchanged"), **digests}
    chunks: list[dict[str, Any]] = []
    for i, (start, m) in enumerate(_spans(t, chunk_elements)):
        bw, tw = _words(b, start, m), _words(t, start, m)
        changed = sum(x != y for x, y in zip(bw, tw, strict=True))
        if changed == 0:
            chunks.append({"encoding": "unchanged", "changed": 0})
            continue
        plan = choose(t.name, i)
        chunks.append(new_chunk(plan, chunk_payload(plan, bw, tw, t.size), changed))
    return {**_entry(t, "modified"), **digests, "chunks": chunks}


def full_chunks(t: TensorData, chunk_elements: int, plan: ChunkPlan) -> list[dict[str, Any]]:
    """Full chunks holding every element of ``t``."""
    return [
        new_chunk(plan, _le_bytes(_words(t, start, m), t.size), m)
        for start, m in _spans(t, chunk_elements)
    ]


def build(
    base: Checkpoint, target: Checkpoint, chunk_elements: int, choose: Chooser, *,
    keep_removed: bool = True, full: ChunkPlan = ChunkPlan("full"),
) -> Delta:  # fmt: skip
    """The delta base -> target with the chunk plans ``choose`` gives.

    Tensors whose dtype or shape changes become a removal and an addition;
    ``keep_removed`` stores removed tensors (needed for reverse application);
    ``full`` is the plan of added and removed tensors' chunks.
    """
    bmap, tmap = base.by_name, target.by_name
    entries: list[dict[str, Any]] = []
    for name in sorted(set(bmap) | set(tmap), key=lambda n: n.encode("utf-8")):
        b, t = bmap.get(name), tmap.get(name)
        if b is not None and t is not None and (b.dtype, b.shape) == (t.dtype, t.shape):
            entries.append(_modified(b, t, chunk_elements, choose))
            continue
        if b is not None:
            entry = {**_entry(b, "removed"), "base_digest": tensor_digest(b)}
            if keep_removed:
                entry["chunks"] = full_chunks(b, chunk_elements, full)
            entries.append(entry)
        if t is not None:
            chunks = full_chunks(t, chunk_elements, full)
            entries.append(
                {**_entry(t, "added"), "target_digest": tensor_digest(t), "chunks": chunks}
            )
    doc = {
        "version": 1,
        "required_features": [],
        "generator": GENERATOR,
        "chunk_elements": chunk_elements,
        "reversible": all(reversible_entry(e) for e in entries),
        "base": side_json(base),
        "target": side_json(target),
        "tensors": entries,
    }
    return Delta(doc)


def reversible_entry(entry: dict[str, Any]) -> bool:
    """Whether an entry can be applied target -> base (SPEC "reversible")."""
    if entry["op"] == "removed":
        n = 1
        for dim in entry["shape"]:
            n *= dim
        return "chunks" in entry or n == 0
    chunks = entry.get("chunks", [])
    return entry["op"] != "modified" or all(c["encoding"] != "full" for c in chunks)
