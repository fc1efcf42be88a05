"""The ``sparse`` encoding: changed positions plus transformed values there.

Raw payload (SPEC.md "sparse"): u8 position coding (0 bitmap, 1 rice), u8 k,
u8 value coding.  Value coding 0 (v1): 5 zero bytes, u64 count c; then for
bitmap ceil(m/8) bytes, for rice u64 U, U unary bytes and ceil(c·k/8)
remainder bytes; then the c values as byte planes.  Value coding 1 (feature
``coded-values``, the short head): c is the chunk's ``changed``, not stored;
then the bitmap, or ULEB128 U and the Rice streams; then the coded values
(:mod:`.values`).  The payload length must be exactly what these fields imply.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError
from . import leb128, planes, positions, values

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
    """The cheaper position coding for a chunk, its Rice k and exact size.

    ``gaps`` and ``ones`` (see :func:`positions.unary_ones`) cache what
    planning computed, so that encoding does not repeat it (None: derive).
    """

    coding: int
    k: int
    nbytes: int
    gaps: Positions | None = None
    ones: Positions | None = None


def plan_positions(pos: Positions, m: int) -> PositionPlan:
    """Compare the exact sizes of the bitmap and the best Rice coding."""
    bitmap = (m + 7) // 8
    gaps = positions.gaps_of(pos)
    k = positions.best_rice_k(gaps)
    ones = positions.unary_ones(gaps, k)
    rice = 8 + int(ones[-1]) // 8 + 1 + (len(gaps) * k + 7) // 8
    if rice < bitmap:
        return PositionPlan(RICE, k, rice, gaps, ones)
    return PositionPlan(BITMAP, 0, bitmap, gaps, ones)


def encode(pos: Positions, values: Words, m: int, plan: PositionPlan) -> bytes:
    """Payload for sorted positions ``pos`` in a chunk of m and their values."""
    count = len(pos)
    if plan.coding == BITMAP:
        head = _HEAD.pack(BITMAP, 0, bytes(6), count)
        body = positions.bitmap_encode(pos, m)
        return b"".join((head, body, planes.split(values)))
    gaps = plan.gaps if plan.gaps is not None else positions.gaps_of(pos)
    unary, rem = positions.rice_encode(gaps, plan.k, plan.ones)
    head = _HEAD.pack(RICE, plan.k, bytes(6), count) + struct.pack("<Q", len(unary))
    return b"".join((head, unary, rem, planes.split(values)))


class BitmapPayload:
    """A bitmap payload built from a changed-element mask, values added in order.

    The buffer is sized up front from the mask and the change count, and each
    batch of values is split straight into its place in the planes, so an
    encoder can produce values block by block without collecting them first.
    """

    def __init__(self, mask: np.ndarray[Any, np.dtype[np.bool_]], count: int, word: np.dtype[Any]):
        bits = (len(mask) + 7) // 8
        start = _HEAD.size + bits
        self._buf = np.empty(start + count * word.itemsize, dtype=np.uint8)
        self._buf[: _HEAD.size] = np.frombuffer(_HEAD.pack(BITMAP, 0, bytes(6), count), np.uint8)
        self._buf[_HEAD.size : start] = np.packbits(mask, bitorder="little")
        self._rows = self._buf[start:].reshape(word.itemsize, count)
        self._count = count
        self._filled = 0

    def add(self, values: Words) -> None:
        """Append the values of the next changed elements, in position order."""
        end = self._filled + len(values)
        if end > self._count:
            raise ValueError(f"more than the {self._count} values the bitmap announces")
        planes.split_into(values, self._rows[:, self._filled : end])
        self._filled = end

    def finish(self) -> memoryview:
        """The payload; every announced value must have been added."""
        if self._filled != self._count:
            raise ValueError(f"{self._filled} values added, the bitmap announces {self._count}")
        return self._buf.data


def sections(payload: bytes | memoryview, m: int, size: int) -> list[int]:
    """Offsets where the parts of a valid payload start: the Rice remainders
    (rice only), then each byte plane of the values, in order."""
    coding, k, _, count = _HEAD.unpack_from(payload)
    if coding == BITMAP:
        values = _HEAD.size + (m + 7) // 8
        starts = []
    else:
        (unary_len,) = struct.unpack_from("<Q", payload, _HEAD.size)
        remainders = _HEAD.size + 8 + unary_len
        values = remainders + (count * k + 7) // 8
        starts = [remainders]
    return starts + [values + j * count for j in range(size)]


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
    return pos, values.decode(view[cursor:], count, word)


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


# Values that the codec stores in fewer bytes than this are not worth a try:
# the per-chunk cost of counting and costing words is fixed, the gain small.
# Measured on the real fp8 trace (step 6-7, threads=1, CPU): from 32 to 128
# bytes the data section grows by 0.1-0.2% (lr 1e-6: 1.064 -> 1.066 of the
# bound) and encoding takes 65 instead of 79 ms (lr 1e-5: 94 instead of 112;
# byte planes: 46 and 70 ms); at 256 lr 1e-6 loses 3%.
CODED_MIN_BYTES = 128


def with_coded_values(
    payload: bytes | memoryview, m: int, count: int, word: np.dtype[Any], stored: int | None,
    min_gain: float = 0.0,
) -> tuple[bytes, list[int]] | None:  # fmt: skip
    """A valid v1 payload rewritten with the short head and coded values (value
    coding 1), and the offsets where its sections start (those of :func:`sections`,
    then of :func:`values.encode`); None when coding the values would not make the
    payload smaller.  ``stored`` is the v1 payload's stored (compressed) length;
    its part past the positions, which are counted raw, is taken as the values'
    cost.  None: not compressed; the values' cost is then estimated from their
    histogram, and they are coded only if that saves ``min_gain`` of it
    (see :func:`values.encode`)."""
    view = memoryview(payload)
    values_start = len(view) - count * word.itemsize
    planes_bytes = count * word.itemsize if stored is None else max(0, stored - values_start)
    if planes_bytes < CODED_MIN_BYTES:
        return None
    joined = planes.join(view[values_start:], count, word)
    coded = values.encode(joined, None if stored is None else planes_bytes, min_gain)
    if coded is None or values_start + len(coded.data) > max_raw_length(m, word.itemsize):
        return None
    head = bytes([view[0], view[1], VALUE_CODED])
    streams = _HEAD.size
    if view[0] == RICE:
        (unary_len,) = struct.unpack_from("<Q", view, _HEAD.size)
        head += leb128.encode(unary_len)
        streams += 8
    shift = streams - len(head)  # the short head is this much shorter
    starts = [s - shift for s in sections(view, m, word.itemsize) if s < values_start]
    starts += [values_start - shift + s for s in [0, *coded.sections]]
    return head + bytes(view[streams:values_start]) + coded.data, starts
