"""One storage contract (SPEC.md §17.4), one test base, every backend: a local folder,
S3 (moto's server on loopback), the Hub (its in-memory stand-in) and an in-memory store.

Each backend runs the ``check-storage`` rules (ST-1 create-only under concurrent writers,
ST-2 read-after-write, ST-3 ranged reads) one by one, and the direct contract checks below;
deliberately broken in-memory backends show that the base catches what it tests."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chainkit import S3Server
from storekit import FakeHub
from wdelta.chain.errors import NotFoundError
from wdelta.chain.storage.base import STREAM_BLOCK, ObjectInfo, Progress, Storage, check_key
from wdelta.chain.storage.checkstore import RULES, check_storage
from wdelta.chain.storage.hf import HfStorage, parse_hf_url
from wdelta.chain.storage.local import LocalStorage
from wdelta.errors import BadArgumentError, LimitExceededError, TruncatedError, WdeltaError

Connect = Callable[[], Storage]


class MemoryStorage(Storage):
    """A sound in-memory store: a dict (``objects``, shared by the clients of one store)
    whose creates are atomic (one lock for every client)."""

    lock = threading.Lock()

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self.url = "memory://"
        self.objects = {} if objects is None else objects

    def stat(self, key: str) -> ObjectInfo | None:
        data = self.objects.get(check_key(key))
        return None if data is None else ObjectInfo(key, len(data))

    def _get(self, key: str) -> bytes:
        data = self.objects.get(check_key(key))
        if data is None:
            raise NotFoundError(f"{self.url}: no object {key}")
        return data

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self._get(key)[start : start + length]
        if len(data) != length:
            raise TruncatedError(f"{key}: {length} bytes at {start} run past its end")
        return data

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        data = self._get(key)
        for at in range(start, len(data), STREAM_BLOCK):
            yield data[at : at + STREAM_BLOCK]

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        self.objects[check_key(key)] = path.read_bytes()

    def create(self, key: str, data: bytes) -> bool:
        with self.lock:
            if check_key(key) in self.objects:
                return False
            self.objects[key] = bytes(data)
            return True

    def list(self, prefix: str) -> list[ObjectInfo]:
        keys = sorted(k for k in list(self.objects) if k.startswith(prefix))
        return [ObjectInfo(k, len(self.objects[k])) for k in keys]

    def delete(self, key: str) -> None:
        self.objects.pop(check_key(key), None)


class OverwritingCreate(MemoryStorage):
    """put_if_absent that overwrites: every create "wins"."""

    def create(self, key: str, data: bytes) -> bool:
        self.objects[check_key(key)] = bytes(data)
        return True


class EmptyWhenMissing(MemoryStorage):
    """A missing object reads as empty instead of not-found."""

    def _get(self, key: str) -> bytes:
        return self.objects.get(check_key(key), b"")


class LooseRanges(MemoryStorage):
    """A ranged read that returns what there is, short or not, past the end."""

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self._get(key)[start : start + length]


class Endless(MemoryStorage):
    """A store answering without end (``/dev/zero`` behind a key), whatever its stat says."""

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        self._get(key)
        while True:
            yield bytes(STREAM_BLOCK)


class PrefixAsFolder(MemoryStorage):
    """A listing that takes the prefix as a folder: ``a`` does not list ``ab/x``."""

    def list(self, prefix: str) -> list[ObjectInfo]:
        folder = prefix if not prefix or prefix.endswith("/") else f"{prefix}/"
        return super().list(folder)



def _local(tmp_path: Path) -> Connect:
    return lambda: LocalStorage(tmp_path / "store")


def _s3(request: pytest.FixtureRequest) -> Connect:
    from wdelta.chain.storage.s3 import S3Storage

    server: S3Server = request.getfixturevalue("s3")
    bucket = server.new_bucket()
    return lambda: S3Storage(bucket, "runs/contract", client=server.client())


def _hub() -> Connect:
    pytest.importorskip("huggingface_hub")
    url = "hf://me/model/chain"
    hub = FakeHub(parse_hf_url(url).fs_root)
    return lambda: HfStorage(url, api=hub, fs=hub)


def _memory() -> Connect:
    objects: dict[str, bytes] = {}
    return lambda: MemoryStorage(objects)


@pytest.fixture(params=["local", "s3", "hub", "memory"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Connect:
    """How to open a client of a fresh, empty store of each backend."""
    kind = request.param
    if kind == "local":
        return _local(tmp_path)
    if kind == "s3":
        return _s3(request)
    return _hub() if kind == "hub" else _memory()


# ------------------------------------------------------------------ the contract


def put(st: Storage, tmp_path: Path, key: str, data: bytes) -> None:
    path = tmp_path / f"upload-{uuid.uuid4().hex}"
    path.write_bytes(data)
    st.put_file(key, path)


def contract_create_only(st: Storage, tmp_path: Path) -> None:
    """put_if_absent: the first create wins, a second one is told the key exists and
    changes nothing; an upload's key cannot be created over either."""
    assert st.create("manifests/000000000001.json", b"first") is True
    assert st.create("manifests/000000000001.json", b"second") is False
    assert st.read("manifests/000000000001.json", 100) == b"first"
    put(st, tmp_path, "deltas/a.wdelta", b"uploaded")
    assert st.create("deltas/a.wdelta", b"over it") is False
    assert st.read("deltas/a.wdelta", 100) == b"uploaded"


