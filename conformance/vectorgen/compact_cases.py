"""Cases of the compact header form (SPEC §4.11): valid forms and each new rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import checkpoints as ck
from .builder import Delta, build
from .common import Pair, add_valid
from .compactform import form
from .edge import changed, cycling
from .host import Host, host_delta, host_pair
from .layouts import BASE_HEADER, shard_tensors
from .suite import Suite

SECTION = "§4.11"
EXPAND = (
    "a reader expands a compact header into the v1 form and applies every rule of §4.3 to §4.10 "
    "to the expanded header"
)
C1 = "C1: a chunk has a member offset → header-invalid (by the schema)"
C3 = ("C3: same_as_base in the base side, a target file's same_as_base names no file of the "
      "base side, or the target index says same_as_base and the base has none → "
      "header-invalid")  # fmt: skip
C4 = ("C4: a side with an index has a canonical file and the index text is not a JSON text with "
      "an object weight_map → header-invalid")  # fmt: skip
DIGEST = ("digests are 43 characters of unpadded base64url, the last one of AEIMQUYcgkosw048 "
          "(schema) → header-invalid")  # fmt: skip
FILES = ("each element of files is exactly one of {path, header}, {path, canonical[, metadata]}, "
         "{path, same_as_base: file name} (schema) → header-invalid")  # fmt: skip
Edit = Callable[[dict[str, Any]], None]


def _compact(delta: Delta, edit: Edit | None = None, **records: dict[str, str]) -> Delta:
    delta.form = form(edit, **records)
    return delta


def _mixed_pair() -> Pair:
    """Element sizes 1, 4 and 2 under names a, b, c: canonical order b, c, a."""
    a_b, a_t = changed("compact", "a", "I8", (3,), 0.7)
    b_b, b_t = changed("compact", "b", "F32", (2, 3), 0.5)
    c_b, c_t = changed("compact", "c", "BF16", (4,), 0.5)
    meta = {"note": "caf\u00e9 \"q\"\n", "format": "pt"}  # not in key order
    return Pair("compact-mixed", ck.single([a_b, b_b, c_b], meta), ck.single([a_t, b_t, c_t], meta))


def _same_header_pair() -> Pair:
    a_b, a_t = changed("compact-same", "a", "F32", (2, 2), 0.5)
    b_b, b_t = changed("compact-same", "b", "F16", (3,), 0.5)
    return Pair("compact-same-header", ck.with_header([a_b, b_b], BASE_HEADER),
                ck.with_header([a_t, b_t], BASE_HEADER, name="step-2.safetensors"))  # fmt: skip


def _shard_pair() -> Pair:
    base_t, _ = shard_tensors()
    target_t = [base_t[0], base_t[1], base_t[2], changed("compact-shard", "d", "F16", (4,), 0.5)[1]]
    two = {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
           "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}
    return Pair("compact-shards", ck.sharded(base_t, two), ck.sharded(target_t, two))


def _long_names(doc: dict[str, Any]) -> None:
    """Members the compact form does not define: v1 names with wrong values, ignored."""
    for entry in doc["tensors"]:
        entry["name"], entry["dtype"] = "ignored", "F4"
        for chunk in entry.get("c", []):
            chunk["codec"], chunk["length"], chunk["x-note"] = "none", 0, [1]
            if chunk["e"] != "unchanged":
                chunk.setdefault("z", "zstd")


def _host() -> tuple[Pair, Delta]:
    pair = host_pair()
    return pair, host_delta(pair)


def _built(make: Callable[[], Pair]) -> Callable[[], tuple[Pair, Delta]]:
    def pair_and_delta() -> tuple[Pair, Delta]:
        pair = make()
        return pair, build(pair.base, pair.target, 4, cycling)

    return pair_and_delta


Make = Callable[[], tuple[Pair, Delta]]
VALID: list[tuple[str, Make, dict[str, dict[str, str]], Edit | None, str, str]] = [
    ("host", _host, {}, None,
     "the host delta in the compact form: canonical layouts, offsets implied, codec zstd implied",
     EXPAND),
    ("canonical-order", _built(_mixed_pair), {}, None,
     "canonical layouts of tensors of element sizes 1, 4, 2 (canonical order b, c, a, not name "
     "order) with __metadata__ (members not in key order) whose strings need escapes",
     "the canonical header: order by decreasing element size, then UTF-8 name; offsets from 0; "
     "compact JSON; pad to 8"),
    ("same-as-base", _built(_same_header_pair), {}, None,
     "a non-canonical base header stored verbatim; the target file, of another name, says "
     "same_as_base model.safetensors", "same_as_base P: the header text of the base side's "
     "file whose path is P"),
    ("verbatim", _built(_mixed_pair), {"base": {"model.safetensors": "text"},
                               "target": {"model.safetensors": "text"}}, None,
     "canonical headers stored verbatim anyway (a writer's choice)", EXPAND),
    ("sharded-same-index", _built(_shard_pair),
     {"target": {"model-00001-of-00002.safetensors": "same"}}, None,
     "two shards on both sides: base shards canonical with __metadata__, target shard 1 "
     "same_as_base, shard 2 canonical, index same_as_base", "canonical: the tensors that the "
     "side's weight_map maps to the file"),
    ("ignored-long-names", _built(_mixed_pair), {}, _long_names,
     "v1 member names with wrong values beside the compact ones, and an explicit z: zstd: the "
     "v1 names are unknown members in the compact form and are ignored", "§4.2 unknown keys"),
]  # fmt: skip


def add_compact_valid(suite: Suite) -> None:
    for name, make, records, edit, what, rule in VALID:
        pair, delta = make()
        add_valid(suite, f"valid/compact/{name}", pair, _compact(delta, edit, **records),
                  what, SECTION, rule)  # fmt: skip


def _first_blob(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for e in doc["tensors"] for c in e.get("c", []) if c["e"] != "unchanged")


def _pad_bits(doc: dict[str, Any]) -> None:
    """The target digest's last character with a low bit set: same bytes to a lax decoder."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    digest = doc["target"]["digest"]
    doc["target"]["digest"] = digest[:-1] + alphabet[alphabet.index(digest[-1]) + 1]


