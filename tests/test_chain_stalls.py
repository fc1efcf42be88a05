"""A hostile store that would hang a node rather than feed it bad bytes (SPEC §15): answers
that trickle, listings without end or in a loop. Each is cut off with an error naming the
store, and a node keeps its checkpoint."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chainkit import Proxy, S3Server
from signkit import signed_chain
from wdelta import chain
from wdelta.chain.manifest import MANIFEST_PREFIX
from wdelta.chain.storage import base, stall
from wdelta.chain.storage import s3 as s3_backend
from wdelta.errors import WdeltaError

SIZE = 2 << 20  # bytes of the object a trickling store serves



@pytest.fixture
def impatient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets a test can reach: 0.5 s of grace, then 1 MiB/s (the proxy gives ~50 KiB/s)."""
    monkeypatch.setattr(stall, "GRACE", 0.5)
    monkeypatch.setattr(stall, "MIN_RATE", 1 << 20)


def _trickling(s3: S3Server) -> tuple[s3_backend.S3Storage, Proxy]:
    bucket = s3.new_bucket()
    s3_backend.S3Storage(bucket, "m", client=s3.client()).create("obj", bytes(SIZE))
    proxy = Proxy(s3.port, delay=0.3)  # 16 KiB every 0.3 s: SIZE would take 40 s
    return s3_backend.S3Storage(bucket, "m", client=s3.client(proxy.endpoint)), proxy


@pytest.mark.parametrize("read", ["read", "read_range", "stream"])
def test_a_trickling_answer_is_cut_off(s3: S3Server, impatient: None, read: str) -> None:
    st, proxy = _trickling(s3)
    calls: dict[str, Any] = {
        "read": lambda: st.read("obj", SIZE),
        "read_range": lambda: st.read_range("obj", 0, SIZE),
        "stream": lambda: b"".join(st.stream("obj")),
    }
    try:
        with pytest.raises(WdeltaError) as info:
            calls[read]()
    finally:
        proxy.close()
    assert info.value.category == "io-error", info.value
    assert "s3://" in str(info.value) and "obj" in str(info.value)
    assert "stalled" in str(info.value)


def test_an_answer_at_a_fair_rate_is_not_cut(s3: S3Server, impatient: None) -> None:
    bucket = s3.new_bucket()
    s3_backend.S3Storage(bucket, "m", client=s3.client()).create("obj", bytes(range(256)) * 64)
    proxy = Proxy(s3.port, delay=0.0)
    try:
        st = s3_backend.S3Storage(bucket, "m", client=s3.client(proxy.endpoint))
        assert st.read("obj", 1 << 20) == bytes(range(256)) * 64
    finally:
        proxy.close()


def test_the_watchdog_budget_grows_with_the_bytes_received() -> None:
    w = stall.Watch("x", lambda: None)
    w.grace, w.rate = 10.0, 1000
    assert not w.late(9.0) and w.late(11.0)
    w.got(5000)  # 5 more seconds earned
    assert not w.late(14.0) and w.late(16.0)


class _Pages:
    """A paginator whose pages never end: ``repeat`` serves the same page each time."""

    def __init__(self, repeat: bool) -> None:
        self.repeat, self.pages = repeat, 0

    def paginate(self, **kw: Any) -> Iterator[dict[str, Any]]:
        for n in itertools.count():
            self.pages += 1
            first = 0 if self.repeat else n * 1000
            keys = [f"{kw['Prefix']}{i:012d}" for i in range(first, first + 1000)]
            yield {"Contents": [{"Key": k, "Size": 1} for k in keys]}


class _EndlessClient:
    def __init__(self, repeat: bool) -> None:
        self.paginator = _Pages(repeat)

    def get_paginator(self, name: str) -> _Pages:
        assert name == "list_objects_v2"
        return self.paginator


@pytest.mark.parametrize("repeat", [False, True], ids=["endless", "looping"])
def test_a_listing_without_end_is_refused(monkeypatch: pytest.MonkeyPatch, repeat: bool) -> None:
    monkeypatch.setattr(base, "MAX_LISTED", 20_000)
    client = _EndlessClient(repeat)
    st = s3_backend.S3Storage("b", "m", client=client)
    with pytest.raises(WdeltaError) as info:
        st.list(MANIFEST_PREFIX)
    words = "the listing went backwards" if repeat else "goes past 20,000 objects"
    assert words in str(info.value) and "s3://b/m/manifests/" in str(info.value)
    assert client.paginator.pages <= 21


def test_a_local_store_flooded_with_objects_is_refused_and_the_node_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    for n in range(40):
        (s.store / MANIFEST_PREFIX / f"planted-{n}").write_bytes(b"x")
    monkeypatch.setattr(base, "MAX_LISTED", 30)
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:
        s.pull()
    assert info.value.category == "limit-exceeded" and "goes past 30 objects" in str(info.value)
    assert s.node.read_bytes() == before
    monkeypatch.undo()
    assert chain.pull(s.node_chain(), s.node).version.number == 2
