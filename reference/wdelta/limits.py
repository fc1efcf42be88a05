"""Every limit of SPEC §13, in one place, in the order of its table.

A reader checks each limit before it allocates memory for the quantity the
limit bounds (SPEC §13).  ``tests/test_limits.py`` reads the table in SPEC.md
and checks these values against it, so that the two cannot drift apart.

The reference's own bounds, which SPEC leaves to implementations (how many
roots a node keeps, how large its acceptance state may grow), live with the
code they protect and are not repeated here.
"""

from __future__ import annotations

#: Bytes of a delta's header ``N`` (SPEC §3.3); also bounds a compact header (§4.11).
MAX_HEADER_BYTES = 100_000_000
#: ``chunk_elements`` of a delta (SPEC §4.3).
MAX_CHUNK_ELEMENTS = 1 << 26
#: Elements of one tensor, and any one dimension, in a delta, a layout or an input (T3, H4).
MAX_ELEMENTS = 1 << 48
#: Bytes of a chunk's ``dense`` or ``full`` payload: ``chunk_elements`` x 8-byte words (K7).
MAX_DENSE_RAW_BYTES = MAX_CHUNK_ELEMENTS * 8
#: Bytes of a ``sparse`` payload: below ``24 + m·(s + 5)`` for the largest chunk (K8).
MAX_SPARSE_RAW_BYTES = 1 << 30
#: Stored bytes of an inline blob: 256 base64url characters (I1).
MAX_INLINE_BYTES = 192
#: zstd ``Window_Size`` of a blob, bytes (SPEC §8).
MAX_ZSTD_WINDOW = 1 << 27
#: Nesting depth of any JSON text (SPEC §4.1).
MAX_JSON_DEPTH = 64
#: The reference reader's memory estimate for parsing ``N`` bytes of JSON:
#: ``JSON_BYTES_FACTOR * N + JSON_FIXED_BYTES`` (SPEC §13, §15).
JSON_BYTES_FACTOR = 10
JSON_FIXED_BYTES = 32 << 20
#: Digits of one JSON integer (SPEC §4.1): Python's own conversion limit.
MAX_INT_DIGITS = 4300
#: Bytes of an input safetensors header (SPEC §10.3).
MAX_INPUT_HEADER_BYTES = 100_000_000
#: Bytes of one manifest revision of a chain (RD-5).
MAX_MANIFEST_BYTES = 100_000_000
#: Bytes of a revision signature object or a trust root (SG-2, SG-4); key files too.
MAX_DOCUMENT_BYTES = 1 << 16
