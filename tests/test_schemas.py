"""The compiled header checks agree with jsonschema on the same subschemas."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdelta.format import schemas

DIGEST = "ab" * 32
_scalars = st.one_of(
    st.sampled_from([-1, 0, 1, 2**64]), st.integers(-3, 2**64),
    st.sampled_from(["", "x", DIGEST, DIGEST + "\n", DIGEST.upper()]),
    st.booleans(), st.none(), st.floats(allow_nan=False, width=32),
)  # fmt: skip


def _near_valid(valid: dict[str, Any]) -> st.SearchStrategy[Any]:
    """The valid object with keys dropped, replaced by scalars, lists or objects."""
    keys = sorted(valid)
    mutated = st.fixed_dictionaries(
        {},
        optional={
            k: st.one_of(st.just(valid[k]), _scalars, st.lists(_scalars, max_size=3),
                         st.dictionaries(st.sampled_from(keys), _scalars, max_size=2))
            for k in keys
        },
    )  # fmt: skip
    return st.one_of(mutated, _scalars, st.lists(_scalars, max_size=2))


_CHUNK = {
    "encoding": "sparse", "changed": 3, "transform": "sub", "codec": "zstd", "offset": 0,
    "length": 9, "raw_length": 40, "checksum": DIGEST,
}  # fmt: skip
_TENSOR = {
    "name": "w", "op": "modified", "dtype": "BF16", "shape": [2, 3],
    "base_digest": DIGEST, "target_digest": DIGEST, "chunks": [_CHUNK],
}  # fmt: skip


# An inline chunk (SPEC §4.12): mutations drop it, add blob members beside it
# (dependentSchemas) or break its text, in both forms.
_INLINE_CHUNK = {"encoding": "dense", "changed": 2, "transform": "xor", "codec": "none",
                 "raw_length": 3, "inline": "AAEC", "offset": 0}  # fmt: skip
_COMPACT_CHUNK = {"e": "dense", "k": 2, "x": "xor", "z": "none", "r": 3, "i": "AAEC",
                  "l": 3, "h": "A" * 43}  # fmt: skip


def _agree(definition: str, value: Any) -> None:
    found = schemas.compiled_checker("delta-header", definition).errors(value)
    reference = schemas.validator("delta-header", definition)
    assert (found is None) == reference.is_valid(value), (value, found)


@settings(max_examples=400)
@given(_near_valid(_CHUNK))
def test_chunk_check_agrees_with_jsonschema(value: Any) -> None:
    _agree("chunk", value)


@settings(max_examples=400)
@given(st.one_of(
    _near_valid(_TENSOR),
    st.builds(lambda c, s: {**_TENSOR, "chunks": c, "shape": s},
              st.lists(_near_valid(_CHUNK), max_size=3), st.lists(_scalars, max_size=3)),
))  # fmt: skip
def test_tensor_check_agrees_with_jsonschema(value: Any) -> None:
    _agree("tensor", value)


@settings(max_examples=300)
@given(_near_valid(_INLINE_CHUNK))
def test_inline_chunk_check_agrees_with_jsonschema(value: Any) -> None:
    _agree("chunk", value)


@settings(max_examples=300)
@given(_near_valid(_COMPACT_CHUNK))
def test_compact_chunk_check_agrees_with_jsonschema(value: Any) -> None:
    _agree("compact_chunk", value)


@pytest.mark.parametrize("path", sorted(schemas.schema_dir().glob("*.schema.json")),
                         ids=lambda p: p.name)  # fmt: skip
def test_every_schema_is_valid_against_its_metaschema(path: Any) -> None:
    """The validators do not check the schemas at run time (50 ms per process): this does."""
    import jsonschema

    schema = schemas.load(path.name.removesuffix(".schema.json"))
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_a_broken_schema_fails_the_metaschema_check() -> None:
    import jsonschema

    broken = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": 5}
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.validators.validator_for(broken).check_schema(broken)


def test_violation_names_the_path() -> None:
    checker = schemas.compiled_checker("delta-header", "tensor")
    bad = {**_TENSOR, "chunks": [_CHUNK, {**_CHUNK, "changed": -1}]}
    assert checker.errors(bad) == ("chunks/1/changed", "-1 is less than the minimum of 0")
    assert checker.errors({**_TENSOR, "shape": [1, "2"]}) == (
        "shape/1", "'2' is not of type 'integer'"
    )  # fmt: skip


def test_unimplemented_keyword_is_refused() -> None:
    schema = {"$defs": {"x": {"type": "object", "properties": {"a": {"enum": [1]}}}}}
    with pytest.raises(ValueError, match="does not implement"):
        schemas.CompiledChecker(schema, "x")
