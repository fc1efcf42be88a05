"""A hostile S3 store's answers, malformed or endless (SPEC §15): every one is an
``io-error`` naming the object, read no further than a small limit, and a follower that
meets one keeps its version and polls again."""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from chainkit import HostileS3, S3Server, http_answer
from signkit import signed_chain
from wdelta.chain.model.manifest import MANIFEST_PREFIX
from wdelta.chain.storage import s3 as s3_backend
from wdelta.chain.storage import s3http, stall
from wdelta.errors import WdeltaError

DATE = "2020-01-01T00:00:00.000Z"


@pytest.fixture
def hostile(s3: S3Server) -> Iterator[HostileS3]:
    store = HostileS3(s3.port)
    yield store
    store.close()


def _through(s3: S3Server, hostile: HostileS3, read_timeout: float = 10) -> s3_backend.S3Storage:
    """A bucket with ``obj`` and one manifest revision, read through ``hostile``."""
    bucket = s3.new_bucket()
    honest = s3_backend.S3Storage(bucket, "m", client=s3.client())
    honest.create("obj", b"hello")
    honest.create(f"{MANIFEST_PREFIX}rev-1", b"{}")
    client = s3.client(hostile.endpoint, read_timeout=read_timeout)
    return s3_backend.S3Storage(bucket, "m", client=client)


def _page(key: str = "m/manifests/rev-1", size: str = "2", date: str = DATE) -> bytes:
    return (
        "<ListBucketResult><Name>b</Name><Prefix>m/manifests/</Prefix><KeyCount>1</KeyCount>"
        "<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated><Contents>"
        f"<Key>{key}</Key><LastModified>{date}</LastModified><Size>{size}</Size>"
        "</Contents></ListBucketResult>"
    ).encode()


_HEAD = {"Content-Length": "5", "Last-Modified": "Wed, 01 Jan 2020 00:00:00 GMT"}
_GET = {"Last-Modified": _HEAD["Last-Modified"], "Content-Range": "bytes 0-1/5"}
# (the request answered: HEAD, GET or LIST; its crafted answer)
MALFORMED: dict[str, tuple[str, bytes]] = {
    "HEAD, bad Last-Modified": ("HEAD", http_answer(200, {**_HEAD, "Last-Modified": "soon"})),
    "HEAD, non-integer Content-Length": ("HEAD", http_answer(200, {"Content-Length": "5x"})),
    "HEAD, non-integer parts count": (
        "HEAD", http_answer(200, {**_HEAD, "x-amz-mp-parts-count": "many"}),
    ),
    "GET, bad Last-Modified": ("GET", http_answer(206, {**_GET, "Last-Modified": "soon"}, b"hi")),
    "GET, non-integer Content-Length": ("GET", http_answer(206, {"Content-Length": "x2"}, b"hi")),
    "listing, bad Size": ("LIST", http_answer(200, {}, _page(size="big"))),
    "listing, negative Size": ("LIST", http_answer(200, {}, _page(size="-2"))),
    "listing, bad date": ("LIST", http_answer(200, {}, _page(date="never"))),
    "listing, key outside the prefix": ("LIST", http_answer(200, {}, _page(key="../etc"))),
    "listing, not XML": ("LIST", http_answer(200, {}, b"<ListBucketResult><Contents>")),
}  # fmt: skip


def _kind(method: str, target: str) -> str:
    return "LIST" if "list-type" in target else method


def _call(st: s3_backend.S3Storage, kind: str) -> object:
    if kind == "HEAD":
        return st.stat("obj")
    return st.list(MANIFEST_PREFIX) if kind == "LIST" else st.read("obj", 100)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_answer_is_an_io_error_naming_the_object(
    s3: S3Server, hostile: HostileS3, case: str
) -> None:
    st = _through(s3, hostile)
    kind, answer = MALFORMED[case]
    hostile.play = lambda method, target: [answer] if _kind(method, target) == kind else None
    with pytest.raises(WdeltaError) as info:
        _call(st, kind)
    assert info.value.category == "io-error", info.value
    named = f"{st.url}manifests/" if kind == "LIST" else f"{st.url}obj"
    assert str(info.value).startswith(named), info.value


