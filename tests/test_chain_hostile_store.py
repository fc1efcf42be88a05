"""A hostile store, or an attacker on the node's own disk (SPEC.md §17.4, §17.6, §17.7):
non-regular objects in a local store, an S3 mirror whose answers are longer than asked,
intermediates planted in the node's work folder and poisoned cache objects.  Each is
refused with one error line naming the object (the node keeps its checkpoint and
nothing is left behind) or repaired (a bad local file is removed and fetched again)."""

from __future__ import annotations

import io
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from chainkit import S3Server, ThreadRanks, Wrapped, folder_history
from signkit import Signed, key, root_file, signed_chain
from wdelta import chain
from wdelta.chain.model.manifest import revision_key
from wdelta.chain.reading.parts import mark_part, part_file
from wdelta.chain.reading.pull import work_dir
from wdelta.chain.storage import LocalStorage
from wdelta.chain.storage.base import Storage
from wdelta.chain.store import file_digest
from wdelta.chain.trust.updater import read_root_file, root_key, signature_key
from wdelta.chain.writing.append import append_parts
from wdelta.errors import WdeltaError
from wdelta.format.digest import digest_bytes

WDELTA = [sys.executable, "-m", "wdelta", "chain"]
LIE = 64 << 20  # what a lying store answers to any GET


