"""Strict JSON decoding shared by every JSON structure wdelta reads.

RFC 8259 only: no ``NaN``/``Infinity`` literals, no duplicate member names,
no unpaired surrogate escapes, nesting at most 64 levels, integers of at
most 4300 digits, and never a crash
(``RecursionError``) on hostile input: every violation raises ``error``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import WdeltaError

MAX_DEPTH = 64
MAX_INT_DIGITS = 4300  # Python's default int conversion limit (sys.int_info)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(data: bytes | str, error: type[WdeltaError], what: str) -> Any:
    """Parse ``data`` (UTF-8 bytes or text) or raise ``error`` naming ``what``."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise error(f"{what}: duplicate key {key!r}")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise error(f"{what}: {name} is not JSON")

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{what} is not valid UTF-8 JSON: {exc}") from exc
    except ValueError as exc:
        # int() refuses more than sys.get_int_max_str_digits() (4300) digits.
        raise error(f"{what}: a number of more than {MAX_INT_DIGITS} digits") from exc
    if _SURROGATE_ESCAPE.search(text):
        _check_encodable(value, error, what)
    _check_depth(value, error, what)
    return value


def _check_encodable(value: Any, error: type[WdeltaError], what: str) -> None:
    # Paired surrogate escapes decode to one character; unpaired ones survive
    # as lone surrogates, which no UTF-8 encoder accepts.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what}: unpaired surrogate escape") from exc


def _check_depth(value: Any, error: type[WdeltaError], what: str) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise error(f"{what}: nested more than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
