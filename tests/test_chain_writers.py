"""The writer side of signed chains (SPEC.md §17.11 WS-1..WS-6): a writer signs only a
revision it created, waits a bounded time for the signatures of a head another writer
is still storing, checks its own signatures as a node would before it uploads anything,
and ``chain sign`` shows what it signs and checks it against what the signer expects."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from chainkit import ThreadRanks, Wrapped
from signkit import FAR, PAST, Signed, key, root_file, signed_chain
from wdelta import chain
from wdelta.chain.live import distributed
from wdelta.chain.model.manifest import revision_key
from wdelta.chain.reading.local import digest_of_path
from wdelta.chain.storage import LocalStorage
from wdelta.chain.storage.base import ObjectInfo, Storage
from wdelta.chain.trust import signing
from wdelta.chain.trust.updater import Trust, signature_key
from wdelta.checkpoint.source import open_checkpoint
from wdelta.errors import ChecksumMismatchError, StorageError, WdeltaError
from wdelta.format.container import PREFIX_SIZE, pack_prefix
from wdelta.format.digest import digest_bytes
from wdelta.limits import MAX_MANIFEST_BYTES

WDELTA = [sys.executable, "-m", "wdelta", "chain"]


def wd(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WDELTA, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip


class _Race(Wrapped):
    """Writer B's storage: just before B's create-only write of ``key``, ``first`` runs
    (writer A publishes the same revision number and wins); keeps the bytes B tried."""

    def __init__(self, inner: Storage, key: str, first: Callable[[], object]) -> None:
        super().__init__(inner)
        self.key, self.first = key, first
        self.lost: bytes | None = None

    def create(self, key: str, data: bytes) -> bool:
        if key == self.key and self.lost is None:
            self.lost = data
            self.first()
        return self.inner.create(key, data)


def _listing(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}


def test_a_race_loser_signs_nothing_an_attacker_could_plant(tmp_path: Path) -> None:
    s = signed_chain(tmp_path, keys=["alice", "bob"], threshold=1, signers=["alice"])
    base, mine, theirs = s.ckpts[1], s.next_checkpoint(), s.next_checkpoint()
    genuine = chain.LocalStorage(s.store)
    race = _Race(genuine, revision_key(3),
                 lambda: chain.append(s.writer(signers=["alice"]), mine, base))  # fmt: skip
    loser = chain.Chain(race, tmp_path / "bcache", trust=s.root, sign=[key("bob")])
    chain.append(loser, theirs, base)  # lost revision 3 to alice, published as 4
    assert race.lost is not None and genuine.read(revision_key(3), MAX_MANIFEST_BYTES) != race.lost
    assert genuine.list(f"signatures/{digest_bytes(race.lost)}/") == []  # never signed
    # The attacker rebuilds the loser's revision 3 and serves it before the winner's.
    evil = tmp_path / "evil"
    shutil.copytree(s.store, evil)
    (evil / revision_key(4)).unlink()
    (evil / revision_key(3)).write_bytes(race.lost)
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:
        chain.pull(chain.Chain(evil, tmp_path / "ncache", trust=s.root), s.node)
    assert info.value.category == "signature-invalid"
    assert s.node.read_bytes() == before
    # The genuine revisions are accepted: the winner's, then the loser's retry on top of it.
    assert s.pull(chain.Chain(s.store, tmp_path / "ncache", trust=s.root)).version.number == 3
    assert s.node.read_bytes() == theirs.read_bytes()
    policy = Trust.from_file(s.root)
    for r in (3, 4):
        assert policy.check_revision(genuine, r, genuine.read(revision_key(r), MAX_MANIFEST_BYTES))


class _Overwriting(Wrapped):
    """A store that breaks ST-1: a create-only write of ``key`` always "succeeds", and
    another writer's write of the same revision (``rival``) lands on top of it."""

    def __init__(self, inner: Storage, key: str, rival: Callable[[bytes], bytes]) -> None:
        super().__init__(inner)
        self.key, self.rival = key, rival

    def create(self, key: str, data: bytes) -> bool:
        if key != self.key:
            return self.inner.create(key, data)
        (Path(self.inner.url) / key).write_bytes(self.rival(data))
        return True


