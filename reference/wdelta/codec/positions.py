"""Sets of changed positions within a chunk (SPEC §7.6.2 bitmap, §7.6.3 Rice-coded
gaps): each coding's writer, given its parameters, and its validating reader.

Bit streams are LSB-first: stream bit n is bit (n & 7) of byte (n >> 3).
Rice coding of the gaps g_i = p_i - p_{i-1} - 1 with parameter k puts the
quotients g >> k in a unary stream and the k-bit remainders in a second stream;
for geometric gaps (changes scattered at density p) this is within a few
percent of the n·H(p) bound, and NumPy packs and unpacks both streams without
a Python loop.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..errors import EncodingInvalidError, IndexOutOfRangeError
from . import native

Positions = np.ndarray[Any, np.dtype[np.int64]]
MAX_RICE_K = 31


def gaps_of(positions: Positions) -> Positions:
    """g_0 = p_0, g_i = p_i - p_{i-1} - 1 (a new array)."""
    gaps = np.empty_like(positions)
    gaps[:1] = positions[:1]
    np.subtract(positions[1:], positions[:-1], out=gaps[1:])
    gaps[1:] -= 1
    return gaps


def rice_bits(gaps: Positions, k: int) -> int:
    """Exact size in bits of both Rice streams for parameter k."""
    return int(np.sum(gaps >> k)) + len(gaps) * (k + 1)


def unary_ones(gaps: Positions, k: int) -> Positions:
    """Stream index of each code's 1 bit in the unary stream: Σ_{j<=i} (q_j + 1) - 1."""
    ones = gaps >> k
    ones += 1
    np.cumsum(ones, out=ones)
    ones -= 1
    return ones


def rice_encode(gaps: Positions, k: int, ones: Positions | None = None) -> tuple[bytes, bytes]:
    """(unary stream, remainder stream) for the gaps with parameter k.

    ``ones`` is :func:`unary_ones` of the gaps when the caller has it already.
    """
    if ones is None:
        ones = unary_ones(gaps, k)
    unary = unary_stream(ones)
    if k == 0:
        return unary, b""
    if k <= _LANE:
        # Casting to uint8 keeps the low 8 bits, which hold the remainder.
        rem8 = gaps.astype(np.uint8)
        rem8 &= np.uint8((1 << k) - 1)
        return unary, pack_fields(rem8, k)
    rem = (gaps & ((1 << k) - 1)).astype(np.uint64)
    rbits = ((rem[:, None] >> np.arange(k, dtype=np.uint64)) & 1).astype(np.uint8)
    return unary, np.packbits(rbits.reshape(-1), bitorder="little").tobytes()


def unary_stream(ones: np.ndarray[Any, Any]) -> bytes:
    """The unary stream whose 1 bits are at the increasing stream indices ``ones``."""
    bits = np.zeros(int(ones[-1]) + 1, dtype=np.bool_)
    bits[ones] = True
    return np.packbits(bits, bitorder="little").tobytes()


def unary_ones_of(unary: bytes | memoryview) -> Positions:
    """Stream indices of the 1 bits of a unary stream (inverse of :func:`unary_stream`)."""
    if native.kernels() is not None:
        return native.set_bits(unary)
    ubits = np.unpackbits(np.frombuffer(unary, dtype=np.uint8), bitorder="little")
    # flatnonzero is ~4x faster on a bool view than on the uint8 bits.
    ones: Positions = np.flatnonzero(ubits.view(np.bool_))
    return ones


# For k <= 8 the fields of a group of eight fill exactly k bytes.  Each group
# is loaded as one u64 holding a field per byte, and neighbouring fields are
# merged in three shift-and-mask steps (8-bit lanes -> 16 -> 32 -> 64), which
# costs a few passes over c/8 words instead of a pass per bit.
_LANE = 8


@cache
def _lane_masks(k: int) -> tuple[tuple[int, np.uint64, np.uint64], ...]:
    """Per merge step (8-, 16-, 32-bit lanes): (shift that closes the gap between a
    lane pair's fields, mask of each pair's low lane, mask of the bits its field uses)."""
    steps = []
    width = k
    for lane in (8, 16, 32):
        low = sum(((1 << lane) - 1) << i for i in range(0, 64, 2 * lane))
        used = sum(((1 << width) - 1) << i for i in range(0, 64, 2 * lane))
        steps.append((lane - width, np.uint64(low), np.uint64(used)))
        width *= 2
    return tuple(steps)


