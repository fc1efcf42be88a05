"""Text for a terminal: control characters from hostile input made visible.

Tensor names, file names and messages can come from a hostile delta, manifest
or checkpoint.  Printed raw, an ESC sequence could clear the screen or recolour
it, a CR or a bidi override could forge a table row.  Every line of human
output goes through :func:`printable` (``--json`` output is escaped by JSON).
"""

from __future__ import annotations

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def printable(text: str) -> str:
    """``text`` with every character that ``str.isprintable`` rejects escaped.

    Escapes are those of ``repr`` (``\\n``, ``\\x1b``, ``\\u202e``,
    ``\\U000e0001``), without quotes and without doubling backslashes, so that
    text already quoted by ``repr`` is unchanged: C0 and C1 controls, DEL,
    format characters (bidi overrides, zero-width marks), line and paragraph
    separators, surrogates, private-use and unassigned code points, and
    spaces other than U+0020.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
