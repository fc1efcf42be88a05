"""Manifest cases: chain manifests (SPEC §17) a manifest reader must accept or refuse.

Rule cases give one manifest revision file, named by its key
(``rev-RRRRRRRRRRRR.json``), and check CH-1 to CH-9; each invalid one breaks
exactly one rule of a valid manifest.  Storage cases add a chain root with
the files the manifest lists (a snapshot and a delta written by the builder)
and check RD-2 and RD-3.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import blake3

from . import checkpoints as ck
from .builder import ChunkPlan, Delta, build, uniform
from .edge import changed
from .payload import RICE
from .suite import Suite, accepted, invalid, sha256

Doc = dict[str, Any]
RULE = "SPEC §17.3: a reader MUST check CH-1 to CH-9 in order and report the first failure"
STORE_RULE = ("SPEC §17.6: RD-2 every file used is checked against the manifest; RD-3 a listed "
              "file missing from storage is not-found, never skipped")  # fmt: skip


def _hex(label: str) -> str:
    return blake3.blake3(label.encode()).hexdigest()


def _version(n: int, label: str, step: int | None = None) -> Doc:
    v: Doc = {"number": n, "digest": _hex(f"{label}/v{n}")}
    if step is not None:
        v["step"] = step
    return v


def _snapshot(n: int, names: tuple[str, ...] = ("model.safetensors",)) -> Doc:
    files = [{"name": name, "sha256": hashlib.sha256(f"{n}/{name}".encode()).hexdigest(),
              "size": 1000 + n} for name in names]  # fmt: skip
    return {"version": n, "files": files}


def _link(a: int, b: int, reversible: bool = True) -> Doc:
    return {"from": a, "to": b, "digest": _hex(f"link/{a}-{b}"), "size": 4096 + b,
            "reversible": reversible}  # fmt: skip


def manifest(revision: int, versions: list[Doc], snapshots: list[Doc], links: list[Doc]) -> Doc:
    parent = None if revision == 1 else {"revision": revision - 1, "digest": _hex(f"r{revision}")}
    return {"format": "wdelta-chain", "version": 1, "required_features": [],
            "revision": revision, "parent": parent, "generator": "wdelta-conformance/2",
            "updated": "2026-01-02T03:04:05Z", "versions": versions, "snapshots": snapshots,
            "links": sorted(links, key=lambda k: (k["to"], k["from"]))}  # fmt: skip


def typical() -> Doc:
    """Versions 0-4; snapshots of 0 (one file) and 4 (sharded); 3 reached backwards."""
    shards = ("m-1.safetensors", "m-2.safetensors", "m.safetensors.index.json")
    versions = [_version(n, "typ", 100 * n) for n in range(5)]
    links = [_link(0, 1), _link(1, 2, False), _link(0, 2), _link(3, 4)]
    return manifest(3, versions, [_snapshot(0), _snapshot(4, shards)], links)


def large() -> Doc:
    """1000 versions, a snapshot every 100, every step linked and squashed links every 10."""
    versions = [_version(n, "large", n) for n in range(1000)]
    links = [_link(n, n + 1, n % 3 != 0) for n in range(999)]
    links += [_link(n, n + 10) for n in range(0, 990, 10)]
    return manifest(4321, versions, [_snapshot(n) for n in range(0, 1000, 100)], links)


def extended() -> Doc:
    """Unknown members at every level, metadata and times: all ignored or informative."""
    doc = typical()
    doc["x-dashboard"] = {"owner": "team"}
    doc["versions"][1].update(time="2026-01-02T03:04:05.123Z", metadata={"loss": "1.25"},
                              **{"x-note": [1, 2]})  # fmt: skip
    doc["snapshots"][0]["x-region"] = "eu"
    doc["snapshots"][0]["files"][0]["x-etag"] = "abc"
    doc["links"][0]["x-composed"] = False
    return doc


def _text(doc: Doc) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


Edit = Callable[[Doc], None]


def _set(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(doc: Doc) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _drop(key: str) -> Edit:
    return lambda doc: doc.pop(key) and None


def _append(key: str, item: Doc) -> Edit:
    return lambda doc: doc[key].append(item)


def _swap(key: str, i: int, j: int) -> Edit:
    def edit(doc: Doc) -> None:
        doc[key][i], doc[key][j] = doc[key][j], doc[key][i]

    return edit


def _first_revision(doc: Doc) -> None:
    doc.update(revision=1)


TextEdit = Callable[[bytes], bytes]
# name -> (rule, category, what, bytes edit or document edit, revision in the key)
TEXT_CASES: dict[str, tuple[str, str, str, TextEdit]] = {
    "not-json": ("CH-1", "manifest-invalid", "the closing brace missing", lambda t: t[:-2]),
    "not-object": ("CH-1", "manifest-invalid", "an array holding the manifest",
                   lambda t: b"[" + t + b"]"),
    "invalid-utf8": ("CH-1", "manifest-invalid", "an invalid UTF-8 byte in a string",
                     lambda t: t.replace(b"wdelta-conformance", b"wdelta-conf\xffrmance")),
    "duplicate-key": ("CH-1", "manifest-invalid", "the member revision twice",
                      lambda t: t.replace(b'"revision": 3,', b'"revision": 3, "revision": 3,')),
    "nan": ("CH-1", "manifest-invalid", "NaN as a version's step",
            lambda t: t.replace(b'"step": 100', b'"step": NaN')),
    "lone-surrogate": ("CH-1", "manifest-invalid", "a \\ud800 escape in generator",
                       lambda t: t.replace(b"wdelta-conformance/2", b"\\ud800")),
    "nesting-65": ("CH-1", "manifest-invalid", "an unknown member nesting arrays to depth 65",
                   lambda t: t[:-2] + b',"x":' + b"[" * 64 + b"]" * 64 + b"}\n"),
    "number-4301-digits": ("CH-1", "manifest-invalid", "an unknown member holding an integer "
                           "of 4301 digits (§13)",
                           lambda t: t[:-2] + b',"x-big":' + b"9" * 4301 + b"}\n"),
    "integer-fraction": ("CH-1", "manifest-invalid", "revision written as 3.0",
                         lambda t: t.replace(b'"revision": 3,', b'"revision": 3.0,')),
}  # fmt: skip
DOC_CASES: dict[str, tuple[str, str, str, Edit]] = {
    "format": ("CH-2", "manifest-invalid", 'format "wdelta-chain-v2"',
               _set(("format",), "wdelta-chain-v2")),
    "version-2": ("CH-2", "unsupported-version", "version 2", _set(("version",), 2)),
    "required-feature": ("CH-2", "unsupported-feature", "an unknown required feature",
                         _set(("required_features",), ["x-encrypted"])),
    "required-feature-not-string": ("CH-2", "manifest-invalid", "required_features: [1] (no "
                                    "string: a schema error, as in a delta header, §4.2)",
                                    _set(("required_features",), [1])),
    "no-versions": ("CH-3", "manifest-invalid", "no versions member", _drop("versions")),
    "empty-versions": ("CH-3", "manifest-invalid", "versions: []", _set(("versions",), [])),
    "digest-uppercase": ("CH-3", "manifest-invalid", "a version digest in upper-case hex",
                         lambda d: d["versions"][0].update(digest=d["versions"][0]["digest"]
                                                           .upper())),
    "digest-final-line-feed": ("CH-3", "manifest-invalid",
                               "a version digest ending in a line feed (full match, §2.2)",
                               lambda d: d["versions"][0].update(
                                   digest=d["versions"][0]["digest"] + "\n")),
    "snapshot-name-final-line-feed": ("CH-3", "manifest-invalid",
                                      "a snapshot file named model.safetensors + line feed",
                                      _set(("snapshots", 0, "files", 0, "name"),
                                           "model.safetensors\n")),
    "link-size-small": ("CH-3", "manifest-invalid", "a link of 63 bytes",
                        _set(("links", 0, "size"), 63)),
    "snapshot-file-path": ("CH-3", "manifest-invalid", "a snapshot file named ../x.safetensors",
                           _set(("snapshots", 0, "files", 0, "name"), "../x.safetensors")),
    "parent-null": ("CH-5", "manifest-invalid", "parent null in revision 3",
                    _set(("parent",), None)),
    "parent-revision": ("CH-5", "manifest-invalid", "parent.revision 1 in revision 3",
                        _set(("parent", "revision"), 1)),
    "version-order": ("CH-6", "manifest-invalid", "versions 1 and 0 swapped",
                      _swap("versions", 0, 1)),
    "duplicate-digest": ("CH-6", "manifest-invalid", "two versions with one digest",
                         lambda d: d["versions"][2].update(digest=d["versions"][1]["digest"])),
    "step-order": ("CH-6", "manifest-invalid", "step of version 2 below version 1's",
                   _set(("versions", 2, "step"), 50)),
    "snapshot-unknown-version": ("CH-7", "manifest-invalid", "a snapshot of version 9",
                                 _set(("snapshots", 1, "version"), 9)),
    "snapshot-twice": ("CH-7", "manifest-invalid", "two snapshots of version 0",
                       _set(("snapshots", 1, "version"), 0)),
    "snapshot-file-repeated": ("CH-7", "manifest-invalid", "a shard listed twice",
                               _set(("snapshots", 1, "files", 1, "name"), "m-1.safetensors")),
    "snapshot-shards-no-index": ("CH-7", "manifest-invalid", "two shards and no index",
                                 lambda d: d["snapshots"][1]["files"].pop()),
    "snapshot-index-only": ("CH-7", "manifest-invalid", "a snapshot whose only file is an index",
                            _set(("snapshots", 0, "files", 0, "name"),
                                 "model.safetensors.index.json")),
    "snapshot-two-indexes": ("CH-7", "manifest-invalid", "two index files",
                             _set(("snapshots", 1, "files", 0, "name"),
                                  "a.safetensors.index.json")),
    "snapshot-order": ("CH-7", "manifest-invalid", "snapshots out of order",
                       _swap("snapshots", 0, 1)),
    "link-dangling": ("CH-8", "manifest-invalid", "a link to version 7",
                      _set(("links", 3, "to"), 7)),
    "link-backwards": ("CH-8", "manifest-invalid", "a link 4 -> 3",
                       lambda d: d["links"][3].update({"from": 4, "to": 3})),
    "link-self": ("CH-8", "manifest-invalid", "a link 3 -> 3", _set(("links", 3, "to"), 3)),
    "link-twice": ("CH-8", "manifest-invalid", "two links 0 -> 1",
                   lambda d: d["links"].insert(1, copy.deepcopy(d["links"][0]))),
    "link-order": ("CH-8", "manifest-invalid", "links out of (to, from) order",
                   _swap("links", 0, 1)),
    "unreachable": ("CH-9", "chain-broken", "version 3 reached by no link or snapshot",
                    lambda d: d["links"].pop()),
    "unreachable-irreversible": ("CH-9", "chain-broken",
                                 "version 3 only behind a link 3 -> 4 that is not reversible",
                                 _set(("links", 3, "reversible"), False)),
}  # fmt: skip


def _key(revision: int) -> str:
    return f"rev-{revision:012d}.json"


def rule_case(suite: Suite, name: str, data: bytes, revision: int, what: str,
                   rule: str, expect: dict[str, Any]) -> None:  # fmt: skip
    path = suite.blob(f"chain/{name}/{_key(revision)}", data)
    suite.add(f"manifest/{name}", "manifest", what, "§17.3", rule, {"manifest": path}, expect)


def add_rule_cases(suite: Suite) -> None:
    valid = {"valid/minimal": (manifest(1, [_version(0, "min")], [_snapshot(0)], []),
                               "revision 1: one version, its snapshot, no link"),
             "valid/typical": (typical(), "5 versions, a sharded snapshot, a squashed link, a "
                               "version reached backwards over a reversible link"),
             "valid/large": (large(), "1000 versions, 10 snapshots, 1098 links"),
             "valid/extended": (extended(),
                                "unknown members at every level, metadata, times")}  # fmt: skip
    for name, (doc, what) in valid.items():
        rule_case(suite, name, _text(doc), doc["revision"], what, RULE, accepted())
    good = _text(typical())
    for name, (rule, category, what, text_edit) in TEXT_CASES.items():
        data = text_edit(good)
        assert data != good, name
        rule_case(suite, f"invalid/{name}", data, 3, what, f"{rule}: {RULE}",
                       invalid(category))  # fmt: skip
    for name, (rule, category, what, edit) in DOC_CASES.items():
        doc = typical()
        edit(doc)
        rule_case(suite, f"invalid/{name}", _text(doc), 3, what, f"{rule}: {RULE}",
                       invalid(category))  # fmt: skip
    rule_case(suite, "invalid/revision-not-key", good, 4,
                   "revision 3 read from the key of revision 4", f"CH-4: {RULE}",
                   invalid("manifest-invalid"))  # fmt: skip
    first = typical()
    first["revision"] = 1
    rule_case(suite, "invalid/parent-in-revision-1", _text(first), 1,
                   "revision 1 with a parent", f"CH-5: {RULE}",
                   invalid("manifest-invalid"))  # fmt: skip


def _store_chain(edit: Callable[[Delta], None] | None = None) -> tuple[dict[str, bytes], Doc]:
    """A real two-version chain: its files by key and its revision-2 manifest (its delta
    changed by ``edit``, once built, and listed as it then is)."""
    b, t = changed("chain", "w", "F32", (64,), 0.2)
    base, target = ck.single([b]), ck.single([t])
    delta = build(base, target, 32, uniform(ChunkPlan("sparse", "xor", "zstd", RICE)))
    if edit is not None:
        delta.to_bytes()
        delta.freeze()
        edit(delta)
    data = delta.to_bytes()
    ((snap_name, snap),) = base.file_bytes().items()
    snap_sha, delta_b3 = sha256(snap), blake3.blake3(data).hexdigest()
    files = {f"snapshots/{snap_sha}/{snap_name}": snap, f"deltas/{delta_b3}.wdelta": data}
    versions = [
        {"number": 0, "digest": delta.doc["base"]["digest"]},
        {"number": 1, "digest": delta.doc["target"]["digest"]},
    ]
    snapshots = [
        {"version": 0, "files": [{"name": snap_name, "sha256": snap_sha, "size": len(snap)}]}
    ]
    links = [{"from": 0, "to": 1, "digest": delta_b3, "size": len(data),
              "reversible": delta.doc["reversible"]}]  # fmt: skip
    return files, manifest(2, versions, snapshots, links)


SHARD = "model-00001-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def _sharded_snapshot(defect: str) -> tuple[Doc, dict[str, bytes]]:
    """The store chain whose snapshot of version 0 is one shard and an index, with a
    ``defect``: ``missing-shard`` (the index names a second shard, not listed or stored) or
    ``malformed-shard`` (the shard's safetensors header is not JSON)."""
    files, doc = _store_chain()
    b, _ = changed("chain", "w", "F32", (64,), 0.2)
    listed = dict(ck.sharded([b], {"w": SHARD}).file_bytes())
    if defect == "missing-shard":
        weight_map = {"v": "model-00002-of-00002.safetensors", "w": SHARD}
        listed[INDEX] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    else:
        listed[SHARD] = listed[SHARD][:8] + b"[" + listed[SHARD][9:]
    files = {k: v for k, v in files.items() if not k.startswith("snapshots/")}
    entries = []
    for name, data in sorted(listed.items()):
        files[f"snapshots/{sha256(data)}/{name}"] = data
        entries.append({"name": name, "sha256": sha256(data), "size": len(data)})
    doc["snapshots"][0]["files"] = entries
    return doc, files


def _zero_chunk_elements(delta: Delta) -> None:
    delta.doc["chunk_elements"] = 0


def _snapshot_of_target() -> tuple[Doc, dict[str, bytes]]:
    """The store chain whose snapshot of version 0 holds version 1's checkpoint: its
    files match their SHA-256, their checkpoint digest is not version 0's."""
    files, doc = _store_chain()
    _, t = changed("chain", "w", "F32", (64,), 0.2)
    ((name, data),) = ck.single([t]).file_bytes().items()
    files = {k: v for k, v in files.items() if not k.startswith("snapshots/")}
    files[f"snapshots/{sha256(data)}/{name}"] = data
    doc["snapshots"][0]["files"] = [{"name": name, "sha256": sha256(data), "size": len(data)}]
    return doc, files


def _other_version(doc: Doc) -> None:
    """A version 2 whose link reuses the delta of 0 -> 1: its header names version 1."""
    doc["versions"].append(_version(2, "store"))
    doc["links"].append({**doc["links"][0], "to": 2})


def _flip_reversible(doc: Doc) -> None:
    doc["links"][0]["reversible"] = not doc["links"][0]["reversible"]


def _corrupt(files: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    key = next(k for k in files if k.startswith(prefix))
    data = files[key]
    return {**files, key: data[:-1] + bytes([data[-1] ^ 1])}


def add_store_cases(suite: Suite) -> None:
    files, doc = _store_chain()
    cases: dict[str, tuple[str, Doc, dict[str, bytes], dict[str, Any]]] = {
        "store/valid": ("a snapshot and a delta, both as listed", doc, files, accepted()),
        "store/delta-missing": ("RD-3: the listed delta file is not stored", doc,
                                {k: v for k, v in files.items() if not k.startswith("deltas/")},
                                invalid("not-found")),
        "store/snapshot-missing": ("RD-3: the listed snapshot file is not stored", doc,
                                   {k: v for k, v in files.items()
                                    if not k.startswith("snapshots/")}, invalid("not-found")),
        "store/delta-corrupted": ("RD-2: the delta's last byte flipped (BLAKE3 differs)", doc,
                                  _corrupt(files, "deltas/"), invalid("checksum-mismatch")),
        "store/snapshot-corrupted": ("RD-2: the snapshot's last byte flipped (SHA-256 differs)",
                                     doc, _corrupt(files, "snapshots/"),
                                     invalid("checksum-mismatch")),
        "store/delta-header-invalid": (
            "RD-2: the listed delta matches its BLAKE3 and size, but its header breaks §4 "
            "(chunk_elements 0): refused as the reader profile refuses it, not as chain-broken",
            _store_chain(_zero_chunk_elements)[1], _store_chain(_zero_chunk_elements)[0],
            invalid("header-invalid")),
        "store/snapshot-index-names-missing-shard": (
            "RD-2: the snapshot's index maps a tensor to a shard the snapshot does not list: "
            "its files assemble into no checkpoint (§10.3)", *_sharded_snapshot("missing-shard"),
            invalid("checkpoint-invalid")),
        "store/snapshot-shard-malformed": (
            "RD-2: the snapshot's shard (listed with its SHA-256) has a safetensors header that "
            "is not JSON (§10.3)", *_sharded_snapshot("malformed-shard"),
            invalid("checkpoint-invalid")),
        "store/snapshot-other-version": (
            "RD-2: version 0's snapshot holds version 1's checkpoint (its files match their "
            "SHA-256; the checkpoint digest is not version 0's)", *_snapshot_of_target(),
            invalid("chain-broken")),
    }  # fmt: skip
    for name, edit, what in (
        (
            "store/link-versions-disagree",
            _other_version,
            "RD-2: link 0 -> 2 points at the delta of 0 -> 1, whose header names version 1",
        ),
        (
            "store/link-reversible-disagrees",
            _flip_reversible,
            "RD-2: the link's reversible differs from the delta header's",
        ),
    ):
        changed_doc = copy.deepcopy(doc)
        edit(changed_doc)
        cases[name] = (what, changed_doc, files, invalid("chain-broken"))
    for name, (what, mdoc, store, expect) in cases.items():
        store_case(suite, name, what, mdoc, store, expect, "§17.6", STORE_RULE)


def store_case(suite: Suite, name: str, what: str, mdoc: Doc, store: dict[str, bytes],
               expect: dict[str, Any], section: str, rule: str) -> None:  # fmt: skip
    """Register a manifest case with the chain root holding ``store`` (files by key)."""
    folder = name.replace("/", "-")
    path = suite.blob(f"chain/{folder}/{_key(mdoc['revision'])}", _text(mdoc))
    root = f"chain/{folder}/store"
    for key, data in store.items():
        suite.blob(f"{root}/{key}", data)
    listing = {k: sha256(v) for k, v in sorted(store.items())}
    suite.inputs[f"vectors/{root}"] = {"path": f"vectors/{root}", "files": listing}
    suite.add(f"manifest/{name}", "manifest", what, section, rule,
              {"manifest": path, "store": f"vectors/{root}"}, expect)  # fmt: skip


SEEN_RULE = ("SPEC §17.6: RD-1 a reader that accepted revision r (bytes of BLAKE3 d) refuses a "
             "lower revision, revision r with other bytes, and revision r + 1 whose parent is "
             "not d")  # fmt: skip


def _successor(doc: Doc, parent: bytes, revision: int) -> Doc:
    """Revision ``revision`` after ``doc``: one more version and link; ``parent`` the bytes
    of revision ``revision - 1``."""
    new = copy.deepcopy(doc)
    last = new["versions"][-1]["number"]
    new["versions"].append(_version(last + 1, "seen", 100 * (last + 1)))
    new["links"].append(_link(last, last + 1))
    new.update(
        revision=revision,
        parent={"revision": revision - 1, "digest": blake3.blake3(parent).hexdigest()},
    )
    return new  # fmt: skip


def add_seen_cases(suite: Suite) -> None:
    """RD-1: ``{manifest}`` read by a reader that accepted ``{seen}`` before."""
    r3 = _text(typical())
    other = typical()
    other["generator"] = "another writer"
    r3_rewritten = _text(other)
    r3_compact = (json.dumps(typical(), separators=(",", ":")) + "\n").encode()
    r4 = _text(_successor(typical(), r3, 4))
    r4_fork = _text(_successor(typical(), r3_rewritten, 4))
    r6 = _text(_successor(typical(), b"revision 5", 6))
    cases = {
        "valid-same": ("the revision accepted, read again", r3, r3, accepted()),
        "valid-next": ("revision 4 whose parent is the accepted revision 3", r3, r4, accepted()),
        "valid-later": ("revision 6 after revision 3 (4 and 5 not at hand)", r3, r6,
                        accepted()),
        "lower": ("(a) revision 3 after revision 4: storage rolled back", r4, r3,
                  invalid("manifest-invalid")),
        "lower-by-three": ("(a) revision 3 after revision 6", r6, r3,
                           invalid("manifest-invalid")),
        "rewritten": ("(b) revision 3 with another generator than the accepted revision 3",
                      r3, r3_rewritten, invalid("manifest-invalid")),
        "rewritten-whitespace": ("(b) revision 3 with the accepted content, written without "
                                 "indentation: other bytes", r3, r3_compact,
                                 invalid("manifest-invalid")),
        "fork": ("(c) revision 4 whose parent digest is not the accepted revision 3's", r3,
                 r4_fork, invalid("manifest-invalid")),
    }  # fmt: skip
    for name, (what, seen, data, expect) in cases.items():
        seen_rev, rev = json.loads(seen)["revision"], json.loads(data)["revision"]
        path = suite.blob(f"chain/seen-{name}/{_key(rev)}", data)
        seen_path = suite.blob(f"chain/seen-{name}/seen/{_key(seen_rev)}", seen)
        suite.add(f"manifest/seen/{name}", "manifest", what, "§17.6", SEEN_RULE,
                  {"manifest": path, "seen": seen_path}, expect)  # fmt: skip
    # {seen} must be a valid revision under its key: revision 3 named as revision 2 breaks
    # CH-4, and a reader's record it cannot read is a bad argument, not "nothing accepted".
    path = suite.blob(f"chain/seen-not-a-revision/{_key(3)}", r3)
    seen_path = suite.blob(f"chain/seen-not-a-revision/seen/{_key(2)}", r3)
    suite.add("manifest/seen/not-a-revision", "manifest", "{seen} holds revision 3 under the "
              "key of revision 2 (CH-4): not a revision the reader accepted", "§16.3",
              SEEN_RULE, {"manifest": path, "seen": seen_path}, invalid("bad-argument"))
