"""Invalid file layouts (recorded safetensors headers, index) and blob offsets."""

from __future__ import annotations

import json
from typing import Any

from wdelta.checkpoint.safetensors_header import build_header
from wdelta.format.dtypes import DTYPES

from . import checkpoints as ck
from .builder import Delta, build
from .edge import cycling
from .host import Host
from .invalid_header import Mutation
from .layouts import shard_tensors

BLOB_RULE = (
    "B[0].offset = 0, B[i].offset = B[i-1].offset + B[i-1].length, and the sum of all lengths "
    "equals D → header-invalid"
)


def _target_file(fn: Any) -> Mutation:
    def mutate(delta: Delta) -> None:
        fn(delta.doc["target"]["files"][0])

    return mutate


def _without_c(f: dict[str, Any]) -> None:
    host_target = [("a", "F32", (596,)), ("b", "BF16", (4, 8)), ("e", "F16", (2,))]
    f["header"] = build_header([(n, DTYPES[d], s) for n, d, s in host_target], None).header_text


def _retyped_b(f: dict[str, Any]) -> None:
    old = '"b":{"dtype":"BF16"'
    assert old in f["header"]
    f["header"] = f["header"].replace(old, '"b":{"dtype":"F16"')


def _split_files(delta: Delta) -> None:
    groups = (
        (("a", "F32", (596,)), ("b", "BF16", (4, 8))),
        (("c", "I8", (5,)), ("e", "F16", (2,))),
    )
    delta.doc["target"]["files"] = [
        {"path": f"model-0000{i + 1}-of-00002.safetensors",
         "header": build_header([(n, DTYPES[d], s) for n, d, s in g], None).header_text}
        for i, g in enumerate(groups)
    ]  # fmt: skip


def _edit_header(old: str, new: str) -> Mutation:
    def mutate(delta: Delta) -> None:
        f = delta.doc["target"]["files"][0]
        assert old in f["header"], old
        f["header"] = f["header"].replace(old, new, 1)

    return mutate


LAYOUT_CASES: list[tuple[str, Mutation, str, str]] = [
    ("layout-header-not-json", _target_file(lambda f: f.update(header="{not json")),
     "L1/H1: a files[].header is not UTF-8 JSON whose value is an object → header-invalid",
     "the target file's recorded safetensors header is not JSON"),
    ("layout-metadata-not-string", _edit_header('{"a":', '{"__metadata__":{"step":1},"a":'),
     "L1/H2: __metadata__ is null or an object whose values are all strings → header-invalid",
     'the target header\'s __metadata__ is {"step": 1}'),
    ("layout-tensor-extra-member", _edit_header('"b":{"dtype"', '"b":{"x":0,"dtype"'),
     "L1/H3: a tensor's value has exactly the members dtype, shape and data_offsets → "
     "header-invalid", "tensor b of the target header has an extra member"),
    ("layout-offsets-hole", _edit_header("[2452,2457]", "[2453,2458]"),
     "L1/H5: sorted by (begin, end) the ranges tile [0, L) → header-invalid",
     "a one-byte hole before tensor c in the target header"),
    ("layout-missing-tensor", _target_file(_without_c),
     "L4: the set of (name, dtype, shape) listed differs from the side's entries → "
     "header-invalid", "the target file's header lacks added tensor c"),
    ("layout-dtype-disagrees", _target_file(_retyped_b),
     "L4: the set of (name, dtype, shape) listed differs from the side's entries → "
     "header-invalid", "the target file's header gives b dtype F16, the tensor list BF16"),
    ("layout-two-files-no-index", _split_files,
     "L3: index is null and there is not exactly one file → header-invalid",
     "two target files and index: null"),
]  # fmt: skip


def _index(fn: Any) -> Mutation:
    def mutate(delta: Delta) -> None:
        fn(delta.doc["target"])

    return mutate


def _wrong_weight_map(side: dict[str, Any]) -> None:
    doc = json.loads(side["index"]["text"])
    doc["weight_map"]["a"] = "model-00003-of-00003.safetensors"
    side["index"]["text"] = json.dumps(doc, indent=2) + "\n"


def _same_path(side: dict[str, Any]) -> None:
    side["files"][1]["path"] = side["files"][0]["path"]


