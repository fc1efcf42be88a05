"""The chain manifest: versions, snapshots and links (SPEC §17).

A manifest revision is an immutable JSON file.  :func:`parse_manifest`
checks, in this order: UTF-8 JSON without duplicate keys, ``format`` and
``version``, ``required_features``, the JSON Schema, then the reference rules
(numbers ordered and unique, digests unique, steps increasing, no dangling
reference, links only go forwards so the graph has no cycle) and finally that
every version is reachable from a snapshot.  This module is the small
read-only API for tooling: ``parse_manifest`` / ``read_manifest`` /
``Manifest.version``; nothing here touches storage.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..._version import CHAIN_MANIFEST_VERSION, __version__
from ...arguments import as_path
from ...errors import (
    BadArgumentError,
    LimitExceededError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
)
from ...format import schemas, strictjson
from ...format.digest import digest_bytes
from ...io.filekind import document_refusal, naming, os_message
from ...limits import MAX_MANIFEST_BYTES
from ..errors import ChainBrokenError, ManifestInvalidError, NotFoundError
from ..storage.smallfile import open_regular, read_bounded

FORMAT = "wdelta-chain"
MANIFEST_VERSION = CHAIN_MANIFEST_VERSION
# A manifest with a link of several delta files lists this feature (SPEC §17.12).
MULTI_PART = "multi-part-links"
# A manifest whose parts list their header digests lists this feature (SPEC §17.12 MP-5):
# readers must check them, so a reader that cannot refuses the revision.
PART_HEADERS = "part-header-digests"
KNOWN_FEATURES: frozenset[str] = frozenset({MULTI_PART, PART_HEADERS})
MANIFEST_PREFIX = "manifests/"
_REV_DIGITS = 12
# Shorter references are version numbers; a digest prefix this long is
# practically never all decimal digits (p < 0.001).
_MIN_PREFIX = 16


@dataclass(frozen=True)
class Version:
    """A checkpoint version; ``digest`` is its wdelta checkpoint digest."""

    number: int
    digest: str
    step: int | None = None
    time: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot: ``size`` in bytes, ``sha256`` of its bytes."""

    name: str
    sha256: str
    size: int

    @property
    def key(self) -> str:
        """Content-addressed storage key (the Hub's LFS object id is the sha256)."""
        return f"snapshots/{self.sha256}/{self.name}"


