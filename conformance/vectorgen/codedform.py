"""Coded values sections (SPEC §7.6.6) written from the spec text, not the reference.

A section is kept as a list of parts (L, split words, per level k / U / unary
/ remainders, final coding and its fields) so that invalid cases can change
one part and keep every other one consistent.  Python integers and bit lists
only, like :mod:`.payload`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import payload

FEATURE = "coded-values"
PLANES, RICE = 0, 1


def uleb(value: int) -> bytes:
    """Minimal ULEB128: 7 bits per byte, low group first, high bit = more follows."""
    out = bytearray()
    while True:
        group, value = value & 0x7F, value >> 7
        if not value:
            out.append(group)
            return bytes(out)
        out.append(group | 0x80)


def rice_words(words: Sequence[int], k: int) -> tuple[bytes, bytes]:
    """(unary, remainder) streams of the words themselves: q = v >> k, r = v mod 2^k,
    the same streams §7.6.3 writes for gaps."""
    return payload.rice_streams(words, k)


def rice_k(words: Sequence[int], size: int) -> int:
    """The final Rice parameter with the smallest streams (smallest k on ties)."""
    return min(range(8 * size), key=lambda k: (sum((v >> k) + 1 + k for v in words), k))


@dataclass
class Level:
    """One split level's fields; ``keep`` are the indices among the open values."""

    split: int
    k: int
    keep: list[int]
    unary: bytes = b""
    rem: bytes = b""
    u_field: bytes = b""

    def encode(self) -> None:
        """Fill the streams and the ULEB128 U from ``keep`` and ``k``."""
        gaps = payload.gaps(self.keep)
        self.unary, self.rem = payload.rice_streams(gaps, self.k) if gaps else (b"", b"")
        self.u_field = uleb(len(self.unary))


@dataclass
class Section:
    """A coded values section as parts; :meth:`to_bytes` joins them."""

    size: int
    levels: list[Level]
    final: int
    open_values: list[int]
    final_k: int = 0
    final_fields: list[bytes] = field(default_factory=list)
    trailer: bytes = b""
    cut: int = 0  # bytes dropped from the end

    def to_bytes(self) -> bytes:
        out = [bytes([len(self.levels)])]
        out += [lv.split.to_bytes(self.size, "little") for lv in self.levels]
        for lv in self.levels:
            out += [bytes([lv.k]), lv.u_field, lv.unary, lv.rem]
        out.append(bytes([self.final]))
        out += self.final_fields
        data = b"".join(out) + self.trailer
        return data[: len(data) - self.cut]


def section(values: Sequence[int], size: int, splits: Sequence[int], ks: Sequence[int | None],
            final: int) -> Section:  # fmt: skip
    """The section of ``values`` with these split words and level parameters (None, or
    missing: the best k), then ``final`` (Rice with its best k)."""
    open_values = list(values)
    levels = []
    for w, k in zip(splits, [*ks, *[None] * len(splits)], strict=False):
        keep = [i for i, v in enumerate(open_values) if v != w]
        gaps = payload.gaps(keep)
        level = Level(w, (payload.best_k(gaps) if gaps else 0) if k is None else k, keep)
        level.encode()
        levels.append(level)
        open_values = [open_values[i] for i in keep]
    out = Section(size, levels, final, open_values)
    set_final(out, final, rice_k(open_values, size) if final == RICE and open_values else 0)
    return out


def set_final(sec: Section, final: int, k: int) -> None:
    """Write the final coding ``final`` of the open values (Rice with parameter k)."""
    sec.final, sec.final_k = final, k
    if final == PLANES:
        sec.final_fields = [payload.planes(sec.open_values, sec.size)]
        return
    unary, rem = rice_words(sec.open_values, k)
    sec.final_fields = [bytes([k]), uleb(len(unary)), unary, rem]


def values_of(raw: bytes, count: int, size: int) -> list[int]:
    """The values of a v1 sparse payload (its last count·size bytes, byte planes)."""
    planes = raw[len(raw) - count * size :]
    return [sum(planes[j * count + i] << (8 * j) for j in range(size)) for i in range(count)]


def most_frequent(values: Sequence[int], n: int) -> list[int]:
    """The n most frequent words, by decreasing count then increasing word."""
    ranked = sorted(Counter(values).items(), key=lambda item: (-item[1], item[0]))
    return [w for w, _ in ranked[:n]]


def short_head(raw: bytes, count: int, size: int) -> tuple[bytes, bytes]:
    """(head, position streams) of the v1 sparse payload ``raw`` in the short form
    of value coding 1: coding, k, 1, then for Rice U as ULEB128 (c is not stored)."""
    start = len(raw) - count * size
    head = raw[:2] + bytes([1])
    if raw[0] == payload.RICE:
        return head + uleb(int.from_bytes(raw[16:24], "little")), raw[24:start]
    return head, raw[16:start]


def coded(raw: bytes, count: int, size: int, sec: Section, value_coding: int = 1) -> bytes:
    """The v1 sparse payload ``raw`` with value coding ``value_coding`` and its byte
    planes replaced by the section: the short head for value coding 1, else the
    v1 head with byte 2 set (for cases that a decoder must refuse by that byte)."""
    if value_coding == 1:
        head, streams = short_head(raw, count, size)
        return head + streams + sec.to_bytes()
    start = len(raw) - count * size
    return raw[:2] + bytes([value_coding]) + raw[3:start] + sec.to_bytes()
