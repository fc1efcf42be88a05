"""``move_weights`` and ``prefetch``: in-memory weights to any version of a chain,
forward, backward, skipping versions, through a snapshot, all or nothing; a
download ahead after which a move reads no object from storage."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chainkit import Wrapped
from test_chain_follow_weights import copy, publisher, same, state, step
from test_chain_parts import published as parts_published
from wdelta import chain
from wdelta.chain.errors import ChainBrokenError
from wdelta.chain.live import move
from wdelta.errors import StorageError, WdeltaError


class Reads(Wrapped):
    """Counts the reads of delta and snapshot objects; fails them when ``refuse``."""

    def __init__(self, inner: chain.Storage) -> None:
        super().__init__(inner)
        self.objects: list[str] = []
        self.refuse = False

    def _seen(self, key: str) -> None:
        if not key.startswith("manifests/") and not key.startswith("keys/"):
            self.objects.append(key)
            if self.refuse:
                raise StorageError(f"injected: no network ({key})")

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self._seen(key)
        return self.inner.read_range(key, start, length)

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        self._seen(key)
        return self.inner.stream(key, start)


def node(tmp: Path) -> tuple[chain.Chain, Reads]:
    reads = Reads(chain.LocalStorage(tmp / "store"))
    return chain.Chain(reads, tmp / "node-cache"), reads


def changed_between(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    return {n for n in b if n not in a or a[n].tobytes() != b[n].tobytes()}


def test_forward_skipping_and_backward(tmp_path: Path) -> None:
    """From version 1 to 4 (three links at once), then back to 2 over reversible
    links, then to the head: bit for bit each time; ``changed`` names every tensor
    whose bytes differ."""
    _, history = publisher(tmp_path, 5)
    c, _ = node(tmp_path)
    weights = copy(history[1])
    seen: list[tuple[int, frozenset[str]]] = []
    blocks: list[int] = []
    moved = chain.move_weights(c, weights, at=1, to=4, progress=blocks.append,
                               on_link=lambda v, names: seen.append((v.number, names)))  # fmt: skip
    assert moved.version.number == 4 and not moved.jumped and moved.downloaded == sum(blocks) > 0
    assert [v for v, _ in seen] == [2, 3, 4]
    assert seen[0][1] == frozenset(changed_between(history[1], history[2]))
    assert same(weights, history[4])
    assert moved.changed == changed_between(history[1], history[4])
    moved = chain.move_weights(c, weights, at=4, to=2)
    assert moved.version.number == 2 and same(weights, history[2]) and moved.downloaded == 0
    assert moved.changed >= changed_between(history[4], history[2])
    moved = chain.move_weights(c, weights, at=None)  # hashed: version 2; to the head
    assert moved.version.number == 5 and same(weights, history[5])


def test_prefetch_then_move_reads_no_object(tmp_path: Path) -> None:
    """After ``prefetch`` the move downloads nothing: storage refusing every object
    read does not stop it (only the manifest is read)."""
    _, history = publisher(tmp_path, 4)
    c, reads = node(tmp_path)
    got = chain.prefetch(c, at=0, to=3)
    assert got > 0 and reads.objects
    reads.refuse = True
    weights = copy(history[0])
    moved = chain.move_weights(c, weights, at=0, to=3)
    assert same(weights, history[3]) and moved.downloaded == 0
    assert chain.prefetch(c, at=0, to=3) == 0


def test_a_failed_link_undoes_the_links_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third link of a move fails: the two applied are undone from the bytes they
    applied (no new read), the weights are bit for bit where they started."""
    _, history = publisher(tmp_path, 4)
    c, reads = node(tmp_path)
    weights = copy(history[0])
    real, calls = move.apply_link, []

    def third_fails(*args: Any) -> Any:
        calls.append(args[4])  # reverse
        if len(calls) == 3:
            raise StorageError("injected: the third link fails")
        return real(*args)

    monkeypatch.setattr(move, "apply_link", third_fails)
    monkeypatch.setattr(move, "evicting", lambda c, files, run: run())
    chain.prefetch(c, at=0, to=3)
    reads.refuse = True  # undoing reads no object from storage
    with pytest.raises(StorageError, match="third link"):
        chain.move_weights(c, weights, at=0, to=3)
    assert same(weights, history[0])
    assert calls == [False, False, False]  # undone by the links applied, not new applies


