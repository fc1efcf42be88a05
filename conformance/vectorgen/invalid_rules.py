"""Invalid headers that pass the schema but break one rule of §4.3 to §4.8 or §13."""

from __future__ import annotations

from typing import Any

import numpy as np

from wdelta.checkpoint.safetensors_header import parse_header

from . import checkpoints as ck
from .builder import Delta, build, set_raw, uniform
from .edge import RICE_SUB, cycling
from .host import Host
from .invalid_header import Mutation

OTHER = "0" * 63 + "1"
EMPTY = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
ORDER_RULE = (
    "sort keys (UTF-8 name, rank removed 0 < unchanged/modified 1 < added 2) MUST be strictly "
    "increasing → header-invalid"
)


def _chunk(name: str, index: int, **fields: object) -> Mutation:
    def mutate(delta: Delta) -> None:
        delta.tensor(name)["chunks"][index].update(fields)

    return mutate


def _swap_ab(delta: Delta) -> None:
    t = delta.doc["tensors"]
    t[0], t[1] = t[1], t[0]


def _pad_raw(name: str, index: int, size: int) -> Mutation:
    def mutate(delta: Delta) -> None:
        c = delta.tensor(name)["chunks"][index]
        set_raw(c, c["_raw"] + bytes(size - len(c["_raw"])), "none")

    return mutate


def _none_longer(delta: Delta) -> None:
    c = delta.tensor("a")["chunks"][2]
    c["_stored"] = c["_raw"] + b"\x00"


def _raw_block_frame(delta: Delta) -> None:
    """Chunk 0 of a as a valid zstd frame of one raw block: longer than raw_length."""
    c = delta.tensor("a")["chunks"][0]
    raw = c["_raw"]
    block = ((len(raw) << 3) | 1).to_bytes(3, "little")
    c["_stored"] = b"\x28\xb5\x2f\xfd\xa0" + len(raw).to_bytes(4, "little") + block + raw


def _side_digest(side: str) -> Mutation:
    def mutate(delta: Delta) -> None:
        delta.freeze()
        delta.doc[side]["digest"] = OTHER

    return mutate


def _all_unchanged(delta: Delta) -> None:
    delta.tensor("a")["chunks"] = [{"encoding": "unchanged", "changed": 0}] * 3


