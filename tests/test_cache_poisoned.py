"""A node's own cache folder written by an attacker: an object planted under a
part's digest is evicted and fetched again (SPEC §17.7) by ``pull``, the
in-memory follower and ``move_weights``."""

from __future__ import annotations

from pathlib import Path

from test_chain_follow_weights import copy, same
from test_chain_parts import published
from wdelta import chain


def plant_part(tmp: Path, c: chain.Chain, cache: Path) -> str:
    """Put part 1's bytes of the link 1->2 in ``cache`` under part 0's digest."""
    link = next(k for k in c.head().links if k.target == 2)
    first, second = link.parts
    objects = cache / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    (objects / first.digest).write_bytes((tmp / "store" / second.key).read_bytes())
    return first.digest


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
    c, history = published(tmp_path, 2)
    cache = tmp_path / "node-cache"
    plant_part(tmp_path, c, cache)
    node = chain.Chain(chain.LocalStorage(tmp_path / "store"), cache)
    weights = copy(history[1])
    errors: list[object] = []
    follower = chain.follow_weights(node, weights, at=1, interval=0, max_polls=1,
                                    max_failures=1, on_error=lambda e, n: errors.append(e))
    got = list(follower)
    assert [v.number for v in got] == [2] and not errors
    assert same(weights, history[2])


def test_move_evicts_a_planted_part(tmp_path: Path) -> None:
    c, history = published(tmp_path, 2)
    cache = tmp_path / "node-cache"
    plant_part(tmp_path, c, cache)
    node = chain.Chain(chain.LocalStorage(tmp_path / "store"), cache)
    weights = copy(history[1])
    assert chain.move_weights(node, weights, at=1, to=2).version.number == 2
    assert same(weights, history[2])
