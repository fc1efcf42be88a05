"""Valid cases about files and header text: shards, exact safetensors headers,
names, chunk sizes, unknown keys and padding."""

from __future__ import annotations

import json
from typing import Any

from . import checkpoints as ck
from .builder import Delta, build, uniform
from .common import Pair, add_valid
from .edge import CYCLE, RICE_SUB, changed, cycling, same
from .suite import Suite, valid

SHARD_RULE = (
    "the output is built from the layout of the output side; the output files are "
    "byte-identical to the side's original files"
)


def shard_tensors() -> tuple[list[ck.TensorData], list[ck.TensorData]]:
    a_b, a_t = changed("shard", "a", "F32", (8, 8), 0.1)
    d_b, d_t = changed("shard", "d", "F16", (4,), 0.5)
    b, c, e = (
        same("shard", "b", "BF16", (16,)),
        same("shard", "c", "I8", (5,)),
        same("shard", "e", "U8", (3, 3)),
    )
    return [a_b, b, c, d_b], [a_t, b, d_t, e]


def add_shards(suite: Suite) -> None:
    base_t, target_t = shard_tensors()
    two = {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
        "d": "model-00002-of-00002.safetensors",
    }
    three = {
        "a": "model-00001-of-00003.safetensors",
        "b": "model-00002-of-00003.safetensors",
        "e": "model-00002-of-00003.safetensors",
        "d": "model-00003-of-00003.safetensors",
    }
    sharded_base, sharded_target = ck.sharded(base_t, two), ck.sharded(target_t, three)
    cases = {
        "sharded": (sharded_base, sharded_target, "2 shards -> 3 shards, tensors moving"),
        "sharded-to-single": (sharded_base, ck.single(target_t), "2 shards -> one file"),
        "single-to-sharded": (ck.single(base_t), sharded_target, "one file -> 3 shards"),
    }
    for name, (base, target, what) in cases.items():
        pair = Pair(f"layout-{name}", base, target)
        delta = build(base, target, 16, cycling)
        add_valid(suite, f"valid/layout/{name}", pair, delta,
                  f"sharded checkpoints with an index: {what}; output shards and index "
                  "byte-identical", "§10.4", SHARD_RULE)  # fmt: skip


BASE_HEADER = (
    '{"b": {"dtype": "F16", "shape": [3], "data_offsets": [16, 22]}, '
    '"__metadata__": {"format": "pt", "note": "caf\u00e9 \u2713"}, '
    '"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}             '
)
TARGET_HEADER = (
    '{"__metadata__":{"step":"2","format":"pt"},'
    '"a":{"data_offsets":[0,16],"shape":[2,2],"dtype":"F32"},'
    '"b":{"shape":[3],"data_offsets":[16,22],"dtype":"F16"}}'
)


def add_exact_headers(suite: Suite) -> None:
    a_b, a_t = changed("exact", "a", "F32", (2, 2), 0.5)
    b_b, b_t = changed("exact", "b", "F16", (3,), 0.5)
    pair = Pair("layout-exact-header", ck.with_header([a_b, b_b], BASE_HEADER),
                ck.with_header([a_t, b_t], TARGET_HEADER))  # fmt: skip
    add_valid(suite, "valid/layout/exact-header", pair, build(pair.base, pair.target, 4, cycling),
              "non-canonical safetensors headers (key order, spaces, non-ASCII __metadata__, "
              "odd padding) that differ between base and target: reproduced byte for byte",
              "§10.4", SHARD_RULE)  # fmt: skip


NAMES = ("a", "Z", "_", "\u00e9", "\uff61", "\U0001f600", "layer.10.w", "layer.9.w")


def add_names(suite: Suite) -> None:
    pairs = [changed("names", n, "BF16", (5,), 0.4, (1,)) for n in NAMES]
    pair = Pair("layout-names", ck.single([p[0] for p in pairs]),
                ck.single([p[1] for p in pairs]))  # fmt: skip
    delta = build(pair.base, pair.target, 8, uniform(RICE_SUB))
    add_valid(suite, "valid/layout/utf8-names", pair, delta,
              "tensor names sorted by UTF-8 bytes: U+FF61 before U+1F600 (UTF-16 order differs)",
              "§4.5", "sort keys: the UTF-8 bytes of name, compared bytewise")  # fmt: skip
    escaped = delta.copy()
    escaped.header_hook = _ascii_json
    add_valid(suite, "valid/layout/utf8-names-escaped", pair, escaped,
              "the same header written with JSON \\u escapes (surrogate pairs) instead of UTF-8",
              "§4.1", "strings that unescape to the same characters are equal however they "
              "are escaped")  # fmt: skip


