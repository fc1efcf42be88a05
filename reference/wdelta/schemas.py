"""Access to the JSON Schemas of schema/ (installed as ``wdelta/schema``)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

_HERE = Path(__file__).resolve().parent
# Installed wheels carry the schemas inside the package; a source checkout
# keeps the single copy at the repository's top level.
_CANDIDATES = (_HERE / "schema", _HERE.parent.parent / "schema")


def schema_dir() -> Path:
    """The folder holding ``*.schema.json``."""
    for folder in _CANDIDATES:
        if folder.is_dir():
            return folder
    raise FileNotFoundError("wdelta JSON schemas not found; reinstall the package")


@cache
def load(name: str) -> dict[str, Any]:
    """The schema ``name`` (e.g. ``"delta-header"``) as a dict."""
    with open(schema_dir() / f"{name}.schema.json", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """A compiled validator for schema ``name``."""
    schema = load(name)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    # JSON Schema counts 4096.0 as an integer; wdelta does not (SPEC.md §4.1).
    checker = base.TYPE_CHECKER.redefine("integer", _is_integer)
    cls = jsonschema.validators.extend(base, type_checker=checker)
    v: jsonschema.protocols.Validator = cls(schema)
    return v


def _is_integer(checker: object, value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
