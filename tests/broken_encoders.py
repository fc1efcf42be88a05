"""Encoders written from SPEC.md alone, for the conformance tests: valid variants and broken ones.

    python tests/broken_encoders.py MODE BASE TARGET OUT

They build deltas with conformance/vectorgen's builder (independent of the
reference encoder).  Each VARIANT uses freedoms SPEC grants a writer (§4.1
page padding, §11.1 chunk size, codec, encoding, reversibility, §14 unknown
members) and must pass every encoder case; each BROKEN mode breaks one writer
requirement (W1 to W6 of SPEC §11.1) and the suite must fail it with that
rule's id.  A broken mode whose defect cannot occur in a case (no chunk of
the kind it breaks) writes a valid delta.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "conformance"))

from vectorgen import checkpoints as ck  # noqa: E402
from vectorgen import payload  # noqa: E402
from vectorgen.builder import ChunkPlan, Delta, build, set_raw, uniform  # noqa: E402
from vectorgen.compactform import Form, form  # noqa: E402

from wdelta.checkpoint.source import open_checkpoint  # noqa: E402
from wdelta.errors import WdeltaError  # noqa: E402
from wdelta.format.container import PREFIX_SIZE, pack_prefix  # noqa: E402

RICE = ChunkPlan("sparse", "xor", "zstd", payload.RICE)
FULL = ChunkPlan("full")
Mutation = Callable[[Delta, ck.Checkpoint, ck.Checkpoint], None]


@dataclass(frozen=True)
class Mode:
    """How to write: chunk size, chunk plan, reversibility, header text and padding."""

    chunk: int = 1 << 22
    plan: ChunkPlan = RICE
    full: ChunkPlan = FULL
    keep_removed: bool = True
    pretty: bool = False
    page: bool = False
    extra_pad: int = 0
    lead: bytes = b""
    mutate: Mutation | None = None
    form: Form | None = None  # the compact header form (SPEC §4.11)


def _first(delta: Delta, test: Callable[[dict[str, Any], dict[str, Any]], bool]) -> Any:
    for entry in delta.doc["tensors"]:
        for i, chunk in enumerate(entry.get("chunks", [])):
            if test(entry, chunk):
                return entry, i, chunk
    return None


def _unknown_members(delta: Delta, base: ck.Checkpoint, target: ck.Checkpoint) -> None:
    delta.doc["x-writer-note"] = {"any": ["value", 1]}
    for entry in delta.doc["tensors"]:
        entry["x-stats"] = {"entry": True}
        for chunk in entry.get("chunks", []):
            chunk["x-chunk"] = 0


def _changed_off_by_one(delta: Delta, base: ck.Checkpoint, target: ck.Checkpoint) -> None:
    hit = _first(delta, lambda e, c: c["encoding"] == "dense")
    if hit is not None:
        _, _, chunk = hit
        chunk["changed"] += 1 if chunk["changed"] == 1 else -1


def _ignored_member(delta: Delta, base: ck.Checkpoint, target: ck.Checkpoint) -> None:
    hit = _first(delta, lambda e, c: c["encoding"] in ("unchanged", "full"))
    if hit is not None:
        _, _, chunk = hit
        chunk["transform"] = "xor"


def _extra_position(delta: Delta, base: ck.Checkpoint, target: ck.Checkpoint) -> None:
    """List an unchanged element (value 0) in the first sparse chunk that has one."""
    chunk_elements = delta.doc["chunk_elements"]
    for entry in delta.doc["tensors"]:
        for i, chunk in enumerate(entry.get("chunks", [])):
            if chunk["encoding"] != "sparse":
                continue
            b, t = base.by_name[entry["name"]], target.by_name[entry["name"]]
            start = i * chunk_elements
            bw = [int(w) for w in b.words()[start : start + chunk_elements]]
            tw = [int(w) for w in t.words()[start : start + chunk_elements]]
            same = [j for j, (x, y) in enumerate(zip(bw, tw, strict=True)) if x == y]
            if not same:
                continue
            pos = sorted([j for j in range(len(bw)) if bw[j] != tw[j]] + same[:1])
            values = payload.transformed(chunk["transform"], bw, tw, t.size)
            raw = payload.sparse(pos, [values[j] for j in pos], len(bw), t.size,
                                 payload.BITMAP, 0)  # fmt: skip
            set_raw(chunk, raw)
            chunk["changed"] = len(pos)
            return


def _base_header_respaced(delta: Delta, base: ck.Checkpoint, target: ck.Checkpoint) -> None:
    """Not reversible, and the base side records a header that is not the base's."""
    delta.doc["base"]["files"][0]["header"] += "  "


