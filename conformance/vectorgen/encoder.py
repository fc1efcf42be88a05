"""Encoder cases: (base, target) pairs a candidate encoder must turn into a delta.

The delta must be accepted by the reference reader, apply with the reference
decoder to the exact target files, apply in reverse to the exact base files
when it says it is reversible, and meet the writer requirements W1 to W6 of
SPEC §11.1.  Its size is reported against the reference encoder's and a
zeroth-order information estimate (both recorded per case), never bounded.
"""

from __future__ import annotations

import math
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import wdelta
from wdelta.format.dtypes import DTYPES

from . import checkpoints as ck
from .common import Pair
from .edge import changed, same
from .layouts import BASE_HEADER, NAMES, TARGET_HEADER, shard_tensors
from .positions import GAP_N
from .rand import random_bytes, random_words
from .special import special_pair
from .suite import Suite, invalid, output_expect, sha256
from .values import SPECIALS

RULE = (
    "an encoder MUST write files that satisfy every rule of §3 to §9 and the writer "
    "requirements W1 to W6, and that, decoded forward from the base, rebuild the target's "
    "files byte for byte (and the base's, in reverse, when reversible is true)"
)
ESTIMATE_CHUNK = 1 << 22
TensorPairs = list[tuple[ck.TensorData, ck.TensorData]]


def _plane_bits(words: np.ndarray[Any, Any], size: int) -> float:
    """Zeroth-order entropy, in bits, of each byte plane of ``words``, summed."""
    planes = words.astype(f"<u{size}").view(np.uint8).reshape(-1, size)
    bits = 0.0
    for j in range(size):
        counts = np.bincount(planes[:, j], minlength=256)
        p = counts[counts > 0] / len(planes)
        bits += float(-(p * np.log2(p)).sum()) * len(planes)
    return bits


def _chunk_bits(b: np.ndarray[Any, Any], t: np.ndarray[Any, Any], size: int) -> float:
    mask = b != t
    c, m = int(mask.sum()), len(b)
    if c == 0:
        return 0.0
    choose = (math.lgamma(m + 1) - math.lgamma(c + 1) - math.lgamma(m - c + 1)) / math.log(2)
    return choose + _plane_bits(b[mask] ^ t[mask], size)


def information_bytes(pair: Pair) -> int:
    """A zeroth-order estimate of the information a forward delta must carry.

    Per chunk of 2^22 elements of a tensor kept with its dtype and shape:
    log2 C(m, c) bits for the changed positions plus the byte-plane entropy of
    their XOR words; for an added (or retyped) tensor the byte-plane entropy of
    its words.  Not a bound any encoder must meet: a yardstick for the report.
    """
    bmap, bits = pair.base.by_name, 0.0
    for t in pair.target.tensors:
        b = bmap.get(t.name)
        if b is None or (b.dtype, b.shape) != (t.dtype, t.shape):
            bits += _plane_bits(t.words(), t.size) if t.elements else 0.0
            continue
        bw, tw = b.words(), t.words()
        for start in range(0, len(tw), ESTIMATE_CHUNK):
            end = start + ESTIMATE_CHUNK
            bits += _chunk_bits(bw[start:end], tw[start:end], t.size)
    return math.ceil(bits / 8)


def _pair(name: str, pairs: TensorPairs) -> Pair:
    return Pair(name, ck.single([p[0] for p in pairs]), ck.single([p[1] for p in pairs]))


def bf16_weights(label: str, n: int) -> np.ndarray[Any, Any]:
    """BF16 words shaped like trained weights: random sign and mantissa, exponents 2^-8..2^-1."""
    words = np.frombuffer(random_bytes(label, 2 * n), dtype="<u2").astype(np.uint16)
    exponent = (0x77 + ((words >> 7) & 7)).astype(np.uint16)
    return (words & 0x807F) | (exponent << 7)


def finetune() -> Pair:
    """3% of a bf16 matrix moves by -3..+3 ulp; a bias changes, a norm does not."""
    w = bf16_weights("enc/ft/w", 64 * 256)
    hit = np.frombuffer(random_bytes("enc/ft/hit", 2 * w.size), dtype="<u2") < 2000
    step = (random_words("enc/ft/step", w.size, 1) % 7).astype(np.int32) - 3
    moved = np.where(hit, (w.astype(np.int32) + step) & 0xFFFF, w)
    bias, norm = random_words("enc/ft/bias", 256, 4), random_words("enc/ft/norm", 256, 4)
    base = [
        ck.tensor("layer.0.w", "BF16", (64, 256), w),
        ck.tensor("layer.0.b", "F32", (256,), bias),
        ck.tensor("norm", "F32", (256,), norm),
    ]
    target = [ck.tensor("layer.0.w", "BF16", (64, 256), moved),
              ck.tensor("layer.0.b", "F32", (256,), bias ^ 1), base[2]]  # fmt: skip
    return Pair("enc-finetune", ck.single(base), ck.single(target))