@dataclass(frozen=True)
class Snapshot:
    """The complete files of the checkpoint at version ``version``."""

    version: int
    files: tuple[SnapshotFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class LinkPart:
    """One delta file of a link: BLAKE3 ``digest`` of its bytes and ``size``; ``header``
    the BLAKE3 of its header bytes (prefix bytes 24-55), as its writer computed it."""

    digest: str
    size: int
    header: str | None = None

    @property
    def key(self) -> str:
        return delta_key(self.digest)


@dataclass(frozen=True)
class Link:
    """The delta from version ``source`` to ``target``: one file (``digest``, BLAKE3 of
    it, and ``size``) or, with ``parts``, several files each holding some of the
    tensors (SPEC §17.12); ``digest`` is then BLAKE3 of the parts' raw digests (an
    identity for caches and plans, no file) and ``size`` their total."""

    source: int
    target: int
    digest: str
    size: int
    reversible: bool
    parts: tuple[LinkPart, ...] = ()

    @property
    def key(self) -> str:
        assert not self.parts, "a multi-part link has one key per part"
        return delta_key(self.digest)

    @property
    def files(self) -> tuple[LinkPart, ...]:
        """The link's delta files: its parts, or the one file."""
        return self.parts or (LinkPart(self.digest, self.size),)


def multi_part_link(
    source: int, target: int, parts: tuple[LinkPart, ...], reversible: bool
) -> Link:
    """A link of several delta files (at least two, SPEC §17.12)."""
    ident = digest_bytes(b"".join(bytes.fromhex(p.digest) for p in parts))
    return Link(source, target, ident, sum(p.size for p in parts), reversible, parts)


def delta_key(digest: str) -> str:
    """Content-addressed storage key of a delta file with BLAKE3 ``digest``."""
    return f"deltas/{digest}.wdelta"


def revision_key(revision: int) -> str:
    """Storage key of manifest revision ``revision``."""
    return f"{MANIFEST_PREFIX}rev-{revision:0{_REV_DIGITS}d}.json"


def revision_of_key(key: str) -> int | None:
    """The revision number named by a manifest key, or None for other keys."""
    name = key[len(MANIFEST_PREFIX) :] if key.startswith(MANIFEST_PREFIX) else ""
    digits = name[4:-5]
    ok = name.startswith("rev-") and name.endswith(".json") and len(digits) == _REV_DIGITS
    return int(digits) if ok and digits.isdigit() else None


def utc_now() -> str:
    """The current UTC time as RFC 3339 with second precision (``...Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Manifest:
    """A validated manifest revision; tuples are sorted (versions by number)."""

    revision: int
    parent: tuple[int, str] | None
    versions: tuple[Version, ...]
    snapshots: tuple[Snapshot, ...]
    links: tuple[Link, ...]
    updated: str | None = None

    @property
    def head(self) -> Version:
        """The newest version (highest number)."""
        return self.versions[-1]

    def version(self, ref: str | int) -> Version:
        """A version by number (``12``, ``"12"``), ``"head"``, ``"step:N"`` or a digest
        prefix of at least 16 hex digits."""
        if str(ref) == "head":
            return self.head
        found = [v for v in self.versions if _matches(v, str(ref))]
        if len(found) != 1:
            what = "ambiguous" if found else "unknown"
            raise NotFoundError(
                f"{what} version {ref!r}: the chain has versions {self.versions[0].number} to "
                f"{self.head.number} (a number, 'head', 'step:N' or 16+ hex digits of a digest)"
            )
        return found[0]

    def by_digest(self, digest: str) -> Version | None:
        return next((v for v in self.versions if v.digest == digest), None)

    def snapshot(self, number: int) -> Snapshot | None:
        return next((s for s in self.snapshots if s.version == number), None)

    def successor(self, **changes: Any) -> Manifest:
        """The next revision with ``changes`` applied, checked before it is returned."""
        data = self.to_bytes()
        new = replace(
            self, revision=self.revision + 1, parent=(self.revision, digest_bytes(data)),
            updated=utc_now(), **changes,
        )  # fmt: skip
        return parse_manifest(new.to_bytes())

    def to_json(self) -> dict[str, Any]:
        parent = (
            None if self.parent is None else {"revision": self.parent[0], "digest": self.parent[1]}
        )
        parts = [p for k in self.links for p in k.parts]
        features = [MULTI_PART] if parts else []
        features += [PART_HEADERS] if any(p.header is not None for p in parts) else []
        doc: dict[str, Any] = {
            "format": FORMAT, "version": MANIFEST_VERSION, "required_features": features,
            "generator": f"wdelta-py/{__version__}", "revision": self.revision, "parent": parent,
        }  # fmt: skip
        if self.updated is not None:
            doc["updated"] = self.updated
        doc["versions"] = [_version_json(v) for v in self.versions]
        doc["snapshots"] = [
            {"version": s.version, "files": [vars(f).copy() for f in s.files]}
            for s in self.snapshots
        ]  # fmt: skip
        doc["links"] = [_link_json(k) for k in self.links]
        return doc

    def to_bytes(self) -> bytes:
        """Canonical serialisation: 2-space indented UTF-8 JSON ending with a newline."""
        return (json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _matches(v: Version, ref: str) -> bool:
    if ref.startswith("step:"):
        return v.step is not None and str(v.step) == ref[5:]
    if len(ref) < _MIN_PREFIX:
        return ref.isdigit() and v.number == int(ref)
    return v.digest.startswith(ref.lower())


def _link_json(k: Link) -> dict[str, Any]:
    if not k.parts:
        return {"from": k.source, "to": k.target, "digest": k.digest, "size": k.size,
                "reversible": k.reversible}  # fmt: skip
    parts = [{"digest": p.digest, "size": p.size} | ({} if p.header is None else
             {"header": p.header}) for p in k.parts]  # fmt: skip
    return {"from": k.source, "to": k.target, "parts": parts, "reversible": k.reversible}


def _parse_link(k: dict[str, Any]) -> Link:
    if "parts" not in k:
        return Link(k["from"], k["to"], k["digest"], k["size"], k["reversible"])
    parts = tuple(LinkPart(p["digest"], p["size"], p.get("header")) for p in k["parts"])
    return multi_part_link(k["from"], k["to"], parts, k["reversible"])


def _version_json(v: Version) -> dict[str, Any]:
    out: dict[str, Any] = {"number": v.number, "digest": v.digest}
    if v.step is not None:
        out["step"] = v.step
    if v.time is not None:
        out["time"] = v.time
    if v.metadata:
        out["metadata"] = dict(v.metadata)
    return out


def new_manifest(first: Version, snapshot: Snapshot) -> Manifest:
    """Revision 1 of a chain holding one version and its snapshot."""
    return parse_manifest(Manifest(1, None, (first,), (snapshot,), (), utc_now()).to_bytes())


def _load_json(data: bytes) -> dict[str, Any]:
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, (bytes, str)):
        raise BadArgumentError(f"a manifest is given as bytes or str, not {type(data).__name__}")
    raw = strictjson.loads(data, ManifestInvalidError, "manifest")
    if not isinstance(raw, dict):
        raise ManifestInvalidError("manifest must be a JSON object")
    return raw


def _check_envelope(raw: dict[str, Any]) -> None:
    if raw.get("format") != FORMAT:
        raise ManifestInvalidError(f"format is {raw.get('format')!r}, expected {FORMAT!r}")
    if raw.get("version") != MANIFEST_VERSION:
        raise UnsupportedVersionError(f"manifest version {raw.get('version')!r}; reader knows 1")
    features = raw.get("required_features")
    if isinstance(features, list):
        # Non-strings (unhashable lists too) are left to the schema check.
        unknown = sorted(f for f in features if isinstance(f, str) and f not in KNOWN_FEATURES)
        if unknown:
            raise UnsupportedFeatureError(f"unknown required features: {', '.join(unknown)}")
    error = schemas.violation("chain-manifest", raw)
    if error is not None:
        raise ManifestInvalidError(f"schema violation {error}")


def parse_manifest(data: bytes, *, expected_revision: int | None = None) -> Manifest:
    """Validate manifest bytes (every rule of SPEC §17.3)."""
    raw = _load_json(data)
    _check_envelope(raw)
    parent = raw["parent"]
    m = Manifest(
        raw["revision"],
        None if parent is None else (parent["revision"], parent["digest"]),
        tuple(Version(v["number"], v["digest"], v.get("step"), v.get("time"),
                      dict(v.get("metadata", {}))) for v in raw["versions"]),
        tuple(Snapshot(s["version"], tuple(SnapshotFile(f["name"], f["sha256"], f["size"])
                                           for f in s["files"])) for s in raw["snapshots"]),
        tuple(_parse_link(k) for k in raw["links"]),
        raw.get("updated"),
    )  # fmt: skip
    if expected_revision is not None and m.revision != expected_revision:
        raise ManifestInvalidError(
            f"file of revision {expected_revision} holds revision {m.revision}"
        )
    _check_parent(m)
    _check_features(m, raw["required_features"])
    _check_versions(m.versions)
    _check_snapshots(m)
    _check_links(m)
    if unreachable := unreachable_versions(m):
        raise ChainBrokenError(f"versions {unreachable[:5]} cannot be reached from any snapshot")
    return m


def _check_features(m: Manifest, features: list[str]) -> None:
    """CH-8: parts need ``multi-part-links``; header digests of parts ``part-header-digests``,
    which then every part lists (a reader must be able to check each part's header)."""
    parts = [p for k in m.links for p in k.parts]
    if parts and MULTI_PART not in features:
        raise ManifestInvalidError(f"a link has parts but required_features lacks {MULTI_PART!r}")
    headers = [p.header is not None for p in parts]
    if any(headers) and PART_HEADERS not in features:
        raise ManifestInvalidError(
            f"a part lists its header digest but required_features lacks {PART_HEADERS!r}"
        )
    if PART_HEADERS in features and not all(headers):
        raise ManifestInvalidError(f"{PART_HEADERS!r} is required but a part has no header digest")


def unreachable_versions(m: Manifest) -> list[int]:
    """Version numbers that no path from a snapshot reaches: a link leads from its
    source to its target and, when reversible, back (as ``graph`` plans downloads)."""
    steps: dict[int, list[int]] = {}
    for k in m.links:
        steps.setdefault(k.source, []).append(k.target)
        if k.reversible:
            steps.setdefault(k.target, []).append(k.source)
    seen = {s.version for s in m.snapshots}
    todo = list(seen)
    while todo:
        for number in steps.get(todo.pop(), ()):
            if number not in seen:
                seen.add(number)
                todo.append(number)
    return [v.number for v in m.versions if v.number not in seen]


def _check_parent(m: Manifest) -> None:
    if (m.parent is None) != (m.revision == 1):
        raise ManifestInvalidError("parent must be null exactly in revision 1")
    if m.parent is not None and m.parent[0] != m.revision - 1:
        raise ManifestInvalidError(f"parent revision {m.parent[0]} is not {m.revision - 1}")


def _check_versions(versions: tuple[Version, ...]) -> None:
    numbers = [v.number for v in versions]
    if any(b <= a for a, b in itertools.pairwise(numbers)):
        raise ManifestInvalidError("versions must be sorted by strictly increasing number")
    digests = [v.digest for v in versions]
    if len(set(digests)) != len(digests):
        raise ManifestInvalidError("two versions have the same checkpoint digest")
    steps = [v.step for v in versions if v.step is not None]
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ManifestInvalidError("version steps must increase with version numbers")


def _check_snapshots(m: Manifest) -> None:
    numbers = {v.number for v in m.versions}
    seen: set[int] = set()
    for s in m.snapshots:
        if s.version not in numbers:
            raise ManifestInvalidError(f"snapshot of unknown version {s.version}")
        if s.version in seen:
            raise ManifestInvalidError(f"two snapshots of version {s.version}")
        seen.add(s.version)
        names = [f.name for f in s.files]
        indexes = [n for n in names if n.endswith(".index.json")]
        if len(set(names)) != len(names) or len(indexes) > 1:
            raise ManifestInvalidError(f"snapshot of version {s.version}: file names repeat")
        if not indexes and len(names) != 1:
            raise ManifestInvalidError(f"snapshot of version {s.version}: shards need an index")
        if indexes and len(names) == 1:
            raise ManifestInvalidError(f"snapshot of version {s.version}: an index and no shard")
    if [s.version for s in m.snapshots] != sorted(seen):
        raise ManifestInvalidError("snapshots must be sorted by version")


def _check_links(m: Manifest) -> None:
    numbers = {v.number for v in m.versions}
    pairs: set[tuple[int, int]] = set()
    for k in m.links:
        if k.source not in numbers or k.target not in numbers:
            raise ManifestInvalidError(f"link {k.source}->{k.target} names an unknown version")
        if k.source >= k.target:
            # Links only go from an older to a newer version, so the link
            # graph is acyclic; a reversible link is walked backwards instead.
            raise ManifestInvalidError(f"link {k.source}->{k.target} does not go forwards")
        if (k.source, k.target) in pairs:
            raise ManifestInvalidError(f"two links {k.source}->{k.target}")
        pairs.add((k.source, k.target))
        if len({p.digest for p in k.parts}) != len(k.parts):
            raise ManifestInvalidError(f"link {k.source}->{k.target} lists a part twice")
    keys = [(k.target, k.source) for k in m.links]
    if keys != sorted(keys):
        raise ManifestInvalidError("links must be sorted by (to, from)")


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Load and validate a manifest file from the local file system."""
    p = as_path(path, "path")
    try:
        fd = open_regular(p, lambda why: BadArgumentError(f"{p}: {why}"))
        try:
            data = read_bounded(
                fd, MAX_MANIFEST_BYTES, lambda why: LimitExceededError(f"{p}: {why}")
            )
        finally:
            os.close(fd)
    except OSError as exc:
        raise NotFoundError(os_message(p, exc)) from exc
    if (impostor := document_refusal(p, data, "manifest revision")) is not None:
        raise ManifestInvalidError(impostor)
    with naming(p, ManifestInvalidError):
        return parse_manifest(data, expected_revision=revision_of_key(f"{MANIFEST_PREFIX}{p.name}"))
