"""One cache folder shared by many processes (a node's GPU workers, or hosts on a
shared file system): pulls, loads, prefetches and moves at the same time all
succeed, and each object is downloaded once."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import wdelta
from chainkit import FailingStorage, Wrapped
from wdelta import chain
from wdelta.chain import cachelock
from wdelta.chain.reading import cachegc
from wdelta.errors import StorageError

WORKER = Path(__file__).resolve().parent / "cache_worker.py"
ENV = {**os.environ, "PYTHONPATH": str(Path(wdelta.__file__).resolve().parent.parent)}


def publish(store: Path, versions: int = 4) -> list[dict[str, np.ndarray]]:
    """A chain whose objects are large enough (~1 MB) for downloads to overlap."""
    rng = np.random.default_rng(7)
    w = {f"layer{i}.weight": rng.standard_normal((256, 512)).astype(np.float32)
         for i in range(2)}  # fmt: skip
    pub = chain.Publisher(chain.Chain(chain.LocalStorage(store), store.parent / "pub-cache"))
    history = [w]
    pub.publish(w)
    for _ in range(versions - 1):
        w = {n: a + rng.standard_normal(a.shape).astype(np.float32) * (rng.random(a.shape) < 0.3)
             for n, a in w.items()}  # fmt: skip
        pub.publish(w)
        history.append(w)
    return history


def run_workers(store: Path, cache: Path, work: Path, count: int) -> list[str]:
    work.mkdir()
    args = [sys.executable, str(WORKER), str(store), str(cache), str(work)]
    procs = [
        subprocess.Popen([*args, str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=ENV)
        for i in range(count)
    ]  # fmt: skip
    (work / "go").touch()
    return [p.communicate(timeout=300)[0].strip() for p in procs]


def test_four_processes_share_one_cache(tmp_path: Path) -> None:
    """Four processes pull, load, prefetch and move into one (fresh) cache folder at
    once, two rounds: every one succeeds with the head's bytes."""
    store = tmp_path / "store"
    publish(store)
    for round_ in range(2):
        outs = run_workers(store, tmp_path / f"cache{round_}", tmp_path / f"work{round_}", 4)
        assert outs == ["ok"] * 4, outs


class Counting(Wrapped):
    """Counts the bytes read of every object but manifests."""

    def __init__(self, inner: chain.Storage) -> None:
        super().__init__(inner)
        self.got: dict[str, int] = {}
        self.lock = threading.Lock()

    def _count(self, key: str, n: int) -> None:
        if not key.startswith("manifests/"):
            with self.lock:
                self.got[key] = self.got.get(key, 0) + n

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self.inner.read_range(key, start, length)
        self._count(key, len(data))
        return data

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        for block in self.inner.stream(key, start):
            self._count(key, len(block))
            yield block


def test_workers_download_each_object_once(tmp_path: Path) -> None:
    """Four workers (threads, each its own Chain on one cache folder) prefetch the
    same move at once: every object is read from storage once, whole."""
    store = tmp_path / "store"
    publish(store)
    counting = Counting(chain.LocalStorage(store))
    m = chain.Chain(counting).head()
    go = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            go.wait()
            chain.prefetch(chain.Chain(counting, tmp_path / "cache"), at=0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert counting.got == {k.key: k.size for k in m.links}


def test_gc_keeps_a_partial_file_being_downloaded(tmp_path: Path) -> None:
    """``gc`` skips an entry whose lock another process holds (its download runs)."""
    cache = tmp_path / "cache"
    (cache / "partial").mkdir(parents=True)
    digest = "ab" * 32
    part = cache / "partial" / f"{digest}.part"
    part.write_bytes(b"x" * 10)
    cachelock.lock_path(cache, digest).parent.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR "
         "| os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
         "time.sleep(60)", str(cachelock.lock_path(cache, digest))],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert cachegc.gc(cache, None, 0).removed == [] and part.exists()
    finally:
        holder.kill()
        holder.wait()
    assert cachegc.gc(cache, None, 0).removed == [part]


def test_without_locks_each_process_downloads_to_a_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without locks (flock: ENOLCK, as an NFS mount with ``nolock``):
    downloads go to a fresh partial file per process, removed if the download fails,
    and the object is stored as usual; ``gc`` is not held up."""

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(cachelock.fcntl, "flock", no_locks)
    store = tmp_path / "store"
    history = publish(store, 2)
    link = chain.Chain(chain.LocalStorage(store)).head().links[0]
    cache = tmp_path / "cache"
    failing = FailingStorage(chain.LocalStorage(store), "deltas/", 1000)
    with pytest.raises(StorageError, match="injected"):
        chain.Chain(failing, cache).fetch(link.key, link.size, link.digest, "blake3")
    assert not any((cache / "partial").iterdir())  # no resuming without a lock
    weights = {n: a.copy() for n, a in history[0].items()}
    moved = chain.move_weights(chain.Chain(chain.LocalStorage(store), cache), weights, at=0)
    assert moved.version.number == 1 and (cache / "objects" / link.digest).is_file()
    assert not any((cache / "partial").iterdir())
    assert cachegc.gc(cache, None, 0).removed  # everything may go