def specials() -> Pair:
    pairs: TensorPairs = []
    for dtype in SPECIALS:
        sp = special_pair(dtype)
        b, t = sp.base.tensors[0], sp.target.tensors[0]
        pairs.append((ck.TensorData(f"x.{dtype}", dtype, b.shape, b.data),
                      ck.TensorData(f"x.{dtype}", dtype, t.shape, t.data)))  # fmt: skip
    signs = np.array([0, 0x80000000] * 2)
    pairs.append(
        (ck.tensor("z", "F32", (4,), signs), ck.tensor("z", "F32", (4,), signs ^ 0x80000000))
    )
    return _pair("enc-specials", pairs)


def shapes() -> Pair:
    empty = ck.tensor("e", "F16", (0, 4), np.zeros(0))
    scalar, one = changed("enc", "s", "F64", (), 1.0), changed("enc", "one", "I8", (1,), 1.0)
    return _pair("enc-shapes", [scalar, one, (empty, empty)])


def ops() -> Pair:
    w = same("enc", "w", "F32", (4, 4))
    base = [same("enc", "gone", "U16", (3,)), w]
    target = [same("enc", "new", "BF16", (5,)), ck.TensorData("w", "BF16", (16,), w.data[:32])]
    return Pair("enc-ops", ck.single(base), ck.single(target))


def sharded(single_target: bool) -> Pair:
    base_t, target_t = shard_tensors()
    shard_of = {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-2.safetensors",
                "d": "m-1.safetensors", "e": "m-3.safetensors"}  # fmt: skip
    base = ck.sharded(base_t, {k: v for k, v in shard_of.items() if k != "e"})
    if single_target:
        return Pair("enc-sharded-to-single", base, ck.single(target_t))
    return Pair(
        "enc-sharded", base, ck.sharded(target_t, {k: v for k, v in shard_of.items() if k != "c"})
    )


def exact_header() -> Pair:
    a, b = changed("exact", "a", "F32", (2, 2), 0.5), changed("exact", "b", "F16", (3,), 0.5)
    return Pair("enc-exact-header", ck.with_header([a[0], b[0]], BASE_HEADER),
                ck.with_header([a[1], b[1]], TARGET_HEADER))  # fmt: skip


def scalars() -> Pair:
    """A changed 0-d tensor and an unchanged empty tensor of every dtype."""
    pairs: TensorPairs = []
    for d in DTYPES:
        pairs.append(changed("enc-0d", f"s.{d}", d, (), 1.0))
        empty = ck.tensor(f"e.{d}", d, (2, 0), np.zeros(0))
        pairs.append((empty, empty))
    return _pair("enc-scalars", pairs)


def retyped() -> Pair:
    """Same shape, new dtype; an empty tensor that grows; one that empties."""
    w = same("enc-re", "w", "F32", (6,))
    grow = ck.tensor("grow", "U8", (0,), np.zeros(0))
    shrink = same("enc-re", "shrink", "I16", (3,))
    base = [grow, shrink, w]
    target = [same("enc-re", "grow", "U8", (3,)), ck.tensor("shrink", "I16", (0, 3), np.zeros(0)),
              ck.TensorData("w", "I32", (6,), w.data)]  # fmt: skip
    return Pair("enc-retyped", ck.single(base), ck.single(target))


def single_with_index() -> Pair:
    """A checkpoint of one shard with an index (the output is a folder)."""
    b, t = changed("enc-idx", "w", "F16", (10,), 0.5)
    one = {"w": "model-00001-of-00001.safetensors"}
    return Pair("enc-one-shard", ck.sharded([b], one), ck.sharded([t], one))


def metadata() -> Pair:
    b, t = changed("enc-meta", "w", "BF16", (12,), 0.25)
    meta = {"format": "pt", "note": "kept verbatim"}
    return Pair("enc-metadata", ck.single([b], meta), ck.single([t], {"format": "pt"}))


