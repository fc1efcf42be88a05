"""The chain manifest: schema, every reader rule with its category, round trips,
version references and path planning."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from wdelta.chain.model import graph
from wdelta.chain.model.manifest import (
    Link,
    Manifest,
    Snapshot,
    SnapshotFile,
    Version,
    parse_manifest,
    read_manifest,
    revision_key,
    revision_of_key,
)
from wdelta.errors import WdeltaError

D = [hashlib.sha256(bytes([i])).hexdigest() for i in range(20)]


def doc(**changes: Any) -> dict[str, Any]:
    """A valid manifest: versions 0..3, a snapshot of 0, links 0->1->2->3 and 0->3."""
    base: dict[str, Any] = {
        "format": "wdelta-chain", "version": 1, "required_features": [], "revision": 2,
        "parent": {"revision": 1, "digest": D[10]},
        "versions": [{"number": i, "digest": D[i], "step": 10 * i} for i in range(4)],
        "snapshots": [{"version": 0, "files": [
            {"name": "model.safetensors", "sha256": D[11], "size": 1000}]}],
        "links": [
            {"from": 0, "to": 1, "digest": D[12], "size": 100, "reversible": True},
            {"from": 1, "to": 2, "digest": D[13], "size": 100, "reversible": True},
            {"from": 0, "to": 3, "digest": D[15], "size": 150, "reversible": False},
            {"from": 2, "to": 3, "digest": D[14], "size": 100, "reversible": True},
        ],
    }  # fmt: skip
    base.update(changes)
    return base


def parse(d: dict[str, Any]) -> Manifest:
    return parse_manifest(json.dumps(d).encode())


def category(d: dict[str, Any] | bytes) -> str:
    data = d if isinstance(d, bytes) else json.dumps(d).encode()
    with pytest.raises(WdeltaError) as info:
        parse_manifest(data)
    return info.value.category


def test_valid_manifest_round_trips() -> None:
    m = parse(doc())
    assert [v.number for v in m.versions] == [0, 1, 2, 3]
    assert m.links[2] == Link(0, 3, D[15], 150, False)
    assert m.snapshot(0) == Snapshot(0, (SnapshotFile("model.safetensors", D[11], 1000),))
    again = parse_manifest(m.to_bytes())
    assert again == m
    assert m.links[0].key == f"deltas/{D[12]}.wdelta"
    assert m.snapshots[0].files[0].key == f"snapshots/{D[11]}/model.safetensors"


def test_unknown_keys_are_ignored() -> None:
    d = doc(future={"x": 1})
    d["versions"][0]["colour"] = "blue"
    d["links"][0]["hint"] = 3
    assert parse(d) == parse(doc())


def mutate(path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc())
    *parents, last = path.split(".")
    node: Any = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is DELETE:
        del node[int(last) if last.isdigit() else last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return d


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("format", "other", "manifest-invalid"),
        ("version", 2, "unsupported-version"),
        ("required_features", ["zzz"], "unsupported-feature"),
        ("revision", 0, "manifest-invalid"),
        ("parent", None, "manifest-invalid"),  # only revision 1 has no parent
        ("parent.revision", 7, "manifest-invalid"),
        ("versions", [], "manifest-invalid"),
        ("versions.1.digest", "XYZ", "manifest-invalid"),
        ("versions.1.number", 5, "manifest-invalid"),  # out of order
        ("versions.2.digest", D[1], "manifest-invalid"),  # duplicate digest
        ("versions.2.step", 5, "manifest-invalid"),  # steps must increase
        ("versions.0.metadata", {"a": 1}, "manifest-invalid"),
        ("snapshots.0.version", 9, "manifest-invalid"),  # dangling
        ("snapshots.0.files.0.name", "../x.safetensors", "manifest-invalid"),
        ("snapshots.0.files.0.size", -1, "manifest-invalid"),
        ("links.0.to", 9, "manifest-invalid"),  # dangling
        ("links.1.from", 2, "manifest-invalid"),  # 2 -> 2 is a cycle
        ("links.1.from", 3, "manifest-invalid"),  # backwards: would close a cycle
        ("links.0.size", 10, "manifest-invalid"),  # smaller than a delta prefix
        ("links.0.reversible", DELETE, "manifest-invalid"),
        ("snapshots", [], "chain-broken"),  # nothing reachable
    ],
)
def test_rule_violations_have_categories(path: str, value: Any, expected: str) -> None:
    assert category(mutate(path, value)) == expected


def test_duplicate_keys_and_bad_json() -> None:
    text = json.dumps(doc())
    assert category(text.replace('"revision": 2', '"revision": 2, "revision": 2').encode()) == (
        "manifest-invalid"
    )
    assert category(b"\xff\xfe") == "manifest-invalid"
    assert category(b"[1, 2]") == "manifest-invalid"
    assert category(text.replace('"size": 1000', '"size": NaN').encode()) == "manifest-invalid"
    assert category(text.replace('"step": 0', '"step": 0.0').encode()) == "manifest-invalid"
    assert category(b"[" * 100 + b"]" * 100) == "manifest-invalid"


def test_duplicate_links_and_order() -> None:
    d = doc()
    d["links"].append(dict(d["links"][-1]))
    assert category(d) == "manifest-invalid"
    d = doc()
    d["links"].reverse()
    assert category(d) == "manifest-invalid"


def test_unreachable_version_is_chain_broken() -> None:
    d = doc()
    d["links"] = [k for k in d["links"] if k["to"] != 1]
    d["links"][0]["reversible"] = False  # now nothing leads to 1
    assert category(d) == "chain-broken"
    d = doc()
    d["links"] = [k for k in d["links"] if (k["from"], k["to"]) != (1, 2)]
    d["links"][-1]["reversible"] = False  # 2 needs 2->3 walked backwards
    assert category(d) == "chain-broken"
    d["links"][-1]["reversible"] = True
    parse(d)


def test_sharded_snapshot_needs_an_index() -> None:
    d = doc()
    d["snapshots"][0]["files"].append({"name": "b.safetensors", "sha256": D[1], "size": 1})
    assert category(d) == "manifest-invalid"
    d["snapshots"][0]["files"].append(
        {"name": "model.safetensors.index.json", "sha256": D[2], "size": 1}
    )
    parse(d)


def test_revision_file_names(tmp_path: Path) -> None:
    assert revision_key(42) == "manifests/rev-000000000042.json"
    assert revision_of_key(revision_key(42)) == 42
    assert revision_of_key("manifests/rev-42.json") is None
    assert revision_of_key("deltas/rev-000000000042.json") is None
    (tmp_path / "rev-000000000002.json").write_text(json.dumps(doc()))
    assert read_manifest(tmp_path / "rev-000000000002.json").revision == 2
    (tmp_path / "rev-000000000003.json").write_text(json.dumps(doc()))
    with pytest.raises(WdeltaError) as info:
        read_manifest(tmp_path / "rev-000000000003.json")
    assert info.value.category == "manifest-invalid"
    with pytest.raises(WdeltaError) as info:
        read_manifest(tmp_path / "missing.json")
    assert info.value.category == "not-found"


def test_version_references() -> None:
    m = parse(doc())
    assert m.version("head").number == 3
    assert m.version(2).number == 2
    assert m.version("step:20").number == 2
    assert m.version(D[1][:16]).number == 1
    assert m.version(D[1].upper()).number == 1
    for ref in ("9", "step:7", "0" * 16, D[1][:7]):
        with pytest.raises(WdeltaError) as info:
            m.version(ref)
        assert info.value.category == "not-found"


def test_successor_grows_revision_and_chains_parent() -> None:
    m = parse(doc())
    v4 = Version(4, D[4], 40)
    nxt = m.successor(versions=(*m.versions, v4), links=(*m.links, Link(3, 4, D[16], 99, True)))
    assert nxt.revision == 3
    assert nxt.parent is not None and nxt.parent[0] == 2
    with pytest.raises(WdeltaError) as info:
        m.successor(links=(*m.links, Link(3, 9, D[16], 99, True)))
    assert info.value.category == "manifest-invalid"


def test_cheapest_path_prefers_fewest_bytes() -> None:
    m = parse(doc())
    none: set[str] = set()
    start, hops = graph.cheapest_path(m, [], 3, none.__contains__)  # type: ignore[misc]
    assert start == graph.NOTHING
    assert [(h.snapshot is not None, h.link and (h.link.source, h.link.target)) for h in hops] == [
        (True, None), (False, (0, 3)),
    ]  # fmt: skip
    # From version 1: 1->2->3 (200 B) beats 1<-0 is impossible backwards? 0->1 is reversible
    # so 1->0->3 costs 250 B; the forward path wins.
    start, hops = graph.cheapest_path(m, [1], 3, none.__contains__)  # type: ignore[misc]
    assert start == 1 and [h.version for h in hops] == [2, 3]
    # Cached files are free: with 0->1 and 0->3 cached, going back through 0 is cheapest.
    cached = {D[12], D[15]}
    start, hops = graph.cheapest_path(m, [1], 3, cached.__contains__)  # type: ignore[misc]
    assert [(h.version, h.reverse) for h in hops] == [(0, True), (3, False)]
    # Version 3 -> 0: 0->3 is not reversible, so 3->2->1->0 backwards (300 B)
    # loses to the snapshot (1000 B)? No: 300 < 1000.
    start, hops = graph.cheapest_path(m, [3], 0, none.__contains__)  # type: ignore[misc]
    assert [(h.version, h.reverse) for h in hops] == [(2, True), (1, True), (0, True)]
    assert graph.cheapest_path(m, [3], 3, none.__contains__) == (3, [])
