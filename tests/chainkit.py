"""Helpers for the chain tests: training-like checkpoints, a loopback S3 server,
a TCP proxy that cuts or slows connections, a storage that fails on cue, and the ranks
of a process group as threads."""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import kit
from wdelta import chain
from wdelta.chain.live import collective
from wdelta.chain.storage.base import ObjectInfo, Progress, Storage
from wdelta.errors import StorageError, WdeltaError


class Trainer:
    """bf16 weights that change ~``density`` of their elements per step, plus a
    tensor that is added at some step and one whose dtype changes."""

    def __init__(self, rows: int = 256, cols: int = 1024, seed: int = 0, density: float = 0.02):
        self.rng = np.random.default_rng(seed)
        self.density = density
        self.w: dict[str, Any] = {
            f"layer{i}.weight": self.rng.standard_normal((rows, cols)).astype(ml_dtypes.bfloat16)
            for i in range(3)
        }
        self.w["norm.bias"] = np.zeros(cols, np.float32)
        self.w["step"] = np.array(0, np.int64)

    def step(self, n: int) -> None:
        for name in [k for k in self.w if k.startswith("layer")]:
            a = self.w[name].astype(np.float32)
            hit = self.rng.random(a.shape) < self.density
            a[hit] += self.rng.standard_normal(int(hit.sum())).astype(np.float32) * 0.05
            self.w[name] = a.astype(ml_dtypes.bfloat16)
        self.w["norm.bias"] = self.w["norm.bias"] + np.float32(1e-3)
        self.w["step"] = np.array(n, np.int64)
        if n == 5:
            self.w["extra.scale"] = np.full(16, n, np.float32)
        if n == 9:
            self.w["extra.scale"] = self.w["extra.scale"].astype(np.float16)

    def save(self, path: Path) -> Path:
        raw = {name: kit.as_raw(a) for name, a in self.w.items()}
        path.write_bytes(kit.safetensors_bytes(raw, {"format": "pt"}))
        return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's standalone S3 server on 127.0.0.1 (a real HTTP server in a thread)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request log lines
        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def client(self, endpoint: str | None = None, read_timeout: float = 10) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(retries={"max_attempts": 1, "mode": "standard"},
                          connect_timeout=5, read_timeout=read_timeout),
        )  # fmt: skip

    def new_bucket(self) -> str:
        name = f"chain-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def bucket_holding(self, folder: Path, prefix: str) -> str:
        """A new bucket holding every file below ``folder`` under ``prefix`` (a chain
        written locally, served from S3)."""
        bucket = self.new_bucket()
        client = self.client()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder)}")
        return bucket

    def stop(self) -> None:
        self.server.stop()


class Proxy:
    """A loopback TCP proxy to ``port``; ``cut_after`` closes every connection once
    that many response bytes went through it, ``delay`` slows each 16 KiB block of a
    response, ``rate`` caps each connection at that many bytes per second each way."""

    def __init__(
        self, port: int, cut_after: int | None = None, delay: float = 0.0,
        rate: float | None = None,
    ) -> None:  # fmt: skip
        self.upstream = port
        self.cut_after = cut_after
        self.delay = delay
        self.rate = rate
        self.sent = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, response: bool) -> None:
        start, moved = time.monotonic(), 0
        try:
            while block := src.recv(16384):
                if response and self.cut_after is not None and self.sent >= self.cut_after:
                    break
                if response:
                    self.sent += len(block)
                    time.sleep(self.delay)
                dst.sendall(block)
                moved += len(block)
                if self.rate is not None:  # sleep off what this connection is ahead by
                    time.sleep(max(0.0, moved / self.rate - (time.monotonic() - start)))
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def http_answer(status: int, headers: dict[str, str], body: bytes = b"") -> bytes:
    """The bytes of an HTTP/1.1 answer (``Content-Length`` added unless in ``headers``)."""
    head = {"Content-Length": str(len(body)), **headers, "Connection": "close"}
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in head.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def trickle(data: bytes, every: float) -> Iterator[bytes]:
    """``data`` one byte at a time, ``every`` seconds apart."""
    for i in range(len(data)):
        time.sleep(every)
        yield data[i : i + 1]


