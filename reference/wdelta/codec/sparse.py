"""The ``sparse`` encoding (SPEC §7.6): changed positions plus transformed values there.

Raw payload: u8 position coding (0 bitmap, 1 rice), u8 k,
u8 value coding.  Value coding 0 (v1): 5 zero bytes, u64 count c; then for
bitmap ceil(m/8) bytes, for rice u64 U, U unary bytes and ceil(c·k/8)
remainder bytes; then the c values as byte planes.  Value coding 1 (feature
``coded-values``, the short head): c is the chunk's ``changed``, not stored;
then the bitmap, or ULEB128 U and the Rice streams; then the coded values
(:mod:`.coded_values`).  The payload length must be exactly what these fields imply.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError
from . import coded_values, leb128, native, planes, positions
from .coded_values import Coded

BITMAP, RICE = 0, 1
VALUE_PLANES, VALUE_CODED = 0, 1
_HEAD = struct.Struct("<BB6sQ")
SHORT_HEAD = 3  # value coding 1: position coding, k, value coding
Positions = positions.Positions
Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def max_raw_length(m: int, size: int) -> int:
    """Upper bound on a valid sparse payload for m elements of ``size`` bytes."""
    return 24 + m * (size + 5)


@dataclass(frozen=True)
class PositionPlan:
    """A chunk's position coding, its Rice k and exact size, as the encoder chose them.

    ``gaps`` and ``ones`` (see :func:`positions.unary_ones`) cache what
    planning computed, so that encoding does not repeat it (None: derive);
    ``unary_len`` is the unary stream's length where the native planner found it,
    which lets the compiled writer code the positions without a gaps array.
    """

    coding: int
    k: int
    nbytes: int
    gaps: Positions | None = None
    ones: Positions | None = None
    unary_len: int | None = None


@dataclass(frozen=True)
class Parts:
    """A sparse payload before its values are laid out: the position coding, its
    Rice k, the unary stream's length U (0 for a bitmap), the position streams
    (the bitmap, or the unary and remainder streams) and the changed elements'
    values, contiguous and in position order.  :meth:`v1` lays the values out
    as byte planes, :meth:`short_form` lays out coded values (feature ``coded-values``)."""

    coding: int
    k: int
    unary_len: int
    streams: bytes | memoryview
    values: Words

    def v1(self) -> tuple[memoryview, list[int]]:
        """The payload with value coding 0, and where its sections start: the Rice remainders
        (rice only), then each byte plane of the values, in order."""
        count, size = len(self.values), self.values.dtype.itemsize
        head = _HEAD.pack(self.coding, self.k, bytes(6), count)
        if self.coding == RICE:
            head += struct.pack("<Q", self.unary_len)
        start = len(head) + len(self.streams)
        buf = np.empty(start + count * size, dtype=np.uint8)
        buf[: len(head)] = np.frombuffer(head, np.uint8)
        buf[len(head) : start] = np.frombuffer(self.streams, np.uint8)
        planes.split_into(self.values, buf[start:].reshape(size, count))
        remainders = [len(head) + self.unary_len] if self.coding == RICE else []
        return buf.data, remainders + [start + j * count for j in range(size)]

    @property
    def values_start(self) -> int:
        """Where the values start in the :meth:`v1` payload."""
        return _HEAD.size + (8 if self.coding == RICE else 0) + len(self.streams)

    def short_form(self, found: Coded) -> tuple[bytes, list[int]]:
        """The payload with the short head and the coded values ``found`` (value
        coding 1), and where its sections start: the Rice remainders (rice only),
        then those of the coded values section."""
        head = bytes([self.coding, self.k, VALUE_CODED])
        if self.coding == RICE:
            head += leb128.encode(self.unary_len)
        at = len(head) + len(self.streams)
        starts = [len(head) + self.unary_len] if self.coding == RICE else []
        starts += [at + s for s in [0, *found.sections]]
        return b"".join((head, self.streams, found.data)), starts


def parts(pos: Positions, values: Words, m: int, plan: PositionPlan) -> Parts:
    """The parts of the payload for sorted positions ``pos`` in a chunk of m."""
    if plan.coding == BITMAP:
        return Parts(BITMAP, 0, 0, positions.bitmap_encode(pos, m), values)
    if plan.unary_len is not None and native.usable(pos):
        streams = native.rice_positions(pos, plan.k, plan.unary_len)
        return Parts(RICE, plan.k, plan.unary_len, streams, values)
    gaps = plan.gaps if plan.gaps is not None else positions.gaps_of(pos)
    unary, rem = positions.rice_encode(gaps, plan.k, plan.ones)
    return Parts(RICE, plan.k, len(unary), unary + rem, values)


def encode(pos: Positions, values: Words, m: int, plan: PositionPlan) -> bytes:
    """Payload (value coding 0) for sorted positions ``pos`` and their values."""
    return bytes(parts(pos, values, m, plan).v1()[0])


class BitmapPayload:
    """The parts of a bitmap payload built from a changed-element mask, values
    added in order, so that an encoder can produce values block by block
    without collecting them first."""

    def __init__(self, mask: np.ndarray[Any, np.dtype[np.bool_]], count: int, word: np.dtype[Any]):
        self._bitmap = np.packbits(mask, bitorder="little").data
        self._values: Words = np.empty(count, dtype=word)
        self._filled = 0

    def add(self, values: Words) -> None:
        """Append the values of the next changed elements, in position order."""
        end = self._filled + len(values)
        if end > len(self._values):
            raise ValueError(f"more than the {len(self._values)} values the bitmap announces")
        self._values[self._filled : end] = values
        self._filled = end

    def finish(self) -> Parts:
        """The parts; every announced value must have been added."""
        if self._filled != len(self._values):
            raise ValueError(
                f"{self._filled} values added, the bitmap announces {len(self._values)}"
            )
        return Parts(BITMAP, 0, 0, self._bitmap, self._values)


def decode(
    payload: bytes | memoryview, m: int, word: np.dtype[Any], coded: bool = False,
    changed: int | None = None,
) -> tuple[Positions, Words]:  # fmt: skip
    """(positions, values) from a payload; every byte is validated.

    ``coded`` says the header requires ``coded-values``: only then may the
    value coding byte be 1, whose short head does not store the count: it is
    ``changed``, the chunk's (1 <= changed <= m, checked with the header).
    """
    view = memoryview(payload)
    if coded and len(view) >= SHORT_HEAD and view[2] == VALUE_CODED:
        if changed is None:
            raise ValueError("a coded sparse payload needs the chunk's changed count")
        return _decode_short(view, m, word, changed)
    if len(view) >= SHORT_HEAD and view[2] != VALUE_PLANES:
        need = " without feature coded-values" if view[2] == VALUE_CODED else ""
        raise EncodingInvalidError(f"sparse value coding {view[2]}{need}")
    if len(view) < _HEAD.size:
        raise EncodingInvalidError("sparse payload shorter than its 16-byte head")
    coding, k, reserved, count = _HEAD.unpack_from(view)
    # reserved[0] is the value coding, already checked above to be 0.
    if coding not in (BITMAP, RICE) or (coding == BITMAP and k) or reserved[1:] != bytes(5):
        raise EncodingInvalidError(f"sparse head invalid (coding {coding}, k {k}, value coding 0)")
    if not 1 <= count <= m:
        raise EncodingInvalidError(f"sparse count {count} outside 1..{m}")
    planes_length = count * word.itemsize
    if coding == BITMAP:
        pos, cursor = _read_positions(view, coding, k, count, m, _HEAD.size, 0, planes_length)
    else:
        if k > positions.MAX_RICE_K or len(view) < _HEAD.size + 8:
            raise EncodingInvalidError(f"rice parameter {k} or head invalid")
        (unary_len,) = struct.unpack_from("<Q", view, _HEAD.size)
        start = _HEAD.size + 8
        pos, cursor = _read_positions(view, coding, k, count, m, start, unary_len, planes_length)
    return pos, planes.join(view[cursor:], count, word)


def _decode_short(
    view: memoryview, m: int, word: np.dtype[Any], count: int
) -> tuple[Positions, Words]:
    """(positions, values) of a payload with the short head (value coding 1)."""
    coding, k = view[0], view[1]
    if coding not in (BITMAP, RICE) or (coding == BITMAP and k) or k > positions.MAX_RICE_K:
        raise EncodingInvalidError(f"sparse head invalid (coding {coding}, k {k}, value coding 1)")
    unary_len, start = (0, SHORT_HEAD) if coding == BITMAP else leb128.decode(view, SHORT_HEAD)
    pos, cursor = _read_positions(view, coding, k, count, m, start, unary_len, None)
    return pos, coded_values.decode(view[cursor:], count, word)


def _read_positions(
    view: memoryview, coding: int, k: int, count: int, m: int, start: int, unary_len: int,
    planes_length: int | None,
) -> tuple[Positions, int]:  # fmt: skip
    """(positions, offset where the values start) of the position streams at ``start``:
    the bitmap, or the Rice unary stream of ``unary_len`` bytes and its remainders.
    The payload's length is checked first (:func:`_expect_length`)."""
    if coding == BITMAP:
        cursor = start + (m + 7) // 8
        _expect_length(view, cursor, planes_length)
        return positions.bitmap_decode(view[start:cursor], count, m), cursor
    remainders = start + unary_len
    cursor = remainders + (count * k + 7) // 8
    _expect_length(view, cursor, planes_length)
    pos = positions.rice_decode(view[start:remainders], view[remainders:cursor], k, count, m)
    return pos, cursor


def _expect_length(view: memoryview, values_start: int, planes_length: int | None) -> None:
    """The payload ends after the planes (or, coded: None, holds at least the positions)."""
    if planes_length is None:
        if len(view) < values_start:
            raise EncodingInvalidError(
                f"sparse payload is {len(view)} bytes, its positions end at {values_start}"
            )
    elif len(view) != values_start + planes_length:
        raise EncodingInvalidError(
            f"sparse payload is {len(view)} bytes, layout implies {values_start + planes_length}"
        )
