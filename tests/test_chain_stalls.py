"""A hostile store that would hang a node rather than feed it bad bytes (SPEC §15): answers
that trickle (in every phase: headers, bodies, listing pages, error bodies), listings without
end or in a loop. Each is cut off with an error naming the store, and a node keeps its
checkpoint."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chainkit import HostileS3, Proxy, S3Server, http_answer, trickle
from signkit import signed_chain
from wdelta import chain
from wdelta.chain.model.manifest import MANIFEST_PREFIX
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


def test_an_upload_at_a_fair_rate_is_not_cut(
    s3: S3Server, impatient: None, tmp_path: Path
) -> None:
    # 2 MiB at 2 MiB/s takes 1 s, past the 0.5 s grace: the bytes sent earn their time.
    bucket = s3.new_bucket()
    proxy = Proxy(s3.port, rate=2 << 20)
    (tmp_path / "f").write_bytes(bytes(SIZE))
    try:
        st = s3_backend.S3Storage(bucket, "m", client=s3.client(proxy.endpoint))
        st.put_file("obj", tmp_path / "f")
    finally:
        proxy.close()
    assert s3_backend.S3Storage(bucket, "m", client=s3.client()).stat("obj") == base.ObjectInfo(
        "obj", SIZE
    )


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


@pytest.fixture
def hostile(s3: S3Server) -> Iterator[HostileS3]:
    store = HostileS3(s3.port)
    yield store
    store.close()


def _through(s3: S3Server, hostile: HostileS3) -> s3_backend.S3Storage:
    """A bucket with ``obj`` and one manifest revision, read through ``hostile``."""
    bucket = s3.new_bucket()
    honest = s3_backend.S3Storage(bucket, "m", client=s3.client())
    honest.create("obj", b"hello")
    honest.create(f"{MANIFEST_PREFIX}rev-1", b"{}")
    return s3_backend.S3Storage(bucket, "m", client=s3.client(hostile.endpoint))


_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"x-amz-meta-a: b\r\n" * 200  # a byte every 0.05 s: 25 s


def _trickled(phase: str, method: str, target: str) -> Iterable[bytes] | None:
    """An answer trickled in ``phase``, to the request of that phase (None: honest)."""
    listing = "list-type" in target
    if phase == "HEAD headers" and method == "HEAD":
        return trickle(_HEADERS, 0.05)
    if phase == "GET headers" and method == "GET" and not listing:
        return trickle(_HEADERS, 0.05)
    if phase == "listing page" and listing:
        head = http_answer(200, {"Content-Length": "100000"})
        return itertools.chain([head], trickle(b"<ListBucketResult>" + b" " * 1000, 0.05))
    if phase == "error body" and method == "GET" and not listing:
        head = http_answer(500, {"Content-Length": "100000"})
        return itertools.chain([head], trickle(b"<Error>" + b" " * 1000, 0.05))
    return None


@pytest.mark.parametrize("phase", ["HEAD headers", "GET headers", "listing page", "error body"])
def test_every_phase_of_an_answer_is_cut_off(
    s3: S3Server, hostile: HostileS3, impatient: None, phase: str
) -> None:
    st = _through(s3, hostile)
    hostile.play = lambda method, target: _trickled(phase, method, target)
    calls: dict[str, Any] = {
        "HEAD headers": lambda: st.stat("obj"),
        "GET headers": lambda: st.read("obj", 100),
        "listing page": lambda: st.list(MANIFEST_PREFIX),
        "error body": lambda: st.read_range("obj", 0, 5),
    }
    start = time.monotonic()
    with pytest.raises(WdeltaError) as info:
        calls[phase]()
    assert time.monotonic() - start < 5  # the trickle would last 25 s; the budget is 0.5 s
    assert info.value.category == "io-error", info.value
    assert "stalled" in str(info.value) and "s3://" in str(info.value)
    assert ("manifests/" if phase == "listing page" else "obj") in str(info.value)


def _empty_pages(counter: list[int]) -> Iterable[bytes]:
    """An empty listing page that says more follow, under a continuation token never seen."""
    counter[0] += 1
    page = (
        "<ListBucketResult><Name>b</Name><Prefix>m/manifests/</Prefix><KeyCount>0</KeyCount>"
        "<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
        f"<NextContinuationToken>t{counter[0]}</NextContinuationToken></ListBucketResult>"
    )
    return [http_answer(200, {}, page.encode())]


@pytest.mark.parametrize("cap", ["pages", "seconds"])
def test_a_listing_of_empty_pages_without_end_is_refused(
    s3: S3Server, hostile: HostileS3, monkeypatch: pytest.MonkeyPatch, cap: str
) -> None:
    st = _through(s3, hostile)
    if cap == "pages":
        monkeypatch.setattr(s3_backend, "MAX_PAGES", 30)
    else:
        monkeypatch.setattr(s3_backend, "LIST_SECONDS", 0.5)
    served = [0]
    hostile.play = lambda method, target: _empty_pages(served) if "list-type" in target else None
    with pytest.raises(WdeltaError) as info:
        st.list(MANIFEST_PREFIX)
    assert info.value.category == "limit-exceeded", info.value
    assert "pages without end" in str(info.value) and "/m/manifests/" in str(info.value)
    assert ("past 30 pages" if cap == "pages" else "past 0.5 s") in str(info.value)
    assert served[0] == 30 if cap == "pages" else served[0] < 2000


def test_a_node_keeps_its_version_past_an_endless_listing(
    tmp_path: Path, s3: S3Server, hostile: HostileS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    bucket = s3.bucket_holding(s.store, "m")
    st = s3_backend.S3Storage(bucket, "m", client=s3.client(hostile.endpoint))
    monkeypatch.setattr(s3_backend, "MAX_PAGES", 20)
    served = [0]
    hostile.play = lambda method, target: _empty_pages(served) if "list-type" in target else None
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:
        chain.pull(chain.Chain(st, tmp_path / "mc", trust=s.root), s.node)
    assert info.value.category == "limit-exceeded" and s.node.read_bytes() == before
    hostile.play = lambda method, target: None
    assert chain.pull(chain.Chain(st, tmp_path / "mc", trust=s.root), s.node).version.number == 2


class _TlsTrickler:
    """A loopback server that answers a TLS handshake with the header of a 16 KiB record
    whose bytes then come one every 0.05 s (for at most 8 s)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.endpoint = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.recv(4096)  # the ClientHello
                for chunk in itertools.chain([b"\x16\x03\x03\x40\x00"], trickle(bytes(160), 0.05)):
                    conn.sendall(chunk)

    def close(self) -> None:
        self.sock.close()


def test_a_trickled_tls_handshake_is_cut_off(impatient: None) -> None:
    import boto3
    from botocore.config import Config

    server = _TlsTrickler()
    client = boto3.client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1", verify=False,
        aws_access_key_id="testing", aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=10),
    )  # fmt: skip
    st = s3_backend.S3Storage("b", "m", client=client)
    start = time.monotonic()
    try:
        with pytest.raises(WdeltaError) as info:
            st.stat("obj")
    finally:
        server.close()
    assert time.monotonic() - start < 4  # the handshake would trickle for 8 s
    assert info.value.category == "io-error" and "stalled" in str(info.value)
    assert str(info.value).startswith("s3://b/m/obj")
