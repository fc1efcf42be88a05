"""Keys, canonical form, roots and revision signatures (SPEC.md §17.11), and the signing
commands through a subprocess, including their unhappy paths."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signkit import FAR, forged_root, key, root_file, signed_chain
from wdelta import chain
from wdelta.chain.trust import signing
from wdelta.chain.trust import updater as trust
from wdelta.chain.trust.updater import Trust, revision_payload, sign_revision, signature_key
from wdelta.errors import BadArgumentError, WdeltaError
from wdelta.format.digest import digest_bytes


def test_canonical_form_is_sorted_compact_ascii() -> None:
    doc = {"z": 1, "a": {"y": "b", "b": 2}, "format": "x"}
    assert signing.canonical(doc) == b'{"a":{"b":2,"y":"b"},"format":"x","z":1}'


def test_key_id_is_sha256_of_the_raw_public_key() -> None:
    k = key("alice")
    assert k.public.keyid == hashlib.sha256(k.public.raw).hexdigest()
    assert len(k.public.raw) == 32


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 199), st.integers(0, 7))
def test_a_signature_verifies_only_its_payload(payload: bytes, at: int, bit: int) -> None:
    k = key("alice")
    sig = k.sign(payload)
    assert sig == k.sign(payload)  # deterministic: vectors regenerate byte-identically
    assert k.public.verify(sig, payload)
    assert not key("bob").public.verify(sig, payload)
    if payload:
        flipped = bytearray(payload)
        flipped[at % len(payload)] ^= 1 << bit
        assert not k.public.verify(sig, bytes(flipped))
    assert not k.public.verify("zz" * 64, payload)


def _category(call: Callable[[], object]) -> str:
    with pytest.raises(WdeltaError) as info:
        call()
    return info.value.category


def test_make_root_checks_roles_and_thresholds(tmp_path: Path) -> None:
    r = tmp_path / "r.json"
    two_root_keys = {"root_keys": ("root", "root2"), "root_threshold": 2}
    assert _category(lambda: root_file(r, "c", ["alice"], signers=["root"],
                                       **two_root_keys)) == "signature-invalid"  # fmt: skip
    assert _category(lambda: root_file(r, "c", ["alice"], 2)) == "bad-argument"
    with pytest.raises(BadArgumentError, match="both the root and the revisions role"):
        root_file(r, "c", ["alice"], root_keys=("alice",))  # an online key cannot be a root key
    # A revisions key cannot sign a root: only the root role does.
    assert _category(lambda: root_file(r, "c", ["alice"], signers=["alice"])) == "signature-invalid"
    old = root_file(tmp_path / "r1.json", "c", ["alice"])
    for signers in (["root2"], ["root2", "alice"]):  # the old root role must sign the new root
        assert _category(lambda s=signers: root_file(  # type: ignore[misc]
            r, "c", ["bob"], root_keys=("root2",), signers=s, previous=old)) == "signature-invalid"
    new = root_file(tmp_path / "r2.json", "c", ["bob"], root_keys=("root2",),
                    signers=["root", "root2"], previous=old)  # fmt: skip
    assert new.version == 2 and chain.read_root_file(tmp_path / "r2.json") == new
    assert new.root.keyids == (key("root2").public.keyid,)
    assert new.revisions.keyids == (key("bob").public.keyid,)


def test_a_version_1_root_is_refused_as_unsupported(tmp_path: Path) -> None:
    """A root of the single-role format is refused, never read as if its keys could do
    everything; an old reader refuses a new root by its schema (closed members)."""
    root_file(tmp_path / "r.json", "c", ["alice"])
    doc = json.loads((tmp_path / "r.json").read_text())
    signed = doc["signed"]
    del signed["format_version"], signed["roles"]
    signed["threshold"] = 1
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(WdeltaError) as info:
        chain.read_root_file(tmp_path / "old.json")
    assert info.value.category == "unsupported-version" and "--revision-key" in str(info.value)


def test_tampered_root_file_is_refused(tmp_path: Path) -> None:
    root_file(tmp_path / "r.json", "c", ["alice"])
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["signed"]["roles"]["revisions"]["threshold"] = 1
    doc["signed"]["expires"] = "2098-01-01T00:00:00Z"
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(WdeltaError) as info:
        chain.read_root_file(tmp_path / "r.json")
    assert info.value.category == "signature-invalid"


def test_revision_signature_binds_chain_revision_digest(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    storage = chain.LocalStorage(s.store)
    policy = Trust.from_file(s.root)
    data = (s.store / "manifests" / "rev-000000000002.json").read_bytes()
    assert policy.check_revision(storage, 2, data) == [key("alice").public.keyid]
    with pytest.raises(WdeltaError, match="0 valid"):
        policy.check_revision(storage, 3, data)  # the same bytes as another revision
    with pytest.raises(WdeltaError, match="0 valid"):
        policy.check_revision(storage, 2, data + b" ")  # a byte more
    with pytest.raises(WdeltaError) as info:
        policy.check_revision(storage, 2, data, now=4102444800.0 + 10**8)
    assert info.value.category == "frozen"
    # Writers skip freshness (they publish the fresh revision), never validity.
    assert policy.check_revision(storage, 2, data, now=4102444800.0 + 10**8, fresh=False)


def test_threshold_two_of_three_and_co_signing(tmp_path: Path) -> None:
    s = signed_chain(tmp_path, keys=["alice", "bob", "carol"], threshold=2)
    s.publish(signers=["alice"])  # one signer so far: not yet accepted
    with pytest.raises(WdeltaError, match="1 valid signatures of trusted keys, 2 needed"):
        s.pull()
    data = (s.store / "manifests" / "rev-000000000003.json").read_bytes()
    storage = chain.LocalStorage(s.store)
    Trust.from_file(s.root).sign(storage, 3, data, [key("bob")], FAR)  # the second place
    assert s.pull().version.number == 2


def test_a_signature_object_in_the_way_is_a_conflict(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    data = (s.store / "manifests" / "rev-000000000002.json").read_bytes()
    policy, storage = Trust.from_file(s.root), chain.LocalStorage(s.store)
    policy.sign(storage, 2, data, [key("alice")], FAR)  # an identical-key re-sign is fine
    other = sign_revision(key("alice"), revision_payload("test/run", 1, data, FAR))
    (s.store / signature_key(digest_bytes(data), other.keyid)).write_bytes(other.to_bytes())
    with pytest.raises(WdeltaError) as info:
        policy.sign(storage, 2, data, [key("alice")], FAR)
    assert info.value.category == "conflict"


def test_api_trust_on_pull_load_and_follow_weights(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    weights, v = chain.load(chain.Chain(s.store, tmp_path / "lcache"), trust=s.root)
    assert v.number == 1
    s.publish()
    seen: list[str] = []
    fcache = chain.Chain(s.store, tmp_path / "fcache")
    with pytest.raises(BadArgumentError, match="needs a state file"):  # else a restart forgets
        next(chain.follow_weights(fcache, weights, at=1, trust=s.root, max_polls=1))
    follower = chain.follow_weights(
        fcache, weights, at=1, trust=s.root, state=tmp_path / "fstate.json", interval=0,
        max_polls=2, backoff=(0.0, 0.0), on_error=lambda e, n: seen.append(e.category),
    )  # fmt: skip
    assert next(follower).number == 2
    evil = s.next_checkpoint()
    chain.append(chain.Chain(s.store, tmp_path / "ecache"), evil, s.ckpts[-2])
    assert list(follower) == [] and seen == ["signature-invalid"]  # weights stay at 2
    for call in (
        lambda: chain.load(chain.Chain(s.store, tmp_path / "lcache"), trust=s.root),
        lambda: chain.pull(chain.Chain(s.store, tmp_path / "pcache"), s.node, trust=s.root),
    ):
        with pytest.raises(WdeltaError) as info:
            call()
        assert info.value.category == "signature-invalid"
    assert chain.load(chain.Chain(s.store, tmp_path / "lcache"))[1].number == 3  # no policy


# ---------------------------------------------------------------- command line

WDELTA = [sys.executable, "-m", "wdelta", "chain"]


def wd(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WDELTA, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)  # fmt: skip


def test_cli_publish_signed_pull_rotate(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)  # the checkpoints; the chain is rebuilt through the CLI
    for name, role in (("root", "root"), ("alice", "revisions"), ("bob", None)):
        labelled = ("--role", role) if role else ()
        r = wd("keygen", f"{name}.key", *labelled, cwd=tmp_path)
        said = f"{role} key " if role else "key "
        assert r.returncode == 0 and r.stdout.startswith(said), r.stderr
        assert os.stat(tmp_path / f"{name}.key").st_mode & 0o077 == 0
    r = wd("root", "r1.json", "--chain-id", "acme/run", "--root-key", "root.key.pub",
           "--revision-key", "alice.key.pub", "--sign", "root.key", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0 and "root role 1 of 1 keys, revisions role 1 of 1" in r.stdout
    signed = ("--trust", "r1.json", "--sign", "alice.key")
    assert wd("init", "cli", s.ckpts[0], *signed, cwd=tmp_path).returncode == 0
    assert wd("append", "cli", s.ckpts[1], "--base", s.ckpts[0], *signed,
              cwd=tmp_path).returncode == 0  # fmt: skip
    r = wd("pull", "cli", "n.safetensors", "--trust", "r1.json", cwd=tmp_path)
    assert r.returncode == 0 and "version 1" in r.stdout and r.stderr == "", r.stderr
    r = wd("pull", "cli", "m.safetensors", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.count("not authenticated") == 1
    r = wd("pull", "cli", "q.safetensors", "-q", cwd=tmp_path)  # quiet: no output on success
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
    r = wd("log", "cli", "--trust", "r1.json", cwd=tmp_path)
    assert f"signed by {key_of(tmp_path / 'alice.key.pub')[:16]}" in r.stdout
    assert "(unverified" in wd("log", "cli", cwd=tmp_path).stdout
    # Rotation: the offline root key hands the revisions over from alice to bob; bob
    # co-signs the head, then publishes. Alice's online key cannot sign a root.
    rotate = ("root", "r2.json", "--previous", "r1.json", "--root-key", "root.key.pub",
              "--revision-key", "bob.key.pub")  # fmt: skip
    r = wd(*rotate, "--sign", "alice.key", cwd=tmp_path)  # labelled: refused by its label
    assert r.returncode == 2 and "--sign takes root keys" in r.stderr, r.stderr
    r = wd(*rotate, "--sign", "bob.key", cwd=tmp_path)  # unlabelled: by the signature check
    assert r.returncode == 1 and "error: signature-invalid: " in r.stderr, r.stderr
    assert wd(*rotate, "--sign", "root.key", cwd=tmp_path).returncode == 0
    assert wd("rotate", "cli", "r2.json", cwd=tmp_path).returncode == 0
    r = wd("pull", "cli", "n.safetensors", "--trust", "r1.json", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("error: signature-invalid: "), r.stderr
    # A root 3 written with bob's (online) key as its root key: refused by rotate.
    (tmp_path / "evil.json").write_bytes(forged_root(3, "acme/run", ["bob"], ["mallory"], ["bob"]))
    r = wd("rotate", "cli", "evil.json", cwd=tmp_path)
    assert r.returncode == 1 and "root keys of root version 2" in r.stderr, r.stderr
    assert not (tmp_path / "cli" / "trust" / "root-000000000003.json").exists()
    r = wd("sign", "cli", "--trust", "r1.json", "--sign", "bob.key", "--yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = wd("append", "cli", s.next_checkpoint(), "--base", s.ckpts[1], "--trust", "r1.json",
           "--sign", "bob.key", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = wd("pull", "cli", "n.safetensors", "--trust", "r1.json", cwd=tmp_path)
    assert r.returncode == 0 and "version 2" in r.stdout, r.stderr
    r = wd("refresh", "cli", "--trust", "r1.json", "--sign", "bob.key", cwd=tmp_path)
    assert r.returncode == 0 and "signatures renewed" in r.stdout, r.stderr


def key_of(public: Path) -> str:
    return signing.load_public_key(public).keyid


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    signing.write_json(d / "k", key("alice").to_json(), private=True)
    signing.write_json(d / "k.pub", key("alice").public.to_json())
    (d / "open.key").write_text(json.dumps(key("alice").to_json()))
    os.chmod(d / "open.key", 0o644)
    (d / "page.html").write_text("<!doctype html><html><body>Sign in</body></html>\n")
    (d / "x.wdelta").write_bytes(b"WDELTA\x00\x01" + bytes(56))
    root_file(d / "root.json", "acme/run", ["alice"])
    signing.write_json(d / "r", key("root").to_json(), private=True)
    signing.write_json(d / "r.pub", key("root").public.to_json())
    for role in ("root", "revisions"):  # labelled by keygen --role
        signing.write_json(d / role, {**key(role).to_json(), "role": role}, private=True)
        signing.write_json(d / f"{role}.pub", {**key(role).public.to_json(), "role": role})
    return d


@pytest.mark.parametrize(
    ("args", "category", "words"),
    [
        (("append", "s", "c.st", "--base", "b.st", "--sign", "k"), "bad-argument", "trust root"),
        (("append", "s", "c.st", "--base", "b.st", "--trust", "root.json", "--sign", "missing"),
         "io-error", "missing"),
        (("append", "s", "c.st", "--base", "b.st", "--trust", "root.json", "--sign", "x.wdelta"),
         "bad-argument", "not a signing key file"),
        (("append", "s", "c.st", "--base", "b.st", "--trust", "root.json", "--sign", "open.key"),
         "bad-argument", "chmod 600"),
        (("append", "s", "c.st", "--base", "b.st", "--trust", "root.json", "--sign", "k.pub"),
         "bad-argument", "a public key, not a private"),
        (("pull", "s", "n.st", "--trust", "k"), "bad-argument", "not a trust root"),
        (("pull", "s", "n.st", "--trust", "page.html"), "bad-argument", "not a trust root"),
        (("pull", "s", "n.st", "--trust", "."), "bad-argument", "folder"),
        (("sign", "s", "--trust", "root.json", "--sign", "page.html"), "bad-argument",
         "not a signing key file"),
        (("root", "r.json", "--chain-id", "bad id", "--root-key", "r.pub", "--revision-key",
          "k.pub", "--sign", "r"), "bad-argument", "invalid root"),
        (("root", "r.json", "--chain-id", "c", "--root-key", "r", "--revision-key", "k.pub",
          "--sign", "r"), "bad-argument", "not a public key"),
        (("root", "r.json", "--chain-id", "c", "--root-key", "k.pub", "--revision-key", "k.pub",
          "--sign", "k"), "bad-argument", "both the root and the revisions role"),
        (("root", "r.json", "--chain-id", "c", "--revision-key", "k.pub", "--sign", "r"),
         "bad-argument", "--root-key"),
        (("root", "r.json", "--chain-id", "c", "--root-key", "r.pub", "--revision-key", "k.pub",
          "--sign", "k"), "signature-invalid", "root keys"),
        (("root", "r.json", "--chain-id", "c", "--root-key", "revisions.pub", "--revision-key",
          "k.pub", "--sign", "r"), "bad-argument", "--root-key takes root keys"),
        (("root", "r.json", "--chain-id", "c", "--root-key", "r.pub", "--revision-key",
          "root.pub", "--sign", "r"), "bad-argument", "--revision-key takes revisions keys"),
        (("root", "r.json", "--chain-id", "c", "--root-key", "r.pub", "--revision-key", "k.pub",
          "--sign", "revisions"), "bad-argument", "--sign takes root keys"),
        (("append", "s", "c.st", "--base", "b.st", "--trust", "root.json", "--sign", "root"),
         "bad-argument", "keep root keys offline"),
        (("sign", "s", "--trust", "root.json", "--sign", "root"), "bad-argument",
         "keep root keys offline"),
        (("keygen", "k"), "bad-argument", "exists"),
        (("rotate", "s", "page.html"), "bad-argument", "not a trust root"),
    ],
)  # fmt: skip
def test_cli_unhappy_paths(keys: Path, args: tuple[str, ...], category: str, words: str) -> None:
    r = wd(*args, cwd=keys)
    assert r.returncode == (2 if category == "bad-argument" else 1), r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {category}: "), r.stderr
    assert words in lines[0], lines[0]
    assert not (keys / "r.json").exists() and not (keys / "s").exists()


def test_trust_module_rejects_a_root_walk_that_skips_a_chain(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    old = chain.read_root_file(s.root)
    other = root_file(tmp_path / "other.json", "other/run", ["alice"])
    doc = other.to_json()
    doc["signed"]["version"] = 2
    (s.store / "trust" / "root-000000000002.json").write_text(json.dumps(doc))
    with pytest.raises(WdeltaError) as info:
        Trust(old).update(chain.LocalStorage(s.store))
    assert info.value.category == "signature-invalid" and "other/run" in str(info.value)


def test_signed_squash_and_prune_keep_the_chain_verifiable(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    for _ in range(3):
        s.publish()
    w = s.writer()
    chain.squash(w, 1, 4, base=s.ckpts[1])
    m, deleted = chain.prune(w, chain.Policy(10, 1, 2))
    revisions = chain.Chain(s.store).revisions()
    assert len(revisions) == 2 and m.revision == revisions[-1]
    digests = {digest_bytes((s.store / f"manifests/rev-{r:012d}.json").read_bytes())
               for r in revisions}  # fmt: skip
    signed = {o.key.split("/")[1] for o in chain.LocalStorage(s.store).list("signatures/")}
    assert signed == digests  # no orphaned signature objects
    assert any(k.startswith("signatures/") for k in deleted)
    assert s.pull().version.number == 4
    assert s.node.read_bytes() == s.ckpts[4].read_bytes()


def test_the_kept_root_must_be_of_the_same_chain(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    kept = trust.root_state_beside(s.node)
    assert not kept.exists()  # the trust file's own root is not worth keeping
    other = root_file(tmp_path / "other.json", "other/run", ["alice"])
    kept.write_text(json.dumps({"format": "wdelta-kept-roots", "roots": [other.to_json()]}))
    with pytest.raises(WdeltaError) as info:
        s.pull()
    assert info.value.category == "bad-argument" and "other/run" in str(info.value)
    kept.unlink()
    assert s.pull(chain.Chain(s.store, tmp_path / "ncache", trust=s.root)).version.number == 1


def test_a_fifo_or_folder_as_a_key_or_trust_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO put where a trust root or key goes must not hang the node (its size
    is 0 to stat, and reading it would block for a writer)."""
    fifo = tmp_path / "root.json"
    os.mkfifo(fifo)
    for read in (chain.read_root_file, signing.load_signing_key, signing.load_public_key):
        with pytest.raises(BadArgumentError, match="not a file"):
            read(fifo)
        with pytest.raises(BadArgumentError, match="a folder"):
            read(tmp_path)
