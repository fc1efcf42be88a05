"""Strict JSON decoding shared by every JSON structure wdelta reads.

RFC 8259 only: no ``NaN``/``Infinity`` literals, no duplicate member names,
no unpaired surrogate escapes, nesting at most 64 levels, integers of at
most 4300 digits, and never a crash (``RecursionError``, ``MemoryError``) on
hostile input: every violation raises ``error``.  Memory is bounded before
parsing (:mod:`.jsoncost`): text whose Python objects would take more than
10 bytes per byte plus 32 MiB is refused with ``LimitExceededError``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import LimitExceededError, WdeltaError
from ..limits import MAX_INT_DIGITS, MAX_JSON_DEPTH
from . import jsoncost

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(data: bytes | str, error: type[WdeltaError], what: str) -> Any:
    """Parse ``data`` (UTF-8 bytes or text) or raise ``error`` naming ``what``."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    counts = jsoncost.scan(raw)
    if counts.depth > MAX_JSON_DEPTH:
        raise error(f"{what}: nested more than {MAX_JSON_DEPTH} levels")
    cost, allowed = jsoncost.parse_cost(counts, raw), jsoncost.budget(len(raw))
    if cost > allowed:
        raise LimitExceededError(
            f"{what}: its {counts.objects} objects, {counts.arrays} arrays and "
            f"{counts.numbers + counts.strings} values in {len(raw)} bytes would take up to "
            f"{cost >> 20} MiB to parse, over the limit of {allowed >> 20} MiB "
            "(10 bytes per byte + 32 MiB)"
        )
    value = _parse(raw, error, what, None)
    if _members(value) != counts.members:
        # Fewer members than ':' tokens: a duplicate name collapsed; parse
        # again, slowly, to name it.
        _parse(raw, error, what, _pairs(error, what))
    if _SURROGATE_ESCAPE.search(raw):
        _check_encodable(value, error, what)
    return value


def within_budget(raw: bytes) -> bool:
    """Whether :func:`loads` would parse ``raw`` (valid JSON) within its memory budget."""
    return jsoncost.parse_cost(jsoncost.scan(raw), raw) <= jsoncost.budget(len(raw))


def _parse(raw: bytes, error: type[WdeltaError], what: str, pairs: Any) -> Any:
    def constant(name: str) -> Any:
        raise error(f"{what}: {name} is not JSON")

    try:
        text = raw.decode("utf-8")
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{what} is not valid UTF-8 JSON: {exc}") from exc
    except ValueError as exc:
        # int() refuses more than sys.get_int_max_str_digits() (4300) digits.
        raise error(f"{what}: a number of more than {MAX_INT_DIGITS} digits") from exc


def _pairs(error: type[WdeltaError], what: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise error(f"{what}: duplicate key {key!r}")
            out[key] = value
        return out

    return pairs


def _members(value: Any) -> int:
    """Members of every object in ``value``; memory bounded by the depth."""
    total = 0
    stack = [iter((value,))]
    while stack:
        for node in stack[-1]:
            if type(node) is dict:
                total += len(node)
                stack.append(iter(node.values()))
                break
            if type(node) is list:
                stack.append(iter(node))
                break
        else:
            stack.pop()
    return total


def _check_encodable(value: Any, error: type[WdeltaError], what: str) -> None:
    # Paired surrogate escapes decode to one character; unpaired ones survive
    # as lone surrogates, which no UTF-8 encoder accepts.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what}: unpaired surrogate escape") from exc