@pytest.mark.parametrize("write", ["put_file", "create"])
def test_a_refused_write_is_an_io_error_naming_the_object(
    tmp_path: Path, s3: S3Server, hostile: HostileS3, write: str
) -> None:
    st = _through(s3, hostile)
    refusal = http_answer(403, {}, b"<Error><Code>AccessDenied</Code></Error>")
    hostile.play = lambda method, target: [refusal] if method == "PUT" else None
    (tmp_path / "f").write_bytes(b"data")
    with pytest.raises(WdeltaError) as info:
        st.put_file("new", tmp_path / "f") if write == "put_file" else st.create("new", b"data")
    assert info.value.category == "io-error" and str(info.value).startswith(f"{st.url}new")


def test_an_error_body_that_stalls_past_the_socket_timeout_is_an_io_error(
    s3: S3Server, hostile: HostileS3
) -> None:
    # urllib3's ReadTimeoutError, raised where botocore reads an error body whole.
    st = _through(s3, hostile, read_timeout=0.5)

    def stalled() -> Iterator[bytes]:
        yield http_answer(500, {"Content-Length": "100"})
        time.sleep(3)  # no byte of the body: past the 0.5 s socket timeout

    hostile.play = lambda method, target: stalled() if method == "GET" else None
    with pytest.raises(WdeltaError) as info:
        st.read("obj", 100)
    assert info.value.category == "io-error" and str(info.value).startswith(f"{st.url}obj")


def _endless(status: int, start: bytes) -> Iterable[bytes]:
    """An answer of ``status`` whose body says it is 64 MiB long, and is."""
    yield http_answer(status, {"Content-Length": str(64 << 20)})
    yield start
    for _ in range(64):
        yield bytes(1 << 20)


@pytest.mark.parametrize("kind", ["error body", "listing page"])
def test_an_answer_read_whole_is_read_no_further_than_its_cap(
    s3: S3Server, hostile: HostileS3, kind: str
) -> None:
    st = _through(s3, hostile)
    listing = kind == "listing page"

    def play(method: str, target: str) -> Iterable[bytes] | None:
        if listing != ("list-type" in target) or method != "GET":
            return None
        return _endless(200, b"<ListBucketResult>") if listing else _endless(500, b"<Error>")

    hostile.play = play
    with pytest.raises(WdeltaError) as info:
        st.list(MANIFEST_PREFIX) if listing else st.read("obj", 100)
    assert info.value.category == "io-error" and "bytes allowed; refused" in str(info.value)
    # What went out: the cap, plus what the loopback socket's buffers held when cut.
    assert hostile.sent < s3http.MAX_BODY + (16 << 20) < 64 << 20


WDELTA = [sys.executable, "-m", "wdelta", "chain"]


def test_a_follower_keeps_its_version_past_malformed_listings_and_retries(
    tmp_path: Path, s3: S3Server, hostile: HostileS3
) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    bucket = s3.bucket_holding(s.store, "m")
    bad = [http_answer(200, {}, _page(size="big"))]
    listed = itertools.count()
    hostile.play = lambda m, t: bad if "list-type" in t and next(listed) < 2 else None
    env = {**os.environ, "AWS_ENDPOINT_URL": hostile.endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    r = subprocess.run(
        [*WDELTA, "pull", f"s3://{bucket}/m", str(s.node), "--trust", str(s.root), "--follow",
         "--interval", "0", "--max-iterations", "3", "--backoff-cap", "0.01"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env,
    )  # fmt: skip
    failed = [line for line in r.stderr.splitlines() if line.startswith("pull failed: ")]
    assert r.returncode == 0 and len(failed) == 2, r.stderr
    assert all(f"io-error: s3://{bucket}/m/manifests/" in line for line in failed), r.stderr
    assert "version 2" in r.stdout and s.node.read_bytes() == s.ckpts[2].read_bytes()


def _client_calls(module: object) -> set[str]:
    """The names of the methods called on ``self.client`` in ``module``'s source."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "self.client"
    }


def test_every_call_to_the_s3_client_is_audited() -> None:
    # Each of these sends its requests through s3http's bounded sender (time and bytes)
    # and is wrapped by S3Storage so that a failed or malformed answer is io-error; a new
    # call must be checked the same way and added to s3http's audit list.
    assert _client_calls(s3_backend) == set(s3http.AUDITED_CALLS)
    assert stall.GRACE > 0  # the budget the sender applies is the watchdog's
