"""Invalid headers: JSON (§4.1), version and features (§4.2), schema, unknown values.

Every case keeps the header digest, blob checksums and side digests valid
(recomputed after the change), so only the named defect can be found.
Schema cases freeze everything else first: a broken field may make the
recomputation meaningless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .builder import Delta
from .common import add_valid
from .host import Host

Mutation = Callable[[Delta], None]


def hook(fn: Callable[[bytes], bytes]) -> Mutation:
    """A mutation of the header text (before padding and digest)."""

    def mutate(delta: Delta) -> None:
        delta.header_hook = fn

    return mutate


def on_doc(fn: Callable[[dict[str, Any]], Any]) -> Mutation:
    def mutate(delta: Delta) -> None:
        fn(delta.doc)

    return mutate


def on_tensor(name: str, fn: Callable[[dict[str, Any]], Any]) -> Mutation:
    def mutate(delta: Delta) -> None:
        fn(delta.tensor(name))

    return mutate


def frozen(mutate: Mutation) -> Mutation:
    def apply(delta: Delta) -> None:
        delta.freeze()
        mutate(delta)

    return apply


def setter(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def assign(obj: dict[str, Any]) -> None:
        obj[key] = value

    return assign


def dropper(key: str) -> Callable[[dict[str, Any]], None]:
    def remove(obj: dict[str, Any]) -> None:
        del obj[key]

    return remove


def _nest(depth: int) -> Callable[[bytes], bytes]:
    """Add a member nesting arrays so that the header reaches ``depth`` levels."""
    return lambda h: h[:-1] + b',"x-deep":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def _replace(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def edit(h: bytes) -> bytes:
        assert old in h, old
        return h.replace(old, new, 1)

    return edit


JSON_CASES: list[tuple[str, Mutation, str, str]] = [
    ("json-truncated", hook(lambda h: h[:-1]), "not one JSON text",
     "the header JSON without its closing brace"),
    ("json-not-object", hook(lambda h: b"[" + h + b"]"), "its value is not an object",
     "the header JSON is an array holding the header object"),
    ("json-invalid-utf8", hook(_replace(b"conformance", b"conf\xffrmance")),
     "the bytes are not valid UTF-8", "an invalid UTF-8 byte inside a JSON string"),
    ("json-bom", hook(lambda h: b"\xef\xbb\xbf" + h), "begin with a byte-order mark",
     "a UTF-8 byte-order mark before the JSON"),
    ("json-nan", hook(_replace(b'"chunk_elements":256', b'"chunk_elements":NaN')),
     "the literals NaN and Infinity are not JSON", "chunk_elements: NaN"),
    ("json-unpaired-surrogate", hook(_replace(b"wdelta-conformance/1", b"\\ud800")),
     "a \\u escape of an unpaired surrogate", 'generator "\\ud800"'),
    ("json-nesting-65", hook(_nest(65)), "nested more than 64 levels deep",
     "an unknown member nesting arrays to depth 65"),
    ("json-duplicate-key", hook(lambda h: b'{"chunk_elements":256,' + h[1:]),
     "two members with the same name", "top-level chunk_elements twice (same value)"),
    ("json-duplicate-key-escaped", hook(lambda h: b'{"vers\\u0069on":1,' + h[1:]),
     "two members with the same name (compared after unescaping)",
     'members "vers\\u0069on" and "version"'),
    ("json-duplicate-key-nested", hook(_replace(b'"codec":"zstd"', b'"codec":"zstd",' * 2)),
     "two members with the same name, at any depth", "a chunk object with codec twice"),
    ("json-integer-fraction", hook(_replace(b'"chunk_elements":256', b'"chunk_elements":256.0')),
     "an integer field written with a fraction", "chunk_elements: 256.0"),
    ("json-integer-exponent", hook(_replace(b'"chunk_elements":256', b'"chunk_elements":2.56e2')),
     "an integer field written with an exponent", "chunk_elements: 2.56e2"),
    ("json-number-4301-digits", hook(lambda h: h[:-1] + b',"x-big":' + b"9" * 4301 + b"}"),
     "an integer of more than 4300 digits, in a member readers otherwise ignore",
     "x-big: an integer of 4301 digits"),
    ("json-version-fraction", hook(_replace(b'"version":1', b'"version":1.0')),
     "an integer field written with a fraction, version included (§4.1 is step 1 of §4.2, "
     "before the version is read)", "version: 1.0"),
    ("json-version-exponent", hook(_replace(b'"version":1', b'"version":1e0')),
     "an integer field written with an exponent, version included (§4.1 is step 1 of §4.2)",
     "version: 1e0"),
]  # fmt: skip

SCHEMA_CASES: list[tuple[str, Mutation, str]] = [
    ("schema-missing-tensors", on_doc(dropper("tensors")), "no tensors member"),
    ("schema-missing-required-features", on_doc(dropper("required_features")),
     "no required_features member"),
    ("schema-required-features-string", on_doc(setter("required_features", "none")),
     'required_features: "none"'),
    ("schema-required-features-not-string", on_doc(setter("required_features", [1])),
     "required_features: [1] (an element that is no string is a schema error of step 4, "
     "not an unknown feature of step 3)"),
    ("schema-chunk-elements-string", on_doc(setter("chunk_elements", "256")),
     'chunk_elements: "256"'),
    ("schema-chunk-elements-zero", on_doc(setter("chunk_elements", 0)), "chunk_elements: 0"),
    ("schema-reversible-not-boolean", on_doc(setter("reversible", 1)), "reversible: 1"),
    ("schema-tensors-not-array", on_doc(setter("tensors", {})), "tensors: {}"),
    ("schema-missing-base-files", on_doc(lambda d: d["base"].pop("files")), "base without files"),
    ("schema-digest-uppercase", on_tensor("e", lambda t: t.update(
        base_digest=t["base_digest"].upper(), target_digest=t["target_digest"].upper())),
     "tensor digests in upper-case hex"),
    ("schema-negative-dimension", on_tensor("a", setter("shape", [-596])), "shape [-596]"),
    ("schema-changed-boolean", on_tensor("a", lambda t: t["chunks"][1].update(changed=False)),
     "an unchanged chunk with changed: false"),
    ("schema-length-zero", on_tensor("a", lambda t: t["chunks"][0].update(length=0)),
     "a blob length of 0 (K10)"),
    ("schema-path-traversal", on_doc(lambda d: d["target"]["files"][0].update(
        path="../model.safetensors")), "target file path ../model.safetensors"),
    ("schema-path-subfolder", on_doc(lambda d: d["target"]["files"][0].update(
        path="sub/model.safetensors")), "target file path sub/model.safetensors"),
    ("schema-path-dot-file", on_doc(lambda d: d["target"]["files"][0].update(
        path=".model.safetensors")), "target file path .model.safetensors"),
    ("schema-path-too-long", on_doc(lambda d: d["target"]["files"][0].update(
        path="m" * 244 + ".safetensors")), "a 256-character target file path"),
    ("schema-path-suffix", on_doc(lambda d: d["target"]["files"][0].update(
        path="model.bin")), "target file path model.bin"),
    ("schema-path-final-line-feed", on_doc(lambda d: d["target"]["files"][0].update(
        path="model.safetensors\n")),
     "target file path model.safetensors + line feed (patterns are full matches, §2.2)"),
    ("schema-digest-final-line-feed", on_tensor("a", lambda t: t.update(
        base_digest=t["base_digest"] + "\n")),
     "a base_digest ending in a line feed (patterns are full matches, §2.2)"),
    ("schema-checksum-final-line-feed", on_tensor("a", lambda t: t["chunks"][0].update(
        checksum=t["chunks"][0]["checksum"] + "\n")),
     "a blob checksum ending in a line feed (patterns are full matches, §2.2)"),
]  # fmt: skip

VERSION_CASES: list[tuple[str, Mutation, str]] = [
    ("header-version-2", on_doc(setter("version", 2)), "header version 2 in a version-1 file"),
    ("header-version-missing", on_doc(dropper("version")), "no version member"),
    ("header-version-string", on_doc(setter("version", "1")), 'version: "1"'),
    ("header-version-true", on_doc(setter("version", True)), "version: true"),
]


def add_header_cases(host: Host) -> None:
    for name, mutate, rule, what in JSON_CASES:
        rule = f"the header is not UTF-8 JSON meeting §4.1: {rule} → header-invalid"
        host.mutated(name, mutate, "header-invalid", "§4.1", rule, what)
    for name, mutate, what in SCHEMA_CASES:
        host.mutated(name, frozen(mutate), "header-invalid", "§4.2",
                     "step 4: the header does not validate against "
                     "schema/delta-header.schema.json → header-invalid", what)  # fmt: skip
    for name, mutate, what in VERSION_CASES:
        host.mutated(name, frozen(mutate), "unsupported-version", "§4.2",
                     "step 2: the top-level member version is absent or is not the integer 1 "
                     "→ unsupported-version", what)  # fmt: skip
    host.mutated("unknown-required-feature",
                 on_doc(setter("required_features", ["x-quantized-deltas"])),
                 "unsupported-feature", "§4.2",
                 "step 3: an element of required_features is not a feature the reader "
                 "implements → unsupported-feature (v1 defines none)",
                 'required_features: ["x-quantized-deltas"]')  # fmt: skip
    _add_enum_cases(host)
    delta = host.delta()
    delta.header_hook = lambda h: h[:-1] + b',"x-big":' + b"9" * 4300 + b"}"
    add_valid(host.suite, "valid/number-4300-digits", host.pair, delta,
              "the host delta with an ignored member holding an integer of 4300 digits (the "
              "most §4.1 allows)", "§4.1", "a number of at most 4300 digits is JSON a reader "
              "accepts; unknown members are ignored (§4.2)")  # fmt: skip


def _retype_layout(delta: Delta, dtype: str) -> None:
    """Tensor ``e`` becomes ``dtype`` in its entry and in both sides' file headers."""
    delta.tensor("e")["dtype"] = dtype
    for side in ("base", "target"):
        f = delta.doc[side]["files"][0]
        old = '"e":{"dtype":"F16"'
        assert old in f["header"]
        f["header"] = f["header"].replace(old, f'"e":{{"dtype":"{dtype}"')


