"""A pass over JSON bytes, before parsing, that bounds the parse's memory.

Python objects cost far more than the JSON that describes them: ``{},`` is
3 bytes and a 64-byte dict plus an 8-byte list slot; ``[[[[[[[[]]]]]]]],`` is
40 times its size.  :func:`scan` counts, with NumPy over blocks of the bytes
(so in memory bounded by the block, in time linear in the length), the tokens
outside strings and the nesting depth; :func:`parse_cost` turns the counts
into an upper bound on the bytes ``json.loads`` allocates for them, and the
reader refuses text whose bound exceeds :func:`budget` before parsing it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..limits import JSON_BYTES_FACTOR, JSON_FIXED_BYTES

BLOCK = 1 << 20  # bytes scanned per NumPy step: ~50 bytes of temporaries each

# Bytes that CPython 3.11 allocates (measured with tracemalloc, see
# tests/test_hostile_json.py): a dict of up to 5 members with its list slot;
# each member beyond 5 per dict (entries, index, resize peak and a distinct
# key); a share of a key string per member (keys are shared by the parser, so
# only distinct keys cost; a header's keys repeat); a list with its first
# element's slot; a number of 3 or more characters (smaller ones are cached
# ints; an int of up to 19 digits or a float) plus a byte per character for
# longer ints; a string value (without its characters); a slot per comma.
DICT, MEMBER, KEY, LIST, NUMBER, STRING, SLOT = 192, 112, 16, 88, 36, 64, 8
# Memory allowed for parsing: 10 bytes per header byte plus this constant.

_NUMBER_CHARS = np.zeros(256, dtype=bool)
_NUMBER_CHARS[list(b"0123456789+-.eE")] = True
_NUMBER_START = np.zeros(256, dtype=bool)
_NUMBER_START[list(b"0123456789-")] = True
_BRACKET = np.zeros(256, dtype=bool)
_BRACKET[list(b"{[]}")] = True


@dataclass
class Counts:
    """Tokens outside strings, strings and their bytes, and the deepest nesting."""

    objects: int = 0
    arrays: int = 0
    members: int = 0  # ':' outside strings
    commas: int = 0
    numbers: int = 0  # of 3 or more characters
    number_bytes: int = 0
    strings: int = 0
    string_bytes: int = 0  # between the quotes, escapes included
    depth: int = 0


def scan(data: bytes) -> Counts:
    """Count the tokens of JSON text ``data`` (any bytes: invalid text is
    counted as if strings ended at the next unescaped quote)."""
    counts = Counts()
    state = (0, 0, 0, False)  # backslash run, quotes so far, depth, previous is a number char
    view = np.frombuffer(data, dtype=np.uint8)
    for start in range(0, len(view), BLOCK):
        state = _scan_block(view[start : start + BLOCK], state, counts)
    counts.strings = state[1] // 2
    return counts


def _scan_block(
    b: np.ndarray, state: tuple[int, int, int, bool], counts: Counts
) -> tuple[int, int, int, bool]:
    run_before, quotes_before, depth_before, number_before = state
    quote = b == 0x22
    backslash = b == 0x5C
    tail = run_before + len(b)
    if backslash.any():
        # Index of the last non-backslash at or before each position; a quote
        # is escaped when the backslashes right before it are odd in number.
        idx = np.arange(len(b), dtype=np.int32)
        last = np.maximum.accumulate(np.where(backslash, np.int32(-1), idx))
        at = np.flatnonzero(quote)
        before = last[np.maximum(at - 1, 0)]
        run = np.where(at == 0, run_before, at - 1 - before)
        run[(at > 0) & (before < 0)] += run_before
        quote[at[run % 2 == 1]] = False
        tail = len(b) - 1 - int(last[-1]) if last[-1] >= 0 else tail
    else:
        tail = 0
    parity = np.bitwise_xor.accumulate(quote.view(np.uint8)) ^ np.uint8(quotes_before & 1)
    outside = (parity == 0) & ~quote
    quotes = quotes_before + int(np.count_nonzero(quote))
    counts.string_bytes += len(b) - int(np.count_nonzero(outside)) - (quotes - quotes_before)
    kept = np.where(outside, b, np.uint8(0x20))
    counts.objects += int(np.count_nonzero(kept == 0x7B))
    counts.arrays += int(np.count_nonzero(kept == 0x5B))
    counts.members += int(np.count_nonzero(kept == 0x3A))
    counts.commas += int(np.count_nonzero(kept == 0x2C))
    brackets = kept[_brackets(kept)]
    steps = np.where((brackets == 0x7B) | (brackets == 0x5B), 1, -1).astype(np.int32)
    level = np.cumsum(steps, dtype=np.int64) + depth_before
    if len(level):
        counts.depth = max(counts.depth, int(level.max()))
        depth_before = int(level[-1])
    chars = _NUMBER_CHARS[kept]
    counts.number_bytes += int(np.count_nonzero(chars))
    previous = np.empty(len(b), dtype=bool)
    previous[0] = number_before
    previous[1:] = chars[:-1]
    # A number continuing past the block counts as long (an over-estimate).
    ahead = np.ones(len(b) + 2, dtype=bool)
    ahead[: len(b)] = chars
    long = ahead[1:-1] & ahead[2:]
    counts.numbers += int(np.count_nonzero(_NUMBER_START[kept] & ~previous & long))
    return tail, quotes, depth_before, bool(chars[-1])


def _brackets(kept: np.ndarray) -> np.ndarray:
    """Positions of ``{ [ } ]`` in ``kept`` (strings blanked)."""
    return np.flatnonzero(_BRACKET[kept])


def parse_cost(counts: Counts, data: bytes) -> int:
    """Upper bound in bytes on what ``json.loads`` of ``data`` allocates,
    the decoded text included."""
    # A str takes 1, 2 or 4 bytes per character: ASCII text without \\u
    # escapes stays at 1; otherwise count 4 (an escape or one emoji widens a string).
    narrow = data.isascii() and b"\\u" not in data
    width = 1 if narrow else 4
    return (
        width * len(data)
        + DICT * counts.objects
        + MEMBER * max(0, counts.members - 5 * counts.objects)
        + LIST * counts.arrays
        + NUMBER * counts.numbers
        + counts.number_bytes
        + KEY * counts.members
        + STRING * max(0, counts.strings - counts.members)
        + SLOT * counts.commas
        + width * counts.string_bytes
    )


def budget(length: int) -> int:
    """Bytes the parse of a ``length``-byte JSON text may allocate."""
    return JSON_BYTES_FACTOR * length + JSON_FIXED_BYTES
