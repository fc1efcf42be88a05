"""Multi-part links (SPEC §17.12): publishing, checking, pulling and following them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from wdelta import chain
from wdelta.chain.errors import ChainBrokenError, ManifestInvalidError
from wdelta.chain.live.weights import weights_digest
from wdelta.chain.model.manifest import (
    MAX_MANIFEST_BYTES,
    LinkPart,
    delta_key,
    parse_manifest,
    revision_key,
)
from wdelta.chain.reading.local import digest_of_path
from wdelta.chain.reading.parts import mark_part, part_file
from wdelta.chain.store import file_digest
from wdelta.chain.writing.append import append_parts, check_files
from wdelta.checkpoint.source import open_checkpoint
from wdelta.errors import HeaderInvalidError, UnsupportedFeatureError
from wdelta.format import schemas
from wdelta.format.container import PREFIX_SIZE, pack_prefix, parse_prefix
from wdelta.ops.summary import summarize


def weights(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "a.weight": rng.standard_normal((64, 40)).astype(np.float32),
        "b.weight": rng.standard_normal((300,)).astype(np.float16),
        "c.bias": rng.standard_normal((17,)).astype(np.float32),
        "d.norm": np.ones(8, np.float32),
    }


def stepped(w: dict[str, Any], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, arr in w.items():
        new = arr.copy()
        if name != "d.norm":  # one tensor stays unchanged
            mask = rng.random(arr.shape) < 0.2
            new[mask] += np.asarray(1e-2, arr.dtype)
        out[name] = new
    return out


def new_chain(tmp: Path) -> chain.Chain:
    return chain.Chain(chain.open_storage(str(tmp / "store")), cache=tmp / "cache")


def part_files(
    c: chain.Chain, tmp: Path, old: dict[str, Any], new: dict[str, Any], split: list[list[str]],
    whole: tuple[str, str] | None = None, count: int | None = None,
) -> list[LinkPart]:  # fmt: skip
    """Encode and upload each group of ``split`` as a part of the link old -> new."""
    base, target = whole or (weights_digest(old), weights_digest(new))
    files = []
    for i, names in enumerate(split):
        raw, out = tmp / f"raw{i}.wdelta", tmp / f"part{i}.wdelta"
        wdelta.diff({n: old[n] for n in names}, {n: new[n] for n in names}, raw, overwrite=True)
        mark_part(raw, out, i, count or len(split), base, target)
        part = part_file(out)
        c.upload(part.key, out, part.digest, "blake3")
        files.append(part)
    return files


SPLIT = [["a.weight", "d.norm"], ["b.weight", "c.bias"]]


def link_of(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, str]:
    return weights_digest(old), weights_digest(new)


def published(tmp: Path, steps: int = 2) -> tuple[chain.Chain, list[dict[str, Any]]]:
    c = new_chain(tmp)
    history = [weights(0)]
    chain.Publisher(c).publish(history[0], step=0)
    for k in range(1, steps + 1):
        history.append(stepped(history[-1], k))
        files = part_files(c, tmp, history[-2], history[-1], SPLIT)
        append_parts(c, files, versions=link_of(history[-2], history[-1]), step=k)
    return c, history


def test_a_part_is_a_delta_of_its_tensors(tmp_path: Path) -> None:
    """A part applies alone to its tensors; its header says which part it is."""
    old, new = weights(0), stepped(weights(0), 1)
    raw, out = tmp_path / "raw.wdelta", tmp_path / "part.wdelta"
    wdelta.diff({"a.weight": old["a.weight"]}, {"a.weight": new["a.weight"]}, raw)
    mark_part(raw, out, 1, 3, weights_digest(old), weights_digest(new))
    with wdelta.open_delta(out) as d:
        assert d.header.part == (1, 3, weights_digest(old), weights_digest(new))
    sub = {"a.weight": old["a.weight"].copy()}
    wdelta.apply_inplace(sub, out)
    assert sub["a.weight"].tobytes() == new["a.weight"].tobytes()
    with wdelta.open_delta(out) as d, wdelta.open_delta(raw) as plain:
        shown, unmarked = summarize(d).to_json(), summarize(plain).to_json()
    assert schemas.violation("inspect", shown) is None and unmarked["part"] is None
    assert shown["part"] == {"index": 1, "count": 3, "base": weights_digest(old),
                             "target": weights_digest(new)}  # fmt: skip
    raw_bytes, out_bytes = raw.read_bytes(), out.read_bytes()
    assert raw_bytes[-100:] == out_bytes[-100:]  # the data section is kept as it was


def test_part_index_below_count(tmp_path: Path) -> None:
    old, new = weights(0), stepped(weights(0), 1)
    raw, out = tmp_path / "raw.wdelta", tmp_path / "part.wdelta"
    wdelta.diff({"c.bias": old["c.bias"]}, {"c.bias": new["c.bias"]}, raw)
    mark_part(raw, out, 2, 2, weights_digest(old), weights_digest(new))
    with pytest.raises(HeaderInvalidError, match="part index"):
        wdelta.verify(out)


def test_pull_full_and_partial(tmp_path: Path) -> None:
    c, history = published(tmp_path)
    m = c.head()
    assert m.links[-1].parts and json.loads(m.to_bytes())["required_features"] == [
        "multi-part-links", "part-header-digests"
    ]
    local = tmp_path / "node" / "model.safetensors"
    local.parent.mkdir()
    got = chain.pull(chain.Chain(c.storage, cache=tmp_path / "fresh"), local, to=1)
    assert digest_of_path(local) == weights_digest(history[1])
    # From nothing: the snapshot of version 0 and the two parts of link 0 -> 1, each once.
    assert got.downloaded == m.snapshots[0].size + m.links[0].size
    chain.pull(c, local)
    assert digest_of_path(local) == weights_digest(history[2])
    part = tmp_path / "node" / "part.safetensors"
    got = chain.pull(chain.Chain(c.storage), part, tensors="b.*")
    assert got.version.number == 2
    with wdelta.open_delta(c.cached_path(m.links[-1].parts[1].digest)) as d:  # type: ignore[arg-type]
        assert d.header.part is not None
    check_files(c, m)
    chain.verify(c, deep=True)


def test_follow_weights_applies_parts_in_place(tmp_path: Path) -> None:
    c, history = published(tmp_path)
    live = {n: a.copy() for n, a in history[0].items()}
    got = list(chain.follow_weights(c, live, at=0, max_polls=1, interval=0))
    assert [v.number for v in got] == [1, 2]
    assert all(live[n].tobytes() == history[2][n].tobytes() for n in live)
    rank = {n: a.copy() for n, a in history[0].items() if n.startswith("b.")}
    fresh = chain.Chain(c.storage, cache=tmp_path / "rank-cache")
    list(chain.follow_weights(fresh, rank, at=0, tensors="b.*", max_polls=1, interval=0))
    assert rank["b.weight"].tobytes() == history[2]["b.weight"].tobytes()
    # The rank read every part's header but only its own tensors' blobs: nothing cached.
    assert not any((tmp_path / "rank-cache" / "objects").glob("*"))


def test_in_memory_failure_undoes_applied_parts(tmp_path: Path) -> None:
    c, history = published(tmp_path, steps=1)
    live = {n: a.copy() for n, a in history[0].items()}
    live["c.bias"][0] += 1  # not version 0: the second part fails after the first applied
    before = {n: a.tobytes() for n, a in live.items()}
    errors: list[Exception] = []
    got = chain.follow_weights(c, live, at=0, max_polls=1, interval=0, backoff=(0, 0),
                               on_error=lambda e, n: errors.append(e))  # fmt: skip
    assert list(got) == []
    assert errors and {n: a.tobytes() for n, a in live.items()} == before


def test_sets_that_are_not_the_link(tmp_path: Path) -> None:
    """append_parts reads every part's header back and refuses a bad set before publishing."""
    c, history = published(tmp_path, steps=1)
    old, new = history[1], stepped(history[1], 7)
    cases = {
        "overlapping": [["a.weight", "d.norm", "b.weight"], ["b.weight", "c.bias"]],
        "missing": [["a.weight", "d.norm"], ["b.weight"]],
    }
    for name, split in cases.items():
        why = "two parts" if name == "overlapping" else "missing"
        with pytest.raises(ChainBrokenError, match=why):
            append_parts(c, part_files(c, tmp_path, old, new, split), versions=link_of(old, new),
                         step=5)  # fmt: skip
    other = stepped(new, 8)
    good = part_files(c, tmp_path, old, new, SPLIT)
    stray = part_files(c, tmp_path, new, other, SPLIT)  # a part of the next step
    with pytest.raises(ChainBrokenError, match="says it is"):
        append_parts(c, [good[0], stray[1]], versions=link_of(old, new), step=5)
    with pytest.raises(ChainBrokenError, match="says it is"):
        append_parts(c, [good[1], good[0]], versions=link_of(old, new), step=5)
    assert c.head().revision == 2