PAIRS: dict[str, tuple[Callable[[], Pair], str]] = {
    "finetune-bf16": (finetune, "a small fine-tuning step on bf16 weights"),
    "all-dtypes": (lambda: _pair("enc-dtypes", [changed("enc", f"t.{d}", d, (7, 9), 0.3)
                                                for d in DTYPES]), "every dtype, 30% changed"),
    "special-values": (specials, "NaN payload changes and +0.0 <-> -0.0 are changes"),
    "identical": (lambda: _pair("enc-identical", [(same("enc", "w", "F32", (50,)),) * 2]),
                  "base and target identical"),
    "shapes": (shapes, "0-d, one-element and empty tensors"),
    "ops": (ops, "an added, a removed and a retyped-and-reshaped tensor"),
    "sharded": (lambda: sharded(False), "sharded checkpoints, resharded"),
    "sharded-to-single": (lambda: sharded(True), "a sharded base, a single-file target"),
    "exact-header": (exact_header, "non-canonical safetensors headers to reproduce exactly"),
    "utf8-names": (lambda: _pair("enc-names", [changed("enc", n, "BF16", (5,), 0.4, (1,))
                                               for n in NAMES]),
                   "names whose UTF-8 and UTF-16 orders differ"),
    "all-changed": (lambda: _pair("enc-dense", [changed("enc", "w", "F32", (40, 40), 1.0)]),
                    "every element changed"),
    "one-change-far": (lambda: _pair("enc-far", [changed("enc", "w", "U8", (GAP_N,), 0.0,
                                                         (GAP_N - 1,))]),
                       f"one change at element {GAP_N - 1}"),
    "low-density": (lambda: _pair("enc-low", [changed("enc", "w", "F32", (50000,), 0.001)]),
                    "0.1% of 50000 elements changed (Rice positions)"),
    "mid-density": (lambda: _pair("enc-mid", [changed("enc", "w", "BF16", (8192,), 0.1)]),
                    "10% changed (bitmap positions)"),
    "high-density": (lambda: _pair("enc-high", [changed("enc", "w", "F32", (20000,), 0.6)]),
                     "60% of an 80 KB tensor changed (dense)"),
    "scalars": (scalars, "a changed 0-d tensor and an empty tensor of every dtype"),
    "retyped": (retyped, "a retyped tensor of the same shape; empty tensors grown and emptied"),
    "single-with-index": (single_with_index, "one shard with an index on both sides"),
    "metadata": (metadata, "safetensors __metadata__ that differs between the sides"),
}  # fmt: skip


def write_checkpoint(ckpt: ck.Checkpoint, folder: Path, name: str) -> Path:
    """Write ``ckpt`` under ``folder`` as a file, or a folder when sharded."""
    files = ckpt.file_bytes()
    if ckpt.index is None:
        ((data,),) = [tuple(files.values())]
        path = folder / f"{name}.safetensors"
        path.write_bytes(data)
        return path
    path = folder / name
    path.mkdir()
    for fname, data in files.items():
        (path / fname).write_bytes(data)
    return path


def reference_size(pair: Pair) -> int:
    """Bytes of the reference encoder's delta with its default settings."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # The suite's file names: a single file's name is recorded in the delta.
        base = write_checkpoint(pair.base, folder, f"{pair.name}-base")
        target = write_checkpoint(pair.target, folder, f"{pair.name}-target")
        return wdelta.diff(base, target, folder / "ref.wdelta", threads=1).stat().st_size


def add_encoder_cases(suite: Suite) -> None:
    """Valid encoder cases with the reference encoder's size, then invalid inputs."""
    for name, (make, what) in PAIRS.items():
        pair = make()
        base, target = pair.paths(suite)
        size = reference_size(pair)
        expect = {"outcome": "valid", "output": output_expect(pair.target),
                  "reverse_output": output_expect(pair.base), "reference_delta_bytes": size,
                  "information_bytes": information_bytes(pair)}  # fmt: skip
        suite.add(f"encoder/{name}", "encoder", what, "§11.1", RULE,
                  {"base": base, "target": target}, expect)  # fmt: skip
    _add_invalid_inputs(suite)


def _safetensors(header: str, data: bytes) -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + data


BROKEN_TARGETS = {
    "target-truncated": (None, "checkpoint-invalid", "the target file misses its last byte"),
    "target-not-safetensors": (b"PK\x03\x04 not a safetensors file", "checkpoint-invalid",
                               "the target is not a safetensors file"),
    "target-overlapping-offsets": (_safetensors(
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
        '"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', bytes(6)), "checkpoint-invalid",
        "two tensors whose data_offsets overlap"),
    "target-duplicate-name": (_safetensors(
        '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
        '"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', bytes(4)), "checkpoint-invalid",
        "a tensor name twice in the safetensors header"),
    "target-dtype-f4": (_safetensors('{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}',
                                     bytes(2)), "unsupported-feature",
                        "a tensor of dtype F4 (not supported by v1)"),
}  # fmt: skip


