"""The vector manifest: loading, schema validation and integrity of the vector files.

``manifest.json`` (schema ``conformance-manifest``) lists every case with its
inputs (paths relative to the manifest, with sha256) and the expected outcome.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from ..arguments import as_path
from ..errors import BadArgumentError, StorageError
from ..format import schemas
from ..io.filekind import os_message

PROFILES = ("reader", "decoder", "reverse", "encoder", "manifest")
# Placeholders every template of a profile must hold; manifest cases that need
# storage add ``{store}`` (a chain root), those that need a revision accepted
# before add ``{seen}`` (RD-1); each is tested only with a template holding it.
ROLES = {
    "reader": ("delta",),
    "decoder": ("base", "delta", "out"),
    "reverse": ("target", "delta", "out"),
    "encoder": ("base", "target", "out"),
    "manifest": ("manifest",),
}
# The manifest cases that need storage, a trust root or a revision seen before
# run with a template of their own: the extra role -> that template's name (the
# first role a case has decides: a signature case also has a store).
STORE_TEMPLATE = "manifest-store"
SEEN_TEMPLATE = "manifest-seen"
TRUST_TEMPLATE = "manifest-trust"
STATE_TEMPLATE = "manifest-state"
TRUST_STATE_TEMPLATE = "manifest-trust-state"
EXTRA_TEMPLATES = {"trust": TRUST_TEMPLATE, "store": STORE_TEMPLATE, "seen": SEEN_TEMPLATE}
TEMPLATE_ROLES = {**ROLES, STORE_TEMPLATE: ("manifest", "store"),
                  SEEN_TEMPLATE: ("manifest", "seen"),
                  TRUST_TEMPLATE: ("manifest", "store", "trust"),
                  STATE_TEMPLATE: ("manifest", "store", "state"),
                  TRUST_STATE_TEMPLATE: ("manifest", "store", "trust", "state")}  # fmt: skip


def template_of(profile: str, roles: Collection[str]) -> str:
    """The template a case with input ``roles`` runs with: its profile's, or an extra one
    (a node's acceptance state, ``{state}``, with or without a trust root)."""
    if "state" in roles:
        return TRUST_STATE_TEMPLATE if "trust" in roles else STATE_TEMPLATE
    return next((t for r, t in EXTRA_TEMPLATES.items() if r in roles), profile)


def placeholder_of(template: str) -> str:
    """The placeholder that sets an extra template apart (``{trust}``, ``{state}``...)."""
    if template in (STATE_TEMPLATE, TRUST_STATE_TEMPLATE):
        return "{state}"
    return next("{" + r + "}" for r, t in EXTRA_TEMPLATES.items() if t == template)


CHAIN_CATEGORIES = (
    "manifest-invalid", "chain-broken", "not-found", "conflict", "signature-invalid", "frozen",
)  # fmt: skip
_HERE = Path(__file__).resolve().parent
# An installed wheel carries the vectors inside the package; a source checkout
# keeps them at the repository's top level.
_CANDIDATES = (_HERE / "data", _HERE.parents[2] / "conformance")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Input:
    """A vector file, or a folder (sharded checkpoint) of files, with their sha256."""

    path: str
    files: dict[str, str]
    is_folder: bool


@dataclass(frozen=True)
class Output:
    """An expected checkpoint: file sha256s (``"."`` for a single file) and tensor sha256s."""

    layout: str
    files: dict[str, str]
    tensors: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Case:
    """One case of the suite."""

    id: str
    profile: str
    description: str
    section: str
    rule: str
    inputs: dict[str, Input]
    out: str | None
    outcome: str
    category: str | None
    output: Output | None
    reverse_output: Output | None
    reference_delta_bytes: int | None
    information_bytes: int | None
    since: int = 1  # the suite version that introduced the case

    @property
    def expected(self) -> str:
        """``valid`` or ``invalid: CATEGORY``."""
        return "valid" if self.outcome == "valid" else f"invalid: {self.category}"


@dataclass(frozen=True)
class Manifest:
    """A loaded manifest: ``root`` is its folder, ``raw`` its JSON, ``sha256`` its hash."""

    root: Path
    raw: dict[str, Any]
    cases: tuple[Case, ...]
    sha256: str


def default_vectors() -> Path:
    """The installed vectors, else the repository's ``conformance/`` folder."""
    for folder in _CANDIDATES:
        if (folder / "manifest.json").is_file():
            return folder
    raise BadArgumentError("conformance vectors not found: pass --vectors DIR")


def _output(raw: dict[str, Any] | None) -> Output | None:
    if raw is None:
        return None
    if raw["layout"] == "file":
        files = {".": raw["sha256"]}
    else:
        files = {name: f["sha256"] for name, f in raw["files"].items()}
    return Output(raw["layout"], files, raw["tensors"])


def _input(raw: dict[str, Any]) -> Input:
    if "files" in raw:
        return Input(raw["path"], dict(raw["files"]), True)
    return Input(raw["path"], {".": raw["sha256"]}, False)


def _case(raw: dict[str, Any]) -> Case:
    expect = raw["expect"]
    return Case(
        raw["id"], raw["profile"], raw["description"], raw["spec"]["section"],
        raw["spec"]["rule"], {role: _input(v) for role, v in raw["inputs"].items()},
        raw.get("out"), expect["outcome"], expect.get("category"), _output(expect.get("output")),
        _output(expect.get("reverse_output")), expect.get("reference_delta_bytes"),
        expect.get("information_bytes"), raw["since"],
    )  # fmt: skip


def load(root: Path | str, check_files: bool = True) -> Manifest:
    """Read and validate ``root/manifest.json``; optionally hash every vector file."""
    root = as_path(root, "root")
    if root.is_file():
        raise BadArgumentError(
            f"{root} is a file; the vectors are the folder holding manifest.json"
        )
    path = root / "manifest.json"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StorageError(os_message(path, exc)) from exc
    try:
        raw = json.loads(data)
        schemas.validator("conformance-manifest").validate(raw)
    except (ValueError, jsonschema.ValidationError) as exc:
        raise BadArgumentError(f"{path}: not a valid conformance manifest: {exc}") from exc
    manifest = Manifest(root, raw, tuple(_case(c) for c in raw["cases"]),
                        hashlib.sha256(data).hexdigest())  # fmt: skip
    if check_files:
        check_vector_files(manifest)
    return manifest


def input_files(root: Path, item: Input) -> dict[Path, str]:
    """Every file of an input with its expected sha256."""
    base = root / item.path
    return {base if name == "." else base / name: digest for name, digest in item.files.items()}


def check_vector_files(manifest: Manifest) -> None:
    """Every vector file must hash to the manifest's sha256 (a damaged copy is refused)."""
    seen: dict[Path, str] = {}
    for case in manifest.cases:
        for item in case.inputs.values():
            seen.update(input_files(manifest.root, item))
    for path, digest in sorted(seen.items()):
        if not path.is_file() or sha256_file(path) != digest:
            raise BadArgumentError(f"vector file {path} is missing or does not match the manifest")