def add_more_layouts(suite: Suite) -> None:
    """An empty tensor name, a single file with an index, an input laid out differently."""
    pairs = [changed("empty-name", n, "F32", (3,), 0.6, (0,)) for n in ("", "x")]
    pair = Pair("layout-empty-name", ck.single([p[0] for p in pairs]),
                ck.single([p[1] for p in pairs]))  # fmt: skip
    add_valid(suite, "valid/layout/empty-name", pair, build(pair.base, pair.target, 2, cycling),
              'a tensor named "" (the empty string sorts first)', "§4.4",
              "name: string (may be empty)")  # fmt: skip
    base_t, target_t = shard_tensors()
    one = {t.name: "model.safetensors" for t in target_t}
    pair = Pair("layout-indexed-single", ck.single(base_t), ck.sharded(target_t, one))
    add_valid(suite, "valid/layout/single-file-with-index", pair,
              build(pair.base, pair.target, 16, cycling),
              "a target of one safetensors file plus an index: the output is a folder",
              "§4.9", "a single-file checkpoint MAY have an index; its output is then a "
              "folder")  # fmt: skip
    _add_resharded_input(suite)


def _add_resharded_input(suite: Suite) -> None:
    base_t, target_t = shard_tensors()
    two = {
        "a": "p-1.safetensors",
        "b": "p-2.safetensors",
        "c": "p-2.safetensors",
        "d": "p-1.safetensors",
    }
    three = {"a": "q-1.safetensors", "b": "q-1.safetensors", "d": "q-2.safetensors",
             "e": "q-3.safetensors"}  # fmt: skip
    recorded = Pair("layout-recorded", ck.sharded(base_t, two), ck.sharded(target_t, three))
    delta = build(recorded.base, recorded.target, 16, cycling)
    path = suite.blob("delta/valid/layout/input-resharded.wdelta", delta.to_bytes())
    rule = (
        "only the input's tensor names, dtypes, shapes and bytes matter: its file names, "
        "sharding, metadata and tensor order need not match the recorded layout"
    )
    given = Pair("layout-given", ck.single(base_t, {"any": "metadata"}), ck.single(target_t))
    base, target = given.paths(suite)
    suite.add(
        "decoder/valid/layout/input-resharded",
        "decoder",
        "a delta recording a 2-shard base applied to the same tensors in one file",
        "§10.3",
        rule,
        {"base": base, "delta": path},
        valid(recorded.target),
    )
    suite.add(
        "reverse/valid/layout/input-resharded",
        "reverse",
        "a delta recording a 3-shard target applied in reverse to the same tensors in one file",
        "§10.3",
        rule,
        {"target": target, "delta": path},
        valid(recorded.base),
    )


def _ascii_json(header: bytes) -> bytes:
    return json.dumps(json.loads(header), ensure_ascii=True, separators=(",", ":")).encode()


def add_chunking(suite: Suite) -> None:
    b, t = changed("many", "w", "F16", (4, 25), 0.3)
    t = ck.TensorData("w", "F16", (4, 25), t.data[:70] + b.data[70:84] + t.data[84:])
    pair = Pair("chunk-many", ck.single([b]), ck.single([t]))
    add_valid(suite, "valid/chunking/many-chunks", pair, build(pair.base, pair.target, 7, cycling),
              "100 elements in chunks of 7 (15 chunks, the last of 2), every plan in turn, "
              "chunk 5 unchanged", "§7.1",
              "chunk i covers elements [i·C, min((i+1)·C, n))")  # fmt: skip
    b, t = changed("one", "w", "I32", (10,), 0.5, (0, 9))
    pair = Pair("chunk-one", ck.single([b]), ck.single([t]))
    add_valid(suite, "valid/chunking/chunk-elements-1", pair,
              build(pair.base, pair.target, 1, lambda n, i: CYCLE[i % len(CYCLE)]),
              "chunk_elements = 1: every element its own chunk", "§4.3",
              "chunk_elements: integer ≥ 1")  # fmt: skip
    b, t = changed("max", "w", "BF16", (50,), 0.3)
    pair = Pair("chunk-max", ck.single([b]), ck.single([t]))
    add_valid(suite, "valid/chunking/chunk-elements-max", pair,
              build(pair.base, pair.target, 1 << 26, uniform(RICE_SUB)),
              "chunk_elements = 2^26, the largest a reader must accept", "§4.3",
              "C > 2^26 → limit-exceeded (so 2^26 is valid)")  # fmt: skip


