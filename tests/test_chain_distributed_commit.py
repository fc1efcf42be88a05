"""A distributed publish that fails says what happened to the version and to the
rank's previous copy (a gloo group of one rank, in this process): a failure after
rank 0 created the revision carries ``published_revision``; a failure before it
takes the copy back, which the diff had brought forward, so the next step
publishes the right weights; a diff cut short drops the copy, and the next step
says to resume with ``previous=``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wdelta import chain
from wdelta.chain.errors import ConflictError
from wdelta.chain.live import distributed
from wdelta.chain.live import weights as live_weights
from wdelta.errors import BadArgumentError, StorageError
from wdelta.policy import chunk as chunk_policy

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def weights(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    # "big" is one chunk above 64 KiB: the compiled change pass brings it forward itself.
    big = rng.standard_normal((256, 256)).astype(np.float32)
    return {"a": rng.standard_normal((40, 30)).astype(np.float32), "big": big,
            "c": np.ones(3, np.float32)}  # fmt: skip


def stepped(w: dict[str, Any], seed: int) -> dict[str, Any]:
    """About 2% of the elements changed (below the change pass's give-up density)."""
    rng = np.random.default_rng(seed)
    return {n: np.where(rng.random(a.shape) < 0.02, a + np.float32(0.5), a) for n, a in w.items()}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.asarray(a[n]).tobytes() == b[n].tobytes() for n in a)


def new_chain(tmp_path: Path, name: str = "store") -> chain.Chain:
    return chain.Chain(chain.open_storage(str(tmp_path / name)), cache=tmp_path / f"{name}-c")


def started(tmp_path: Path) -> tuple[chain.Chain, distributed.DistributedPublisher, dict[str, Any]]:
    """A chain, its publisher (a group of one rank) and the weights of version 0."""
    c = new_chain(tmp_path)
    pub = distributed.DistributedPublisher(c)
    w0 = weights(0)
    pub.publish(w0, step=0)
    return c, pub, w0


def test_a_failure_after_the_commit_names_the_revision(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, pub, _ = started(tmp_path)

    def fails(*args: Any, **kwargs: Any) -> None:
        raise StorageError("injected: the previous copy cannot be brought forward")

    monkeypatch.setattr(pub._local, "_advance", fails)
    with pytest.raises(StorageError) as info:
        pub.publish(stepped(weights(0), 1))
    head = c.head()
    assert head.head.number == 1 and info.value.published_revision == head.revision
    assert f"revision {head.revision} was created first: version 1 is published" in str(info.value)
    # The copy could not take the version's digests: dropped, and the next step says so.
    assert pub._local._previous is None
    with pytest.raises(BadArgumentError, match="previous="):
        pub.publish(stepped(weights(0), 2))


Inject = Callable[[distributed.DistributedPublisher, pytest.MonkeyPatch], None]


def _fail_at_agreement(which: int) -> Inject:
    """The group's ``which``-th agreement of a step (1: after encoding, 2: after
    uploading) reports another rank's failure, as a two-rank group would."""

    def inject(pub: distributed.DistributedPublisher, m: pytest.MonkeyPatch) -> None:
        agree, calls = pub.group.agree, []

        def failing(outcome: Any) -> list[Any]:
            got = agree(outcome)
            calls.append(outcome)
            if len(calls) == which:
                raise StorageError("rank 1 failed, nothing published: injected")
            return got

        m.setattr(pub.group, "agree", failing)

    return inject


def _fail(name: str, error: Exception) -> Inject:
    def inject(pub: distributed.DistributedPublisher, m: pytest.MonkeyPatch) -> None:
        def raises(*args: Any, **kwargs: Any) -> Any:
            raise error

        m.setattr(pub, name, raises)

    return inject


FAILURES = {
    "another rank's diff": _fail_at_agreement(1),
    "this rank's upload": _fail("_upload_part", StorageError("injected: upload failed")),
    "another rank's upload": _fail_at_agreement(2),
    "the commit": _fail("_commit", ConflictError("injected: lost the race")),
}


@pytest.mark.parametrize("native_path", ["1", "0"])
@pytest.mark.parametrize("failure", FAILURES)
def test_a_failure_before_the_commit_takes_the_copy_back(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, native_path: str
) -> None:
    monkeypatch.setenv("WDELTA_NATIVE", native_path)
    c, pub, w0 = started(tmp_path)
    w1 = stepped(w0, 1)
    with monkeypatch.context() as m:
        FAILURES[failure](pub, m)
        with pytest.raises((StorageError, ConflictError)) as info:
            pub.publish(w1, step=1)
    assert info.value.published_revision is None and c.head().head.number == 0
    assert pub._local._previous is not None and same(pub._local._previous, w0)
    assert pub.publish(w1, step=1).head.digest == chain.weights_digest(w1)
    assert same(pub._local._previous, w1)
    loaded, version = chain.load(new_chain(tmp_path))  # the link replays to w1, bit for bit
    assert version.number == 1 and same(loaded, w1)


def test_the_diff_brings_the_copy_forward(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No delta is applied to the copy after the commit, unless the step adds a tensor."""
    _, pub, w = started(tmp_path)
    applied: list[str] = []
    real = live_weights.apply_unchecked

    def counted(*args: Any, **kwargs: Any) -> None:
        applied.append("apply")
        real(*args, **kwargs)

    monkeypatch.setattr(live_weights, "apply_unchecked", counted)
    for k in (1, 2):
        w = stepped(w, k)
        pub.publish(w)
        assert same(pub._local._previous, w) and not applied
    w = {**stepped(w, 3), "d": np.arange(5, dtype=np.float32)}
    pub.publish(w)
    assert same(pub._local._previous, w) and applied == ["apply"]
    loaded, version = chain.load(new_chain(tmp_path))
    assert version.number == 3 and same(loaded, w)


def test_a_diff_cut_short_drops_the_copy(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, pub, w0 = started(tmp_path)
    encode_modified = chunk_policy.encode_modified

    def encoded_then_failed(*args: Any) -> Any:
        encode_modified(*args)  # the chunk's part of the copy brought forward, then a failure
        raise StorageError("injected: the disk is full")

    with monkeypatch.context() as m:
        m.setattr(chunk_policy, "encode_modified", encoded_then_failed)
        with pytest.raises(StorageError, match="disk is full"):
            pub.publish(stepped(w0, 1))
    assert pub._local._previous is None and c.head().head.number == 0
    with pytest.raises(BadArgumentError, match=r"rank 0 has no previous copy.*previous="):
        pub.publish(stepped(w0, 1))
    assert c.head().head.number == 0
    resumed = distributed.DistributedPublisher(c, previous=w0)
    w1 = stepped(w0, 1)
    assert resumed.publish(w1).head.digest == chain.weights_digest(w1)
    loaded, _ = chain.load(new_chain(tmp_path))
    assert same(loaded, w1)
