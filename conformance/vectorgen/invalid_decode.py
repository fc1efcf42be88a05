"""Refusals that need the data: checksums, digests, the wrong base, reverse."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import checkpoints as ck
from .builder import Delta
from .encoder import BROKEN_FILES, BROKEN_FOLDERS, INPUT_RULE, register_folder
from .host import A0, CHUNK, Host
from .invalid_header import Mutation
from .invalid_rules import OTHER
from .suite import invalid, valid

HOST_DELTA = "vectors/delta/valid/host.wdelta"
BLOB_RULE = (
    "checksum = BLAKE3 of the blob's stored bytes; a decoder MUST verify it before "
    "decompressing or otherwise using the blob → checksum-mismatch"
)
TARGET_RULE = (
    "step 7: hash the bytes of every output tensor and compare with the entry's output "
    "digest → checksum-mismatch (step 6: every input tensor → base-mismatch)"
)
SET_RULE = (
    "step 4: the input's set of (name, dtype, shape) MUST equal that of the delta's input "
    "side → base-mismatch, before creating any output"
)
BYTES_RULE = (
    "step 6: hash the n·s bytes of every input tensor, including tensors that are not "
    "copied to the output, and compare with the entry's input digest → base-mismatch"
)


def _checksum(name: str) -> Mutation:
    def mutate(delta: Delta) -> None:
        delta.freeze()
        delta.tensor(name)["chunks"][0]["checksum"] = OTHER

    return mutate


def _corrupt_added(delta: Delta) -> None:
    delta.freeze()
    assert delta.data is not None
    at = delta.tensor("c")["chunks"][0]["offset"]
    delta.data = delta.data[:at] + bytes([delta.data[at] ^ 1]) + delta.data[at + 1 :]


def _digest(name: str, key: str) -> Mutation:
    def mutate(delta: Delta) -> None:
        delta.tensor(name)[key] = OTHER

    return mutate


def add_integrity_cases(host: Host) -> None:
    host.mutated("blob-checksum", _checksum("a"), "checksum-mismatch", "§9.1", BLOB_RULE,
                 "the checksum of a's first blob altered; the blob itself intact",
                 ("reader", "decoder", "reverse"))  # fmt: skip
    every = ("reader", "decoder", "reverse")
    host.mutated("blob-corrupted", _corrupt_added, "checksum-mismatch", "§9.1", BLOB_RULE,
                 "one byte of added tensor c's blob flipped, checksum not updated (in reverse "
                 "a blob the decoder does not use: it is verified all the same, §10.2)",
                 every)  # fmt: skip
    host.mutated("removed-blob-checksum", _checksum("d"), "checksum-mismatch", "§9.1",
                 BLOB_RULE, "the checksum of removed tensor d's blob altered (forward a blob "
                 "the decoder does not use: it is verified all the same, §10.2)",
                 every)  # fmt: skip
    digest_cases = [
        ("wrong-target-digest", "a", "target_digest", "checksum-mismatch", "base-mismatch"),
        ("wrong-added-digest", "c", "target_digest", "checksum-mismatch", "base-mismatch"),
        ("wrong-base-digest", "a", "base_digest", "base-mismatch", "checksum-mismatch"),
    ]
    for name, tensor, key, forward, backward in digest_cases:
        what = f"{tensor}.{key} altered (side digest recomputed): decoding does not match it"
        path = host.mutated(name, _digest(tensor, key), forward, "§10.2", TARGET_RULE, what,
                            ("decoder",))  # fmt: skip
        host.suite.add(f"reverse/invalid/{name}", "reverse", what, "§10.2", TARGET_RULE,
                       {"target": host.target, "delta": path}, invalid(backward))  # fmt: skip


def _wrong_bases(host: Host) -> dict[str, tuple[ck.Checkpoint, str]]:
    base = host.pair.base
    a = base.by_name["a"].words().copy()
    a40, a3 = a.copy(), a.copy()
    a40[300] ^= 1
    quiet = min(set(range(CHUNK)) - set(A0))
    a3[quiet] ^= 0x80000000
    flip = {n: bytes([base.by_name[n].data[0] ^ 1]) + base.by_name[n].data[1:] for n in "de"}
    tensors = list(base.tensors)
    without_e = [t for t in tensors if t.name != "e"]
    retyped = [replace(t, dtype="BF16") if t.name == "e" else t for t in tensors]
    reshaped = [replace(t, shape=(32,)) if t.name == "b" else t for t in tensors]
    extra = [*tensors, ck.tensor("z", "U8", (2,), np.zeros(2))]
    return {
        "unchanged-chunk-bytes": (base.with_data("a", a40.tobytes()),
                                  "a's element 300 (in an unchanged chunk) differs"),
        "sparse-chunk-bytes": (base.with_data("a", a3.tobytes()),
                               f"the sign bit of a's element {quiet} (an unchanged element "
                               "of a sparse chunk) differs"),
        "unchanged-tensor-bytes": (base.with_data("e", flip["e"]), "unchanged tensor e differs"),
        "removed-tensor-bytes": (base.with_data("d", flip["d"]), "removed tensor d differs"),
        "missing-tensor": (ck.single(without_e), "tensor e missing"),
        "extra-tensor": (ck.single(extra), "an extra tensor z"),
        "dtype-differs": (ck.single(retyped), "e is BF16 (same bytes), the delta says F16"),
        "shape-differs": (ck.single(reshaped), "b has shape [32] (same bytes), the delta [4, 8]"),
        "is-target": (host.pair.target, "the target given as the base"),
    }  # fmt: skip


def add_base_cases(host: Host) -> None:
    suite = host.suite
    for name, (ckpt, what) in _wrong_bases(host).items():
        path = suite.checkpoint(f"wrong-base-{name}", ckpt)
        rule = BYTES_RULE if name.endswith("bytes") else SET_RULE
        suite.add(f"decoder/base-mismatch/{name}", "decoder", what, "§10.2", rule,
                  {"base": path, "delta": HOST_DELTA}, invalid("base-mismatch"))  # fmt: skip
    good = suite.files[host.base]
    broken = (
        ("not-safetensors", b"not a safetensors file at all", "garbage"),
        ("truncated", good[:-1], "the last byte of the file missing"),
    )
    for name, data, what in broken:
        path = suite.blob(f"ckpt/broken-base-{name}.safetensors", data)
        suite.add(f"decoder/base-invalid/{name}", "decoder", f"base checkpoint: {what}",
                  "§10.3", "each file MUST satisfy: header length ≤ 100,000,000, a valid "
                  "header (§4.10), a file length of exactly 8 + H_len + L → checkpoint-invalid",
                  {"base": path, "delta": HOST_DELTA}, invalid("checkpoint-invalid"))  # fmt: skip
    _add_malformed_inputs(host)
    _add_extra_files(host)
    _add_reverse_cases(host)


def _add_malformed_inputs(host: Host) -> None:
    """The malformed checkpoints of the encoder cases, given to a decoder as its base."""
    suite = host.suite
    for name, (data, category, what) in BROKEN_FILES.items():
        short = name.removeprefix("target-")
        path = suite.blob(f"ckpt/broken-base-{short}.safetensors", data)
        suite.add(f"decoder/base-invalid/{short}", "decoder", f"base checkpoint: {what}",
                  "§10.3", INPUT_RULE, {"base": path, "delta": HOST_DELTA},
                  invalid(category))  # fmt: skip
    for name, (files, category, what) in BROKEN_FOLDERS.items():
        short = name.removeprefix("target-")
        path = register_folder(suite, f"broken-base-{short}", files)
        suite.add(f"decoder/base-invalid/{short}", "decoder", f"base checkpoint: {what}",
                  "§10.3", INPUT_RULE, {"base": path, "delta": HOST_DELTA},
                  invalid(category))  # fmt: skip


def _add_extra_files(host: Host) -> None:
    """A base folder with files its index does not name: they are not read."""
    tensors = list(host.pair.base.tensors)
    sharded = ck.sharded(tensors, {t.name: "model-00001-of-00001.safetensors" for t in tensors})
    files = {**sharded.file_bytes(), "config.json": b'{"architectures": ["X"]}\n',
             "stray.safetensors": b"not a safetensors file"}  # fmt: skip
    path = register_folder(host.suite, "host-base-extra-files", files)
    host.suite.add("decoder/valid/layout/extra-files", "decoder",
                   "the base as a folder with an index, a config.json and a stray "
                   "*.safetensors file the index does not name", "§10.3",
                   "the shards are the files weight_map names: other files in the folder are "
                   "not read", {"base": path, "delta": HOST_DELTA},
                   valid(host.pair.target))  # fmt: skip


def _add_reverse_cases(host: Host) -> None:
    suite = host.suite
    target = host.pair.target
    a = target.by_name["a"].words().copy()
    a[300] ^= 1
    for name, ckpt, what in (
        ("unchanged-chunk-bytes", target.with_data("a", a.tobytes()),
         "a's element 300 (an unchanged chunk) differs from the target"),
        ("is-base", host.pair.base, "the base given as the target"),
    ):  # fmt: skip
        path = suite.checkpoint(f"wrong-target-{name}", ckpt)
        rule = BYTES_RULE if name.endswith("bytes") else SET_RULE
        suite.add(f"reverse/target-mismatch/{name}", "reverse", what, "§10.2", rule,
                  {"target": path, "delta": HOST_DELTA}, invalid("base-mismatch"))  # fmt: skip
    rule = "step 2: in reverse, refuse a delta whose reversible is false → not-reversible"
    for name, delta, tgt in (
        ("full-chunks", "valid/matrix/F32/full", "matrix-F32-target"),
        ("removed-dropped", "valid/edge/added-removed-not-reversible", "edge-add-remove-target"),
    ):
        suite.add(f"reverse/not-reversible/{name}", "reverse",
                  f"reverse of a non-reversible delta ({name.replace('-', ' ')})", "§10.2",
                  rule, {"target": f"vectors/ckpt/{tgt}.safetensors",
                         "delta": f"vectors/delta/{delta}.wdelta"},
                  invalid("not-reversible"))  # fmt: skip
