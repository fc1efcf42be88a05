"""Code cites SPEC in one form (``SPEC §N.N``, rule ids bare) and only what SPEC has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "SPEC.md").read_text(encoding="utf-8")
CODE = sorted(
    [*(ROOT / "reference" / "wdelta").rglob("*.py"), *(ROOT / "conformance").rglob("*.py")]
)
SECTIONS = set(re.findall(r"^#{2,4} (\d+(?:\.\d+)*) ", SPEC, re.M))
# Rule ids are defined in bold (**K7**), as the first cell of a table row (| W1 |) or at
# the start of a list item (- RD-5 ...).
RULES = (
    set(re.findall(r"\*\*([A-Z]{1,2}-?\d{1,2})\*\*", SPEC))
    | set(re.findall(r"^\| *([A-Z]{1,2}-?\d{1,2}) *\|", SPEC, re.M))
    | set(re.findall(r"^- ([A-Z]{2}-\d{1,2}) ", SPEC, re.M))
)
SECTION_CITE = re.compile(r"§(\d+(?:\.\d+)*)")
CHAIN_RULE = re.compile(r"\b([A-Z]{2}-\d{1,2})\b")
# Single-letter rule ids are cited in parentheses or lists: "(K7)", "W1-W6", "rules T3, H4".
LETTER_RULE = re.compile(r"(?<=[(,/ ])([CHIKLPTVW]\d{1,2})(?=[),/-])")
OTHER_FORMS = re.compile(r'SPEC\.md\s+(§|section\b|\(?")|SPEC(\.md)?\s+\d')


def _cited(pattern: re.Pattern[str]) -> set[tuple[str, str]]:
    found = set()
    for path in CODE:
        for m in pattern.finditer(path.read_text(encoding="utf-8")):
            found.add((str(path.relative_to(ROOT)), m[1]))
    return found


def test_spec_defines_sections_and_rules() -> None:
    assert {"4.6", "7.6.6", "13", "17.11"} <= SECTIONS
    assert {"K7", "T3", "W1", "RD-5", "SG-2", "WS-2", "MP-1"} <= RULES


def test_every_cited_section_exists() -> None:
    missing = sorted(c for c in _cited(SECTION_CITE) if c[1] not in SECTIONS)
    assert not missing, missing


def test_every_cited_rule_exists() -> None:
    cited = _cited(CHAIN_RULE) | _cited(LETTER_RULE)
    missing = sorted(c for c in cited if c[1] not in RULES)
    assert not missing, missing


def test_one_citation_form() -> None:
    """``SPEC §4.6``, not ``SPEC.md §4.6``, ``SPEC.md "Header"`` or ``SPEC 4.6``."""
    offenders = []
    for path in CODE:
        text = path.read_text(encoding="utf-8")
        for m in OTHER_FORMS.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {m[0]!r}")
    assert not offenders, offenders


def test_every_test_spec_names_exists() -> None:
    """SPEC §15 names the test that shows each attack refused: it must exist."""
    defined = set()
    for path in (ROOT / "tests").glob("*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    named = set(re.findall(r"`(test_\w+)`", SPEC))
    assert named, "SPEC names no test"
    assert not named - defined, sorted(named - defined)