def test_a_failed_download_leaves_the_weights(tmp_path: Path) -> None:
    """A full mapping's move downloads every link before applying any."""
    _, history = publisher(tmp_path, 3)
    c, _ = node(tmp_path)
    m = c.head()
    last = next(k for k in m.links if k.target == 3)
    path = tmp_path / "store" / last.key
    path.write_bytes(path.read_bytes()[:-1] + bytes([path.read_bytes()[-1] ^ 1]))
    weights = copy(history[0])
    with pytest.raises(WdeltaError):
        chain.move_weights(c, weights, at=0, to=3)
    assert same(weights, history[0])


def test_pruned_version_jumps_through_a_snapshot(tmp_path: Path) -> None:
    """No links from the weights' version (pruned): the target is loaded through its
    snapshot and applied in place; ``jump=False`` refuses instead."""
    pub = chain.Publisher(chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "p"))
    history = [state(0)]
    pub.publish(history[0])
    for k in range(1, 5):
        history.append(step(history[-1], k))
        pub.publish(history[-1], snapshot=k == 3)
    chain.prune(pub.chain, chain.Policy(snapshot_every=3, keep_links=1, keep_revisions=1))
    c, _ = node(tmp_path)
    weights = copy(history[1])
    with pytest.raises(ChainBrokenError, match="no jump through a snapshot"):
        chain.move_weights(c, weights, at=1, to=4, jump=False)
    assert same(weights, history[1])
    moved = chain.move_weights(c, weights, at=1, to=4)
    assert moved.jumped and moved.version.number == 4 and same(weights, history[4])
    assert moved.changed == changed_between(history[1], history[4])


def test_multi_part_links_both_ways(tmp_path: Path) -> None:
    """Multi-part links: forward two versions and back, ``changed`` from every part."""
    _, history = parts_published(tmp_path, 2)
    node_chain = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "node-cache")
    weights = copy(history[0])
    moved = chain.move_weights(node_chain, weights, at=0, to=2)
    assert same(weights, history[2]) and moved.changed == changed_between(history[0], history[2])
    assert "d.norm" not in moved.changed
    chain.move_weights(node_chain, weights, at=2, to=0)
    assert same(weights, history[0])


def test_partial_mapping_reads_its_tensors_only(tmp_path: Path) -> None:
    """A mapping of some tensors (a pattern) moves with ranged reads of their blobs."""
    _, history = publisher(tmp_path, 3)
    c, _ = node(tmp_path)
    pattern = "layers.*"
    weights = {n: a.copy() for n, a in history[0].items() if n.startswith("layers.")}
    moved = chain.move_weights(c, weights, at=0, to=3, tensors=pattern)
    assert all(np.array_equal(weights[n], history[3][n]) for n in weights)
    assert moved.changed <= set(weights)
    assert not any((tmp_path / "node-cache" / "objects").glob("*"))  # nothing whole cached


def test_bad_arguments(tmp_path: Path) -> None:
    _, history = publisher(tmp_path, 1)
    with pytest.raises(WdeltaError, match="cache folder"):
        chain.move_weights(chain.Chain(chain.LocalStorage(tmp_path / "store")),
                           copy(history[0]), at=0)  # fmt: skip
    c, _ = node(tmp_path)
    with pytest.raises(WdeltaError, match="mutable mapping"):
        chain.move_weights(c, tuple(history[0].items()), at=0)  # type: ignore[arg-type]
    with pytest.raises(WdeltaError, match="pass at="):
        chain.move_weights(c, {"embed.weight": history[0]["embed.weight"].copy()}, at=None,
                           tensors="embed.*")  # fmt: skip


def test_a_partial_move_is_undone_from_the_bytes_its_ranged_reads_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial mapping reads uncached links by ranges; when the third link fails, the
    two applied before are undone from the blobs those reads kept (no new read: the
    store is gone by then), and the weights are at version 0 again, bit for bit."""
    _, history = publisher(tmp_path, 3)
    c, _ = node(tmp_path)
    weights = {n: a.copy() for n, a in history[0].items() if n.startswith("layers.")}
    real, calls = move.apply_link, []

    def third_fails(*args: Any) -> Any:
        calls.append(args[4])
        if len(calls) == 3:
            shutil.rmtree(tmp_path / "store")  # any read from now on fails
            raise StorageError("injected: the third link fails")
        return real(*args)

    monkeypatch.setattr(move, "apply_link", third_fails)
    monkeypatch.setattr(move, "evicting", lambda c, files, run: run())
    with pytest.raises(StorageError, match="the third link fails"):
        chain.move_weights(c, weights, at=0, to=3, tensors="layers.*")
    assert all(np.array_equal(weights[n], history[0][n]) for n in weights)