CASES: list[tuple[str, Mutation, str, str, str, str]] = [
    ("tensors-unsorted", _swap_ab, "header-invalid", "§4.5", ORDER_RULE,
     "tensor b listed before a"),
    ("tensor-duplicated", lambda d: d.doc["tensors"].append(dict(d.tensor("e"))),
     "header-invalid", "§4.5", ORDER_RULE, "tensor e listed twice"),
    ("chunk-count-short", lambda d: d.tensor("a")["chunks"].pop(), "header-invalid", "§4.4",
     "T6: the number of chunks is not ceil(n / C) → header-invalid",
     "tensor a of 596 elements in chunks of 256 lists 2 chunks"),
    ("unchanged-op-with-chunks", lambda d: d.tensor("e").update(chunks=[]), "header-invalid",
     "§4.4", "T5: an unchanged entry has a chunks member → header-invalid",
     "unchanged tensor e with chunks: []"),
    ("modified-digests-equal", lambda d: d.tensor("a").update(
        target_digest=d.tensor("a")["base_digest"]), "header-invalid", "§4.4",
     "T4: a modified entry's digests are equal → header-invalid",
     "modified tensor a whose target_digest equals its base_digest"),
    ("modified-all-unchanged", _all_unchanged, "header-invalid", "§4.4",
     "T4: all chunks of a modified entry are unchanged → header-invalid",
     "modified tensor a with three unchanged chunks"),
    ("unchanged-digests-differ", lambda d: d.tensor("e").update(target_digest=OTHER),
     "header-invalid", "§4.4", "T4: an unchanged entry's digests differ → header-invalid",
     "unchanged tensor e with different digests"),
    ("missing-target-digest", lambda d: d.tensor("a").pop("target_digest"), "header-invalid",
     "§4.4", "T4: digest presence differs from the table → header-invalid",
     "modified tensor a without target_digest"),
    ("removed-with-target-digest", lambda d: d.tensor("d").update(target_digest=OTHER),
     "header-invalid", "§4.4", "T4: digest presence differs from the table → header-invalid",
     "removed tensor d with a target_digest"),
    ("added-with-base-digest", lambda d: d.tensor("c").update(base_digest=OTHER),
     "header-invalid", "§4.4", "T4: digest presence differs from the table → header-invalid",
     "added tensor c with a base_digest"),
    ("unchanged-chunk-in-added", lambda d: d.tensor("c").update(
        chunks=[{"encoding": "unchanged", "changed": 0}]), "header-invalid", "§4.6",
     "K4: an unchanged chunk appears outside a modified entry → header-invalid",
     "added tensor c holding an unchanged chunk"),
    ("unchanged-chunk-changed-1", _chunk("a", 1, changed=1), "header-invalid", "§4.6",
     "K4: an unchanged chunk has changed ≠ 0 → header-invalid",
     "an unchanged chunk with changed: 1"),
    ("added-changed-not-m", _chunk("c", 0, changed=4), "header-invalid", "§4.6",
     "K5: a chunk of an added entry has changed ≠ m → header-invalid",
     "an added chunk of 5 elements with changed: 4"),
    ("added-dense-chunk", _chunk("c", 0, encoding="dense", transform="xor"), "header-invalid",
     "§4.6", "K5: a chunk of an added or removed entry is not full → header-invalid",
     "added tensor c stored as a dense chunk"),
    ("changed-zero", _chunk("a", 0, changed=0), "header-invalid", "§4.6",
     "K6: a sparse, dense or full chunk has changed < 1 → header-invalid",
     "a sparse chunk with changed: 0"),
    ("changed-over-m", _chunk("a", 0, changed=257), "header-invalid", "§4.6",
     "K6: a sparse, dense or full chunk has changed > m → header-invalid",
     "a sparse chunk of 256 elements with changed: 257"),
    ("dense-raw-length", _pad_raw("b", 0, 65), "header-invalid", "§4.6",
     "K7: a dense or full chunk has raw_length ≠ m·s → header-invalid",
     "dense raw_length 65 for 32 2-byte elements (payload 65 bytes)"),
    ("sparse-raw-length-over-limit", _pad_raw("a", 2, 24 + 84 * 9 + 1), "limit-exceeded",
     "§4.6", "K8: a sparse chunk has raw_length > 24 + m·(s + 5) → limit-exceeded",
     "sparse raw_length 781 for m = 84, s = 4 (limit 780)"),
    ("none-length-not-raw-length", _none_longer, "header-invalid", "§4.6",
     "K9: a chunk with codec none has length ≠ raw_length → header-invalid",
     "codec none with length = raw_length + 1"),
    ("zstd-not-smaller", _raw_block_frame, "header-invalid", "§4.6",
     "K11: a chunk with codec zstd has length ≥ raw_length → header-invalid",
     "a valid zstd frame (one raw block) 12 bytes longer than its payload"),
    ("reversible-flag-true", lambda d: d.tensor("d").pop("chunks"), "header-invalid", "§4.8",
     "reversible MUST be true if and only if no modified entry has a full chunk and every "
     "removed entry with n > 0 has chunks → header-invalid",
     "reversible: true while removed tensor d carries no chunks"),
    ("reversible-flag-false", lambda d: d.doc.update(reversible=False), "header-invalid",
     "§4.8", "reversible MUST be true if and only if … → header-invalid",
     "reversible: false for a reversible delta"),
    ("base-side-digest", _side_digest("base"), "header-invalid", "§4.9",
     "L6: digest differs from the checkpoint digest computed from the side's entries → "
     "header-invalid", "base.digest not the digest of the base-side tensors"),
    ("target-side-digest", _side_digest("target"), "header-invalid", "§4.9",
     "L6: digest differs from the checkpoint digest computed from the side's entries → "
     "header-invalid", "target.digest not the digest of the target-side tensors"),
]  # fmt: skip


