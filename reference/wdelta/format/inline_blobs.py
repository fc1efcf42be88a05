"""Blobs stored in the header, feature ``inline-blobs`` (SPEC §4.12).

A chunk whose stored blob is tiny (an fp8 block-scale tensor of 4-48 F32
values, a changed norm vector) costs more header bytes for its checksum and
length than the blob itself.  With this feature such a chunk carries the blob
as a member ``inline`` (``i`` in the compact form): unpadded base64url of the
stored bytes, covered by the header digest like every other header byte, so it
needs no checksum and no place in the data section.
"""

from __future__ import annotations

import base64

FEATURE = "inline-blobs"
# At most this many stored bytes (256 base64url characters), so that a header
# stays a description and every large payload stays reachable by byte range.
# The reference writer inlines blobs up to this many bytes: below about 150
# bytes the compact form's "l" and "h" members (~55 bytes) cost more than
# base64's third; 128 leaves a margin for the length's digits.
WRITE_MAX_BYTES = 128


def encode(blob: bytes | memoryview) -> str:
    """The unpadded base64url text of ``blob`` (1 to MAX_INLINE_BYTES bytes)."""
    return base64.urlsafe_b64encode(blob).decode("ascii").rstrip("=")


def decode(text: str) -> bytes:
    """The bytes of a schema-checked inline text (canonical, unpadded base64url)."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def length(text: str) -> int:
    """Stored bytes of a schema-checked inline text, without decoding it."""
    return len(text) * 3 // 4
