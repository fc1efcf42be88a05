"""Cases of coded values (SPEC §7.6.6, feature ``coded-values``): valid forms, each rule.

Sections come from :mod:`.codedform`, written from the spec text.  Every
invalid section breaks one rule and is otherwise consistent (a decoder that
skips the rule would read it to the end), so that the rule, not a later
check, must catch it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import checkpoints as ck
from . import payload
from .builder import ChunkPlan, Delta, build, set_raw
from .codedform import (
    FEATURE,
    PLANES,
    RICE,
    Section,
    coded,
    most_frequent,
    section,
    set_final,
    short_head,
    uleb,
    values_of,
)
from .common import Pair, add_valid
from .compactform import form
from .host import A0, Host
from .invalid_payload import READ_ALL
from .rand import random_mask
from .values import update, weights_like

SECTION = "§7.6.6"
DECODE = ("coded values: level j keeps open the values that are not w_j; the others get "
          "w_j; the final coding stores the values still open")  # fmt: skip
S2 = ("S2: the value coding is not 0, or is 1 in a delta whose required_features does not list "
      "coded-values → encoding-invalid")  # fmt: skip
C2 = ("C2: with coded-values, a compact chunk without z has codec none if its l equals its r, "
      "zstd otherwise")
S5 = ("S5: value coding 1: the payload ends before its positions do → encoding-invalid")
V = {
    1: "V1: L > 8 → encoding-invalid",
    2: "V2: two split words are equal → encoding-invalid",
    3: "V3: a level's k_j > 31, or the final Rice k ≥ 8·s → encoding-invalid",
    4: "V4: a ULEB128 integer is not minimal, has more than 10 bytes, or is 2^64 or more → "
       "encoding-invalid",
    5: "V5: a field or stream runs past the end of the payload → encoding-invalid",
    6: "V6: a non-empty unary stream whose last byte holds no 1 bit → encoding-invalid",
    7: "V7: a padding bit of a remainder stream is 1 → encoding-invalid",
    8: "V8: c_j > n_j, or a level's last position ≥ n_j → index-out-of-range",
    9: "V9: the final coding is not 0 or 1 → encoding-invalid",
    10: "V10: final Rice: the unary stream does not hold exactly n_(L+1) one bits → "
        "encoding-invalid",
    11: "V11: final Rice: a value q·2^k + r ≥ 2^(8·s) → encoding-invalid",
    12: "V12: bytes follow the final values → encoding-invalid",
}  # fmt: skip
Config = Callable[[list[int], int], Section]


def _all_levels(values: list[int], size: int) -> Section:
    """Every distinct word split off (at most 8): the last level keeps nothing."""
    words = most_frequent(values, 8)
    return section(values, size, words, [None] * len(words), PLANES)


# One configuration per chunk, cycling: L = 0 to all distinct words, final planes
# and Rice, k chosen or forced, a split word that no value has (c_j = n_j).
CONFIGS: list[Config] = [
    lambda v, s: section(v, s, [], [], RICE),
    lambda v, s: section(v, s, most_frequent(v, 1), [None], PLANES),
    lambda v, s: section(v, s, most_frequent(v, 2), [None, 3], RICE),
    _all_levels,
    lambda v, s: section(v, s, [0, *most_frequent(v, 1)], [1, None], RICE),
    lambda v, s: section(v, s, most_frequent(v, 3), [0, 2, None], PLANES),
]


def _pair() -> Pair:
    """I8, BF16, F32 and F64 tensors: steps of +-1 (two words) or any change."""
    specs = (("a", "I8", 96, True), ("b", "BF16", 160, False), ("c", "F32", 128, True),
             ("d", "F64", 64, False), ("e", "U16", 96, False))  # fmt: skip
    base, target = [], []
    for name, dtype, n, small in specs:
        words = weights_like(f"coded/{name}", dtype, n)
        b, t = update(f"coded/{name}", dtype, words, random_mask(f"coded/{name}", n, 0.6), small)
        if not small:  # a few repeated steps, so that levels have words to split off
            t[::3] = b[::3] ^ 1
        base.append(ck.tensor(name, dtype, (n,), b))
        target.append(ck.tensor(name, dtype, (n,), t))
    return Pair("coded-values", ck.single(base), ck.single(target))


def _plan(name: str, index: int) -> ChunkPlan:
    coding = payload.RICE if index % 2 else payload.BITMAP
    return ChunkPlan("sparse", "sub" if name in "abd" else "xor", "zstd", coding)


def coded_delta(pair: Pair, plan: Callable[[str, int], ChunkPlan] = _plan) -> Delta:
    """Every sparse chunk recoded with the next configuration."""
    delta = build(pair.base, pair.target, 32, plan)
    delta.doc["required_features"] = [FEATURE]
    sizes = {"I8": 1, "BF16": 2, "F32": 4, "F64": 8, "U16": 2}
    turn = 0
    for entry in delta.doc["tensors"]:
        size = sizes[entry["dtype"]]
        for chunk in entry.get("chunks", []):
            if chunk["encoding"] != "sparse":
                continue
            count = chunk["changed"]
            values = values_of(chunk["_raw"], count, size)
            sec = CONFIGS[turn % len(CONFIGS)](values, size)
            set_raw(chunk, coded(chunk["_raw"], count, size, sec))
            turn += 1
    assert turn >= 2 * len(CONFIGS), turn
    return delta


def _plan_some_raw(name: str, index: int) -> ChunkPlan:
    plan = _plan(name, index)
    return replace(plan, codec="none" if index % 2 else plan.codec)


def add_coded_valid(suite: Any) -> None:
    pair = _pair()
    add_valid(suite, "valid/coded/widths", pair, coded_delta(pair),
              "coded values in 1-, 2-, 4- and 8-byte words: L = 0 to every distinct word "
              "(the last level keeping nothing), final byte planes and Rice, a split word no "
              "value has, bitmap and Rice positions", SECTION, DECODE)  # fmt: skip
    compact = coded_delta(pair, _plan_some_raw)
    compact.form = form()
    add_valid(suite, "valid/coded/compact", pair, compact,
              "the same coded values in the compact header form, every other chunk stored "
              "raw: with coded-values, a chunk without z whose l equals its r has codec none",
              "§4.11", C2)  # fmt: skip


# Invalid cases: chunk 0 of host tensor a (F32, 41 changes), recoded.
COUNT, SIZE = len(A0), 4
Edit = Callable[[Section], None]


def _host_section(values: list[int]) -> Section:
    return section(values, SIZE, most_frequent(values, 2), [None, None], RICE)


Base = Callable[[list[int]], Section]


def _mutation(edit: Edit | None, *, value_coding: int = 1, feature: bool = True,
              base: Base = _host_section) -> Callable[[Delta], None]:  # fmt: skip
    def mutate(delta: Delta) -> None:
        chunk = delta.tensor("a")["chunks"][0]
        values = values_of(chunk["_raw"], COUNT, SIZE)
        sec = base(values)
        if edit is not None:
            edit(sec)
        set_raw(chunk, coded(chunk["_raw"], COUNT, SIZE, sec, value_coding))
        if feature:
            delta.doc["required_features"] = [FEATURE]

    return mutate


def _head_mutation(edit: Callable[[bytes, bytes], bytes]) -> Callable[[Delta], None]:
    """Chunk 0 of tensor a in coded values, its short head and positions rewritten
    by ``edit(head, streams)`` (the section kept)."""

    def mutate(delta: Delta) -> None:
        chunk = delta.tensor("a")["chunks"][0]
        raw = chunk["_raw"]
        assert raw[0] == payload.RICE, "the host chunk must use Rice positions"
        head, streams = short_head(raw, COUNT, SIZE)
        sec = _host_section(values_of(raw, COUNT, SIZE))
        set_raw(chunk, edit(head, streams) + sec.to_bytes())
        delta.doc["required_features"] = [FEATURE]

    return mutate


def _head_u_not_minimal(head: bytes, streams: bytes) -> bytes:
    u = int.from_bytes(head[3:], "little") if len(head) == 4 else None
    assert u is not None and u < 128, "U of the host chunk fits one byte"
    return head[:3] + bytes([u | 0x80, 0]) + streams


def _head_u_past_end(head: bytes, streams: bytes) -> bytes:
    """U larger than every byte after it (the section included)."""
    return head[:3] + uleb(len(streams) + 4096) + streams


def _head_bitmap_k(head: bytes, streams: bytes) -> bytes:
    return bytes([payload.BITMAP, 1, 1]) + head[3:] + streams


def _nine_levels(values: list[int]) -> Section:
    """Nine consistent levels: the two most frequent words, then words no value has."""
    top = most_frequent(values, 2)
    absent = [w for w in range(1, 64) if w not in values][:7]
    return section(values, SIZE, [*top, *absent], [None] * 9, RICE)


def _duplicate(values: list[int]) -> Section:
    top = most_frequent(values, 1)
    return section(values, SIZE, [top[0], top[0]], [None, None], RICE)


def _level_k32(values: list[int]) -> Section:
    return section(values, SIZE, most_frequent(values, 1), [32], PLANES)


def _final_k(k: int) -> Edit:
    return lambda sec: set_final(sec, RICE, k)


def _u_not_minimal(sec: Section) -> None:
    lv = sec.levels[0]
    assert len(lv.unary) < 128
    lv.u_field = bytes([len(lv.unary) | 0x80, 0])


def _u_huge(sec: Section) -> None:
    sec.levels[0].u_field = b"\x80" * 9 + b"\x02"  # 2^64


def _u_past_end(sec: Section) -> None:
    lv = sec.levels[0]
    rest = len(sec.to_bytes()) - len(b"".join(
        [bytes([len(sec.levels)]), *(x.split.to_bytes(SIZE, "little") for x in sec.levels),
         bytes([lv.k]), lv.u_field]))  # fmt: skip
    lv.u_field = uleb(rest + 1)


def _unary_extra_byte(sec: Section) -> None:
    lv = sec.levels[0]
    lv.unary += b"\x00"
    lv.u_field = uleb(len(lv.unary))


def _remainder_padding(sec: Section) -> None:
    lv = sec.levels[0]
    k = next(k for k in range(1, 8) if len(lv.keep) * k % 8)
    lv.k = k
    lv.encode()
    lv.rem = lv.rem[:-1] + bytes([lv.rem[-1] | 0x80])


def _too_many_codes(sec: Section) -> None:
    """Level 2 lists one position more than it has open values (k = 0, all ones)."""
    lv, n = sec.levels[1], len(sec.levels[0].keep)
    lv.k, lv.keep = 0, list(range(n + 1))
    lv.encode()


def _position_past_open(sec: Section) -> None:
    lv, n = sec.levels[1], len(sec.levels[0].keep)
    assert lv.keep, "level 2 must keep a value"
    lv.keep = [*lv.keep[:-1], n]
    lv.encode()


def _final_count(sec: Section) -> None:
    sec.open_values = sec.open_values[:-1]
    set_final(sec, RICE, sec.final_k)


def _final_overflow(sec: Section) -> None:
    """With k = 31, one quotient of 2 makes 2^32 (the other values kept)."""
    sec.open_values = [2 << 31, *sec.open_values[1:]]
    set_final(sec, RICE, 31)


def _final_coding_2(sec: Section) -> None:
    sec.final = 2


def _trailing(sec: Section) -> None:
    sec.trailer = b"\x00"


def _truncated(sec: Section) -> None:
    sec.cut = 1


INVALID: list[tuple[str, Callable[[Delta], None], str, str, str]] = [
    ("coded-without-feature", _mutation(None, feature=False), "encoding-invalid", S2,
     "value coding 1 in a delta whose required_features is empty"),
    ("coded-value-coding-2", _mutation(None, value_coding=2), "encoding-invalid", S2,
     "value coding 2 (the feature listed)"),
    ("coded-head-bitmap-k", _head_mutation(_head_bitmap_k), "encoding-invalid", S2,
     "short head (value coding 1) with position coding 0 (bitmap) and k = 1"),
    ("coded-head-uleb-not-minimal", _head_mutation(_head_u_not_minimal), "encoding-invalid",
     V[4], "the short head's U (positions' unary stream) written with a final 0x00 group"),
    ("coded-head-unary-past-end", _head_mutation(_head_u_past_end), "encoding-invalid", S5,
     "the short head's U 4096 bytes more than the payload holds"),
    ("coded-nine-levels", _mutation(None, base=_nine_levels), "encoding-invalid", V[1],
     "L = 9, every level consistent (7 split words no value has)"),
    ("coded-split-duplicate", _mutation(None, base=_duplicate), "encoding-invalid", V[2],
     "the same split word twice (the second level keeps every value)"),
    ("coded-level-k-32", _mutation(None, base=_level_k32), "encoding-invalid", V[3],
     "a level with k = 32, its streams consistent"),
    ("coded-final-k-32", _mutation(_final_k(32)), "encoding-invalid", V[3],
     "final Rice with k = 32 for 4-byte words, its streams consistent"),
    ("coded-uleb-not-minimal", _mutation(_u_not_minimal), "encoding-invalid", V[4],
     "U_1 written with a final 0x00 group"),
    ("coded-uleb-2-64", _mutation(_u_huge), "encoding-invalid", V[4],
     "U_1 = 2^64 in 10 bytes"),
    ("coded-unary-past-end", _mutation(_u_past_end), "encoding-invalid", V[5],
     "U_1 one byte more than the payload has left"),
    ("coded-unary-extra-byte", _mutation(_unary_extra_byte), "encoding-invalid", V[6],
     "a zero byte after level 1's unary stream, U_1 one larger"),
    ("coded-remainder-padding", _mutation(_remainder_padding), "encoding-invalid", V[7],
     "the last padding bit of level 1's remainder stream set"),
    ("coded-more-codes-than-open", _mutation(_too_many_codes), "index-out-of-range", V[8],
     "level 2 lists n_2 + 1 positions among its n_2 open values"),
    ("coded-position-past-open", _mutation(_position_past_open), "index-out-of-range", V[8],
     "level 2's last position is n_2"),
    ("coded-final-coding-2", _mutation(_final_coding_2), "encoding-invalid", V[9],
     "final coding 2"),
    ("coded-final-count", _mutation(_final_count), "encoding-invalid", V[10],
     "final Rice with one code fewer than values open, streams consistent"),
    ("coded-final-overflow", _mutation(_final_overflow), "encoding-invalid", V[11],
     "final Rice k = 31 with a quotient of 2: the value 2^32 in 4-byte words"),
    ("coded-trailing-byte", _mutation(_trailing), "encoding-invalid", V[12],
     "one byte after the final values"),
    ("coded-truncated", _mutation(_truncated), "encoding-invalid", V[5],
     "the last byte of the final remainder stream missing"),
]  # fmt: skip


def add_coded_cases(host: Host) -> None:
    add_coded_valid(host.suite)
    delta = host.delta()
    _mutation(None)(delta)
    add_valid(host.suite, "valid/coded/host", host.pair, delta,
              "the host delta with chunk 0 of tensor a in coded values (2 levels, final Rice)",
              SECTION, DECODE)  # fmt: skip
    for name, mutate, category, rule, what in INVALID:
        host.mutated(name, mutate, category, SECTION, rule, what, READ_ALL)