def _add_enum_cases(host: Host) -> None:
    cases: list[tuple[str, Mutation, str, str, str]] = [
        ("unknown-op", on_tensor("e", setter("op", "renamed")), "§4.4",
         "T1: op is not one of the four operations → unsupported-feature", 'op "renamed"'),
        ("unsupported-dtype-f4", lambda d: _retype_layout(d, "F4"), "§5.3",
         "F4, F6_E2M3, F6_E3M2 and C128 → unsupported-feature wherever they appear",
         "tensor e of dtype F4, in its entry and in both sides' file headers"),
        ("unsupported-dtype-c128", lambda d: _retype_layout(d, "C128"), "§5.3",
         "F4, F6_E2M3, F6_E3M2 and C128 → unsupported-feature wherever they appear",
         "tensor e of dtype C128, in its entry and in both sides' file headers"),
        ("unknown-encoding", on_tensor("b", lambda t: t["chunks"][0].update(encoding="planes2")),
         "§4.6", "K1: encoding is not unchanged, sparse, dense or full → unsupported-feature",
         'encoding "planes2"'),
        ("unknown-transform", on_tensor("b", lambda t: t["chunks"][0].update(transform="rotate")),
         "§4.6", "K3: transform of a sparse or dense chunk is not xor or sub → "
         "unsupported-feature", 'transform "rotate"'),
        ("unknown-codec", on_tensor("b", lambda t: t["chunks"][0].update(codec="brotli")),
         "§4.6", "K3: codec is not zstd or none → unsupported-feature", 'codec "brotli"'),
    ]  # fmt: skip
    for name, mutate, section, rule, what in cases:
        host.mutated(name, mutate, "unsupported-feature", section, rule, what)
