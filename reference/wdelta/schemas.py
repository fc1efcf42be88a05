"""Access to the JSON Schemas of schema/ (installed as ``wdelta/schema``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    # Imported here: jsonschema costs ~65 ms of start-up, which ``wdelta diff``
    # (it writes headers, never validates them) should not pay.
    import jsonschema

    schema = load(name)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    # JSON Schema counts 4096.0 as an integer; wdelta does not (SPEC.md §4.1).
    checker = base.TYPE_CHECKER.redefine("integer", _is_integer)
    cls = jsonschema.validators.extend(
        base, validators={"pattern": _pattern_keyword}, type_checker=checker
    )
    v: jsonschema.protocols.Validator = cls(schema)
    return v


def violation(name: str, instance: Any) -> str | None:
    """None if ``instance`` is valid against schema ``name``, else "at PATH: message"."""
    import jsonschema

    try:
        validator(name).validate(instance)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"at {where}: {exc.message}"
    return None


def _is_integer(checker: object, value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a schema pattern with ECMA-262 ``$`` semantics.

    In Python ``$`` also matches before a final newline, so ``"name\n"`` would
    pass ``^...$``; ECMA-262, which JSON Schema specifies, does not allow that.
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern_keyword(
    validator: Any, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    import jsonschema

    if isinstance(instance, str) and not ecma_pattern(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_FLAT_KEYWORDS = frozenset({"type", "minimum", "pattern", "$ref"})
_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
}


@dataclass(frozen=True)
class _Field:
    key: str
    type: str
    minimum: int | None
    pattern: re.Pattern[str] | None


def _resolve(root: dict[str, Any], sub: dict[str, Any]) -> dict[str, Any]:
    """Inline local ``$ref``s (``#/$defs/...``) of a property subschema."""
    while "$ref" in sub:
        ref = sub.pop("$ref")
        sub = {**root["$defs"][ref.removeprefix("#/$defs/")], **sub}
    return sub


class FlatChecker:
    """A compiled check of a flat ``$defs`` object schema (scalar properties only).

    Header chunk entries number in the hundreds of thousands for a large
    model, and jsonschema spends about 0.3 ms on each (75 s for 250k chunks);
    this checker applies the same subschema, read from the schema file, at
    memory speed.  It refuses to compile a subschema that uses any keyword it
    does not implement, so the schema and this check cannot drift apart.
    """

    def __init__(self, schema: dict[str, Any], definition: str) -> None:
        sub = schema["$defs"][definition]
        if set(sub) - {"type", "required", "properties"} or sub.get("type") != "object":
            raise ValueError(f"$defs/{definition} is not a flat object schema")
        self.required = tuple(sub.get("required", ()))
        self.fields = tuple(self._field(schema, k, v) for k, v in sub["properties"].items())

    @staticmethod
    def _field(schema: dict[str, Any], key: str, prop: dict[str, Any]) -> _Field:
        prop = _resolve(schema, dict(prop))
        if set(prop) - _FLAT_KEYWORDS or prop.get("type") not in _TYPES:
            raise ValueError(f"property {key!r} uses keywords FlatChecker does not implement")
        pattern = ecma_pattern(prop["pattern"]) if "pattern" in prop else None
        return _Field(key, prop["type"], prop.get("minimum"), pattern)

    def errors(self, value: Any) -> str | None:
        """None if ``value`` is valid, else a message naming the first violation."""
        if not isinstance(value, dict):
            return "is not an object"
        for key in self.required:
            if key not in value:
                return f"{key!r} is a required property"
        for f in self.fields:
            if f.key not in value:
                continue
            v = value[f.key]
            if not _TYPES[f.type](v):
                return f"{f.key}: {v!r} is not of type {f.type!r}"
            if f.minimum is not None and v < f.minimum:
                return f"{f.key}: {v!r} is less than the minimum of {f.minimum}"
            if f.pattern is not None and not f.pattern.search(v):
                return f"{f.key}: {v!r} does not match {f.pattern.pattern!r}"
        return None


@cache
def flat_checker(name: str, definition: str) -> FlatChecker:
    """The :class:`FlatChecker` of ``$defs/definition`` in schema ``name``."""
    return FlatChecker(load(name), definition)