SHARD_CASES: list[tuple[str, Mutation, str, str]] = [
    ("layout-index-disagrees", _index(_wrong_weight_map),
     "L5: weight_map maps each tensor to the path of the file that lists it → header-invalid",
     "the target index maps a to a shard whose header does not list it"),
    ("layout-duplicate-file", _index(_same_path),
     "L2: two files have the same path → header-invalid", "two target shards with one path"),
    ("layout-index-not-json", _index(lambda s: s["index"].update(text="{")),
     "L5: index.text is not a JSON text meeting §4.1 → header-invalid",
     "the target index text is not JSON"),
    ("layout-index-path-traversal", _index(lambda s: s["index"].update(
        path="../model.safetensors.index.json")),
     "index.path matches ^[A-Za-z0-9][A-Za-z0-9._-]*\\.safetensors\\.index\\.json$ (schema) "
     "→ header-invalid", "target index path ../model.safetensors.index.json"),
    ("layout-index-path-suffix", _index(lambda s: s["index"].update(path="index.json")),
     "index.path matches ^[A-Za-z0-9][A-Za-z0-9._-]*\\.safetensors\\.index\\.json$ (schema) "
     "→ header-invalid", "target index path index.json"),
]  # fmt: skip


def add_layout_cases(host: Host) -> None:
    for name, mutate, rule, what in LAYOUT_CASES:
        host.mutated(name, mutate, "header-invalid", "§4.9", rule, what)
    base_t, target_t = shard_tensors()
    two = {
        "a": "s-1.safetensors",
        "b": "s-1.safetensors",
        "c": "s-2.safetensors",
        "d": "s-2.safetensors",
    }
    three = {
        "a": "model-00001-of-00003.safetensors",
        "b": "model-00002-of-00003.safetensors",
        "e": "model-00002-of-00003.safetensors",
        "d": "model-00003-of-00003.safetensors",
    }
    base, target = ck.sharded(base_t, two), ck.sharded(target_t, three)
    paths = (host.suite.checkpoint("shards-base", base),
             host.suite.checkpoint("shards-target", target))  # fmt: skip
    for name, mutate, rule, what in SHARD_CASES:
        delta = build(base, target, 16, cycling)
        mutate(delta)
        host.add(name, delta.to_bytes(), "header-invalid", "§4.9", rule, what, pair=paths,
                 out="out")  # fmt: skip
    _add_blob_cases(host)


def _frozen(fn: Any) -> Mutation:
    def mutate(delta: Delta) -> None:
        delta.freeze()
        fn(delta, delta.chunks())

    return mutate


def _gap(delta: Delta, chunks: list[dict[str, Any]]) -> None:
    assert delta.data is not None
    cut = chunks[0]["length"]
    delta.data = delta.data[:cut] + b"\x00" + delta.data[cut:]
    for c in chunks[1:]:
        c["offset"] += 1


def _lead(delta: Delta, chunks: list[dict[str, Any]]) -> None:
    assert delta.data is not None
    delta.data = b"\x00" + delta.data
    for c in chunks:
        c["offset"] += 1


def _swap(delta: Delta, chunks: list[dict[str, Any]]) -> None:
    assert delta.data is not None
    first, second = chunks[0], chunks[1]
    one, two = (
        delta.data[: first["length"]],
        delta.data[first["length"] : second["offset"] + second["length"]],
    )
    delta.data = two + one + delta.data[len(one) + len(two) :]
    first["offset"], second["offset"] = len(two), 0


BLOB_CASES: list[tuple[str, Mutation, str]] = [
    ("blob-overlap", _frozen(lambda d, c: c[1].update(offset=c[1]["offset"] - 1)),
     "the second blob starts 1 byte before the first ends"),
    ("blob-gap", _frozen(_gap), "one unused byte between the first two blobs"),
    ("blob-first-offset-nonzero", _frozen(_lead), "the first blob at offset 1"),
    ("blob-length-past-end", _frozen(lambda d, c: c[-1].update(length=c[-1]["length"] + 1)),
     "the last blob's length runs 1 byte past the data section"),
    ("blob-offset-past-end", _frozen(lambda d, c: c[-1].update(offset=c[-1]["offset"] + 100)),
     "the last blob's offset lies past the data section"),
    ("blob-offset-huge", _frozen(lambda d, c: c[-1].update(offset=(1 << 64) - 1)),
     "the last blob's offset is 2^64 - 1 (offset + length overflows 64 bits)"),
    ("blob-uncovered-tail", _frozen(lambda d, c: setattr(d, "extra_data", b"\x00")),
     "a data byte after the last blob"),
    ("blobs-out-of-order", _frozen(_swap),
     "the first two blobs stored in swapped order (each checksum matches its bytes)"),
]  # fmt: skip


def _add_blob_cases(host: Host) -> None:
    for name, mutate, what in BLOB_CASES:
        host.mutated(name, mutate, "header-invalid", "§4.7", BLOB_RULE, what)