def _bounded_memory() -> None:
    # A reader that does not bound its reads would read /dev/zero until memory runs out:
    # cap the child's address space, so that such a reader fails this test, not the host.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def wd(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The chain CLI; a read that blocks on a FIFO fails the test by its timeout."""
    return subprocess.run([*WDELTA, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=90, preexec_fn=_bounded_memory)  # fmt: skip


def _one_error_line(r: subprocess.CompletedProcess[str], category: str, names: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {category}: ") and names in lines[0], lines[0]


def _plant(path: Path, kind: str) -> None:
    """Replace the object at ``path`` by a FIFO or a symlink to /dev/zero."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def _head_signature(s: Signed) -> str:
    r = chain.Chain(s.store).revisions()[-1]
    data = (s.store / revision_key(r)).read_bytes()
    return signature_key(digest_bytes(data), key("alice").public.keyid)


def _target(s: Signed, what: str) -> str:
    """The store key of the object ``what`` names (the next pull of the node reads it)."""
    m = chain.Chain(s.store).head()
    if what == "signature":
        return _head_signature(s)
    if what == "next root":
        return root_key(2)
    if what == "delta":
        return m.links[-1].key
    return m.snapshots[0].files[0].key


# ---------------------------------------------------------------- hole: non-regular objects


@pytest.mark.parametrize("kind", ["fifo", "zero"])
@pytest.mark.parametrize("what", ["signature", "next root", "delta", "snapshot"])
def test_a_non_regular_object_is_refused_naming_it(tmp_path: Path, what: str, kind: str) -> None:
    s = signed_chain(tmp_path)
    s.publish()  # version 2: the node pulls link 1->2 (a new node starts from the snapshot)
    target = _target(s, what)
    _plant(s.store / target, kind)
    node = s.node if what != "snapshot" else tmp_path / "node" / "fresh.safetensors"
    before = node.read_bytes() if node.exists() else None
    r = wd("pull", s.store, node, "--trust", s.root, cwd=tmp_path)
    _one_error_line(r, "io-error", target)
    assert "not a file" in r.stderr
    assert (node.read_bytes() if node.exists() else None) == before
    assert not work_dir(node).exists()
    assert not any((node.parent / ".wdelta-cache" / "partial").glob("*"))


def test_a_follower_keeps_serving_past_a_fifo(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    target = _head_signature(s)
    _plant(s.store / target, "fifo")
    r = wd("pull", s.store, s.node, "--trust", s.root, "--follow", "--interval", "0",
           "--max-iterations", "3", "--backoff-cap", "0.01", cwd=tmp_path)  # fmt: skip
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 3, r.stderr
    assert all(line.startswith("pull failed: io-error: ") for line in lines[:2]), r.stderr
    assert lines[-1].startswith("error: io-error: ") and all(target in line for line in lines)
    assert s.node.read_bytes() == s.ckpts[1].read_bytes()


@pytest.mark.parametrize(("command", "what"), [
    (("verify", "{store}"), "delta"),
    (("check", "{manifest}", "--store", "{store}"), "delta"),
    (("check", "{manifest}", "--store", "{store}", "--trust", "{root}"), "signature"),
    (("sign", "{store}", "--trust", "{root}", "--sign", "k.key"), "next root"),
    (("append", "{store}", "{new}", "--base", "{base}", "--trust", "{root}", "--sign", "k.key"),
     "next root"),
])  # fmt: skip
def test_every_command_reading_the_store_refuses_a_fifo(
    tmp_path: Path, command: tuple[str, ...], what: str
) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    target = _target(s, what)
    _plant(s.store / target, "fifo")
    assert wd("keygen", "k.key", cwd=tmp_path).returncode == 0
    head = chain.Chain(s.store).revisions()[-1]
    names = {"store": s.store, "root": s.root, "manifest": s.store / revision_key(head),
             "new": s.next_checkpoint(), "base": s.ckpts[-2]}  # fmt: skip
    before = sorted(p.relative_to(s.store) for p in s.store.rglob("*"))
    r = wd(*(part.format(**names) for part in command), cwd=tmp_path)
    _one_error_line(r, "io-error", target)
    assert sorted(p.relative_to(s.store) for p in s.store.rglob("*")) == before


def test_log_lists_a_fifo_signature_as_no_signature(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    _plant(s.store / _head_signature(s), "fifo")
    r = wd("log", s.store, "--trust", s.root, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "revision 3 unsigned", r.stderr


def test_local_reads_are_bounded_by_the_callers_limit(tmp_path: Path) -> None:
    st = chain.LocalStorage(tmp_path)
    (tmp_path / "k").write_bytes(b"x" * 11)
    assert st.read("k", 11) == b"x" * 11
    with pytest.raises(WdeltaError) as info:
        st.read("k", 10)
    assert info.value.category == "limit-exceeded" and "k" in str(info.value)
    (tmp_path / "d").mkdir()
    with pytest.raises(WdeltaError) as info:
        st.read("d", 10)
    assert info.value.category == "io-error" and "not a file" in str(info.value)
    with pytest.raises(WdeltaError) as info:
        st.read("missing", 10)
    assert info.value.category == "not-found"


# ---------------------------------------------------------------- hole: lying S3 mirrors


class _Lie(io.RawIOBase):
    """The body a lying store sends: the genuine bytes, then zeros up to LIE bytes,
    whatever range was asked; ``consumed`` counts what the reader took."""

    def __init__(self, genuine: bytes, counter: list[int]) -> None:
        self.genuine, self.at, self.counter = genuine, 0, counter

    def readable(self) -> bool:
        return True

    def read(self, amt: int | None = -1) -> bytes:
        n = LIE - self.at if amt is None or amt < 0 else min(amt, LIE - self.at)
        out = self.genuine[self.at : self.at + n]
        out += bytes(n - len(out))
        self.at += n
        self.counter[0] += n
        return out


class LyingClient:
    """A boto3 S3 client whose GETs of the keys ending in one of ``lies`` answer LIE
    bytes (ignoring Range), while HEAD and listings tell the truth."""

    def __init__(self, real: Any, lies: tuple[str, ...]) -> None:
        self.real, self.lies, self.consumed = real, lies, [0]

    def get_object(self, **kw: Any) -> dict[str, Any]:
        from botocore.response import StreamingBody

        if not kw["Key"].endswith(self.lies):
            return dict(self.real.get_object(**kw))
        genuine = self.real.get_object(Bucket=kw["Bucket"], Key=kw["Key"])["Body"].read()
        return {"Body": StreamingBody(_Lie(genuine, self.consumed), LIE)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)



def _s3(s3: S3Server, lies: tuple[str, ...]) -> tuple[Storage, LyingClient]:
    from wdelta.chain.storage.s3 import S3Storage

    client = LyingClient(s3.client(), lies)
    return S3Storage(s3.new_bucket(), "m", client=client), client


def test_a_ranged_read_stops_at_the_bytes_asked(s3: S3Server) -> None:
    st, client = _s3(s3, ("obj",))
    st.create("obj", bytes(range(256)) + bytes(44))  # 300 bytes, HEAD says so
    with pytest.raises(WdeltaError) as info:
        st.read_range("obj", 0, 64)
    assert info.value.category == "io-error" and "obj" in str(info.value)
    assert client.consumed[0] <= 65  # one byte past the range proves the lie
    client.consumed[0] = 0
    with pytest.raises(WdeltaError) as info:
        st.read("obj", 1 << 16)
    assert info.value.category == "limit-exceeded" and "obj" in str(info.value)
    assert client.consumed[0] <= (1 << 16) + 1


def _mirror(s: Signed, s3: S3Server, lies: tuple[str, ...]) -> tuple[Storage, LyingClient]:
    st, client = _s3(s3, lies)
    for path in s.store.rglob("*"):
        if path.is_file():
            st.put_file(str(path.relative_to(s.store)), path)
    return st, client


def test_a_lying_mirror_cannot_push_a_signature_or_root_past_its_cap(
    tmp_path: Path, s3: S3Server
) -> None:
    # The signature lies: it counts as absent (SG-4) after at most 64 KiB + 1 byte.
    s = signed_chain(tmp_path)
    s.publish()
    st, client = _mirror(s, s3, (f"{key('alice').public.keyid}.json",))
    with pytest.raises(WdeltaError) as info:
        chain.pull(chain.Chain(st, tmp_path / "mc", trust=s.root), s.node)
    assert info.value.category == "signature-invalid"
    assert client.consumed[0] <= (1 << 16) + 1
    # A next root lies: refused as no trust root, read no further than its cap.
    root_file(tmp_path / "r2.json", "test/run", ["alice"], previous=read_root_file(s.root))
    st.create(root_key(2), (tmp_path / "r2.json").read_bytes())
    client.lies, client.consumed[0] = (root_key(2),), 0
    with pytest.raises(WdeltaError) as info:
        chain.pull(chain.Chain(st, tmp_path / "mc", trust=s.root), s.node)
    assert info.value.category == "signature-invalid" and root_key(2) in str(info.value)
    assert client.consumed[0] <= (1 << 16) + 1
    assert s.node.read_bytes() == s.ckpts[1].read_bytes()


# ---------------------------------------------------------------- hole: planted intermediates


def _history(tmp_path: Path) -> tuple[Path, list[Path], Path]:
    """A folder chain of versions 0..2 and a node at version 1."""
    store, ckpts = folder_history(tmp_path, 32, 256, last=2, snapshots=())
    node = tmp_path / "node" / "m.safetensors"
    node.parent.mkdir()
    shutil.copyfile(ckpts[1], node)
    return store, ckpts, node


@pytest.mark.parametrize("kind", ["file", "symlink", "fifo", "folder"])
def test_a_planted_intermediate_is_checked_and_removed(tmp_path: Path, kind: str) -> None:
    store, ckpts, node = _history(tmp_path)
    head = chain.Chain(store).head().head
    planted = work_dir(node) / head.digest
    planted.parent.mkdir()
    evil = tmp_path / "evil.safetensors"
    shutil.copyfile(ckpts[0], evil)  # a valid checkpoint, not the version it is named by
    if kind == "file":
        shutil.copyfile(evil, planted)
    elif kind == "symlink":
        planted.symlink_to(evil)
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
        shutil.copyfile(evil, planted / "model.safetensors")
    r = wd("pull", store, node, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "1 hop" in r.stdout and " 0 bytes fetched" not in r.stdout, r.stdout
    assert node.read_bytes() == ckpts[2].read_bytes()
    assert not work_dir(node).exists()
    assert evil.read_bytes() == ckpts[0].read_bytes()  # a symlink's target is not touched


def test_a_genuine_intermediate_is_still_a_starting_point(tmp_path: Path) -> None:
    store, ckpts, node = _history(tmp_path)
    head = chain.Chain(store).head().head
    work_dir(node).mkdir()
    shutil.copyfile(ckpts[2], work_dir(node) / head.digest)  # a finished hop of a killed pull
    r = chain.pull(chain.Chain(store, tmp_path / "c"), node)
    assert r.hops == [] and r.downloaded == 0
    assert node.read_bytes() == ckpts[2].read_bytes()


# ---------------------------------------------------------------- hole: poisoned cache


def _poison(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["delta header", "delta blob", "snapshot"])
def test_a_poisoned_cache_object_is_evicted_and_fetched_again(tmp_path: Path, where: str) -> None:
    store, ckpts, node = _history(tmp_path)
    cache = tmp_path / "cache"
    m = chain.Chain(store).head()
    chain.pull(chain.Chain(store, cache), tmp_path / "other" / "m.safetensors")  # fills it
    if where == "snapshot":
        node.unlink()
        obj = m.snapshots[0].files[0]
        digest, size, at = obj.sha256, obj.size, obj.size - 1
    else:
        link = m.links[-1]
        digest, size = link.digest, link.size
        at = 100 if where == "delta header" else link.size - 1
    _poison(cache / "objects" / digest, at)
    r = chain.pull(chain.Chain(store, cache), node)  # once: it used to fail at every poll
    assert r.version.number == 2
    assert r.downloaded == size
    assert node.read_bytes() == ckpts[2].read_bytes()
    algorithm = "sha256" if where == "snapshot" else "blake3"
    assert file_digest(cache / "objects" / digest, algorithm) == digest


def test_a_poisoned_partial_download_is_started_again(tmp_path: Path) -> None:
    store, ckpts, node = _history(tmp_path)
    cache = tmp_path / "cache"
    link = chain.Chain(store).head().links[-1]
    (cache / "partial").mkdir(parents=True)
    (cache / "partial" / f"{link.digest}.part").write_bytes(b"\xff" * (link.size // 2))
    r = chain.pull(chain.Chain(store, cache), node)
    assert r.version.number == 2 and node.read_bytes() == ckpts[2].read_bytes()


def test_a_corrupt_store_still_fails_and_caches_nothing(tmp_path: Path) -> None:
    store, ckpts, node = _history(tmp_path)
    cache = tmp_path / "cache"
    link = chain.Chain(store).head().links[-1]
    chain.pull(chain.Chain(store, cache), tmp_path / "other" / "m.safetensors")
    _poison(cache / "objects" / link.digest, link.size - 1)
    _poison(store / link.key, link.size - 1)  # the store's copy is bad too
    r = wd("pull", store, node, "--cache", cache, "--quiet", cwd=tmp_path)
    _one_error_line(r, "checksum-mismatch", link.key)
    assert node.read_bytes() == ckpts[1].read_bytes()
    assert not (cache / "objects" / link.digest).exists()
    assert not any((cache / "partial").iterdir())


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_planted_partial_download_is_replaced_not_followed(tmp_path: Path, kind: str) -> None:
    store, ckpts, node = _history(tmp_path)
    cache = tmp_path / "cache"
    link = chain.Chain(store).head().links[-1]
    part = cache / "partial" / f"{link.digest}.part"
    part.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    part.symlink_to(victim) if kind == "symlink" else os.mkfifo(part)
    r = wd("pull", store, node, "--cache", cache, "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert node.read_bytes() == ckpts[2].read_bytes() and victim.read_bytes() == b"keep me"
    assert not (cache / "objects" / link.digest).is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "a number"])
def test_a_planted_pin_is_not_waited_on(tmp_path: Path, kind: str) -> None:
    store, _, node = _history(tmp_path)
    cache = tmp_path / "cache"
    chain.pull(chain.Chain(store, cache), node)
    pin = cache / "pins" / "1-planted.json"  # process 1 is alive: the pin is read
    pin.parent.mkdir(exist_ok=True)
    os.mkfifo(pin) if kind == "fifo" else pin.write_text("5")
    r = wd("gc", store, "--cache", cache, "--max-bytes", "0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not any((cache / "objects").iterdir())


def test_a_folder_planted_in_the_cache_is_replaced(tmp_path: Path) -> None:
    store, ckpts, node = _history(tmp_path)
    cache = tmp_path / "cache"
    link = chain.Chain(store).head().links[-1]
    (cache / "objects" / link.digest).mkdir(parents=True)
    r = chain.pull(chain.Chain(store, cache), node)
    assert r.downloaded == link.size and node.read_bytes() == ckpts[2].read_bytes()
    assert (cache / "objects" / link.digest).is_file()


@pytest.mark.parametrize("where", ["work folder", "cache objects"])
def test_a_file_planted_in_place_of_a_folder(tmp_path: Path, where: str) -> None:
    """The node's work folder is cleared; a cache it cannot use is one io-error line."""
    store, ckpts, node = _history(tmp_path)
    cache = tmp_path / "cache"
    planted = work_dir(node) if where == "work folder" else cache / "objects"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"planted")
    r = wd("pull", store, node, "--cache", cache, "--quiet", cwd=tmp_path)
    if where == "work folder":
        assert r.returncode == 0 and node.read_bytes() == ckpts[2].read_bytes(), r.stderr
        assert not work_dir(node).exists()
    else:
        _one_error_line(r, "io-error", str(planted))
        assert node.read_bytes() == ckpts[1].read_bytes()


def test_an_hf_answer_longer_than_the_range_is_refused() -> None:
    """What the Hub backend can check itself: a range answered with more bytes."""
    from storekit import FakeHub
    from wdelta.chain.storage.hf import HfStorage, parse_hf_url

    class Lying(FakeHub):
        def cat_file(self, path: str, start: int, end: int) -> bytes:
            return bytes(LIE)

    hub = Lying(parse_hf_url("hf://me/model/c").fs_root)
    st = HfStorage("hf://me/model/c", api=hub, fs=hub)
    hub.files[f"{hub.root}/obj"] = bytes(300)
    with pytest.raises(WdeltaError) as info:
        st.read_range("obj", 0, 64)
    assert info.value.category == "io-error" and "obj" in str(info.value)


# ------------------------------------------------- undo from memory, not a second read


def _model(seed: int) -> dict[str, Any]:
    """Tensors whose blobs are stored in the data section (too large to be inline)."""
    rng = np.random.default_rng(seed)
    return {
        "a.w": rng.standard_normal((64, 40)).astype(np.float32),
        "b.w": rng.standard_normal(4096).astype(np.float16),
        "c.w": rng.standard_normal(1000).astype(np.float32),
        "d.w": rng.standard_normal(500).astype(np.float32),
    }


def _stepped(w: dict[str, Any], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {n: np.where(rng.random(a.shape) < 0.2, a + a.dtype.type(0.5), a) for n, a in w.items()}


class _SecondReadLies(Wrapped):
    """A store that answers the first read of each range of a delta truthfully and every
    later read of it (or any read of a key in ``broken``) with one byte changed."""

    def __init__(self, inner: Storage, broken: tuple[str, ...] = ()) -> None:
        super().__init__(inner)
        self.seen: set[tuple[str, int, int]] = set()
        self.broken, self.lies = broken, 0

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self.inner.read_range(key, start, length)
        if not key.startswith("deltas/"):
            return data
        if (key, start, length) in self.seen or key in self.broken:
            self.lies += 1
            return data[:-1] + bytes([data[-1] ^ 1])
        self.seen.add((key, start, length))
        return data


PATTERN = "a.w,c.w,d.w"  # b.w, between them, is not read: a.w and c.w are read apart


def _rank_at(w: dict[str, Any]) -> dict[str, Any]:
    """A rank's tensors, d.w not its version's: a link applies a.w and c.w, then fails."""
    rank = {n: a.copy() for n, a in w.items() if n != "b.w"}
    rank["d.w"][0] += 1
    return rank


@pytest.mark.parametrize("layout", ["single-file", "multi-part"])
def test_a_failed_update_is_undone_from_the_bytes_applied(tmp_path: Path, layout: str) -> None:
    """An in-memory follower reading its tensors by ranges applies a.w and c.w, then d.w
    fails; undoing must not read a.w's blobs again (this store then answers other bytes):
    before, the node was left with a.w new and c.w, d.w old."""
    store = LocalStorage(tmp_path / "store")
    c = chain.Chain(store, cache=tmp_path / "cache")
    old, new = _model(0), _stepped(_model(0), 1)
    chain.Publisher(c).publish(old, step=0)
    if layout == "single-file":
        chain.Publisher(c, previous=old).publish(new, step=1)
    else:
        files = []
        for i, names in enumerate([["a.w", "b.w", "c.w"], ["d.w"]]):
            raw, out = tmp_path / f"raw{i}", tmp_path / f"part{i}"
            wdelta.diff({n: old[n] for n in names}, {n: new[n] for n in names}, raw)
            mark_part(raw, out, i, 2, chain.weights_digest(old), chain.weights_digest(new))
            files.append(part_file(out))
            c.upload(files[-1].key, out, files[-1].digest, "blake3")
        versions = (chain.weights_digest(old), chain.weights_digest(new))
        append_parts(c, files, versions=versions, step=1)
    rank = _rank_at(old)
    before = {n: a.tobytes() for n, a in rank.items()}
    lying = chain.Chain(_SecondReadLies(store), cache=tmp_path / "node-cache")
    errors: list[WdeltaError] = []
    got = chain.follow_weights(lying, rank, at=0, tensors=PATTERN, max_polls=1, threads=1,
                               interval=0, on_error=lambda e, n: errors.append(e))  # fmt: skip
    assert list(got) == []
    assert {n: a.tobytes() for n, a in rank.items()} == before
    assert [e.category for e in errors] == ["base-mismatch"], errors


def test_a_group_that_fails_is_undone_from_the_bytes_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """follow_in_group applies link 0->1, link 1->2 fails (the store corrupts it): the
    rank goes back to version 0 from the bytes of link 0->1 it holds.  Before, it read
    that link again (header and blobs), got other bytes and stayed at version 1."""
    from wdelta.chain.live import group_follow

    store = LocalStorage(tmp_path / "store")
    c = chain.Chain(store, cache=tmp_path / "cache")
    history = [_model(0)]
    pub = chain.Publisher(c)
    for step in range(3):
        pub.publish(history[-1], step=step)
        history.append(_stepped(history[-1], step + 1))
    second = c.head().links[-1].key
    lying = _SecondReadLies(store, broken=(second,))
    monkeypatch.setattr(group_follow, "Group", ThreadRanks.adopt)
    rank = {n: a.copy() for n, a in history[0].items() if n != "b.w"}
    node = chain.Chain(lying, cache=tmp_path / "node-cache")
    with pytest.raises(WdeltaError):
        list(group_follow.follow_in_group(node, rank, at=0, group=ThreadRanks(1).group(0),
                                          tensors=PATTERN, max_polls=1, threads=1))  # fmt: skip
    assert all(rank[n].tobytes() == history[0][n].tobytes() for n in rank)


class _LiesOnceAsked(_SecondReadLies):
    """Truthful until a read of ``trigger``; from then on every delta read is a lie."""

    def __init__(self, inner: Storage, trigger: str) -> None:
        super().__init__(inner, broken=(trigger,))
        self.trigger, self.lying = trigger, False

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self.lying |= key == self.trigger
        if self.lying and key.startswith("deltas/"):
            self.broken = (*self.broken, key)
        return super().read_range(key, start, length)


def test_a_tensor_a_link_removed_comes_back_from_the_bytes_read_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Link 0->1 removes a.x; link 1->2 fails.  Undoing 0->1 brings a.x back from its
    blobs, read (and kept) while 0->1 was applied: the store lies from the moment the
    rank reads link 1->2, and nothing of 0->1 is read again (a.x's blobs are not in the
    window of blobs read last, c.w's and d.w's: b.w, between them, is not selected)."""
    from wdelta.chain.live import group_follow

    store = LocalStorage(tmp_path / "store")
    c = chain.Chain(store, cache=tmp_path / "cache")
    v0 = {**_model(0), "a.x": _model(5)["d.w"]}  # its blobs too large to be inline
    v1 = _stepped(_model(0), 1)
    pub = chain.Publisher(c)
    for step, w in enumerate([v0, v1, _stepped(v1, 2)]):
        pub.publish(w, step=step)
    lying = _LiesOnceAsked(store, c.head().links[-1].key)
    monkeypatch.setattr(group_follow, "Group", ThreadRanks.adopt)
    rank = {n: a.copy() for n, a in v0.items() if n != "b.w"}
    node = chain.Chain(lying, cache=tmp_path / "node-cache")
    with pytest.raises(WdeltaError):
        list(group_follow.follow_in_group(node, rank, at=0, group=ThreadRanks(1).group(0),
                                          tensors=f"a.x,{PATTERN}", max_polls=1,
                                          threads=1))  # fmt: skip
    assert lying.lies and sorted(rank) == sorted(set(v0) - {"b.w"})
    assert all(rank[n].tobytes() == v0[n].tobytes() for n in rank)
