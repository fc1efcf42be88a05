"""A distributed publish that fails after rank 0 created the revision says so: the
error carries ``published_revision`` (a gloo group of one rank, in this process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wdelta import chain
from wdelta.chain.errors import ConflictError
from wdelta.chain.live import distributed
from wdelta.errors import StorageError

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def weights(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((40, 30)).astype(np.float32), "c": np.ones(3, np.float32)}


def test_a_failure_after_the_commit_names_the_revision(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = chain.Chain(chain.open_storage(str(tmp_path / "store")), cache=tmp_path / "cache")
    pub = distributed.DistributedPublisher(c)
    pub.publish(weights(0))

    def fails(*args: Any, **kwargs: Any) -> None:
        raise StorageError("injected: the previous copy cannot be brought forward")

    monkeypatch.setattr(pub._local, "_advance", fails)
    with pytest.raises(StorageError) as info:
        pub.publish(weights(1))
    head = c.head()
    assert head.head.number == 1 and info.value.published_revision == head.revision
    assert f"revision {head.revision} was created first: version 1 is published" in str(info.value)


def test_a_failed_commit_publishes_nothing(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = chain.Chain(chain.open_storage(str(tmp_path / "store")), cache=tmp_path / "cache")
    pub = distributed.DistributedPublisher(c)
    pub.publish(weights(0))

    def lost(*args: Any) -> bytes:
        raise ConflictError("injected: lost the race")

    monkeypatch.setattr(pub, "_commit", lost)
    with pytest.raises(ConflictError) as info:
        pub.publish(weights(1))
    assert info.value.published_revision is None and c.head().head.number == 0