def contract_bounded_read(st: Storage, tmp_path: Path) -> None:
    """A whole read is bounded by the caller's limit: exactly the limit is read, one byte
    more is limit-exceeded naming the key (RD-5)."""
    data = bytes(range(256)) * 40
    put(st, tmp_path, "signatures/d/k.json", data)
    assert st.read("signatures/d/k.json", len(data)) == data
    for limit in (len(data) - 1, 10, 0):
        with pytest.raises(LimitExceededError, match=r"signatures/d/k\.json"):
            st.read("signatures/d/k.json", limit)


def contract_ranged_read(st: Storage, tmp_path: Path) -> None:
    """A ranged read returns exactly the bytes asked; past the end it is truncated."""
    data = bytes(range(251)) * 100
    put(st, tmp_path, "deltas/r.wdelta", data)
    for start, length in ((0, 1), (7, 300), (len(data) - 5, 5), (len(data), 0), (0, len(data))):
        assert st.read_range("deltas/r.wdelta", start, length) == data[start : start + length]
    with pytest.raises(TruncatedError):
        st.read_range("deltas/r.wdelta", len(data) - 5, 6)
    assert b"".join(st.stream("deltas/r.wdelta", 1000)) == data[1000:]


def contract_list_by_prefix(st: Storage, tmp_path: Path) -> None:
    """list(prefix) gives every key starting with the prefix, sorted, with its size."""
    for key, size in (("a/2", 2), ("a/1", 1), ("ab/3", 3), ("b/1", 4), ("a/deep/x", 5)):
        assert st.create(key, bytes(size))
    assert st.list("a/") == [ObjectInfo("a/1", 1), ObjectInfo("a/2", 2), ObjectInfo("a/deep/x", 5)]
    assert [o.key for o in st.list("a")] == ["a/1", "a/2", "a/deep/x", "ab/3"]
    assert [o.key for o in st.list("")] == ["a/1", "a/2", "a/deep/x", "ab/3", "b/1"]
    assert st.list("zz/") == []


def contract_missing_is_not_found(st: Storage, tmp_path: Path) -> None:
    """A missing key is absent to stat and list and not-found to every read, never
    empty; delete is idempotent."""
    assert st.stat("deltas/missing") is None
    assert st.list("deltas/") == []
    reads: list[Callable[[], object]] = [
        lambda: st.read("deltas/missing", 10),
        lambda: st.read_range("deltas/missing", 0, 1),
        lambda: b"".join(st.stream("deltas/missing")),
    ]
    for read in reads:
        with pytest.raises(NotFoundError):
            read()
    assert st.create("deltas/gone", b"x")
    st.delete("deltas/gone")
    st.delete("deltas/gone")
    assert st.stat("deltas/gone") is None
    with pytest.raises(NotFoundError):
        st.read("deltas/gone", 10)


CONTRACT = [
    contract_create_only,
    contract_bounded_read,
    contract_ranged_read,
    contract_list_by_prefix,
    contract_missing_is_not_found,
]


@pytest.mark.parametrize("contract", CONTRACT, ids=lambda f: f.__name__.removeprefix("contract_"))
def test_contract(
    connect: Connect, contract: Callable[[Storage, Path], None], tmp_path: Path
) -> None:
    contract(connect(), tmp_path)


@pytest.mark.parametrize("rule", RULES)
def test_check_storage_rule(connect: Connect, rule: str) -> None:
    report = check_storage(connect, writers=4, rounds=2, rules=(rule,))
    assert [r.rule for r in report.results] == [rule]
    assert report.passed, report
    assert connect().list("") == []  # its prefix is cleaned up


# ------------------------------------------------------------------ broken backends


@pytest.mark.parametrize(
    ("store", "contract", "rule"),
    [
        (OverwritingCreate, contract_create_only, "ST-1"),
        (EmptyWhenMissing, contract_missing_is_not_found, "ST-2"),
        (LooseRanges, contract_ranged_read, "ST-3"),
        (Endless, contract_bounded_read, None),
        (PrefixAsFolder, contract_list_by_prefix, None),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_a_broken_backend_is_caught(
    store: type[MemoryStorage], contract: Callable[[Storage, Path], None], rule: str | None,
    tmp_path: Path,
) -> None:  # fmt: skip
    with pytest.raises((AssertionError, pytest.fail.Exception, WdeltaError)):
        contract(store(), tmp_path)  # an assertion, a missing raise, or an error
    for sound in CONTRACT:  # the others hold: each contract names what broke
        if sound is not contract and store is not Endless:  # endless: every read is
            (tmp_path / sound.__name__).mkdir()
            sound(store(), tmp_path / sound.__name__)
    if rule is not None:
        objects: dict[str, bytes] = {}
        report = check_storage(lambda: store(objects), writers=4, rounds=2)
        assert {r.rule: r.passed for r in report.results} == {r: r != rule for r in RULES}


def test_an_unknown_rule_is_a_bad_argument() -> None:
    with pytest.raises(BadArgumentError):
        check_storage(MemoryStorage, rules=("ST-9",))