def test_a_store_that_lets_two_writers_win_gets_no_signature(tmp_path: Path) -> None:
    """WS-2: before signing, a writer reads its revision back; another writer's bytes there
    mean the store does not keep create-only writes, and signing either would fork nodes."""
    s = signed_chain(tmp_path)
    new = s.next_checkpoint()

    def rival(data: bytes) -> bytes:
        doc = json.loads(data)
        doc["updated"] = "2030-01-01T00:00:00Z"  # the other writer's manifest
        return json.dumps(doc).encode()

    broken = _Overwriting(chain.LocalStorage(s.store), revision_key(3), rival)
    writer = chain.Chain(broken, tmp_path / "wcache", trust=s.root, sign=[key("alice")])
    with pytest.raises(WdeltaError) as info:
        chain.append(writer, new, s.ckpts[1])
    assert info.value.category == "conflict" and "ST-1" in str(info.value), info.value
    assert "nothing was signed" in str(info.value)
    stored = digest_bytes((s.store / revision_key(3)).read_bytes())
    assert list(s.store.glob(f"signatures/{stored}/*")) == []
    assert len(list(s.store.glob("signatures/*/*"))) == 2  # revisions 1 and 2 only
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:
        s.pull()
    assert info.value.category == "signature-invalid"
    assert s.node.read_bytes() == before


class _SignedMeanwhile(Wrapped):
    """The winner of a race storing its signatures while another writer reads the head:
    after the first look for a signature object of ``digest``, ``then`` runs."""

    def __init__(self, inner: Storage, digest: str, then: Callable[[], object]) -> None:
        super().__init__(inner)
        self.digest, self.then, self.looked = digest, then, False

    def stat(self, key: str) -> ObjectInfo | None:
        found = self.inner.stat(key)
        if key.startswith(f"signatures/{self.digest}/") and not self.looked:
            self.looked = True
            self.then()
        return found


def _unsigned_head(s: Signed) -> tuple[int, bytes]:
    """Revision 3 (version 2) created without its signatures (its writer is still
    storing them, or stopped before it could)."""
    chain.append(chain.Chain(s.store, s.tmp / "ucache"), s.next_checkpoint(), s.ckpts[1])
    storage = chain.LocalStorage(s.store)
    return 3, storage.read(revision_key(3), MAX_MANIFEST_BYTES)


