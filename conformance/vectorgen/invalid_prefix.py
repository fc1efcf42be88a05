"""Invalid files: the 64-byte prefix, the file length, the header digest (SPEC §3.3, §9.2)."""

from __future__ import annotations

import struct

import blake3

from wdelta.format.container import MAGIC, PREFIX

from .host import Host

READ_ALL = ("reader", "decoder", "reverse")
MAGIC_RULE = "check 1: the first min(8, size) bytes are not a prefix of the magic → bad-magic"
SHORT_RULE = "check 2: the file is shorter than 64 bytes → truncated"
LENGTH_RULE = (
    "check 7: shorter than 64 + N + D bytes → truncated; longer → header-invalid "
    "(the sum computed without overflow)"
)


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    size = struct.calcsize(fmt)
    return data[:offset] + struct.pack(fmt, value) + data[offset + size :]


def _unpadded(host: Host) -> bytes:
    """The host file with a header whose length is not a multiple of 8 (digest valid)."""
    delta = host.delta()
    data = delta._layout()
    header = delta.header_bytes()
    if len(header) % 8 == 0:
        header += b" "
    digest = blake3.blake3(header).digest()
    return PREFIX.pack(MAGIC, 1, 0, len(header), digest, len(data)) + header + data


def add_prefix_cases(host: Host) -> None:
    good = host.delta().to_bytes()
    n = struct.unpack_from("<Q", good, 16)[0]
    cases = [
        ("bad-magic", b"\x88" + good[1:], "bad-magic", MAGIC_RULE, "first magic byte 0x88"),
        ("bad-magic-safetensors", host.suite.files[host.base], "bad-magic", MAGIC_RULE,
         "a safetensors file given as the delta"),
        ("bad-magic-short", b"\x89WDX", "bad-magic", MAGIC_RULE,
         "a 4-byte file that is not a prefix of the magic"),
        ("empty-file", b"", "truncated", SHORT_RULE, "a file of 0 bytes"),
        ("magic-prefix-only", MAGIC[:5], "truncated", SHORT_RULE, "the first 5 magic bytes"),
        ("prefix-truncated", good[:40], "truncated", SHORT_RULE, "the first 40 bytes only"),
        ("header-truncated", good[: 64 + n // 2], "truncated", LENGTH_RULE,
         "cut in the middle of the header"),
        ("data-truncated", good[:-1], "truncated", LENGTH_RULE, "the last data byte missing"),
        ("data-length-huge", _patch(good, 56, "<Q", (1 << 64) - 1), "truncated", LENGTH_RULE,
         "D = 2^64 - 1 (64 + N + D overflows 64 bits)"),
        ("trailing-bytes", good + b"\x00", "header-invalid", LENGTH_RULE,
         "one byte after the data section"),
    ]  # fmt: skip
    for name, data, category, rule, what in cases:
        host.add(name, data, category, "§3.3", rule, what, READ_ALL)
    _add_field_cases(host, good)


def _add_field_cases(host: Host, good: bytes) -> None:
    version_rule = "check 3: version ≠ 1 → unsupported-version"
    digest = bytes(b ^ 0xFF for b in good[24:56])
    at = good.index(b"wdelta-conformance/1")
    digest_rule = (
        "check 8: BLAKE3 of the header bytes differs from the header digest → checksum-mismatch"
    )
    cases = [
        ("prefix-version-2", _patch(good, 8, "<I", 2), "unsupported-version", version_rule,
         "prefix format version 2"),
        ("prefix-version-0", _patch(good, 8, "<I", 0), "unsupported-version", version_rule,
         "prefix format version 0"),
        ("reserved-nonzero", _patch(good, 12, "<I", 1), "header-invalid",
         "check 4: reserved ≠ 0 → header-invalid", "reserved prefix field = 1"),
        ("header-length-over-limit", _patch(good, 16, "<Q", 100_000_008), "limit-exceeded",
         "check 5: N > 100,000,000 → limit-exceeded (before reading the header)",
         "header length N = 100,000,008 (the file is not that long)"),
        ("header-length-zero", _patch(good, 16, "<Q", 0), "header-invalid",
         "check 6: N = 0 or N mod 8 ≠ 0 → header-invalid", "header length N = 0"),
        ("header-length-unaligned", _unpadded(host), "header-invalid",
         "check 6: N = 0 or N mod 8 ≠ 0 → header-invalid",
         "a header of N bytes, N not a multiple of 8, the file and digest consistent with it"),
        ("header-digest-mismatch", good[:24] + digest + good[56:], "checksum-mismatch",
         digest_rule, "header digest in the prefix inverted"),
        ("header-corrupted", good[:at] + b"W" + good[at + 1 :], "checksum-mismatch",
         digest_rule, "one header byte changed (still valid JSON), digest not updated"),
    ]  # fmt: skip
    for name, data, category, rule, what in cases:
        section = "§9.2" if category == "checksum-mismatch" else "§3.3"
        host.add(name, data, category, section, rule, what, READ_ALL)
