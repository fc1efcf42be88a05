"""Chain operations on a local-folder chain: init, append, log, verify, pull
(full, partial, backwards, resumed), squash, prune, and the failure categories."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import wdelta
from chainkit import FailingStorage, Trainer, race_appends
from wdelta import chain
from wdelta.chain.model.manifest import revision_key
from wdelta.chain.reading.local import digest_of_path, partial_marker
from wdelta.chain.storage.base import ObjectInfo, Storage
from wdelta.errors import WdeltaError


def expect(category: str, fn: Any, *args: Any, **kwargs: Any) -> WdeltaError:
    with pytest.raises(WdeltaError) as info:
        fn(*args, **kwargs)
    assert info.value.category == category, info.value
    return info.value


@pytest.fixture
def history(tmp_path: Path) -> tuple[chain.Chain, list[Path]]:
    """A chain of versions 0..6 in a folder, and the trainer's checkpoint files."""
    t = Trainer(rows=64, cols=256)
    ckpts = [t.save(tmp_path / "ck0.safetensors")]
    c = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "writer-cache")
    chain.init(c, ckpts[0], step=0, metadata={"run": "test"})
    for n in range(1, 7):
        t.step(n)
        ckpts.append(t.save(tmp_path / f"ck{n}.safetensors"))
        chain.append(c, ckpts[n], ckpts[n - 1], step=n,
                     options=chain.AppendOptions(chunk_elements=4096))  # fmt: skip
    return c, ckpts


def node(c: chain.Chain, tmp_path: Path, name: str) -> chain.Chain:
    return chain.Chain(c.storage, tmp_path / f"{name}-cache")


def test_append_publishes_versions_and_links(history: tuple[chain.Chain, list[Path]]) -> None:
    c, ckpts = history
    m = c.head()
    assert m.revision == 7 and [v.number for v in m.versions] == list(range(7))
    assert [v.digest for v in m.versions] == [digest_of_path(p) for p in ckpts]
    assert [(k.source, k.target) for k in m.links] == [(i, i + 1) for i in range(6)]
    assert m.versions[0].metadata == {"run": "test"}
    rows = chain.log_rows(m)
    assert rows[0]["snapshot_bytes"] == ckpts[0].stat().st_size
    assert rows[3]["links_in"][0]["from"] == 2
    chain.verify(c, deep=True)