def test_manifest_rules(tmp_path: Path) -> None:
    c, _ = published(tmp_path, steps=1)
    doc = json.loads(c.storage.read(revision_key(2), MAX_MANIFEST_BYTES))
    plain = dict(doc, required_features=[])
    with pytest.raises(ManifestInvalidError, match="multi-part-links"):
        parse_manifest(json.dumps(plain).encode())
    twice = json.loads(json.dumps(doc))
    twice["links"][0]["parts"][1] = twice["links"][0]["parts"][0]
    with pytest.raises(ManifestInvalidError, match="twice"):
        parse_manifest(json.dumps(twice).encode())
    both = json.loads(json.dumps(doc))
    both["links"][0].update(digest="0" * 64, size=100)
    with pytest.raises(ManifestInvalidError, match="schema"):
        parse_manifest(json.dumps(both).encode())
    no_headers = dict(doc, required_features=["multi-part-links"])  # MP-5, CH-8
    with pytest.raises(ManifestInvalidError, match="part-header-digests"):
        parse_manifest(json.dumps(no_headers).encode())
    one_missing = json.loads(json.dumps(doc))
    del one_missing["links"][0]["parts"][1]["header"]
    with pytest.raises(ManifestInvalidError, match="has no header digest"):
        parse_manifest(json.dumps(one_missing).encode())
    unknown = dict(doc, required_features=["multi-part-links", "x"])
    with pytest.raises(UnsupportedFeatureError):
        parse_manifest(json.dumps(unknown).encode())
    # A corrupted part is found by the store check (RD-2).
    key = delta_key(doc["links"][0]["parts"][0]["digest"])
    path = Path(c.storage.root) / key  # type: ignore[attr-defined]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    fresh = chain.Chain(c.storage, cache=tmp_path / "other-cache")
    with pytest.raises(wdelta.errors.ChecksumMismatchError):
        check_files(fresh, fresh.head())