def _base_canonical(doc: dict[str, Any]) -> None:
    """Base files recorded as canonical without checking that they are (metadata dropped)."""
    doc["base"]["files"] = [{"path": f["path"], "canonical": True} for f in doc["base"]["files"]]


def _compact_ignored_member(doc: dict[str, Any]) -> None:
    """x (transform) on the first unchanged or full chunk, under its compact name."""
    chunks = [c for e in doc["tensors"] for c in e.get("c", []) if c["e"] in ("unchanged", "full")]
    if chunks:
        chunks[0]["x"] = "xor"


VARIANTS: dict[str, Mode] = {
    "page-padding": Mode(page=True),
    "chunk-1000": Mode(chunk=1000),
    "chunk-1": Mode(chunk=1, plan=ChunkPlan("dense", "sub", "zstd")),
    "no-compression": Mode(plan=ChunkPlan("sparse", "sub", "none", payload.BITMAP),
                           full=ChunkPlan("full", codec="none")),
    "dense": Mode(plan=ChunkPlan("dense", "xor", "zstd")),
    "pretty-header": Mode(pretty=True, chunk=7),
    "not-reversible": Mode(plan=ChunkPlan("full"), keep_removed=False),
    "unknown-members": Mode(mutate=_unknown_members, page=True, chunk=64),
    "compact": Mode(form=form()),
    "compact-verbatim": Mode(form=form(target={"model.safetensors": "text"}), chunk=1000),
}  # fmt: skip
BROKEN: dict[str, tuple[Mode, str]] = {
    "leading-whitespace": (Mode(lead=b" "), "W1"),
    "byte-order-mark": (Mode(lead=b"\xef\xbb\xbf"), "header-invalid"),
    "padding-8-to-15": (Mode(extra_pad=8), "W2"),
    "ignored-member": (Mode(mutate=_ignored_member), "W3"),
    "changed-off-by-one": (Mode(plan=ChunkPlan("dense", "xor", "zstd")), "W4"),
    "sparse-extra-position": (Mode(mutate=_extra_position), "W5"),
    "base-layout-respaced": (Mode(plan=ChunkPlan("full"), keep_removed=False,
                                  mutate=_base_header_respaced), "W6"),
    "compact-base-canonical": (Mode(plan=ChunkPlan("full"), keep_removed=False,
                                    form=form(_base_canonical)), "W6"),
    "compact-ignored-member": (Mode(form=form(_compact_ignored_member)), "W3"),
}  # fmt: skip
BROKEN_MUTATIONS: dict[str, Mutation] = {"changed-off-by-one": _changed_off_by_one}


def load(path: Path) -> ck.Checkpoint:
    """A checkpoint file or folder as the builder's in-memory checkpoint."""
    with open_checkpoint(path) as c:
        tensors = tuple(
            ck.TensorData(t.name, t.dtype.name, t.shape, t.read(0, t.elements).tobytes())
            for t in c.sorted_tensors()
        )
        files = tuple((name, f.header_text) for name, f in c.files.items())
        return ck.Checkpoint(tensors, files, c.index)


def _padding(header: bytes, mode: Mode) -> bytes:
    if mode.page:
        return b" " * (-(PREFIX_SIZE + len(header)) % 4096)
    pad = -len(header) % 8 + mode.extra_pad
    if mode.extra_pad and (PREFIX_SIZE + len(header) + pad) % 4096 == 0:
        pad += 8  # stay clear of the permitted page-aligned form
    return b" " * pad


def encode(name: str, base_path: Path, target_path: Path) -> bytes:
    """The delta file that encoder ``name`` writes for base -> target."""
    mode = VARIANTS[name] if name in VARIANTS else BROKEN[name][0]
    base, target = load(base_path), load(target_path)
    delta = build(base, target, mode.chunk, uniform(mode.plan), keep_removed=mode.keep_removed,
                  full=mode.full)  # fmt: skip
    for mutate in (mode.mutate, BROKEN_MUTATIONS.get(name)):
        if mutate is not None:
            mutate(delta, base, target)
    delta.form = mode.form
    if mode.pretty:
        delta.header_hook = lambda h: json.dumps(json.loads(h), indent=2).encode() + b"\n"
    header = mode.lead + delta.header_bytes()
    data = b"".join(c["_stored"] for c in delta.chunks())
    header += _padding(header, mode)
    return pack_prefix(header, len(data)) + header + data


def main(argv: list[str]) -> int:
    name, base, target, out = argv
    try:
        data = encode(name, Path(base), Path(target))
    except WdeltaError as exc:
        print(f"error: {exc.category}: {exc}", file=sys.stderr)
        return 1
    Path(out).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