def add_rule_cases(host: Host) -> None:
    for name, mutate, category, section, rule, what in CASES:
        host.mutated(name, mutate, category, section, rule, what)
    for name, dims, what in (
        ("tensor-elements-over-limit", [1 << 25, 1 << 24], "shape [2^25, 2^24]: n = 2^49"),
        ("tensor-dimension-over-limit", [0, (1 << 48) + 1], "shape [0, 2^48 + 1]: n = 0"),
    ):
        host.mutated(name, _huge(dims), "limit-exceeded", "§4.4",
                     "T3: n > 2^48, or any dimension > 2^48 → limit-exceeded",
                     f"an unchanged U8 tensor of {what}, in the list and both file "
                     "headers")  # fmt: skip
    _add_limits(host)
    _add_added_before_removed(host)


def _huge(shape: list[int]) -> Mutation:
    """An unchanged U8 tensor ``huge`` of ``shape`` in the entries and both layouts."""

    def mutate(delta: Delta) -> None:
        n = int(np.prod(np.array(shape, dtype=object)))
        digest = EMPTY if n == 0 else OTHER
        delta.doc["tensors"].append({"name": "huge", "op": "unchanged", "dtype": "U8",
                                     "shape": shape, "base_digest": digest,
                                     "target_digest": digest})  # fmt: skip
        for side in ("base", "target"):
            f: dict[str, Any] = delta.doc[side]["files"][0]
            text = f["header"].rstrip(" ")
            start = parse_header(text.encode()).data_length
            entry = f'"huge":{{"dtype":"U8","shape":{shape},"data_offsets":[{start},{start + n}]}}'
            f["header"] = text[:-1] + "," + entry.replace(" ", "") + "}"

    return mutate


def _add_limits(host: Host) -> None:
    base = ck.single([ck.tensor("w", "BF16", (50,), np.arange(50))])
    target = ck.single([ck.tensor("w", "BF16", (50,), np.arange(50) ^ 1)])
    paths = (
        host.suite.checkpoint("limit-base", base),
        host.suite.checkpoint("limit-target", target),
    )
    delta = build(base, target, (1 << 26) + 1, uniform(RICE_SUB))
    host.add("chunk-elements-over-limit", delta.to_bytes(), "limit-exceeded", "§4.3",
             "chunk_elements: C > 2^26 → limit-exceeded",
             "chunk_elements = 2^26 + 1 (the 50-element tensor has one chunk either way)",
             pair=paths)  # fmt: skip
    empty = ck.tensor("e0", "F32", (0,), np.zeros(0))
    full = ck.tensor("w", "BF16", (50,), np.arange(50))
    pair = (
        ck.single([empty, full]),
        ck.single([empty, ck.tensor("w", "BF16", (50,), np.arange(50) ^ 1)]),
    )
    paths = (host.suite.checkpoint("empty-digest-base", pair[0]),
             host.suite.checkpoint("empty-digest-target", pair[1]))  # fmt: skip
    delta = build(pair[0], pair[1], 16, uniform(RICE_SUB))
    delta.tensor("e0").update(base_digest=OTHER, target_digest=OTHER)
    host.add("empty-tensor-digest", delta.to_bytes(), "header-invalid", "§4.4",
             "T7: an entry with n = 0 has a digest other than BLAKE3 of the empty string → "
             "header-invalid", "an empty unchanged tensor whose digests are not BLAKE3('')",
             pair=paths)  # fmt: skip


def _add_added_before_removed(host: Host) -> None:
    base = ck.single([ck.tensor("w", "F32", (4,), np.arange(4))])
    target = ck.single([ck.tensor("w", "F16", (4,), np.arange(4))])
    paths = (
        host.suite.checkpoint("retype-base", base),
        host.suite.checkpoint("retype-target", target),
    )
    delta = build(base, target, 4, cycling)
    delta.doc["tensors"].reverse()
    host.add("added-before-removed", delta.to_bytes(), "header-invalid", "§4.5", ORDER_RULE,
             "dtype change of w listed as its addition then its removal", pair=paths)  # fmt: skip
