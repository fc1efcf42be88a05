"""DistributedPublisher in one process (a gloo group of one rank) and its helpers."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wdelta import chain
from wdelta import errors as wdelta_errors
from wdelta.chain.errors import ChainBrokenError
from wdelta.chain.live import distributed
from wdelta.errors import BadArgumentError, UnsupportedFeatureError

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def weights(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((40, 30)), rng.standard_normal(100)
    return {"a": a.astype(np.float32), "b": b.astype(np.float16), "c": np.ones(3, np.float32)}


def stepped(w: dict[str, Any], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {n: np.where(rng.random(a.shape) < 0.1, a + a.dtype.type(0.5), a) for n, a in w.items()}


def test_assign_by_bytes_balances_whole_tensors() -> None:
    sizes = {"big": 100, "m1": 60, "m2": 50, "s1": 10, "s2": 10, "s3": 5}
    out = distributed.assign_by_bytes(sizes, 2)
    assert sorted(n for r in out for n in r) == sorted(sizes)
    loads = [sum(sizes[n] for n in r) for r in out]
    assert loads == [120, 115]
    assert distributed.assign_by_bytes(sizes, 2) == out  # every rank computes the same
    assert distributed.assign_by_bytes({"x": 1}, 3) == [["x"], [], []]
    with pytest.raises(BadArgumentError):
        distributed.assign_by_bytes(sizes, 0)


def test_one_rank_writes_what_publisher_writes(group: None, tmp_path: Path) -> None:
    """A group of one publishes single-file links, byte for byte the Publisher's (MP-1)."""
    a = chain.Chain(chain.open_storage(str(tmp_path / "a")), cache=tmp_path / "ca")
    b = chain.Chain(chain.open_storage(str(tmp_path / "b")), cache=tmp_path / "cb")
    pub, ref = distributed.DistributedPublisher(a), chain.Publisher(b)
    w = weights(0)
    for k in range(3):
        ma, mb = pub.publish(w, step=k), ref.publish(w, step=k)
        assert ma.head.digest == mb.head.digest == chain.weights_digest(w)
        assert [x.digest for x in ma.links] == [x.digest for x in mb.links]
        assert not any(x.parts for x in ma.links)
        w = stepped(w, k + 1)
    futures = [pub.submit(w, step=3), pub.submit(stepped(w, 9), step=4)]
    assert [f.result().head.step for f in futures] == [3, 4]
    pub.close()
    with pytest.raises(BadArgumentError, match="chain exists"):
        distributed.DistributedPublisher(a).publish(w)


def test_needs_a_process_group_and_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    c = chain.Chain(chain.open_storage(str(tmp_path / "a")))
    with pytest.raises(BadArgumentError, match="process group"):
        distributed.DistributedPublisher(c)
    real = builtins.__import__

    def no_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("torch"):
            raise ImportError("No module named 'torch'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(UnsupportedFeatureError, match="needs torch"):
        distributed.DistributedPublisher(c)


def test_group_follow_reaches_the_head_or_stays(group: None, tmp_path: Path) -> None:
    from wdelta.chain.live.group_follow import follow_in_group

    c = chain.Chain(chain.open_storage(str(tmp_path / "a")), cache=tmp_path / "ca")
    pub, history = distributed.DistributedPublisher(c), [weights(0)]
    pub.publish(history[0], step=0)
    for k in (1, 2):
        history.append(stepped(history[-1], k))
        pub.publish(history[-1], step=k)
    live = {n: a.copy() for n, a in history[0].items()}
    got = list(follow_in_group(c, live, at=0, max_polls=2, interval=0))
    assert [v.number for v in got] == [2]  # one poll reached the head; the next had nothing new
    assert all(live[n].tobytes() == history[2][n].tobytes() for n in live)
    wrong = {n: a.copy() for n, a in history[0].items()}
    wrong["c"][0] = 5  # not version 0: the first link fails its digest check, nothing moves
    before = {n: a.tobytes() for n, a in wrong.items()}
    with pytest.raises(wdelta_errors.BaseMismatchError):
        list(follow_in_group(c, wrong, at=0, max_polls=1, interval=0))
    assert {n: a.tobytes() for n, a in wrong.items()} == before
    with pytest.raises(ChainBrokenError, match="no longer in the chain"):
        list(follow_in_group(c, live, at=7, max_polls=1, interval=0))


def test_nothing_to_publish(group: None, tmp_path: Path) -> None:
    c = chain.Chain(chain.open_storage(str(tmp_path / "a")), cache=tmp_path / "ca")
    pub = distributed.DistributedPublisher(c)
    with pytest.raises(BadArgumentError, match="no rank holds a tensor"):
        pub.publish({})
    assert not c.revisions()
    pub.publish(weights(0), step=0)
    with pytest.raises(BadArgumentError, match="no rank holds a tensor"):
        pub.publish({}, step=1)
    assert c.head().revision == 1
