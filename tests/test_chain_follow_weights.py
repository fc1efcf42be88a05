"""``follow_weights`` on a node: failures logged or reported and raised after
``max_failures`` in a row, recovery of weights that are no version of the chain
(``recover=True``), and a cache bounded by ``max_cache_bytes``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wdelta import chain
from wdelta.chain.reading import cachegc
from wdelta.errors import WdeltaError

Weights = dict[str, np.ndarray[Any, Any]]


def state(seed: int) -> Weights:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((96, 64)).astype(np.float32),
        "layers.0.mlp.weight": rng.integers(0, 1 << 16, (64, 32), dtype=np.uint16),
        "layers.1.mlp.weight": rng.integers(0, 1 << 16, (64, 32), dtype=np.uint16),
        "norm.weight": np.ones(64, np.float32),
    }


def step(w: Weights, seed: int) -> Weights:
    rng = np.random.default_rng(seed)
    out = {n: a.copy() for n, a in w.items()}
    for a in out.values():
        flat = a.reshape(-1)
        hit = rng.random(flat.size) < 0.1
        flat[hit] = flat[::-1][hit]
    out["norm.weight"] += np.float32(seed)
    return out


def same(a: Weights, b: Weights) -> bool:
    return a.keys() == b.keys() and all(a[n].tobytes() == b[n].tobytes() for n in a)


def copy(w: Weights) -> Weights:
    return {n: a.copy() for n, a in w.items()}


def node(tmp: Path, name: str = "node") -> chain.Chain:
    return chain.Chain(chain.LocalStorage(tmp / "store"), tmp / f"{name}-cache")


def publisher(tmp: Path, steps: int) -> tuple[chain.Publisher, list[Weights]]:
    pub = chain.Publisher(chain.Chain(chain.LocalStorage(tmp / "store"), tmp / "pub-cache"))
    published = [state(0)]
    pub.publish(published[0])
    for k in range(1, steps + 1):
        published.append(step(published[-1], k))
        pub.publish(published[-1])
    return pub, published


def corrupt(tmp: Path, link: chain.Link) -> bytes:
    path = tmp / "store" / link.key
    good = path.read_bytes()
    bad = bytearray(good)
    bad[-5] ^= 1
    path.write_bytes(bytes(bad))
    return good


def test_failures_are_logged_then_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without ``on_error`` every failed poll is a warning on ``wdelta.chain`` naming the
    category and the count; the third in a row is raised; the weights never move."""
    pub, published = publisher(tmp_path, 1)
    corrupt(tmp_path, pub.chain.head().links[0])
    weights = copy(published[0])
    caplog.set_level(logging.WARNING, logger="wdelta.chain")
    follower = chain.follow_weights(node(tmp_path), weights, interval=0, backoff=(0, 0),
                                    max_failures=3)  # fmt: skip
    with pytest.raises(WdeltaError) as info:
        list(follower)  # max_polls None: only the failures stop it
    assert info.value.category == "checksum-mismatch"
    lines = [r.getMessage() for r in caplog.records if r.name == "wdelta.chain"]
    assert len(lines) == 3 and all("checksum-mismatch" in line for line in lines)
    assert "(3 in a row)" in lines[-1]
    assert same(weights, published[0])