class HostileS3:
    """A loopback HTTP server playing an S3 store in front of moto (``upstream``): each
    request is forwarded and its answer relayed, unless ``play(method, target)`` returns
    the chunks of an answer of its own. Every connection carries one request and lasts at
    most ``seconds``; ``sent`` counts the bytes of the crafted answers that went out."""

    def __init__(self, upstream: int, seconds: float = 8.0) -> None:
        self.upstream, self.seconds, self.sent = upstream, seconds, 0
        self.play: Callable[[str, str], Iterable[bytes] | None] = lambda method, target: None
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self.seconds)
        end = time.monotonic() + self.seconds
        try:
            with conn, conn.makefile("rb") as rfile:
                method, target, _ = rfile.readline().decode().split(" ", 2)
                headers = dict(_header(line) for line in iter(rfile.readline, b"\r\n"))
                if headers.get("expect", "").lower() == "100-continue":
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = rfile.read(int(headers.get("content-length", 0)))
                crafted = self.play(method, target)
                if crafted is None:
                    conn.sendall(self._forward(method, target, headers, body))
                    return
                for chunk in crafted:
                    if time.monotonic() > end:
                        return
                    conn.sendall(chunk)
                    self.sent += len(chunk)
        except OSError:
            pass  # the client cut the answer off (or the connection outlived ``seconds``)

    def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> bytes:
        import http.client

        up = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=self.seconds)
        skip = {"expect", "connection", "content-length"}
        up.request(method, target, body, {k: v for k, v in headers.items() if k not in skip})
        r = up.getresponse()
        data = r.read()
        up.close()
        drop = {"connection", "transfer-encoding"} | ({"content-length"} if data else set())
        kept = {k: v for k, v in r.getheaders() if k.lower() not in drop}
        return http_answer(r.status, kept, data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _header(line: bytes) -> tuple[str, str]:
    name, _, value = line.decode("latin-1").partition(":")
    return name.strip().lower(), value.strip()


class Wrapped(Storage):
    """A storage that forwards every operation to ``inner``; subclasses override
    the ones they observe or break."""

    def __init__(self, inner: Storage) -> None:
        self.inner, self.url = inner, inner.url

    def stat(self, key: str) -> ObjectInfo | None:
        return self.inner.stat(key)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.read_range(key, start, length)

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        return self.inner.stream(key, start)

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        self.inner.put_file(key, path, progress)

    def create(self, key: str, data: bytes) -> bool:
        return self.inner.create(key, data)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


class FailingStorage(Wrapped):
    """Wraps a storage; the stream of a key matching ``key_part`` fails after
    ``fail_after`` bytes, once (a connection lost mid-download)."""

    def __init__(self, inner: Storage, key_part: str, fail_after: int) -> None:
        super().__init__(inner)
        self.key_part, self.fail_after = key_part, fail_after
        self.failed = False

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        sent = 0
        for block in self.inner.stream(key, start):
            if not self.failed and self.key_part in key and sent + len(block) > self.fail_after:
                self.failed = True
                yield block[: self.fail_after - sent]
                raise StorageError("injected: connection lost")
            sent += len(block)
            yield block


def folder_history(
    folder: Path, rows: int, cols: int, last: int = 3, snapshots: tuple[int, ...] = (3,)
) -> tuple[Path, list[Path]]:
    """A folder chain ``folder/store`` of versions 0..``last`` (revisions 1..last+1),
    with a snapshot at 0 and at each of ``snapshots``, and the checkpoints it was
    made from (``Trainer(rows, cols)`` steps)."""
    t = Trainer(rows=rows, cols=cols)
    ckpts = [t.save(folder / "ck0.safetensors")]
    c = chain.Chain(chain.LocalStorage(folder / "store"), folder / "writer-cache")
    chain.init(c, ckpts[0], step=0)
    for n in range(1, last + 1):
        t.step(n)
        ckpts.append(t.save(folder / f"ck{n}.safetensors"))
        chain.append(c, ckpts[n], ckpts[n - 1], step=n,
                     options=chain.AppendOptions(snapshot=n in snapshots))  # fmt: skip
    return folder / "store", ckpts


def race_appends(make_storage: Callable[[], Storage], paths: list[Path], base: Path) -> None:
    """Append ``paths`` from two threads at once, each with its own Chain; re-raise errors."""
    errors: list[BaseException] = []

    def writer(mine: list[Path]) -> None:
        c = chain.Chain(make_storage())
        try:
            for p in mine:
                chain.append(c, p, base)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(paths[i::2],)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


MANIFEST_KEY = "manifests/rev-000000000001.json"


def assert_create_only(st: Storage) -> None:
    """``create`` writes a manifest revision once; a second create of the key loses."""
    assert st.create(MANIFEST_KEY, b"one") is True
    assert st.create(MANIFEST_KEY, b"two") is False
    assert st.read(MANIFEST_KEY, 3) == b"one"
    assert [o.key for o in st.list("manifests/")] == [MANIFEST_KEY]


def assert_delete_then_not_found(st: Storage, key: str) -> None:
    """``delete`` is idempotent and a missing key reads as ``not-found``, never empty."""
    st.delete(key)
    st.delete(key)
    assert st.stat(key) is None
    for call in (lambda: st.read(key, 1), lambda: st.read_range("nope", 0, 1)):
        with pytest.raises(WdeltaError) as info:
            call()
        assert info.value.category == "not-found"


class ThreadRanks:
    """The ranks of one process group as threads of this process, for code that takes a
    ``collective.Group`` (no torch): ``group(rank)`` is rank ``rank``'s; pass it as
    ``group=`` with the module's ``Group`` replaced by ``ThreadRanks.adopt``."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list[Any] = [None] * world

    def group(self, rank: int) -> collective.Group:
        ranks = self

        class _Group(collective.Group):
            def __init__(self) -> None:  # no torch.distributed
                self.group, self.doing, self.undone = None, "publishing", "nothing done"
                self.rank, self.world = rank, ranks.world

            def gather(self, outcome: collective.Outcome) -> list[collective.Outcome]:
                return ranks._exchange(rank, outcome)

            def broadcast(self, outcome: collective.Outcome | None) -> Any:
                return ranks._exchange(rank, outcome)[0]

        return _Group()

    def _exchange(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = pickle.loads(pickle.dumps(value))  # what a process would receive
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got

    @staticmethod
    def adopt(group: collective.Group, doing: str, undone: str) -> collective.Group:
        group.doing, group.undone = doing, undone
        return group

    def run(self, work: Callable[[int], Any]) -> list[Any]:
        """``work(rank)`` on every rank at once; each rank's result or exception."""
        out: list[Any] = [None] * self.world

        def one(rank: int) -> None:
            try:
                out[rank] = work(rank)
            except BaseException as exc:
                out[rank] = exc

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return out
