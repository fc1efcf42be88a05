"""Access to the JSON Schemas of schema/ (installed as ``wdelta/schema``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import jsonschema

_PACKAGE = Path(__file__).resolve().parents[1]
# Installed wheels carry the schemas inside the package (``wdelta/schema``); a
# source checkout keeps the single copy at the repository's top level.
_CANDIDATES = (_PACKAGE / "schema", _PACKAGE.parents[1] / "schema")


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
def validator(name: str, definition: str | None = None) -> jsonschema.protocols.Validator:
    """A compiled validator for schema ``name``, or for its ``$defs/definition``."""
    # Imported here: jsonschema costs ~65 ms of start-up, which ``wdelta diff``
    # (it writes headers, never validates them) should not pay.
    import jsonschema

    # The schemas themselves are checked against their metaschema by the test
    # suite (tests/test_schemas.py), not here: that costs ~50 ms per process.
    schema = load(name)
    base = jsonschema.validators.validator_for(schema)
    # JSON Schema counts 4096.0 as an integer; wdelta does not (SPEC §4.1).
    checker = base.TYPE_CHECKER.redefine("integer", _is_integer)
    cls = jsonschema.validators.extend(
        base, validators={"pattern": _pattern_keyword}, type_checker=checker
    )
    if definition is not None:
        schema = {"$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
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


_SCALAR_KEYWORDS = frozenset({"type", "minimum", "pattern", "description"})
_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
}
# A violation: (path inside the checked value, message).
Violation = tuple[str, str]


class _Check(Protocol):
    def errors(self, value: Any) -> Violation | None: ...


def _under(key: object, found: Violation | None) -> Violation | None:
    if found is None:
        return None
    path, message = found
    return (f"{key}/{path}" if path else str(key)), message


@dataclass(frozen=True)
class _Scalar:
    type: str
    minimum: int | None
    pattern: re.Pattern[str] | None

    def errors(self, value: Any) -> Violation | None:
        if not _TYPES[self.type](value):
            return "", f"{value!r} is not of type {self.type!r}"
        if self.minimum is not None and value < self.minimum:
            return "", f"{value!r} is less than the minimum of {self.minimum}"
        if self.pattern is not None and not self.pattern.search(value):
            return "", f"{value!r} does not match {self.pattern.pattern!r}"
        return None


@dataclass(frozen=True)
class _Array:
    items: _Check

    def errors(self, value: Any) -> Violation | None:
        if not isinstance(value, list):
            return "", f"{value!r} is not of type 'array'"
        for i, item in enumerate(value):
            found = self.items.errors(item)
            if found is not None:
                return _under(i, found)
        return None


@dataclass(frozen=True)
class _Object:
    required: tuple[str, ...]
    fields: tuple[tuple[str, _Check], ...]
    # (member, a check of the whole object that applies when the member is present)
    dependent: tuple[tuple[str, _Check], ...] = ()

    def errors(self, value: Any) -> Violation | None:
        if not isinstance(value, dict):
            return "", f"{value!r} is not of type 'object'"
        for key in self.required:
            if key not in value:
                return "", f"{key!r} is a required property"
        for key, check in self.fields:
            if key in value:
                found = check.errors(value[key])
                if found is not None:
                    return _under(key, found)
        for key, check in self.dependent:
            if key in value:
                found = check.errors(value)
                if found is not None:
                    return found[0], f"with {key!r}: {found[1]}"
        return None


@dataclass(frozen=True)
class _Absent:
    """The ``false`` subschema: a member that must not be present."""

    def errors(self, value: Any) -> Violation | None:
        return "", "the member must be absent"


def _resolve(root: dict[str, Any], sub: dict[str, Any]) -> dict[str, Any]:
    """Inline local ``$ref``s (``#/$defs/...``) of a subschema."""
    while "$ref" in sub:
        ref = sub.pop("$ref")
        sub = {**root["$defs"][ref.removeprefix("#/$defs/")], **sub}
    return sub


def _compile(root: dict[str, Any], sub: dict[str, Any] | bool) -> _Check:
    """A check of ``sub``; ValueError for any keyword not implemented here."""
    if sub is False:
        return _Absent()
    if not isinstance(sub, dict):
        raise ValueError(f"subschema {sub!r} is not implemented by the compiled checker")
    sub = _resolve(root, dict(sub))
    kind = sub.get("type")
    if kind == "object" and set(sub) <= {"type", "required", "properties", "dependentSchemas"}:
        fields = tuple((k, _compile(root, v)) for k, v in sub.get("properties", {}).items())
        dependent = tuple(
            (k, _compile(root, {"type": "object", **v}))
            for k, v in sub.get("dependentSchemas", {}).items()
        )
        return _Object(tuple(sub.get("required", ())), fields, dependent)
    if kind == "array" and set(sub) == {"type", "items"}:
        return _Array(_compile(root, sub["items"]))
    if kind in _TYPES and set(sub) <= _SCALAR_KEYWORDS:
        pattern = ecma_pattern(sub["pattern"]) if "pattern" in sub else None
        return _Scalar(kind, sub.get("minimum"), pattern)
    raise ValueError(f"subschema {sub!r} uses keywords the compiled checker does not implement")


class CompiledChecker:
    """A compiled check of a ``$defs`` object schema built from a few keywords.

    A header holds one tensor entry per tensor (~90 000 for a large MoE model)
    and one chunk entry per chunk (hundreds of thousands), and jsonschema
    spends 0.1-0.3 ms on each, minutes in all; this checker applies the same
    subschema, read from the schema file, at memory speed.  It implements
    ``type`` (object, array, integer, string), ``required``, ``properties``,
    ``dependentSchemas``, ``items``, ``minimum``, ``pattern``, local ``$ref``,
    the ``false`` schema (a member that must be absent) and the ``description``
    annotation, and refuses to
    compile a subschema using any other keyword, so the schema and this check
    cannot drift apart.
    """

    def __init__(self, schema: dict[str, Any], definition: str) -> None:
        check = _compile(schema, schema["$defs"][definition])
        if not isinstance(check, _Object):
            raise ValueError(f"$defs/{definition} is not an object schema")
        self._check = check

    def errors(self, value: Any) -> Violation | None:
        """None if ``value`` is valid, else the first violation's (path, message)."""
        return self._check.errors(value)


@cache
def compiled_checker(name: str, definition: str) -> CompiledChecker:
    """The :class:`CompiledChecker` of ``$defs/definition`` in schema ``name``."""
    return CompiledChecker(load(name), definition)