def pack_fields(rem8: np.ndarray[Any, np.dtype[np.uint8]], k: int) -> bytes:
    """The LSB-first stream of the k-bit fields ``rem8`` (1 <= k <= 8)."""
    count = len(rem8)
    groups = -(-count // _LANE)
    buf = np.zeros(groups * _LANE, dtype=np.uint8)
    buf[:count] = rem8
    words = buf.view("<u8")
    for shift, low, _ in _lane_masks(k):
        words = (words & low) | ((words & ~low) >> np.uint64(shift))
    packed = words.view(np.uint8).reshape(groups, _LANE)[:, :k]
    return packed.tobytes()[: (count * k + 7) // 8]


def _unpack_groups(data: bytes | memoryview, count: int, k: int) -> np.ndarray[Any, Any]:
    """Inverse of :func:`pack_fields` (uint8 fields) for ``data`` of the length
    :func:`remainder_fields` checked; nonzero padding bits are refused."""
    groups = -(-count // _LANE)
    raw = np.frombuffer(data, dtype=np.uint8)
    flat_k = np.zeros(groups * k, dtype=np.uint8)
    flat_k[: len(raw)] = raw
    rows = np.zeros((groups, _LANE), dtype=np.uint8)
    rows[:, :k] = flat_k.reshape(groups, k)
    words = rows.view("<u8").reshape(groups)
    for shift, low, used in reversed(_lane_masks(k)):
        words = (words & used) | ((words << np.uint64(shift)) & ~low)
    fields = words.view(np.uint8)
    if fields[count:].any():
        raise EncodingInvalidError(
            "remainder stream: padding bits after the last field are not zero"
        )
    return fields[:count]


def _unpack_exact(
    data: bytes | memoryview, nbits: int, what: str, error: type[EncodingInvalidError]
) -> np.ndarray[Any, Any]:
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    if bits[nbits:].any():
        raise error(f"{what}: padding bits after the last field are not zero")
    return bits[:nbits]


def rice_decode(
    unary: bytes | memoryview, remainders: bytes | memoryview, k: int, count: int, m: int,
    ones: Positions | None = None,
) -> Positions:  # fmt: skip
    """Positions from both Rice streams; every structural rule is checked.

    ``ones`` is :func:`unary_ones_of` of ``unary`` when the caller has it already.
    """
    if ones is None:
        ones = unary_ones_of(unary)
    if len(ones) != count:
        raise EncodingInvalidError(f"unary stream holds {len(ones)} codes, expected {count}")
    last = int(ones[-1])
    if (last >> 3) + 1 != len(unary):
        raise EncodingInvalidError("unary stream has trailing bytes after its last code")
    # Position i is the sum over j <= i of (q_j << k) + r_j + 1, minus 1, and the
    # quotients up to i sum to ones[i] - i: so p_i = ((ones[i] - i) << k)
    # + (r_0 + ... + r_i) + i, without the gaps.  Quotients summing past the
    # chunk put the last position past it; refusing them before shifting keeps
    # the int64 arithmetic below from overflowing.
    if last - (count - 1) > (m - 1) >> k:
        raise IndexOutOfRangeError(f"Rice quotients put a position past the chunk of {m}")
    if native.usable(ones):
        check_remainders(remainders, count, k)
        positions = native.rice_decode(ones.astype(np.int64, copy=False), remainders, k)
    else:
        index = np.arange(count, dtype=np.int64)
        positions = ones.astype(np.int64) - index
        if k:
            positions <<= k
            positions += np.cumsum(remainder_fields(remainders, count, k), dtype=np.int64)
        positions += index
    if positions[-1] >= m:
        raise IndexOutOfRangeError(f"position {int(positions[-1])} is past the chunk of {m}")
    return positions


# Up to this many bits of k <= 8 fields, unpacking every bit and packing each
# field's bits back costs fewer NumPy calls than merging lanes (a 40-field
# stream: 6 us against 17; the two break even near 3,000 bits).
_BITWISE_MAX_BITS = 2048


def check_remainders(data: bytes | memoryview, count: int, k: int) -> None:
    """A remainder stream of ``count`` k-bit fields is exactly ceil(count·k / 8) bytes and
    its padding bits (the last byte's above the last field) are zero: what
    :func:`remainder_fields` refuses, with the same errors, without unpacking."""
    if len(data) != (count * k + 7) // 8:
        raise EncodingInvalidError(f"remainder stream is {len(data)} bytes for {count} fields")
    used = count * k % 8
    if used and data[-1] >> used:
        raise EncodingInvalidError(
            "remainder stream: padding bits after the last field are not zero"
        )


def remainder_fields(data: bytes | memoryview, count: int, k: int) -> np.ndarray[Any, Any]:
    """The ``count`` k-bit fields (1 <= k <= 31) of a remainder stream of exactly
    ceil(count·k / 8) bytes; its padding bits must be zero."""
    if len(data) != (count * k + 7) // 8:
        raise EncodingInvalidError(f"remainder stream is {len(data)} bytes for {count} fields")
    if k <= _LANE and count * k <= _BITWISE_MAX_BITS:
        bits = _unpack_exact(data, count * k, "remainder stream", EncodingInvalidError)
        return np.packbits(bits.reshape(count, k), axis=1, bitorder="little").reshape(count)
    if k <= _LANE:
        return _unpack_groups(data, count, k)
    rbits = _unpack_exact(data, count * k, "remainder stream", EncodingInvalidError)
    rbits = rbits.reshape(count, k)
    rem = np.zeros(count, dtype=np.int64)
    for j in range(k):
        rem |= rbits[:, j].astype(np.int64) << j
    return rem


def bitmap_encode(positions: Positions, m: int) -> bytes:
    """ceil(m / 8) bytes, bit j set where element j changed."""
    if native.usable(positions):
        return native.bitmap(positions, m)
    bits = np.zeros(m, dtype=np.bool_)
    bits[positions] = True
    return np.packbits(bits, bitorder="little").tobytes()


def bitmap_decode(data: bytes | memoryview, count: int, m: int) -> Positions:
    """Positions from a bitmap; trailing bits and the population are checked."""
    # A set bit past the chunk marks a position out of range, not mere padding.
    bits = _unpack_exact(data, m, "bitmap", IndexOutOfRangeError)
    positions = np.flatnonzero(bits.view(np.bool_)).astype(np.int64, copy=False)
    if len(positions) != count:
        raise EncodingInvalidError(f"bitmap has {len(positions)} bits set, expected {count}")
    return positions