@pytest.mark.parametrize("reader", ["pull", "follow_weights"])
def test_a_partial_reader_checks_each_part_header_against_the_manifest(
    tmp_path: Path, reader: str
) -> None:
    """MP-5.  The store replaces a part by one of the same size whose header differs (one
    character of its generator; the prefix's header digest made to match, the blobs
    kept): a node reading its tensors by ranges refuses it, since its header is not the
    one the signed manifest lists.  (Before, a partial reader checked a part's header only
    against the digest in the same file, and applied whatever header the store served.)"""
    c, history = published(tmp_path, steps=1)
    path = tmp_path / "store" / c.head().links[0].parts[1].key
    data = path.read_bytes()
    n, _, d = parse_prefix(data[:PREFIX_SIZE], len(data))
    header = data[PREFIX_SIZE : PREFIX_SIZE + n]
    other = header.replace(b'"generator":"w', b'"generator":"W', 1)
    assert other != header
    path.write_bytes(pack_prefix(other, d) + other + data[PREFIX_SIZE + n :])
    node = chain.Chain(c.storage, cache=tmp_path / "node-cache")
    with pytest.raises(wdelta.errors.ChecksumMismatchError, match="not the part written"):
        if reader == "pull":
            chain.pull(node, tmp_path / "node.safetensors", tensors="b.*")
        else:
            rank = {n: a.copy() for n, a in history[0].items() if n.startswith("b.")}
            list(chain.follow_weights(node, rank, at=0, tensors="b.*", max_polls=1,
                                      max_failures=1, interval=0))  # fmt: skip


def test_prune_keeps_parts_squash_refuses(tmp_path: Path) -> None:
    c, history = published(tmp_path, steps=3)
    stray = tmp_path / "stray.wdelta"
    stray.write_bytes(b"x" * 100)
    c.upload("deltas/" + "0" * 64 + ".wdelta", stray, file_digest(stray, "blake3"), "blake3")
    chain.prune(c, chain.Policy(snapshot_every=100, keep_links=2, keep_revisions=1))
    m = c.head()
    kept = {f.key for k in m.links for f in k.files}
    # Every link is needed from the one snapshot (version 0): all parts kept, the stray deleted.
    assert len(m.links) == 3 and all(len(k.parts) == 2 for k in m.links)
    assert {o.key for o in c.storage.list("deltas/")} == kept
    node = tmp_path / "node.safetensors"
    chain.pull(chain.Chain(c.storage, cache=tmp_path / "c2"), node)
    assert digest_of_path(node) == weights_digest(history[3])
    with pytest.raises(wdelta.errors.BadArgumentError, match="multi-part"):
        chain.squash(c, 1, 3)


def test_partial_node_reads_its_share_of_a_snapshot(tmp_path: Path) -> None:
    """Version 0 proven by the parts of link 0 -> 1: a partial pull from nothing reads the
    snapshot's byte ranges of its tensors, not whole shards."""
    c, history = published(tmp_path, steps=1)
    counted: list[int] = []
    node = tmp_path / "part.safetensors"
    chain.pull(chain.Chain(c.storage, cache=tmp_path / "pc"), node, to=0, tensors="a.*",
               progress=counted.append)  # fmt: skip
    # Two part headers, the snapshot's safetensors header, then a.weight's bytes alone.
    assert len(counted) == 4 and counted[-1] == history[0]["a.weight"].nbytes, counted
    with open_checkpoint(node) as ckpt:
        assert set(ckpt.tensors) == {"a.weight"}