def _unknown_keys(delta: Delta) -> None:
    doc: dict[str, Any] = delta.doc
    doc["x-note"] = {"nested": [1, 2, {"deep": None}]}
    doc["base"]["x-side"] = 1
    doc["target"]["files"][0]["x-file"] = True
    for t in doc["tensors"]:
        t["x-tensor"] = "ignored"
        for c in t.get("chunks", []):
            c["x-chunk"] = None


def add_header_text(suite: Suite) -> None:
    b, t = changed("text", "w", "F32", (20,), 0.3, (19,))
    pair = Pair("header-text", ck.single([b]), ck.single([t]))
    base_delta = build(pair.base, pair.target, 8, cycling)
    unknown = base_delta.copy()
    _unknown_keys(unknown)
    add_valid(suite, "valid/header/unknown-keys", pair, unknown,
              "unknown keys at every object level (header, side, file, tensor, chunk)",
              "§4.2", "a reader MUST ignore members not defined by this specification, at "
              "every level of the header")  # fmt: skip
    for pad in (0, 7):
        padded = base_delta.copy()
        padded.doc["generator"] = _generator_for_padding(padded, pad)
        add_valid(suite, f"valid/header/padding-{pad}", pair, padded,
                  f"header JSON followed by {pad} space(s) of padding", "§4.1",
                  "the JSON text is followed by 0 to 7 space bytes so that N mod 8 = "
                  "0")  # fmt: skip
    aligned = base_delta.copy()
    aligned.header_hook = lambda h: h + b" " * (-(64 + len(h)) % 4096)
    add_valid(suite, "valid/header/padding-page-aligned", pair, aligned,
              "header JSON followed by the spaces (fewer than 4096) that make the data "
              "section start at a file offset that is a multiple of 4096", "§4.1",
              "or fewer than 4096 so that the data section starts at a file offset that is a "
              "multiple of 4096 ((64 + N) mod 4096 = 0)")  # fmt: skip
    spaced = base_delta.copy()
    spaced.header_hook = lambda h: (
        json.dumps(
            json.loads(h), indent="\t", separators=(" ,", " :\r\n "), ensure_ascii=False
        ).encode()
        + b"\n"
    )
    add_valid(suite, "valid/header/whitespace", pair, spaced,
              "the header JSON with tabs, CR LF and spaces between tokens and a final line feed",
              "§4.1", "a reader MUST accept any whitespace that RFC 8259 permits around and "
              "inside the JSON text; the padding rule binds writers only")  # fmt: skip
    deep = base_delta.copy()
    deep.header_hook = lambda h: h[:-1] + b',"x-deep":' + b"[" * 63 + b"]" * 63 + b"}"
    add_valid(suite, "valid/header/nesting-64", pair, deep,
              "an unknown member nesting arrays so that the header is 64 levels deep",
              "§4.1", "arrays and objects nested more than 64 levels deep → header-invalid "
              "(64 is allowed)")  # fmt: skip
    bare = base_delta.copy()
    del bare.doc["generator"]
    add_valid(suite, "valid/header/no-generator", pair, bare,
              "no generator member (it is informative only)", "§4.3",
              "generator: optional, informative")  # fmt: skip


def _generator_for_padding(delta: Delta, pad: int) -> str:
    for extra in range(8):
        delta.doc["generator"] = "wdelta-conformance/1" + "+" * extra
        if -len(delta.header_bytes()) % 8 == pad:
            return str(delta.doc["generator"])
    raise AssertionError("unreachable")
