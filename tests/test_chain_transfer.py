"""Large objects: S3 multipart uploads (loopback moto server) and concurrent ranged
downloads built on ``read_range`` (every backend), resumable and verified."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import blake3
import pytest

from chainkit import S3Server, Trainer
from wdelta import chain
from wdelta.chain.storage import LocalStorage
from wdelta.chain.storage.base import Storage
from wdelta.errors import StorageError, WdeltaError

MiB = 1 << 20


def _payload(size: int, seed: int = 0) -> bytes:
    return blake3.blake3(seed.to_bytes(8, "little")).digest(length=size)



def _s3_storage(s3: S3Server, transfer: chain.Transfer | None = None) -> Any:
    from wdelta.chain.storage.s3 import S3Storage

    return S3Storage(s3.new_bucket(), "runs/r1", client=s3.client(), transfer=transfer)


def _count_calls(client: Any, operation: str) -> list[int]:
    """Every request of ``operation`` the client sends, recorded before it is sent."""
    calls: list[int] = []
    client.meta.events.register(f"before-call.s3.{operation}", lambda **kw: calls.append(1))
    return calls


def test_large_upload_is_multipart_small_one_is_not(s3: S3Server, tmp_path: Path) -> None:
    """Above the threshold the object is uploaded in parts (the server's ETag counts
    them: ``-3``) and reads back byte for byte; below it, one PutObject."""
    st = _s3_storage(s3, chain.Transfer(threshold=5 * MiB, chunk=5 * MiB, concurrency=3))
    parts, puts = _count_calls(st.client, "UploadPart"), _count_calls(st.client, "PutObject")
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(_payload(12 * MiB + 123))
    small.write_bytes(_payload(MiB, 1))
    st.put_file("deltas/big.wdelta", big)
    assert len(parts) == 3 and not puts
    head = st.client.head_object(Bucket=st.bucket, Key=st._key("deltas/big.wdelta"))
    assert head["ETag"].strip('"').endswith("-3")
    assert b"".join(st.stream("deltas/big.wdelta")) == big.read_bytes()
    st.put_file("deltas/small.wdelta", small)
    assert len(parts) == 3 and len(puts) == 1
    assert st.read("deltas/small.wdelta", 2 * MiB) == small.read_bytes()


def test_a_failed_part_leaves_no_object(s3: S3Server, tmp_path: Path) -> None:
    """One part's request fails: io-error, nothing under the key, the multipart upload
    aborted (no parts left behind); the retried upload then succeeds."""
    from botocore.exceptions import EndpointConnectionError

    st = _s3_storage(s3, chain.Transfer(threshold=5 * MiB, chunk=5 * MiB, concurrency=2))
    src = tmp_path / "big"
    src.write_bytes(_payload(16 * MiB))
    seen: list[int] = []

    def fail_third(**kwargs: Any) -> None:
        seen.append(1)
        if len(seen) == 3:
            raise EndpointConnectionError(endpoint_url=s3.endpoint)

    st.client.meta.events.register("before-call.s3.UploadPart", fail_third)
    with pytest.raises(WdeltaError) as info:
        st.put_file("deltas/big.wdelta", src)
    assert info.value.category == "io-error"
    assert st.stat("deltas/big.wdelta") is None
    assert not st.client.list_multipart_uploads(Bucket=st.bucket).get("Uploads")
    st.put_file("deltas/big.wdelta", src)
    assert b"".join(st.stream("deltas/big.wdelta")) == src.read_bytes()


class _Watched:
    """Wraps ``storage.read_range``: counts requests and the most in flight at once;
    the first two requests wait for each other, which proves two run concurrently."""

    def __init__(self, storage: Storage, fail: dict[int, int] | None = None) -> None:
        self.storage, self.real = storage, storage.read_range
        self.fail = fail or {}  # start -> how many times that range fails (io-error)
        self.lock, self.barrier = threading.Lock(), threading.Barrier(2, timeout=20)
        self.calls: list[tuple[int, int]] = []
        self.inflight = self.peak = 0
        storage.read_range = self.read_range  # type: ignore[method-assign]

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with self.lock:
            self.calls.append((start, length))
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            first = len(self.calls) <= 2
            failing = self.fail.get(start, 0) > 0
            if failing:
                self.fail[start] -= 1
        try:
            if first:
                self.barrier.wait()
            if failing:
                raise StorageError(f"{key}: connection reset (injected)")
            return self.real(key, start, length)
        finally:
            with self.lock:
                self.inflight -= 1


def _stored(kind: str, s3: S3Server | None, tmp_path: Path, data: bytes) -> Storage:
    if kind == "s3":
        assert s3 is not None
        st: Storage = _s3_storage(s3)
    else:
        st = LocalStorage(tmp_path / "store")
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "object"
    src.write_bytes(data)
    st.put_file("deltas/x.wdelta", src)
    st.transfer = chain.Transfer(threshold=MiB, chunk=MiB + 7, concurrency=3)
    return st


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_concurrent_download_reproduces_every_byte(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    s3 = request.getfixturevalue("s3") if kind == "s3" else None
    data = _payload(10 * MiB + 5)
    st = _stored(kind, s3, tmp_path, data)
    watched = _Watched(st)
    node = chain.Chain(st, tmp_path / "cache")
    got: list[int] = []
    path = node.fetch("deltas/x.wdelta", len(data), blake3.blake3(data).hexdigest(), "blake3",
                      got.append)  # fmt: skip
    assert path.read_bytes() == data and sum(got) == len(data)
    assert sorted(watched.calls) == [
        (s, min(MiB + 7, len(data) - s)) for s in range(0, len(data), MiB + 7)
    ]
    assert 2 <= watched.peak <= 3
    assert not list((tmp_path / "cache" / "partial").iterdir())


def test_download_resumes_and_verifies(tmp_path: Path) -> None:
    """A range that keeps failing: io-error, the partial file is a correct prefix, nothing
    cached; the next fetch reads only the rest.  A wrong prefix is caught by the digest."""
    data = _payload(6 * MiB + 1)
    digest = blake3.blake3(data).hexdigest()
    st = _stored("local", None, tmp_path, data)
    step = MiB + 7
    watched = _Watched(st, fail={3 * step: 3})  # three attempts, three failures
    node = chain.Chain(st, tmp_path / "cache")
    with pytest.raises(WdeltaError) as info:
        node.fetch("deltas/x.wdelta", len(data), digest, "blake3")
    assert info.value.category == "io-error"
    part = tmp_path / "cache" / "partial" / f"{digest}.part"
    kept = part.read_bytes()
    assert len(kept) == 3 * step and data.startswith(kept) and not node.is_cached(digest)
    watched.calls.clear()
    watched.barrier = threading.Barrier(1)  # nothing to wait for any more
    assert node.fetch("deltas/x.wdelta", len(data), digest, "blake3").read_bytes() == data
    assert sum(n for _, n in watched.calls) == len(data) - len(kept)
    assert min(s for s, _ in watched.calls) == len(kept)

    flaky = _Watched(_stored("local", None, tmp_path / "b", data), fail={step: 2})
    flaky.barrier = threading.Barrier(1)
    other = chain.Chain(flaky.storage, tmp_path / "b-cache")
    assert other.fetch("deltas/x.wdelta", len(data), digest, "blake3").read_bytes() == data

    bad = tmp_path / "c-cache" / "partial" / f"{digest}.part"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\0" * MiB)  # not the object's first MiB
    third = chain.Chain(_stored("local", None, tmp_path / "c", data), tmp_path / "c-cache")
    # The kept bytes fail the digest: dropped, and the whole object fetched once more.
    assert third.fetch("deltas/x.wdelta", len(data), digest, "blake3").read_bytes() == data
    assert not bad.exists() and third.is_cached(digest)


def test_pull_over_s3_with_ranged_downloads(s3: S3Server, tmp_path: Path) -> None:
    """A node pulls a chain whose snapshot and deltas all go through concurrent ranged
    reads (a threshold below every file): the checkpoint is the trainer's, bit for bit."""
    from wdelta.chain.storage.s3 import S3Storage

    bucket = s3.new_bucket()
    small = chain.Transfer(threshold=1, chunk=64 << 10, concurrency=4)
    trainer = chain.Chain(S3Storage(bucket, "c", client=s3.client()), tmp_path / "t-cache")
    t = Trainer(rows=256, cols=512)
    ckpts = [t.save(tmp_path / "ck0.safetensors")]
    chain.init(trainer, ckpts[0])
    for n in (1, 2):
        t.step(n)
        ckpts.append(t.save(tmp_path / f"ck{n}.safetensors"))
        chain.append(trainer, ckpts[n], ckpts[n - 1])
    node_storage = S3Storage(bucket, "c", client=s3.client(), transfer=small)
    reads = _count_calls(node_storage.client, "GetObject")
    r = chain.pull(chain.Chain(node_storage, tmp_path / "n-cache"), tmp_path / "node.safetensors")
    assert r.version.number == 2
    assert (tmp_path / "node.safetensors").read_bytes() == ckpts[2].read_bytes()
    assert len(reads) > len(r.hops) + 2  # several ranges per file, not one stream each


