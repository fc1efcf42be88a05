"""wdelta.limits mirrors SPEC.md §13, and no module defines a §13 limit of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from wdelta import limits

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "reference" / "wdelta"

# The first cell of each §13 row, and the constants whose value the row states.
ROWS = {
    "Header length `N`": ["MAX_HEADER_BYTES"],
    "`chunk_elements`": ["MAX_CHUNK_ELEMENTS"],
    "Elements per tensor `n`": ["MAX_ELEMENTS"],
    "A tensor dimension": ["MAX_ELEMENTS"],
    "`raw_length` of `dense`, `full`": ["MAX_DENSE_RAW_BYTES"],
    "`raw_length` of `sparse`": ["MAX_SPARSE_RAW_BYTES"],
    "Stored bytes of an inline blob": ["MAX_INLINE_BYTES"],
    "zstd `Frame_Content_Size`": [],  # equals `raw_length`: no constant
    "zstd `Window_Size`": ["MAX_ZSTD_WINDOW"],
    "JSON nesting depth": ["MAX_JSON_DEPTH"],
    "Memory to parse a JSON text of `N` bytes": ["JSON_BYTES_FACTOR", "JSON_FIXED_BYTES"],
    "Digits of a JSON integer": ["MAX_INT_DIGITS"],
    "Input safetensors header": ["MAX_INPUT_HEADER_BYTES"],
    "A chain's manifest revision": ["MAX_MANIFEST_BYTES"],
    "A revision signature object, a trust root": ["MAX_DOCUMENT_BYTES"],
}
UNITS = {"MiB": 1 << 20}


def _section_13() -> list[tuple[str, str]]:
    spec = (ROOT / "SPEC.md").read_text(encoding="utf-8")
    body = spec.split("\n## 13 Limits\n", 1)[1].split("\n## 14 ", 1)[0]
    rows = [line.split("|")[1:3] for line in body.splitlines() if line.startswith("| ")]
    return [(q.strip(), lim.strip()) for q, lim in rows[1:]]


def _numbers(text: str) -> list[int]:
    """Every number the limit cell states: 100,000,000; 2^26; 32 MiB; 10·`N`."""
    found = []
    for m in re.finditer(r"(\d[\d,]*)(?:\^(\d+))?(?: (MiB))?", text):
        value = int(m[1].replace(",", ""))
        if m[2]:
            value = value ** int(m[2])
        found.append(value * UNITS.get(m[3] or "", 1))
    return found


def test_every_row_of_section_13_has_its_constants() -> None:
    assert [q for q, _ in _section_13()] == list(ROWS)


@pytest.mark.parametrize(("quantity", "limit"), _section_13(), ids=lambda v: v[:30])
def test_constant_states_the_spec_value(quantity: str, limit: str) -> None:
    stated = _numbers(limit)
    for name in ROWS[quantity]:
        assert getattr(limits, name) in stated, (quantity, name, stated)


def test_derived_payload_limits_follow_from_the_chunk_limit() -> None:
    largest = limits.MAX_CHUNK_ELEMENTS
    assert largest * 8 == limits.MAX_DENSE_RAW_BYTES
    assert 24 + largest * (8 + 5) < limits.MAX_SPARSE_RAW_BYTES


def test_no_module_defines_a_limit_of_its_own() -> None:
    values = {getattr(limits, n) for n in dir(limits) if n.isupper()}
    named = {n for n in dir(limits) if n.isupper()}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "limits.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in named:
                    offenders.append(f"{path.relative_to(PACKAGE)}: {target.id}")
                elif (
                    isinstance(target, ast.Name)
                    and target.id.startswith("MAX_")
                    and isinstance(node.value, ast.Constant)
                    and node.value.value in values
                    and node.value.value > 1000
                ):
                    offenders.append(f"{path.relative_to(PACKAGE)}: {target.id} repeats a limit")
    assert not offenders