def test_a_writer_waits_for_the_signatures_of_a_new_head(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    r, data = _unsigned_head(s)
    genuine = chain.LocalStorage(s.store)
    late = _SignedMeanwhile(genuine, digest_bytes(data), lambda: Trust.from_file(s.root).sign(
        genuine, r, data, [key("alice")], FAR))  # fmt: skip
    w = chain.Chain(late, tmp_path / "wcache", trust=s.root, sign=[key("alice")])
    chain.append(w, s.next_checkpoint(), s.ckpts[2])
    assert late.looked and s.pull().version.number == 3


def test_a_writer_refuses_a_head_still_unsigned_after_its_wait(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    _unsigned_head(s)
    before = _listing(s.store)
    w = chain.Chain(s.store, tmp_path / "wcache", trust=s.root, sign=[key("alice")],
                    sign_wait=0.2)  # fmt: skip
    with pytest.raises(WdeltaError) as info:
        chain.append(w, s.next_checkpoint(), s.ckpts[2])
    assert info.value.category == "signature-invalid" and "waited 0.2 s" in str(info.value)
    assert _listing(s.store) == before  # WS-1: nothing stored on top of it


@pytest.mark.parametrize("wait", [float("nan"), -1.0, float("inf"), "10"])
def test_a_writer_wait_must_be_a_duration(tmp_path: Path, wait: object) -> None:
    with pytest.raises(WdeltaError) as info:
        chain.Chain(tmp_path, trust=None, sign_wait=wait)  # type: ignore[arg-type]
    assert info.value.category == "bad-argument" and "sign_wait" in str(info.value)


class _NoSignatures(Wrapped):
    """A storage that fails every write under ``signatures/`` (the writer stopped after
    creating its revision)."""

    def create(self, key: str, data: bytes) -> bool:
        if key.startswith("signatures/"):
            raise StorageError(f"{key}: connection lost")
        return self.inner.create(key, data)


def test_a_revision_its_writer_could_not_sign_is_refused_until_signed(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    w = chain.Chain(_NoSignatures(chain.LocalStorage(s.store)), tmp_path / "wcache",
                    trust=s.root, sign=[key("alice")])  # fmt: skip
    new = s.next_checkpoint()
    with pytest.raises(WdeltaError) as info:
        chain.append(w, new, s.ckpts[1])
    digest = digest_of_path(new)
    assert info.value.category == "io-error"
    assert f"--expect-revision 3 --expect-digest {digest}" in str(info.value)
    refused_pull(s, "signature-invalid")
    signing.write_json(tmp_path / "alice.key", key("alice").to_json(), private=True)
    r = wd("sign", "store", "--trust", "root.json", "--sign", "alice.key",
           "--expect-revision", "3", "--expect-digest", digest, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert s.pull().version.number == 2 and s.node.read_bytes() == new.read_bytes()


class _CreatedThenLost(Wrapped):
    """The create-only write of a revision succeeds, but its answer is lost (a timeout)."""

    def create(self, key: str, data: bytes) -> bool:
        created = self.inner.create(key, data)
        if key.startswith("manifests/"):
            raise StorageError(f"{key}: timed out (created: {created})")
        return created


def test_a_revision_whose_creation_is_unknown_is_not_signed(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    w = chain.Chain(_CreatedThenLost(chain.LocalStorage(s.store)), tmp_path / "wcache",
                    trust=s.root, sign=[key("alice")])  # fmt: skip
    new = s.next_checkpoint()
    with pytest.raises(WdeltaError) as info:
        chain.append(w, new, s.ckpts[1])
    assert info.value.category == "io-error" and "was created is unknown" in str(info.value)
    assert f"--expect-revision 3 --expect-digest {digest_of_path(new)}'" in str(info.value)
    data = chain.LocalStorage(s.store).read(revision_key(3), MAX_MANIFEST_BYTES)
    assert not (s.store / "signatures" / digest_bytes(data)).exists()
    refused_pull(s, "signature-invalid")


def refused_pull(s: Signed, category: str) -> None:
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:
        s.pull()
    assert info.value.category == category, info.value
    assert s.node.read_bytes() == before


# ------------------------------------------------ WS-5: a writer checks its own signatures


def _rotated(s: Signed, keys: list[str], expires: str = FAR) -> None:
    """Store root version 2 (revisions role ``keys``, signed by the root key) in the chain."""
    old = chain.read_root_file(s.root)
    new = s.tmp / "root2.json"
    root_file(new, "test/run", keys, 1, previous=old, expires=expires)
    (s.store / "trust" / "root-000000000002.json").write_bytes(new.read_bytes())


@pytest.mark.parametrize(
    ("case", "category", "words"),
    [
        ("revoked", "signature-invalid", "is not a revisions key of trust root version"),
        ("root-role", "signature-invalid", "is not a revisions key of trust root version 1"),
        ("root-expired", "frozen", "expired at 2001-01-01T00:00:00Z"),
        ("zero", "frozen", "would be expired"),
        ("negative", "frozen", "would be expired"),
        ("not-a-date", "bad-argument", "no date"),
        ("another-root", "signature-invalid", "differs from the trust root given"),
    ],
)
def test_a_writer_refuses_signatures_nodes_would_refuse_before_uploading(
    tmp_path: Path, case: str, category: str, words: str
) -> None:
    s = signed_chain(tmp_path)
    seconds = {"zero": 0.0, "negative": -60.0, "not-a-date": 1e20}.get(case, 3600.0)
    first = s.root  # the trust file of a writer that starts a new chain
    if case == "revoked":  # root 2 drops alice; a new chain's root never had her
        _rotated(s, ["bob"])
        head = chain.LocalStorage(s.store).read(revision_key(2), MAX_MANIFEST_BYTES)  # bob vouches
        Trust.from_file(s.root).sign(chain.LocalStorage(s.store), 2, head, [key("bob")], FAR)
        first = tmp_path / "bob-root.json"
        root_file(first, "test/run", ["bob"])
    if case == "root-expired":
        _rotated(s, ["alice"], expires=PAST)
        first = tmp_path / "old-root.json"
        root_file(first, "test/run", ["alice"], expires=PAST)
    if case == "another-root":  # alice's keys, but not the chain's root: the new chain is
        s.root = first = tmp_path / "mine.json"  # another one (its root 1 is stored first)
        root_file(s.root, "test/run", ["alice", "bob"])
        (tmp_path / "new" / "trust").mkdir(parents=True)
        (tmp_path / "new" / "trust" / "root-000000000001.json").write_bytes(
            (s.store / "trust" / "root-000000000001.json").read_bytes())  # fmt: skip
    before = _listing(s.store)

    signer = key("root" if case == "root-role" else "alice")  # the offline key signs roots only

    def writer(store: Path, root: Path) -> chain.Chain:
        return chain.Chain(store, tmp_path / "wcache", trust=root, sign=[signer],
                           sign_seconds=seconds)  # fmt: skip

    w = writer(s.store, s.root)
    for publish in (
        lambda: chain.append(w, s.next_checkpoint(), s.ckpts[1],
                             options=chain.AppendOptions(snapshot=True)),
        lambda: w.publish(lambda cur: cur.successor()),
        lambda: chain.init(writer(tmp_path / "new", first), s.ckpts[0]),
    ):  # fmt: skip
        with pytest.raises(WdeltaError) as info:
            publish()
        assert info.value.category == category and words in str(info.value), info.value
    assert _listing(s.store) == before
    new = tmp_path / "new"
    assert not new.exists() or list(_listing(new)) == ["trust/root-000000000001.json"]


# ------------------------------------------------ WS-6: chain sign shows and checks


@pytest.fixture
def cosigned(tmp_path: Path) -> Signed:
    """A 2-of-2 chain whose head, revision 3 (version 2), alice signed; bob co-signs."""
    s = signed_chain(tmp_path, keys=["alice", "bob"], threshold=2)
    s.publish(signers=["alice"])
    for name in ("alice", "bob", "carol"):
        signing.write_json(tmp_path / f"{name}.key", key(name).to_json(), private=True)
    return s


def _bob_signed(s: Signed) -> bool:
    data = chain.LocalStorage(s.store).read(revision_key(3), MAX_MANIFEST_BYTES)
    return (s.store / signature_key(digest_bytes(data), key("bob").public.keyid)).exists()


def _error(r: subprocess.CompletedProcess[str], category: str, words: str) -> None:
    assert r.returncode == (2 if category == "bad-argument" else 1), r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {category}: "), r.stderr
    assert words in lines[0], lines[0]


def test_cli_sign_shows_what_it_signs_and_checks_it(cosigned: Signed) -> None:
    s, tmp = cosigned, cosigned.tmp
    genuine, old = digest_of_path(s.ckpts[2]), digest_of_path(s.ckpts[1])
    bob = ("sign", "store", "--trust", "root.json", "--sign", "bob.key")
    r = wd(*bob, cwd=tmp)  # no expectation, no terminal: refused
    _error(r, "bad-argument", "nothing to check revision 3 against")
    assert "revision 3 of chain test/run" in r.stdout
    assert f"adds version 2 (no step): checkpoint digest {genuine}" in r.stdout
    assert "(compared with revision 2, accepted by the trust root)" in r.stdout
    assert f"signed already by {key('alice').public.keyid[:16]} (until " in r.stdout
    assert "2 needed (trust root version 1)" in r.stdout
    for args, category, words in [
        (("--expect-digest", old), "conflict", f"does not add checkpoint digest {old}"),
        (("--expect-digest", genuine[:16]), "bad-argument", "not a checkpoint digest"),
        (("--expect-digest", genuine, "--expect-version", "3"), "conflict", "not the expected 3"),
        (("--expect-digest", genuine, "--expect-revision", "2"), "conflict", "not the expected 2"),
        (("--expect-digest", genuine, "--expires-days", "0"), "frozen", "would be expired"),
        (("--expect-digest", genuine, "--expires-days", "-1"), "frozen", "would be expired"),
        (("--expect-digest", genuine, "--expires-days", "nan"), "bad-argument", "no date"),
        (("--expect-digest", old, "--revision", "2"), "bad-argument", "unrecognized arguments"),
    ]:  # fmt: skip
        _error(wd(*bob, *args, cwd=tmp), category, words)
    carol = ("sign", "store", "--trust", "root.json", "--sign", "carol.key")
    r = wd(*carol, "--expect-digest", genuine, cwd=tmp)
    _error(r, "signature-invalid", "not a revisions key of trust root version 1")
    refused_pull(s, "signature-invalid")
    assert not _bob_signed(s)
    r = wd(*bob, "--expect-digest", genuine.upper(), "--expect-version", "2",
           "--expect-revision", "3", cwd=tmp)  # fmt: skip
    assert r.returncode == 0 and "revision 3 (head version 2) signed by" in r.stdout, r.stderr
    assert s.pull().version.number == 2 and _bob_signed(s)


def test_cli_sign_refuses_what_a_stolen_key_published(cosigned: Signed) -> None:
    """The second signer's documented command does not bring an attacker's revision to
    the threshold: the attacker holds alice's key and publishes weights of its own."""
    s, tmp = cosigned, cosigned.tmp
    (s.store / revision_key(3)).unlink()
    genuine = digest_of_path(s.ckpts[2])
    s.ckpts.pop()
    s.publish(signers=["alice"])  # revision 3 again: the attacker's version 2
    r = wd("sign", "store", "--trust", "root.json", "--sign", "bob.key", "--expect-digest",
           genuine, cwd=tmp)  # fmt: skip
    _error(r, "conflict", f"does not add checkpoint digest {genuine}")
    assert not _bob_signed(s)
    refused_pull(s, "signature-invalid")


def test_cli_sign_names_every_version_a_revision_adds(cosigned: Signed) -> None:
    """A revision adding an extra version beside the expected head (a node could pull it
    with --to) is refused unless every added version is expected."""
    s, tmp = cosigned, cosigned.tmp
    scratch = tmp / "scratch"
    shutil.copytree(s.store, scratch)
    plain = chain.Chain(scratch, tmp / "pcache")
    chain.append(plain, s.next_checkpoint(), s.ckpts[2])  # scratch revision 4: version 3
    doc = json.loads((scratch / revision_key(4)).read_bytes())
    parent = (s.store / revision_key(2)).read_bytes()
    doc["revision"], doc["parent"] = 3, {"revision": 2, "digest": digest_bytes(parent)}
    data = (json.dumps(doc, indent=2) + "\n").encode()
    shutil.copytree(scratch / "deltas", s.store / "deltas", dirs_exist_ok=True)
    (s.store / revision_key(3)).write_bytes(data)  # adds versions 2 and 3 to revision 2
    Trust.from_file(s.root).sign(chain.LocalStorage(s.store), 3, data, [key("alice")], FAR)
    head, extra = digest_of_path(s.ckpts[3]), digest_of_path(s.ckpts[2])
    bob = ("sign", "store", "--trust", "root.json", "--sign", "bob.key")
    r = wd(*bob, "--expect-digest", head, cwd=tmp)
    _error(r, "conflict", f"also adds or changes version 2 (no step): checkpoint digest {extra}")
    assert f"adds version 3 (no step): checkpoint digest {head}" in r.stdout
    assert wd(*bob, "--expect-digest", head, "--expect-digest", extra, cwd=tmp).returncode == 0
    assert s.pull().version.number == 3


def test_cli_sign_names_a_version_the_revision_changes(cosigned: Signed) -> None:
    s, tmp = cosigned, cosigned.tmp
    doc = json.loads((s.store / revision_key(3)).read_bytes())
    doc["versions"][1]["metadata"] = {"eval": "passed"}  # version 1, accepted before, changed
    data = (json.dumps(doc, indent=2) + "\n").encode()
    (s.store / revision_key(3)).write_bytes(data)
    Trust.from_file(s.root).sign(chain.LocalStorage(s.store), 3, data, [key("alice")], FAR)
    head, old = digest_of_path(s.ckpts[2]), digest_of_path(s.ckpts[1])
    bob = ("sign", "store", "--trust", "root.json", "--sign", "bob.key")
    r = wd(*bob, "--expect-digest", head, cwd=tmp)
    _error(r, "conflict", f"also adds or changes version 1 (no step): checkpoint digest {old}")
    assert f"changes version 1 (no step): checkpoint digest {old}" in r.stdout
    assert not _bob_signed(s)
    assert wd(*bob, "--expect-digest", head, "--expect-digest", old, cwd=tmp).returncode == 0


def _at_terminal(args: tuple[str, ...], answer: str, cwd: Path) -> tuple[int, str]:
    """Run ``wdelta chain ARGS`` with a terminal as its input and output, answering."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*WDELTA, *args], stdin=slave, stdout=slave,
                            stderr=subprocess.DEVNULL, cwd=cwd)  # fmt: skip
    os.close(slave)
    os.write(master, answer.encode())
    out = b""
    with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
        while block := os.read(master, 4096):
            out += block
    os.close(master)
    return proc.wait(timeout=120), out.decode(errors="replace")


def test_cli_sign_at_a_terminal_asks(cosigned: Signed) -> None:
    bob = ("sign", "store", "--trust", "root.json", "--sign", "bob.key")
    code, out = _at_terminal(bob, "n\n", cosigned.tmp)
    assert code == 2 and "sign revision 3 (head version 2)? [y/N]" in out
    assert not _bob_signed(cosigned)
    code, out = _at_terminal(bob, "y\n", cosigned.tmp)
    assert code == 0 and "signed by" in out and _bob_signed(cosigned)


def test_cli_append_below_the_threshold_says_how_to_co_sign(tmp_path: Path) -> None:
    s = signed_chain(tmp_path, keys=["alice", "bob"], threshold=2)
    for name in ("alice", "bob"):
        signing.write_json(tmp_path / f"{name}.key", key(name).to_json(), private=True)
    new = s.next_checkpoint()
    r = wd("append", "store", new, "--base", s.ckpts[1], "--trust", "root.json", "--sign",
           "alice.key", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    hint = r.stdout.splitlines()[-1]
    assert hint.startswith("revision 3 needs 1 more signature(s): co-sign with 'wdelta chain sign ")
    assert hint.endswith(f"--expect-revision 3 --expect-digest {digest_of_path(new)}'"), hint
    refused_pull(s, "signature-invalid")
    r = wd("sign", "store", "--trust", "root.json", "--sign", "bob.key", "--expect-checkpoint",
           s.ckpts[1], cwd=tmp_path)  # fmt: skip
    _error(r, "conflict", "does not add checkpoint digest")
    _error(wd("sign", "store", "--trust", "root.json", "--sign", "bob.key", "--expect-checkpoint",
              "missing.safetensors", cwd=tmp_path), "io-error", "missing")  # fmt: skip
    r = wd("sign", "store", "--trust", "root.json", "--sign", "bob.key", "--expect-checkpoint",
           new, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert s.pull().version.number == 2


# ---------------------------------------------------------------- WS-7: sign what you computed


def _shares(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "a.w": rng.standard_normal((64, 40)).astype(np.float32),
        "b.w": rng.standard_normal((64, 64)).astype(np.float16),
        "c.w": rng.standard_normal(1000).astype(np.float32),
        "d.w": np.ones(8, np.float32),
    }


def _step(w: dict[str, Any], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {n: np.where(rng.random(a.shape) < 0.2, a + a.dtype.type(0.5), a) for n, a in w.items()}


def _planted(old: dict[str, Any], k: int) -> dict[str, Any]:
    """The attacker's weights: ``k`` words of each tensor changed."""
    out = {}
    for n, a in old.items():
        flat = a.copy().reshape(-1)
        flat[:k] += flat.dtype.type(3)
        out[n] = flat.reshape(a.shape)
    return out


def _crafted(old: dict[str, Any], k: int, size: int, part: tuple[int, int, str, str],
             tmp: Path) -> bytes | None:  # fmt: skip
    """A part of exactly ``size`` bytes joining ``old`` to ``_planted(old, k)``, marked
    as ``part``, padded with an ignored header member; None if no padding fits."""
    raw = tmp / f"crafted-{part[0]}.wdelta"
    wdelta.diff(old, _planted(old, k), raw, overwrite=True)
    data = raw.read_bytes()
    n = int.from_bytes(data[16:24], "little")
    header, body = data[PREFIX_SIZE : PREFIX_SIZE + n].rstrip(b" "), data[PREFIX_SIZE + n :]
    member = {"index": part[0], "count": part[1], "base": part[2], "target": part[3]}
    text = header[:-1] + b',"part":' + json.dumps(member).encode() + b',"x":""}'
    room = size - PREFIX_SIZE - len(body)
    if room % 8 or room < len(text):
        return None
    text = text[:-2] + b"x" * (room - len(text)) + b'"}'
    return pack_prefix(text, len(body)) + text + body


class _SwapsParts(Wrapped):
    """A store that, once the trainer's parts are uploaded and verified, replaces each
    with a crafted part of the same size naming the attacker's weights (``planted``)."""

    def __init__(self, inner: Storage, old: dict[str, Any], tmp: Path) -> None:
        super().__init__(inner)
        self.old, self.tmp = old, tmp
        self.parts: list[tuple[str, int, Any]] = []
        self.lock, self.planted = threading.Lock(), None

    def put_file(self, key: str, path: Path, progress: Any = None) -> None:
        self.inner.put_file(key, path, progress)
        if key.startswith("deltas/"):
            with wdelta.open_delta(path) as d:
                if d.header.part is not None:
                    self.parts.append((key, path.stat().st_size, d.header))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with self.lock:
            if self.planted is None and any(key == p[0] for p in self.parts):
                self._swap()
        return self.inner.read_range(key, start, length)

    def _swap(self) -> None:
        ks: dict[str, int] = {}
        crafted: dict[str, bytes | None] = {}
        for name, size, h in self.parts:  # the fewest changes that pad to the genuine size
            old = {t.name: self.old[t.name] for t in h.side_tensors("base")}
            part = (h.part[0], h.part[1], h.part[2], "0" * 64)
            ks[name] = next(k for k in range(1, 400) if _crafted(old, k, size, part, self.tmp))
        self.planted: dict[str, Any] | None = {}
        for name, _, h in self.parts:
            names = [t.name for t in h.side_tensors("base")]
            self.planted |= _planted({n: self.old[n] for n in names}, ks[name])
        target = chain.weights_digest(self.planted)
        for name, size, h in self.parts:
            old = {t.name: self.old[t.name] for t in h.side_tensors("base")}
            crafted[name] = _crafted(old, ks[name], size, (*h.part[:3], target), self.tmp)
        for name, data in crafted.items():
            assert data is not None and len(data) == dict((p[0], p[1]) for p in self.parts)[name]
            (self.tmp / "swap").write_bytes(data)
            self.inner.put_file(name, self.tmp / "swap")


def test_a_trainer_signs_only_the_digests_its_ranks_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WS-7.  Two ranks publish a step as a two-part link; after both parts are uploaded
    and verified, the store swaps each for a crafted part of the same size, whose
    headers name the attacker's weights as the version.  Rank 0 takes the version's
    digests from what the ranks exchanged and reads the headers back only to compare
    them with the ones written: nothing is committed, and a node pulling every tensor
    by ranges stays at the trainer's version.  (Before WS-7, rank 0 took the version
    digest from the headers read back: the revision named the planted weights, and
    ``pull --tensors '*'`` installed them.)"""
    history = [_shares(0)]
    history.append(_step(history[0], 1))
    store = LocalStorage(tmp_path / "store")
    hostile = _SwapsParts(store, history[0], tmp_path)
    ranks = ThreadRanks(2)
    monkeypatch.setattr(distributed, "Group", ThreadRanks.adopt)

    def trainer(rank: int) -> chain.Manifest:
        c = chain.Chain(hostile, cache=tmp_path / f"cache{rank}")
        pub = distributed.DistributedPublisher(c, group=ranks.group(rank))
        for step, w in enumerate(history):
            m = pub.publish(distributed.share_of(w, rank, 2), step=step)
        return m

    got = ranks.run(trainer)
    assert isinstance(got[0], ChecksumMismatchError), got
    assert "not the part written" in str(got[0])
    assert isinstance(got[1], StorageError) and "rank 0 failed" in str(got[1])
    assert hostile.planted is not None  # the swap happened
    c = chain.Chain(store)
    assert c.head().revision == 1 and c.head().head.number == 0
    node = tmp_path / "node" / "model.safetensors"
    node.parent.mkdir()
    assert chain.pull(chain.Chain(store), node, tensors="*").version.number == 0
    with open_checkpoint(node) as ck:
        assert set(ck.tensors) == set(history[0])