def _hex_digest(doc: dict[str, Any]) -> None:
    entry = next(e for e in doc["tensors"] if "b" in e)
    entry["b"] = "00" * 32


def _set_file(side: str, **members: Any) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        doc[side]["files"][0] = {"path": doc[side]["files"][0]["path"], **members}

    return edit


def _long_entries(doc: dict[str, Any]) -> None:
    entry = doc["tensors"][0]
    doc["tensors"][0] = {"name": entry["n"], "op": entry["o"], "dtype": entry["d"],
                         "shape": entry["s"], **{k: v for k, v in entry.items() if len(k) > 1}}


INVALID: list[tuple[str, Edit, str, str]] = [
    ("compact-chunk-offset", lambda d: _first_blob(d).update(offset=0), C1,
     "the first blob's chunk has offset 0 (its true offset)"),
    ("compact-lengths-past-end", lambda d: _first_blob(d).update(l=_first_blob(d)["l"] + 1),
     "C1: expanded offsets are the running sum of l; the lengths sum to D (§4.7) → "
     "header-invalid", "the first blob's l is 1 too large (its checksum matches its bytes)"),
    ("compact-digest-pad-bits", _pad_bits, DIGEST,
     "the target digest's last character has a nonzero unused bit (same 32 bytes)"),
    ("compact-digest-hex", _hex_digest, DIGEST, "a tensor digest written as 64 hex digits"),
    ("compact-base-same-as-base", _set_file("base", same_as_base="model.safetensors"), C3,
     "the base side's file says same_as_base"),
    ("compact-same-as-base-no-such-file", _set_file("target", same_as_base="other.safetensors"),
     C3, "the target file says same_as_base other.safetensors; the base has model.safetensors"),
    ("compact-file-two-forms", lambda d: d["target"]["files"][0].update(header="{}"), FILES,
     "the target file has canonical: true and a header"),
    ("compact-metadata-with-text", _set_file("base", header="{}", metadata={}), FILES,
     "a base file record with header and metadata"),
    ("compact-v1-entry", _long_entries,
     "compact_tensor requires n, o, d, s (schema) → header-invalid",
     "the first tensor entry uses the v1 member names"),
]  # fmt: skip


def add_compact_invalid(host: Host) -> None:
    for name, edit, rule, what in INVALID:
        host.mutated(name, lambda d, e=edit: _compact(d, e), "header-invalid", SECTION, rule,
                     what)  # fmt: skip
    _add_index_cases(host)


def _bad_index(doc: dict[str, Any]) -> None:
    doc["target"]["index"]["text"] = "{"


def _index_same_as_base(doc: dict[str, Any]) -> None:
    doc["target"]["index"] = {"path": doc["target"]["index"]["path"], "same_as_base": True}


def _add_index_cases(host: Host) -> None:
    base_t, target_t = shard_tensors()
    three = {"a": "model-00001-of-00003.safetensors", "b": "model-00002-of-00003.safetensors",
             "e": "model-00002-of-00003.safetensors", "d": "model-00003-of-00003.safetensors"}
    pair = Pair("layout-single-to-sharded", ck.single(base_t), ck.sharded(target_t, three))
    paths = pair.paths(host.suite)
    cases = [
        ("compact-canonical-index-not-json", _bad_index, C4,
         "target shards canonical, the target index text is not JSON"),
        ("compact-index-same-as-base-no-index", _index_same_as_base, C3,
         "the target index says same_as_base; the base has no index"),
    ]
    for name, edit, rule, what in cases:
        delta = _compact(build(pair.base, pair.target, 16, cycling), edit)
        host.add(name, delta.to_bytes(), "header-invalid", SECTION, rule, what, pair=paths,
                 out="out")  # fmt: skip


def _tensor_named_metadata(host: Host) -> None:
    """A canonical file of a tensor named ``__metadata__``: no safetensors header can hold
    it (the name is the metadata member's), so the expanded layout breaks L1."""
    pairs = [changed("meta", "m", "F32", (16,), 0.5), changed("meta", "w", "F32", (16,), 0.5)]
    delta = build(ck.single([b for b, _ in pairs]), ck.single([t for _, t in pairs]), 32,
                  cycling)  # fmt: skip
    for entry in delta.doc["tensors"]:
        if entry["name"] == "m":
            entry["name"] = "__metadata__"
    rule = (f"{EXPAND}: L1, a canonical file's tensor named __metadata__ (the name of the "
            "safetensors metadata member) makes no valid safetensors header → header-invalid")
    host.add("compact-tensor-named-metadata", _compact(delta).to_bytes(), "header-invalid",
             SECTION, rule, "a tensor named __metadata__ in canonical files of both sides")


def add_compact_cases(host: Host) -> None:
    add_compact_valid(host.suite)
    add_compact_invalid(host)
    _tensor_named_metadata(host)