def test_transfer_settings_are_checked() -> None:
    for bad in ({"threshold": 0}, {"chunk": -1}, {"concurrency": 1.5}, {"attempts": True}):
        with pytest.raises(WdeltaError) as info:
            chain.Transfer(**bad)  # type: ignore[arg-type]
        assert info.value.category == "bad-argument"
    pytest.importorskip("boto3")
    from wdelta.chain.storage.s3 import S3Storage

    with pytest.raises(WdeltaError) as info:
        S3Storage("b", client=object(), transfer={"threshold": 1})  # type: ignore[arg-type]
    assert info.value.category == "bad-argument"


def test_upload_reads_a_large_object_back_with_ranges(tmp_path: Path) -> None:
    """The read-back check of a large upload uses the concurrent ranged reads too; an
    object stored longer or different than the upload is refused (checksum-mismatch)."""
    data = _payload(5 * MiB + 3, 2)
    digest = blake3.blake3(data).hexdigest()
    src = tmp_path / "delta"
    src.write_bytes(data)
    st = LocalStorage(tmp_path / "store")
    st.transfer = chain.Transfer(threshold=MiB, chunk=MiB, concurrency=2)
    watched = _Watched(st)
    chain.Chain(st).upload("deltas/d.wdelta", src, digest, "blake3")
    assert sorted(watched.calls) == [(s, min(MiB, len(data) - s)) for s in range(0, len(data), MiB)]
    assert (tmp_path / "store" / "deltas" / "d.wdelta").read_bytes() == data

    class Lying(LocalStorage):
        longer = False

        def put_file(self, key: str, path: Path, progress: Any = None) -> None:
            super().put_file(key, path, progress)
            with open(self.root / key, "r+b") as f:
                f.seek(0, 2 if self.longer else 0)
                f.write(b"junk")

    for longer in (True, False):
        lying = Lying(tmp_path / f"lying-{longer}")
        lying.longer = longer
        lying.transfer = st.transfer
        with pytest.raises(WdeltaError) as info:
            chain.Chain(lying).upload("deltas/d.wdelta", src, digest, "blake3")
        assert info.value.category == "checksum-mismatch"


def test_transfer_bench_runs(s3: S3Server) -> None:
    """bench/transfer.py end to end on a tiny object (it checks every download byte for
    byte); its speeds are not judged here."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "bench" / "transfer.py"
    run = subprocess.run(
        [sys.executable, str(script), "--mib", "2", "--mbps", "200", "--chunk", "1",
         "--repeat", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| download")]
    assert len(rows) == 5 and "| upload | multipart, 8 in flight |" in run.stdout


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_planted_partial_is_replaced_not_written_through(tmp_path: Path, kind: str) -> None:
    """The concurrent download continues only a regular partial file of the node's own."""
    import os

    from wdelta.chain.storage.transfer import download_ranges

    data = _payload(3 * MiB + 1)
    st = _stored("local", None, tmp_path, data)
    part = tmp_path / "cache" / "x.part"
    part.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    if kind == "symlink":
        part.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(part)
    else:
        part.mkdir()
    download_ranges(st, "deltas/x.wdelta", part, len(data), transfer=st.transfer)
    assert part.read_bytes() == data and not part.is_symlink()
    assert victim.read_bytes() == b"keep me"
