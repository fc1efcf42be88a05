"""The chain over a real S3 server process on loopback (moto's standalone server):
backend semantics, ranged reads, racing writers, a cut connection, and the
fleet scenario (a 20-step chain, nodes killed, partial, squash, prune)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import wdelta
from chainkit import (
    MANIFEST_KEY,
    Proxy,
    S3Server,
    Trainer,
    assert_create_only,
    assert_delete_then_not_found,
    free_port,
    race_appends,
)
from wdelta import chain
from wdelta.chain.reading.local import digest_of_path
from wdelta.errors import WdeltaError

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from wdelta.chain.storage.s3 import S3Storage


def storage(s3: S3Server, bucket: str, endpoint: str | None = None) -> S3Storage:
    return S3Storage(bucket, "runs/r1", client=s3.client(endpoint))


def test_backend_semantics(s3: S3Server, tmp_path: Path) -> None:
    st = storage(s3, s3.new_bucket())
    src = tmp_path / "blob"
    src.write_bytes(bytes(range(256)) * 40_000)  # 10 MB (multipart: test_chain_transfer.py)
    st.put_file("deltas/a.wdelta", src)
    assert st.stat("deltas/a.wdelta") == chain.ObjectInfo("deltas/a.wdelta", src.stat().st_size)
    assert st.read_range("deltas/a.wdelta", 1000, 300) == src.read_bytes()[1000:1300]
    assert b"".join(st.stream("deltas/a.wdelta", 9_000_000)) == src.read_bytes()[9_000_000:]
    assert st.read_range("deltas/a.wdelta", 0, 0) == b""
    with pytest.raises(WdeltaError) as info:
        st.read_range("deltas/a.wdelta", src.stat().st_size - 10, 20)
    assert info.value.category == "truncated"
    assert_create_only(st)
    assert [o.key for o in st.list("")] == ["deltas/a.wdelta", MANIFEST_KEY]
    assert_delete_then_not_found(st, "deltas/a.wdelta")


def test_unreachable_server_is_io_error(s3: S3Server) -> None:
    st = S3Storage("b", "", client=s3.client(f"http://127.0.0.1:{free_port()}"))
    for call in (lambda: st.stat("x"), lambda: st.list(""), lambda: st.create("k", b"")):
        with pytest.raises(WdeltaError) as info:
            call()
        assert info.value.category == "io-error"


def test_create_is_exclusive_under_concurrency(s3: S3Server) -> None:
    bucket = s3.new_bucket()
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def racer(i: int) -> None:
        st = storage(s3, bucket)
        barrier.wait()
        results.append(st.create("manifests/rev-000000000007.json", f"writer {i}".encode()))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(results) == [False, False, False, True]


@pytest.fixture
def s3_chain(s3: S3Server, tmp_path: Path) -> tuple[str, chain.Chain, list[Path]]:
    bucket = s3.new_bucket()
    t = Trainer(rows=128, cols=512)
    ckpts = [t.save(tmp_path / "ck0.safetensors")]
    c = chain.Chain(storage(s3, bucket), tmp_path / "trainer-cache")
    chain.init(c, ckpts[0], step=0)
    for n in range(1, 4):
        t.step(n)
        ckpts.append(t.save(tmp_path / f"ck{n}.safetensors"))
        chain.append(c, ckpts[n], ckpts[n - 1], step=n)
    return bucket, c, ckpts


def test_racing_writers_over_s3(s3: S3Server, tmp_path: Path) -> None:
    bucket = s3.new_bucket()
    t = Trainer(rows=32, cols=128)
    base = t.save(tmp_path / "base.safetensors")
    chain.init(chain.Chain(storage(s3, bucket)), base)
    news = []
    for i in range(6):
        t.step(i + 1)
        news.append(t.save(tmp_path / f"w{i}.safetensors"))
    race_appends(lambda: storage(s3, bucket), news, base)
    m = chain.Chain(storage(s3, bucket)).head()
    assert m.revision == 7
    assert {v.digest for v in m.versions[1:]} == {digest_of_path(p) for p in news}


def test_cut_connection_resumes_the_download(
    s3: S3Server, s3_chain: tuple[str, chain.Chain, list[Path]], tmp_path: Path
) -> None:
    bucket, c, ckpts = s3_chain
    snapshot = c.head().snapshots[0]
    proxy = Proxy(s3.port, cut_after=snapshot.size // 2)
    node = chain.Chain(storage(s3, bucket, proxy.endpoint), tmp_path / "node-cache")
    local = tmp_path / "node.safetensors"
    with pytest.raises(WdeltaError) as info:
        chain.pull(node, local)
    assert info.value.category == "io-error"
    assert not local.exists()
    (part,) = (tmp_path / "node-cache" / "partial").iterdir()
    kept = part.stat().st_size
    assert 0 < kept < snapshot.size
    proxy.close()
    node = chain.Chain(storage(s3, bucket), tmp_path / "node-cache")
    r = chain.pull(node, local)
    assert r.downloaded == snapshot.size - kept + sum(k.size for k in c.head().links)
    assert local.read_bytes() == ckpts[-1].read_bytes()


def _pull_in_subprocess(
    endpoint: str, bucket: str, cache: Path, local: Path
) -> subprocess.Popen[bytes]:
    code = (
        "import sys, boto3\n"
        "from pathlib import Path\n"
        "from wdelta import chain\n"
        "from wdelta.chain.storage.s3 import S3Storage\n"
        "client = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n"
        "    aws_access_key_id='testing', aws_secret_access_key='testing')\n"
        "c = chain.Chain(S3Storage(sys.argv[2], 'runs/r1', client=client), Path(sys.argv[3]))\n"
        "chain.pull(c, Path(sys.argv[4]))\n"
    )
    args = [sys.executable, "-c", code, endpoint, bucket, str(cache), str(local)]
    return subprocess.Popen(args, env=dict(os.environ), stderr=subprocess.PIPE)


def _same_tensors(part: Path, full: Path) -> None:
    with wdelta.open_checkpoint(part) as p, wdelta.open_checkpoint(full) as f:
        for name, t in p.tensors.items():
            assert t.read(0, t.elements).tobytes() == f.tensors[name].read(0, t.elements).tobytes()


def _fleet(s3: S3Server, tmp_path: Path, rows: int, cols: int) -> None:
    bucket = s3.new_bucket()
    trainer = chain.Chain(storage(s3, bucket), tmp_path / "trainer-cache")
    t = Trainer(rows=rows, cols=cols)
    ckpts = [t.save(tmp_path / "ck0.safetensors")]
    chain.init(trainer, ckpts[0], step=0)
    a_local, b_local = tmp_path / "a" / "model.safetensors", tmp_path / "b" / "rank.safetensors"
    a_cache = tmp_path / "a-cache"
    for n in range(1, 21):
        t.step(n)
        ckpts.append(t.save(tmp_path / f"ck{n}.safetensors"))
        opts = chain.AppendOptions(snapshot=n % 10 == 0)
        chain.append(trainer, ckpts[n], ckpts[n - 1], step=n, options=opts)
        if n == 8:  # node A joins at version 8
            chain.pull(chain.Chain(storage(s3, bucket), a_cache), a_local)
        if n == 3:  # node B serves layer0 and the small tensors, joins at version 3
            chain.pull(chain.Chain(storage(s3, bucket)), b_local, tensors="layer0.*,norm.*,step")
    assert a_local.read_bytes() == ckpts[8].read_bytes()

    # Node A is killed (SIGKILL) in the middle of its pull to the head.
    objects = a_cache / "objects"
    cached_before = len(list(objects.iterdir()))
    full = sum(k.size for k in trainer.head().links if k.target > 8)
    proxy = Proxy(s3.port, delay=0.01)
    child = _pull_in_subprocess(proxy.endpoint, bucket, a_cache, a_local)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        if len(list(objects.iterdir())) >= cached_before + 3:
            break
        time.sleep(0.005)
    assert child.poll() is None, child.stderr.read() if child.stderr else ""
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    proxy.close()
    assert a_local.read_bytes() == ckpts[8].read_bytes()  # old version intact
    assert len(list(objects.iterdir())) >= cached_before + 3
    r = chain.pull(chain.Chain(storage(s3, bucket), a_cache), a_local)
    assert r.version.number == 20 and 0 < r.downloaded < full
    assert len(r.hops) < 12  # resumed from the last version finished before the kill
    assert a_local.read_bytes() == ckpts[20].read_bytes()

    # Node B pulls only its tensors' byte ranges.
    r = chain.pull(chain.Chain(storage(s3, bucket)), b_local, tensors="layer0.*,norm.*,step")
    assert r.version.number == 20
    _same_tensors(b_local, ckpts[20])

    # Squash 10 -> 20, prune, and a new node far behind (at version 10) gets one file.
    chain.squash(trainer, 10, 20, base=ckpts[10])
    m, _ = chain.prune(trainer, chain.Policy(snapshot_every=10, keep_links=3))
    assert [s.version for s in m.snapshots] == [0, 10, 20]
    c_local = tmp_path / "c" / "model.safetensors"
    c_node = chain.Chain(storage(s3, bucket), tmp_path / "c-cache")
    chain.pull(c_node, c_local, to=10)
    r = chain.pull(c_node, c_local)
    assert [(h.link.source, h.link.target) for h in r.hops if h.link] == [(10, 20)]
    assert c_local.read_bytes() == ckpts[20].read_bytes()
    chain.verify(chain.Chain(storage(s3, bucket), tmp_path / "v-cache"), deep=True)
    for number in (v.number for v in m.versions):
        local = tmp_path / "every" / f"{number}.safetensors"
        chain.pull(chain.Chain(storage(s3, bucket), tmp_path / "every-cache"), local, to=number)
        assert local.read_bytes() == ckpts[number].read_bytes()


def test_fleet_over_s3(s3: S3Server, tmp_path: Path) -> None:
    """The issue's "done means": 20 steps of a 1.5 MB bf16 model."""
    _fleet(s3, tmp_path, 256, 1024)


@pytest.mark.slow
def test_fleet_over_s3_larger(s3: S3Server, tmp_path: Path) -> None:
    """The same with 24 MB of bf16 weights."""
    _fleet(s3, tmp_path, 2048, 2048)