_ST_A = '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
_INDEX = '{"metadata":{},"weight_map":{"a":"m-1.safetensors"}}'
_INDEX_AB = b'{"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}}'
# Malformed folders: file name -> bytes, the refusal's category, what is wrong.
BROKEN_FOLDERS: dict[str, tuple[dict[str, bytes], str, str]] = {
    "target-index-missing-shard": (
        {"m.safetensors.index.json": _INDEX_AB,
         "m-1.safetensors": _safetensors(_ST_A, bytes(4))},
        "checkpoint-invalid", "the index maps a tensor to a shard that is not in the folder"),
    "target-tensor-in-two-shards": (
        {"m.safetensors.index.json": _INDEX_AB,
         "m-1.safetensors": _safetensors(_ST_A, bytes(4)),
         "m-2.safetensors": _safetensors(
             '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
             '"b":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}', bytes(5))},
        "checkpoint-invalid", "a tensor listed by two shards"),
    "target-shard-lists-unmapped": (
        {"m.safetensors.index.json": _INDEX.encode(),
         "m-1.safetensors": _safetensors(
             '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
             '"z":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}', bytes(5))},
        "checkpoint-invalid", "a shard lists a tensor the index does not map"),
    "target-index-duplicate-key": (
        {"m.safetensors.index.json": _INDEX[:-1].encode() + b',"weight_map":{}}',
         "m-1.safetensors": _safetensors(_ST_A, bytes(4))},
        "checkpoint-invalid", "the index JSON has a member twice (strict JSON, §4.1)"),
    "target-shard-name-line-feed": (
        {"m.safetensors.index.json": b'{"weight_map":{"a":"m-1.safetensors\\n"}}',
         "m-1.safetensors": _safetensors(_ST_A, bytes(4))},
        "checkpoint-invalid",
        "the index maps to 'm-1.safetensors' + line feed (patterns are full matches, §2.2)"),
    "target-two-files-no-index": (
        {"a.safetensors": _safetensors(_ST_A, bytes(4)),
         "b.safetensors": _safetensors(_ST_A.replace('"a"', '"b"'), bytes(4))},
        "checkpoint-invalid", "a folder of two safetensors files and no index"),
}  # fmt: skip
BROKEN_FILES = {
    "target-header-past-end": (struct.pack("<Q", 1000) + b'{"a":1}', "checkpoint-invalid",
                               "the header length runs past the end of the file"),
    "target-json-nan": (_safetensors('{"__metadata__":{"x":NaN}}' + " ", b""),
                        "checkpoint-invalid", "NaN in the safetensors header (not JSON, §4.1)"),
    "target-lone-surrogate": (_safetensors('{"\\ud800":{"dtype":"U8","shape":[1],'
                                           '"data_offsets":[0,1]}}', b"x"),
                              "checkpoint-invalid", "a tensor name escaping a lone surrogate"),
    "target-dtype-f6": (_safetensors('{"a":{"dtype":"F6_E2M3","shape":[4],'
                                     '"data_offsets":[0,3]}}', bytes(3)),
                        "unsupported-feature", "a tensor of dtype F6_E2M3 (not supported by v1)"),
}  # fmt: skip
INPUT_RULE = ("a malformed input checkpoint → checkpoint-invalid (unsupported dtypes: "
              "unsupported-feature, §5.3); nothing is written")  # fmt: skip


def register_folder(suite: Suite, name: str, files: dict[str, bytes]) -> str:
    """Register a (malformed) folder input file by file."""
    for fname, data in files.items():
        suite.blob(f"ckpt/{name}/{fname}", data)
    path = f"vectors/ckpt/{name}"
    suite.inputs[path] = {"path": path, "files": {f: sha256(d) for f, d in sorted(files.items())}}
    return path


def _add_invalid_inputs(suite: Suite) -> None:
    pair = _pair("enc-small", [changed("enc", "w", "F32", (8,), 0.5)])
    base, target = pair.paths(suite)
    good = suite.files[target]
    broken = {**BROKEN_TARGETS, **BROKEN_FILES}
    for name, (data, category, what) in broken.items():
        path = suite.blob(f"ckpt/enc-{name}.safetensors", good[:-1] if data is None else data)
        suite.add(f"encoder/invalid/{name}", "encoder", what, "§10.3", INPUT_RULE,
                  {"base": base, "target": path}, invalid(category))  # fmt: skip
    for name, (files, category, what) in BROKEN_FOLDERS.items():
        path = register_folder(suite, f"enc-{name}", files)
        suite.add(f"encoder/invalid/{name}", "encoder", what, "§10.3", INPUT_RULE,
                  {"base": base, "target": path}, invalid(category))  # fmt: skip
    bad_base = suite.blob("ckpt/enc-base-truncated.safetensors", suite.files[base][:-1])
    suite.add("encoder/invalid/base-truncated", "encoder", "the base file misses its last byte",
              "§10.3", INPUT_RULE, {"base": bad_base, "target": target},
              invalid("checkpoint-invalid"))  # fmt: skip