def test_on_error_replaces_the_log_and_a_success_resets_the_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``on_error`` nothing is logged; failures count in a row only: one failure,
    a success, one failure never reaches ``max_failures=2``."""
    pub, published = publisher(tmp_path, 1)
    good = corrupt(tmp_path, pub.chain.head().links[0])
    seen: list[tuple[str, int]] = []

    def report(exc: WdeltaError, failures: int) -> None:
        seen.append((exc.category, failures))
        (tmp_path / "store" / pub.chain.head().links[-1].key).write_bytes(good)

    weights = copy(published[0])
    caplog.set_level(logging.WARNING, logger="wdelta.chain")
    follower = chain.follow_weights(node(tmp_path), weights, interval=0, backoff=(0, 0),
                                    max_failures=2, max_polls=4, on_error=report)  # fmt: skip
    assert next(follower).number == 1
    published.append(step(published[-1], 2))
    pub.publish(published[-1])
    good = corrupt(tmp_path, pub.chain.head().links[-1])
    assert [v.number for v in follower] == [2]
    assert seen == [("checksum-mismatch", 1), ("checksum-mismatch", 1)]
    assert same(weights, published[2]) and not caplog.records


def test_follow_weights_refuses_bad_settings(tmp_path: Path) -> None:
    publisher(tmp_path, 0)
    weights = state(0)
    for bad in ({"max_failures": 0}, {"max_failures": 1.5}, {"max_failures": True},
                {"max_cache_bytes": -1}, {"max_cache_bytes": "1G"}):  # fmt: skip
        with pytest.raises(WdeltaError) as info:
            next(chain.follow_weights(node(tmp_path), weights, max_polls=1, **bad))
        assert info.value.category == "bad-argument", bad


def test_a_bad_argument_is_raised_at_once(tmp_path: Path) -> None:
    """A read-only tensor cannot be updated by any retry: raised on the first poll,
    not reported, whatever ``max_failures``."""
    _, published = publisher(tmp_path, 1)
    weights = copy(published[0])
    weights["norm.weight"].flags.writeable = False
    seen: list[str] = []
    follower = chain.follow_weights(
        node(tmp_path), weights, interval=0, backoff=(0, 0), max_failures=10,
        on_error=lambda e, n: seen.append(e.category),
    )  # fmt: skip
    with pytest.raises(WdeltaError) as info:
        list(follower)
    assert info.value.category == "bad-argument" and seen == []
    assert same(weights, published[0])


def test_recover_loads_the_head_into_weights_of_no_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Weights that are no version: refused (not-found) unless ``recover``, which loads
    the head in place: the same arrays, bit-identical to the head."""
    _, published = publisher(tmp_path, 2)
    stray = copy(published[1])
    stray["embed.weight"][0, 0] += 1
    with pytest.raises(WdeltaError) as info:
        next(chain.follow_weights(node(tmp_path), stray, interval=0, max_polls=1))
    assert info.value.category == "not-found"
    ids = {n: id(a) for n, a in stray.items()}
    caplog.set_level(logging.WARNING, logger="wdelta.chain")
    got = list(chain.follow_weights(node(tmp_path), stray, interval=0, max_polls=1,
                                    recover=True))  # fmt: skip
    assert [v.number for v in got] == [2]
    assert same(stray, published[2]) and {n: id(a) for n, a in stray.items()} == ids
    assert any("recovering" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("pattern", [None, "layers.0.*"])
def test_recover_after_the_weights_were_written_behind_the_follower(
    tmp_path: Path, pattern: str | None
) -> None:
    """A node at version 1 whose weights were changed in place: the next link refuses them
    (base-mismatch, weights untouched); without ``recover`` every poll fails and the
    follower raises, with ``recover`` the next poll reloads the head."""
    pub, published = publisher(tmp_path, 1)
    weights, v1 = chain.load(node(tmp_path, "load"), tensors=pattern)
    name = "layers.0.mlp.weight"
    weights[name].reshape(-1)[3] ^= 0x5A5A
    drifted = copy(weights)
    published.append(step(published[-1], 2))
    pub.publish(published[-1])
    seen: list[str] = []
    plain = chain.follow_weights(node(tmp_path), weights, at=v1.number, tensors=pattern,
                                 interval=0, backoff=(0, 0), max_failures=2,
                                 on_error=lambda e, n: seen.append(e.category))  # fmt: skip
    with pytest.raises(WdeltaError) as info:
        list(plain)
    assert info.value.category == "base-mismatch" and seen == ["base-mismatch"] * 2
    assert same(weights, drifted)
    seen.clear()
    got = chain.follow_weights(node(tmp_path), weights, at=v1.number, tensors=pattern,
                               interval=0, backoff=(0, 0), max_polls=2, recover=True,
                               on_error=lambda e, n: seen.append(e.category))  # fmt: skip
    assert [v.number for v in got] == [2] and seen == ["base-mismatch"]
    assert same(weights, {n: published[2][n] for n in weights})


def test_cache_is_bounded_oldest_first(tmp_path: Path) -> None:
    """With ``max_cache_bytes`` the node's cache never holds more after a poll, and what
    it evicts is the least recently used (the newest link stays); without it every
    link stays."""
    pub, published = publisher(tmp_path, 0)
    weights = copy(published[0])
    unbounded = copy(published[0])
    sizes: list[int] = []
    for k in range(1, 5):
        published.append(step(published[-1], k))
        link = pub.publish(published[-1]).links[-1]
        bound = link.size + 100
        got = chain.follow_weights(node(tmp_path), weights, at=k - 1, interval=0, max_polls=1,
                                   max_cache_bytes=bound)  # fmt: skip
        assert [v.number for v in got] == [k]
        kept = cachegc.entries(tmp_path / "node-cache")
        sizes.append(sum(e.size for e in kept))
        assert sizes[-1] <= bound and [e.digest for e in kept] == [link.digest]
        list(chain.follow_weights(node(tmp_path, "free"), unbounded, at=k - 1, interval=0,
                                  max_polls=1))  # fmt: skip
    assert same(weights, published[4]) and same(unbounded, published[4])
    assert len(cachegc.entries(tmp_path / "free-cache")) == 4
