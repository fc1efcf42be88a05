"""Invalid chunk payloads and zstd frames, with valid blob checksums.

Chunk 0 of host tensor ``a`` (m = 256, F32, Rice k = 3, 41 changes, the last
at 255, zstd) and chunk 2 (m = 84, bitmap, 5 changes, the last at 83, codec
none) are rewritten; checksums, offsets and digests are recomputed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from . import payload
from .builder import Delta, set_raw, set_stored, zstd_frame
from .host import A0, A2, CHUNK, M2, RICE_K, Host
from .invalid_header import Mutation

READ_ALL = ("reader", "decoder", "reverse")
S1 = "S1: the payload is shorter than 16 bytes → encoding-invalid"
S2 = (
    "S2: the position coding is not 0 or 1, a reserved byte is not 0, or coding 0 has k ≠ 0 "
    "→ encoding-invalid"
)
S3 = "S3: c < 1 or c > m → encoding-invalid"
S4 = "S4: Rice with k > 31, or a Rice payload shorter than 24 bytes → encoding-invalid"
S5 = "S5: the payload length differs from the length of §7.6.1 → encoding-invalid"
S6 = "S6: bitmap: a padding bit (index ≥ m) is 1 → index-out-of-range"
S7 = "S7: bitmap: the number of 1 bits is not c → encoding-invalid"
S8 = (
    "S8: Rice: the unary stream does not hold exactly c one bits, or its last byte holds no "
    "1 bit → encoding-invalid"
)
S9 = "S9: Rice: a padding bit of the remainder stream is 1 → encoding-invalid"
S10 = "S10: Rice: p_(c-1) ≥ m → index-out-of-range, evaluated without integer overflow"
S11 = "S11: c differs from the chunk's changed → encoding-invalid"
ZSTD_RULE = (
    "the blob MUST be exactly one Zstandard frame that declares Frame_Content_Size = "
    "raw_length, needs no dictionary, has Window_Size ≤ 2^27, decompresses without error to "
    "exactly raw_length bytes, passes its checksum if any, and is followed by no other byte "
    "→ encoding-invalid"
)


def _edit(index: int, fn: Callable[[bytes], bytes]) -> Mutation:
    def mutate(delta: Delta) -> None:
        chunk = delta.tensor("a")["chunks"][index]
        set_raw(chunk, fn(chunk["_raw"]))

    return mutate


def _poke(offset: int, value: bytes) -> Callable[[bytes], bytes]:
    return lambda raw: raw[:offset] + value + raw[offset + len(value) :]


def _chunk_words(host: Host, index: int) -> tuple[list[int], list[int], list[int]]:
    """(positions, base words, target words) of chunk ``index`` (0 or 2) of host tensor a."""
    start, m = CHUNK * index, CHUNK if index == 0 else M2
    base = host.pair.base.by_name["a"].words()[start : start + m]
    target = host.pair.target.by_name["a"].words()[start : start + m]
    positions = list(A0 if index == 0 else A2)
    return positions, [int(w) for w in base], [int(w) for w in target]


def _rice(host: Host, positions: list[int], k: int, keep: slice = slice(None)) -> Mutation:
    """Chunk 0 re-coded with the given positions (values of the real ones)."""
    real, base, target = _chunk_words(host, 0)
    values = payload.transformed("xor", [base[p] for p in real], [target[p] for p in real], 4)
    raw = payload.sparse(positions, values[keep], CHUNK, 4, payload.RICE, k)
    return _edit(0, lambda _: raw)


def _bitmap(host: Host, positions: list[int], count: int | None = None) -> Mutation:
    """Chunk 2 re-coded with the given bitmap positions (values of the real ones)."""
    real, base, target = _chunk_words(host, 2)
    values = payload.transformed("sub", [base[p] for p in real], [target[p] for p in real], 4)
    body = payload.bitmap(positions, M2) + payload.planes(values, 4)
    head = payload.sparse_head(payload.BITMAP, 0, len(real) if count is None else count)
    return _edit(2, lambda _: head + body)


def _set_last_bit(raw: bytes, last: int) -> bytes:
    """``raw`` with bit 7 (the last padding bit) of byte ``last`` set."""
    assert not raw[last] & 0x80
    return raw[:last] + bytes([raw[last] | 0x80]) + raw[last + 1 :]


def _unary_padding(raw: bytes) -> bytes:
    unary_len = struct.unpack_from("<Q", raw, 16)[0]
    return _set_last_bit(raw, 24 + unary_len - 1)


def _unary_extra_byte(raw: bytes) -> bytes:
    unary_len = struct.unpack_from("<Q", raw, 16)[0]
    end = 24 + unary_len
    return raw[:16] + struct.pack("<Q", unary_len + 1) + raw[24:end] + b"\x00" + raw[end:]


def _remainder_padding(raw: bytes) -> bytes:
    unary_len = struct.unpack_from("<Q", raw, 16)[0]
    return _set_last_bit(raw, 24 + unary_len + (len(A0) * RICE_K + 7) // 8 - 1)


def payload_cases(host: Host) -> list[tuple[str, Mutation, str, str, str]]:
    real0, real2 = list(A0), list(A2)
    assert real0[-1] == CHUNK - 1 and real2[-1] == M2 - 1 and 1 not in real2
    far = (1 << 32) + CHUNK - 1
    return [
        ("sparse-payload-tiny", _edit(0, lambda r: r[:10]), "encoding-invalid", S1,
         "a 10-byte sparse payload"),
        ("sparse-coding-2", _edit(0, _poke(0, b"\x02")), "encoding-invalid", S2,
         "position coding byte 2"),
        ("bitmap-k-nonzero", _edit(2, _poke(1, b"\x03")), "encoding-invalid", S2,
         "a bitmap chunk with k = 3"),
        ("sparse-reserved-nonzero", _edit(0, _poke(2, b"\x01")), "encoding-invalid", S2,
         "reserved head byte 2 = 1"),
        ("sparse-count-zero", _edit(0, _poke(8, bytes(8))), "encoding-invalid", S3,
         "count c = 0"),
        ("sparse-count-over-m", _edit(0, _poke(8, struct.pack("<Q", CHUNK + 1))),
         "encoding-invalid", S3, f"count c = {CHUNK + 1} in a chunk of {CHUNK}"),
        ("rice-k-32", _rice(host, real0, 32), "encoding-invalid", S4,
         "Rice parameter k = 32 (streams consistent with it)"),
        ("rice-payload-short", _edit(0, lambda r: r[:20]), "encoding-invalid", S4,
         "a 20-byte Rice payload (no room for U)"),
        ("sparse-payload-extra-byte", _edit(0, lambda r: r + b"\x00"), "encoding-invalid", S5,
         "one byte after the value planes"),
        ("sparse-payload-short", _edit(0, lambda r: r[:-1]), "encoding-invalid", S5,
         "the last value byte missing"),
        ("rice-unary-length-huge", _edit(0, _poke(16, struct.pack("<Q", (1 << 64) - 1))),
         "encoding-invalid", S5, "U = 2^64 - 1 (24 + U + ... overflows 64 bits)"),
        ("bitmap-index-past-end", _bitmap(host, [*real2[:-1], M2]), "index-out-of-range", S6,
         f"the last change moved from bit {M2 - 1} to bit {M2} of an {M2}-element chunk"),
        ("bitmap-trailing-bit", _bitmap(host, [*real2[:-1], 87]), "index-out-of-range", S6,
         f"the last change moved from bit {M2 - 1} to the last padding bit, 87"),
        ("bitmap-popcount-mismatch", _bitmap(host, [*real2, 1]), "encoding-invalid", S7,
         "6 bits set in a bitmap whose count is 5"),
        ("rice-unary-padding-bit", _edit(0, _unary_padding), "encoding-invalid", S8,
         "a padding bit after the last 1 of the unary stream set (one code too many)"),
        ("rice-unary-extra-byte", _edit(0, _unary_extra_byte), "encoding-invalid", S8,
         "a zero byte after the unary stream, U one larger"),
        ("rice-remainder-padding-bit", _edit(0, _remainder_padding), "encoding-invalid", S9,
         "the last padding bit of the remainder stream set"),
        ("rice-index-past-end", _rice(host, [*real0[:-1], CHUNK], RICE_K), "index-out-of-range",
         S10, f"the last position decodes to {CHUNK} in a {CHUNK}-element chunk"),
        ("rice-index-past-2-32", _rice(host, [*real0[:-1], far], 31), "index-out-of-range", S10,
         f"the last position decodes to 2^32 + {CHUNK - 1} ({CHUNK - 1} in 32 bits)"),
        ("sparse-count-mismatch", _rice(host, real0[1:], RICE_K, slice(1, None)),
         "encoding-invalid", S11,
         f"a consistent payload of {len(A0) - 1} changes in a chunk whose changed = {len(A0)}"),
    ]  # fmt: skip


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def reheader(frame: bytes, content_size: int, window_log: int | None = None,
             dict_id: int | None = None) -> bytes:  # fmt: skip
    """``frame`` (one frame from :func:`zstd_frame`) with a rewritten frame header.

    The new header declares ``content_size`` in a 4-byte field; with
    ``window_log`` it is not single-segment and carries that window; with
    ``dict_id`` it names a dictionary.  The blocks (and checksum) are kept.
    """
    fhd = frame[4]
    single = (fhd >> 5) & 1
    end = 5 + (1 - single) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
    new_fhd = (2 << 6) | ((window_log is None) << 5) | (fhd & 4) | (3 if dict_id is not None else 0)
    header = ZSTD_MAGIC + bytes([new_fhd])
    if window_log is not None:
        header += bytes([(window_log - 10) << 3])
    if dict_id is not None:
        header += dict_id.to_bytes(4, "little")
    return header + content_size.to_bytes(4, "little") + frame[end:]


def _stored(fn: Callable[[bytes], bytes]) -> Mutation:
    def mutate(delta: Delta) -> None:
        chunk = delta.tensor("a")["chunks"][0]
        set_stored(chunk, fn(chunk["_raw"]))

    return mutate


SKIPPABLE = struct.pack("<II", 0x184D2A50, 4) + b"skip"


def _bad_checksum(raw: bytes) -> bytes:
    frame = zstd_frame(raw, checksum=True)
    return frame[:-1] + bytes([frame[-1] ^ 0xFF])


CODEC_CASES: list[tuple[str, Callable[[bytes], bytes], str]] = [
    ("zstd-declares-other-size", lambda r: zstd_frame(r + b"\x00"),
     "a frame of raw_length + 1 bytes that says so"),
    ("zstd-size-lies-larger", lambda r: reheader(zstd_frame(r + bytes(64)), len(r)),
     "a frame declaring raw_length that holds 64 more bytes"),
    ("zstd-size-lies-smaller", lambda r: reheader(zstd_frame(r[:-1]), len(r)),
     "a frame declaring raw_length that holds one byte less"),
    ("zstd-bomb", lambda r: reheader(zstd_frame(bytes(1 << 20)), len(r)),
     "a 50-byte frame declaring raw_length that expands to 1 MiB: stop at raw_length"),
    ("zstd-dictionary", lambda r: reheader(zstd_frame(r), len(r), dict_id=1),
     "a frame naming dictionary 1"),
    ("zstd-window-too-large", lambda r: reheader(zstd_frame(r), len(r), window_log=28),
     "a frame whose Window_Size is 2^28 (limit 2^27)"),
    ("zstd-no-content-size", lambda r: zstd_frame(r, content_size=False),
     "a frame without a content size field"),
    ("zstd-trailing-bytes", lambda r: zstd_frame(r) + bytes(4), "4 zero bytes after the frame"),
    ("zstd-two-frames", lambda r: zstd_frame(r) + zstd_frame(b""),
     "the payload's frame followed by a second (empty) frame"),
    ("zstd-skippable-frame", lambda r: SKIPPABLE + zstd_frame(r),
     "a skippable frame before the data frame"),
    ("zstd-frame-checksum", _bad_checksum, "a frame whose own XXH64 checksum is wrong"),
    ("zstd-not-a-frame", lambda r: bytes(4) + zstd_frame(r)[4:], "a frame with its magic zeroed"),
]  # fmt: skip


def add_payload_cases(host: Host) -> None:
    for name, mutate, category, rule, what in payload_cases(host):
        host.mutated(name, mutate, category, "§7.6.5", rule, what, READ_ALL)
    for name, fn, what in CODEC_CASES:
        host.mutated(name, _stored(fn), "encoding-invalid", "§8", ZSTD_RULE, what, READ_ALL)
