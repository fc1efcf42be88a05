"""A node's own cache folder written by an attacker: an object planted under a
part's digest is evicted and fetched again (SPEC §17.7) by ``pull``, the
in-memory follower and ``move_weights``; a partial download planted as a hard
link is never written through."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from test_chain_follow_weights import copy, publisher, same
from test_chain_parts import published
from wdelta import chain
from wdelta.chain.storage.smallfile import append_blocks, kept_partial
from wdelta.chain.storage.transfer import Transfer
from wdelta.errors import StorageError


def plant_part(tmp: Path, c: chain.Chain, cache: Path) -> str:
    """Put part 1's bytes of the link 1->2 in ``cache`` under part 0's digest."""
    link = next(k for k in c.head().links if k.target == 2)
    first, second = link.parts
    objects = cache / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    (objects / first.digest).write_bytes((tmp / "store" / second.key).read_bytes())
    return first.digest


def poisoned_node(tmp: Path) -> tuple[chain.Chain, list[Any]]:
    """A node of a two-step multi-part chain whose cache holds a planted part, and the
    weights of each version."""
    c, history = published(tmp, 2)
    cache = tmp / "node-cache"
    plant_part(tmp, c, cache)
    return chain.Chain(chain.LocalStorage(tmp / "store"), cache), history


def test_pull_evicts_a_planted_part(tmp_path: Path) -> None:
    c, history = published(tmp_path, 2)
    cache = tmp_path / "node-cache"
    digest = plant_part(tmp_path, c, cache)
    node = chain.Chain(chain.LocalStorage(tmp_path / "store"), cache)
    local = tmp_path / "node" / "model.safetensors"
    local.parent.mkdir()
    result = chain.pull(node, local)
    assert result.version.number == 2
    assert (cache / "objects" / digest).read_bytes() != b""
    assert chain.weights_digest(history[2]) == result.version.digest


def test_follower_evicts_a_planted_part(tmp_path: Path) -> None:
    node, history = poisoned_node(tmp_path)
    weights = copy(history[1])
    errors: list[object] = []
    follower = chain.follow_weights(node, weights, at=1, interval=0, max_polls=1,
                                    max_failures=1, on_error=lambda e, n: errors.append(e))
    got = list(follower)
    assert [v.number for v in got] == [2] and not errors
    assert same(weights, history[2])


@pytest.mark.usefixtures("group")  # a process group of one rank
def test_group_follower_evicts_a_planted_part(tmp_path: Path) -> None:
    from wdelta.chain.live.group_follow import follow_in_group

    node, history = poisoned_node(tmp_path)
    weights = copy(history[1])
    got = list(follow_in_group(node, weights, at=1, interval=0, max_polls=1))
    assert [v.number for v in got] == [2]
    assert same(weights, history[2])


def test_move_evicts_a_planted_part(tmp_path: Path) -> None:
    node, history = poisoned_node(tmp_path)
    weights = copy(history[1])
    assert chain.move_weights(node, weights, at=1, to=2).version.number == 2
    assert same(weights, history[2])


@pytest.mark.parametrize("ranged", [False, True])
def test_a_hard_link_planted_as_a_partial_download_is_not_written_through(
    tmp_path: Path, ranged: bool
) -> None:
    """``partial/<digest>.part`` planted as a hard link to a file of the node (its
    trust root, say): the pull removes the link and downloads afresh; the file it
    named keeps its bytes."""
    _, history = publisher(tmp_path, 2)
    storage = chain.LocalStorage(tmp_path / "store")
    if ranged:
        storage.transfer = Transfer(threshold=1, chunk=1 << 12)
    node = chain.Chain(storage, tmp_path / "node-cache")
    link = node.head().links[-1]
    victim = tmp_path / "root.json"
    victim.write_bytes(b'{"keep": "me"}')
    part = tmp_path / "node-cache" / "partial" / f"{link.digest}.part"
    part.parent.mkdir(parents=True)
    os.link(victim, part)
    local = tmp_path / "node" / "model.safetensors"
    local.parent.mkdir()
    assert chain.pull(node, local).version.number == 2
    assert victim.read_bytes() == b'{"keep": "me"}'
    assert chain.weights_digest(history[2]) == node.head().head.digest


def test_a_partial_file_swapped_after_its_check_is_refused(tmp_path: Path) -> None:
    """Between ``kept_partial``'s check and the append, the file is replaced: by a hard
    link (continuing), or by any file at all (a new download creates its own, exclusively);
    the append is refused and the other file keeps its bytes."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"12345")
    part = tmp_path / "x.part"
    os.link(victim, part)
    with pytest.raises(StorageError, match="changed since it was checked"):
        append_blocks(part, [b"evil"], None, have=5)
    part.unlink()
    part.write_bytes(b"12345")  # the right size, but not the one checked to be empty
    with pytest.raises(StorageError, match="cannot write"):
        append_blocks(part, [b"evil"], None, have=0)
    assert victim.read_bytes() == b"12345" and part.read_bytes() == b"12345"
    assert kept_partial(part, 10) == 5
    os.link(part, tmp_path / "second-name")
    assert kept_partial(part, 10) == 0 and not part.exists()
    assert (tmp_path / "second-name").read_bytes() == b"12345"