def test_pull_from_nothing_forwards_backwards(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, ckpts = history
    n = node(c, tmp_path, "n")
    local = tmp_path / "node" / "model.safetensors"
    r = chain.pull(n, local, to=2)
    assert r.version.number == 2 and r.hops[0].snapshot is not None
    assert local.read_bytes() == ckpts[2].read_bytes()
    r = chain.pull(n, local)
    assert r.version.number == 6 and [h.version for h in r.hops] == [3, 4, 5, 6]
    assert local.read_bytes() == ckpts[6].read_bytes()
    r = chain.pull(n, local, to="step:4")
    assert [(h.version, h.reverse) for h in r.hops] == [(5, True), (4, True)]
    assert r.downloaded == 0  # both deltas were verified into the cache on the way up
    assert local.read_bytes() == ckpts[4].read_bytes()
    assert chain.pull(n, local, to=4).hops == []
    assert not (local.parent / ".model.safetensors.wdelta-work").exists()


def test_partial_pull_reads_only_the_selected_ranges(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, ckpts = history

    class Counting(FailingStorage):
        ranged = 0

        def read_range(self, key: str, start: int, length: int) -> bytes:
            Counting.ranged += length
            return super().read_range(key, start, length)

    n = chain.Chain(Counting(c.storage, "never", 0), tmp_path / "p-cache")
    local = tmp_path / "rank1.safetensors"
    chain.pull(n, local, to=1, tensors="layer1.*,step")
    Counting.ranged = 0
    r = chain.pull(n, local, tensors="layer1.*,step")
    m = c.head()
    assert r.version.number == 6 and Counting.ranged == r.downloaded
    expected = chosen_blobs = all_blobs = 0  # each delta's prefix, header, chosen blobs
    for k in m.links[1:]:
        with wdelta.open_delta(c.fetch(k.key, k.size, k.digest, "blake3")) as d:
            chosen = [t for t in d.header.tensors if t.name in ("layer1.weight", "step")]
            # Inline blobs (SPEC §4.12) came with the header: no range read of their own.
            blobs = sum(ch.length for t in chosen for ch in t.chunks if ch.inline is None)
            expected += 64 + d.header_length + blobs
            chosen_blobs, all_blobs = chosen_blobs + blobs, all_blobs + d.data_length
    assert Counting.ranged == expected
    assert 0 < chosen_blobs < all_blobs * 0.4
    with wdelta.open_checkpoint(local) as part, wdelta.open_checkpoint(ckpts[6]) as full:
        assert set(part.tensors) == {"layer1.weight", "step"}
        for name, t in part.tensors.items():
            want = full.tensors[name].read(0, t.elements)
            assert t.read(0, t.elements).tobytes() == want.tobytes()
    assert partial_marker(local) == (m.head.digest, "layer1.*,step")
    expect("bad-argument", chain.pull, n, local, tensors="layer2.*")


def test_squash_equals_diff_of_the_end_points(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, ckpts = history
    m = chain.squash(c, 1, 5, base=ckpts[1])
    link = next(k for k in m.links if (k.source, k.target) == (1, 5))
    squashed = c.fetch(link.key, link.size, link.digest, "blake3")
    direct = wdelta.diff(ckpts[1], ckpts[5], tmp_path / "direct.wdelta", chunk_elements=4096)
    for delta in (squashed, direct):
        out = tmp_path / f"fwd-{delta.name}.safetensors"
        wdelta.apply(ckpts[1], delta, out)
        assert out.read_bytes() == ckpts[5].read_bytes()
        back = tmp_path / f"back-{delta.name}.safetensors"
        wdelta.apply(ckpts[5], delta, back, reverse=True)
        assert back.read_bytes() == ckpts[1].read_bytes()
    assert squashed.read_bytes() == direct.read_bytes()  # the very same file
    # Without --base the snapshot of version 0 is used.
    chain.squash(c, 0, 6)
    expect("conflict", chain.squash, c, 0, 6)
    n = node(c, tmp_path, "far")
    local = tmp_path / "far.safetensors"
    chain.pull(n, local, to=0)
    r = chain.pull(n, local)
    assert [(h.link.source, h.link.target) for h in r.hops if h.link] == [(0, 6)]
    assert local.read_bytes() == ckpts[6].read_bytes()


def test_prune_keeps_what_the_policy_promises(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, ckpts = history
    t = Trainer(rows=64, cols=256)
    for n in range(1, 7):
        t.step(n)
    t.step(7)
    ckpt7 = t.save(tmp_path / "ck7.safetensors")
    chain.append(c, ckpt7, ckpts[6], step=7, options=chain.AppendOptions(snapshot=True))
    m, deleted = chain.prune(c, chain.Policy(snapshot_every=5, keep_links=2, keep_revisions=3))
    assert [s.version for s in m.snapshots] == [0, 7]
    assert [(k.source, k.target) for k in m.links] == [(5, 6), (6, 7)]
    assert [v.number for v in m.versions] == [0, 5, 6, 7]
    assert sum(key.startswith("deltas/") for key in deleted) == 5
    assert c.revisions() == [m.revision - 2, m.revision - 1, m.revision]
    chain.verify(c, deep=True)
    for version, want in ((0, ckpts[0]), (5, ckpts[5]), (6, ckpts[6]), (7, ckpt7)):
        local = tmp_path / f"pruned-{version}.safetensors"
        chain.pull(node(c, tmp_path, f"p{version}"), local, to=version)
        assert local.read_bytes() == want.read_bytes()
    expect("not-found", chain.pull, c, tmp_path / "x.safetensors", to=3)


def test_interrupted_download_resumes(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, ckpts = history
    local = tmp_path / "n.safetensors"
    flaky = chain.Chain(FailingStorage(c.storage, "snapshots/", 50_000), tmp_path / "n-cache")
    before = list(tmp_path.iterdir())
    expect("io-error", chain.pull, flaky, local, to=3)
    assert not local.exists()
    new = {p.name for p in tmp_path.iterdir()} - {p.name for p in before}
    assert new == {"n-cache"}  # the first hop failed: no intermediate, no work folder
    parts = list((tmp_path / "n-cache" / "partial").iterdir())
    assert len(parts) == 1 and parts[0].stat().st_size == 50_000
    r = chain.pull(flaky, local, to=3)
    total = c.head().snapshots[0].size + sum(k.size for k in c.head().links[:3])
    assert r.downloaded == total - 50_000
    assert local.read_bytes() == ckpts[3].read_bytes()


def test_failed_hop_leaves_the_local_checkpoint_and_resumes(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, ckpts = history
    local = tmp_path / "n.safetensors"
    local.write_bytes(ckpts[1].read_bytes())
    m = c.head()
    flaky = chain.Chain(FailingStorage(c.storage, m.links[3].digest, 100), tmp_path / "n-cache")
    expect("io-error", chain.pull, flaky, local)
    assert local.read_bytes() == ckpts[1].read_bytes()
    work = tmp_path / ".n.safetensors.wdelta-work"
    assert [p.name for p in work.iterdir()] == [m.versions[3].digest]
    r = chain.pull(flaky, local)
    assert [h.version for h in r.hops] == [4, 5, 6]
    assert local.read_bytes() == ckpts[6].read_bytes()


def test_corrupt_and_missing_files_are_refused(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, _ = history
    m = c.head()
    root = Path(c.storage.url)
    (root / m.links[2].key).write_bytes(b"x" * m.links[2].size)
    expect("checksum-mismatch", chain.pull, node(c, tmp_path, "a"), tmp_path / "a.safetensors")
    (root / m.links[2].key).unlink()
    expect("not-found", chain.pull, node(c, tmp_path, "b"), tmp_path / "b.safetensors")
    expect("not-found", chain.verify, node(c, tmp_path, "v"))
    assert not (tmp_path / "a.safetensors").exists() and not (tmp_path / "b.safetensors").exists()


def test_link_header_must_match_the_manifest(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, _ = history
    m = c.head()
    swapped = m.links[1]
    bad = chain.Link(swapped.source, swapped.target, m.links[2].digest, m.links[2].size, True)
    links = (m.links[0], bad, *m.links[2:])
    tampered = m.successor(links=links)
    assert c.storage.create(revision_key(tampered.revision), tampered.to_bytes())
    expect("chain-broken", chain.verify, node(c, tmp_path, "v"))


def test_writer_errors(history: tuple[chain.Chain, list[Path]], tmp_path: Path) -> None:
    c, ckpts = history
    expect("conflict", chain.init, c, ckpts[0])
    expect("conflict", chain.append, c, ckpts[3], ckpts[2])
    stranger = Trainer(rows=64, cols=256, seed=9).save(tmp_path / "stranger.safetensors")
    expect("base-mismatch", chain.append, c, ckpts[0], stranger)
    expect("not-found", chain.pull, node(c, tmp_path, "s"), stranger)
    c.seen_revision = 99
    expect("manifest-invalid", c.head)
    expect("not-found", chain.Chain(chain.LocalStorage(tmp_path / "empty")).head)


def test_racing_writers_lose_no_version(tmp_path: Path) -> None:
    t = Trainer(rows=32, cols=128)
    base = t.save(tmp_path / "base.safetensors")
    c = chain.Chain(chain.LocalStorage(tmp_path / "store"))
    chain.init(c, base)
    news = []
    for i in range(8):
        t.step(i + 1)
        news.append(t.save(tmp_path / f"w{i}.safetensors"))
    race_appends(lambda: c.storage, news, base)
    m = c.head()
    assert m.revision == 9 and len(m.versions) == 9
    assert {v.digest for v in m.versions[1:]} == {digest_of_path(p) for p in news}
    assert c.revisions() == list(range(1, 10))


def test_sharded_checkpoint_is_swapped_through_a_symlink(tmp_path: Path) -> None:
    import kit

    t = Trainer(rows=32, cols=128)
    folders = []
    for n in range(3):
        if n:
            t.step(n)
        raw = {k: kit.as_raw(a) for k, a in t.w.items()}
        names = sorted(raw)
        folder = tmp_path / f"sharded{n}"
        kit.write_sharded(folder, [{k: raw[k] for k in names[:2]}, {k: raw[k] for k in names[2:]}])
        folders.append(folder)
    c = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "cache")
    chain.init(c, folders[0])
    chain.append(c, folders[1], folders[0])
    chain.append(c, folders[2], folders[1])
    local = tmp_path / "node" / "current"
    chain.pull(c, local, to=1)
    assert local.is_symlink()
    first = local.resolve()
    chain.pull(c, local)
    assert local.is_symlink() and not first.exists()
    assert kit.tree_hashes(local.resolve()) == kit.tree_hashes(folders[2])
    plain = tmp_path / "plain"
    shutil.copytree(folders[1], plain)
    expect("bad-argument", chain.pull, c, plain)
    assert kit.tree_hashes(plain) == kit.tree_hashes(folders[1])


class Recording(Storage):
    """Records calls; used to check that readers never list to find files."""

    def __init__(self, inner: Storage) -> None:
        self.inner, self.url, self.calls = inner, inner.url, []  # type: ignore[var-annotated]

    def stat(self, key: str) -> ObjectInfo | None:
        return self.inner.stat(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.read_range(key, start, length)

    def stream(self, key: str, start: int = 0) -> Any:
        return self.inner.stream(key, start)

    def put_file(self, key: str, path: Path, progress: Any = None) -> None:
        self.inner.put_file(key, path, progress)

    def create(self, key: str, data: bytes) -> bool:
        return self.inner.create(key, data)

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.calls.append(prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def test_readers_list_only_manifests(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, _ = history
    rec = Recording(c.storage)
    chain.pull(chain.Chain(rec, tmp_path / "r-cache"), tmp_path / "r.safetensors")
    assert set(rec.calls) == {"manifests/"}


def test_squash_over_added_retyped_tensors_and_mixed_chunk_sizes(tmp_path: Path) -> None:
    t = Trainer(rows=48, cols=200)
    ckpts = [t.save(tmp_path / "c0.safetensors")]
    c = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "cache")
    chain.init(c, ckpts[0])
    for n in range(1, 11):  # step 5 adds a tensor, step 9 changes its dtype
        t.step(n)
        ckpts.append(t.save(tmp_path / f"c{n}.safetensors"))
        opts = chain.AppendOptions(chunk_elements=(1000, 4096, 333)[n % 3])
        chain.append(c, ckpts[n], ckpts[n - 1], options=opts)
    m = chain.squash(c, 2, 10)
    link = next(k for k in m.links if (k.source, k.target) == (2, 10))
    squashed = c.fetch(link.key, link.size, link.digest, "blake3")
    with wdelta.open_delta(squashed) as d:
        assert d.header.chunk_elements == 333
        ops = {(e.name, e.op) for e in d.header.tensors}
    assert {("extra.scale", "added"), ("norm.bias", "modified")} <= ops
    out = tmp_path / "fwd.safetensors"
    wdelta.apply(ckpts[2], squashed, out)
    assert out.read_bytes() == ckpts[10].read_bytes()
    wdelta.apply(ckpts[10], squashed, tmp_path / "back.safetensors", reverse=True)
    assert (tmp_path / "back.safetensors").read_bytes() == ckpts[2].read_bytes()
    direct = wdelta.diff(ckpts[2], ckpts[10], tmp_path / "d.wdelta", chunk_elements=333)
    assert squashed.read_bytes() == direct.read_bytes()
    m = chain.squash(c, 4, 7, base=ckpts[4])  # 5 adds, 7 keeps: added then modified
    link = next(k for k in m.links if (k.source, k.target) == (4, 7))
    direct = wdelta.diff(ckpts[4], ckpts[7], tmp_path / "d2.wdelta", chunk_elements=333)
    assert c.fetch(link.key, link.size, link.digest, "blake3").read_bytes() == direct.read_bytes()


def test_verify_checks_the_parent_digests(
    history: tuple[chain.Chain, list[Path]], tmp_path: Path
) -> None:
    c, _ = history
    root = Path(c.storage.url)
    rev3 = root / revision_key(3)
    rev3.write_bytes(rev3.read_bytes().replace(b'"step": 2', b'"step": 2, "note": "edited"'))
    expect("manifest-invalid", chain.verify, node(c, tmp_path, "v"))


def test_local_store_objects_follow_the_umask(tmp_path: Path) -> None:
    """A shared folder store: objects get 0o666 less the umask, readable by the fleet's users."""
    store = chain.LocalStorage(tmp_path / "store")
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    old = os.umask(0o022)
    try:
        store.put_file("a/b.wdelta", src)
        assert store.create("a/manifest-1.json", b"{}")
    finally:
        os.umask(old)
    modes = {p.stat().st_mode & 0o777 for p in (tmp_path / "store" / "a").iterdir()}
    assert modes == {0o644}
