"""One test per row of SPEC.md §15 "Chains under attack": the attacker writes straight
into the chain's storage (a local folder, or a loopback S3 mirror); a node with a trust
policy refuses, with a stable category, and keeps its checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from chainkit import S3Server, ThreadRanks, Wrapped
from signkit import FAR, PAST, Signed, forged_root, key, root_file, signed_chain
from wdelta import chain
from wdelta.chain.live import group_follow
from wdelta.chain.model.manifest import revision_key
from wdelta.chain.storage.base import Storage
from wdelta.chain.storage.s3 import S3Storage
from wdelta.chain.trust import acceptance
from wdelta.chain.trust.updater import (
    read_kept_roots,
    revision_payload,
    root_state_beside,
    sign_revision,
    signature_key,
)
from wdelta.errors import WdeltaError
from wdelta.format.digest import digest_bytes


def refused(category: str, s: Signed, c: chain.Chain | None = None) -> WdeltaError:
    """The node's pull fails with ``category`` and its checkpoint is unchanged."""
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:
        s.pull(c)
    assert info.value.category == category, info.value
    assert s.node.read_bytes() == before
    return info.value


def head_bytes(s: Signed) -> tuple[int, bytes]:
    r = chain.Chain(s.store).revisions()[-1]
    return r, (s.store / revision_key(r)).read_bytes()


def test_arbitrary_weights(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    evil = s.next_checkpoint()
    chain.append(chain.Chain(s.store, tmp_path / "ecache"), evil, s.ckpts[-2])  # unsigned
    refused("signature-invalid", s)
    # The attacker's own key, in a root the attacker wrote, under the same chain id.
    s.ckpts.pop()
    (s.store / revision_key(3)).unlink()
    root_file(tmp_path / "evil-root.json", "test/run", ["mallory"])
    c = chain.Chain(s.store, tmp_path / "ecache", trust=tmp_path / "evil-root.json",
                    sign=[key("mallory")])  # fmt: skip
    with pytest.raises(WdeltaError, match="signature"):
        chain.append(c, evil, s.ckpts[-1])  # WS-1: it cannot even extend the signed head
    _forge_revision(s, "mallory")
    refused("signature-invalid", s)


def _forge_revision(s: Signed, signer: str) -> bytes:
    """Revision head+1 with the head's content, signed by ``signer`` into the store."""
    r, data = head_bytes(s)
    doc = json.loads(data)
    doc["revision"], doc["parent"] = r + 1, {"revision": r, "digest": digest_bytes(data)}
    new = (json.dumps(doc, indent=2) + "\n").encode()
    obj = sign_revision(key(signer), revision_payload("test/run", r + 1, new, FAR))
    target = s.store / signature_key(digest_bytes(new), obj.keyid)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(obj.to_bytes())
    (s.store / revision_key(r + 1)).write_bytes(new)
    return new


def test_rollback(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    s.publish()  # revision 3
    s.publish()  # revision 4
    node = s.node_chain()
    s.pull(node)
    assert s.node.read_bytes() == s.ckpts[3].read_bytes()
    (s.store / revision_key(4)).unlink()  # storage rolled back to revision 3
    refused("manifest-invalid", s, node)  # RD-1 within the process
    refused("manifest-invalid", s)  # restarted: the accepted revision persists beside it
    # A node that remembers nothing is sent back, but only until revision 3's signatures
    # expire: here, the same signature as it reads once its expiry has passed.
    r, data = head_bytes(s)
    old = sign_revision(key("alice"), revision_payload("test/run", r, data, PAST))
    (s.store / signature_key(digest_bytes(data), old.keyid)).write_bytes(old.to_bytes())
    with pytest.raises(WdeltaError) as info:
        chain.pull(s.node_chain(), tmp_path / "new" / "m.safetensors", state=False)
    assert info.value.category == "frozen"


def test_indefinite_freeze(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    s.publish_expired()  # the newest revision the storage keeps serving
    # Without a policy (and told to forget that the node required one), silently served.
    chain.pull(chain.Chain(s.store, tmp_path / "ncache"), s.node, allow_unsigned=True)
    s.node.write_bytes(s.ckpts[1].read_bytes())
    err = refused("frozen", s)
    assert "frozen" in str(err)
    errors: list[str] = []
    with pytest.raises(WdeltaError, match="frozen"):
        chain.follow(s.node_chain(), s.node, interval=0, max_iterations=2, sleep=lambda t: None,
                     on_error=lambda e, d: errors.append(e.category))  # fmt: skip
    assert errors == ["frozen"] and s.node.read_bytes() == s.ckpts[1].read_bytes()
    w = s.writer()
    w.publish(lambda cur: cur.successor())  # WS-4: the writer refreshes the expiry
    assert s.pull().version.number == 2


def test_mix_and_match(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    r, data = head_bytes(s)
    digest = digest_bytes(data)
    sig = s.store / signature_key(digest, key("alice").public.keyid)
    # A manifest of the attacker's (another link digest), the genuine signature moved to it.
    doc = json.loads(data)
    doc["links"][-1]["digest"] = doc["links"][0]["digest"]
    forged = (json.dumps(doc, indent=2) + "\n").encode()
    moved = s.store / signature_key(digest_bytes(forged), key("alice").public.keyid)
    moved.parent.mkdir(parents=True)
    shutil.copy(sig, moved)
    (s.store / revision_key(r)).write_bytes(forged)
    refused("signature-invalid", s)
    # An older revision's signature object under the genuine head's digest.
    (s.store / revision_key(r)).write_bytes(data)
    old = digest_bytes((s.store / revision_key(r - 1)).read_bytes())
    shutil.copy(s.store / signature_key(old, key("alice").public.keyid), sig)
    refused("signature-invalid", s)


class _Counting(Wrapped):
    """A storage that counts the bytes it streams (to see where a download stops)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.streamed = 0

    def stream(self, key: str, start: int = 0) -> Any:
        for block in self.inner.stream(key, start):
            self.streamed += len(block)
            yield block


def test_endless_data(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    link = chain.Chain(s.store).head().links[-1]
    endless = 256 << 20
    with open(s.store / link.key, "r+b") as f:
        f.truncate(endless)  # sparse: 256 MiB of zeros after the genuine bytes
    counting = _Counting(chain.LocalStorage(s.store))
    refused("checksum-mismatch", s, chain.Chain(counting, tmp_path / "ncache", trust=s.root))
    assert counting.streamed < link.size + (64 << 20)  # stopped within a block of the size
    assert not any((tmp_path / "ncache" / "partial").iterdir())
    # A signature object far larger than any signature is not read: no valid signature.
    (tmp_path / "b").mkdir()
    s2 = signed_chain(tmp_path / "b")
    sig = s2.store / signature_key(digest_bytes(head_bytes(s2)[1]), key("alice").public.keyid)
    with open(sig, "r+b") as f:
        f.truncate(1 << 30)
    counting = _Counting(chain.LocalStorage(s2.store))
    refused("signature-invalid", s2, chain.Chain(counting, tmp_path / "ncache", trust=s2.root))
    assert counting.streamed < 1 << 20



def _mirror(s: Signed, s3: S3Server) -> S3Storage:
    """A copy of the chain in a loopback S3 bucket (what a mirror serves)."""
    mirror = S3Storage(s3.new_bucket(), "mirror", client=s3.client())
    for path in s.store.rglob("*"):
        if path.is_file():
            mirror.put_file(str(path.relative_to(s.store)), path)
    return mirror


def test_malicious_mirror(tmp_path: Path, s3: S3Server) -> None:
    s = signed_chain(tmp_path)
    s.publish()
    mirror = _mirror(s, s3)
    faithful = chain.Chain(mirror, tmp_path / "mcache", trust=s.root)
    assert chain.pull(faithful, s.node).version.number == 2  # signatures travel with it
    # The mirror serves a version of its own, unsigned, with files that match its manifest.
    evil = s.next_checkpoint()
    chain.append(chain.Chain(mirror, tmp_path / "ecache"), evil, s.ckpts[-2])
    refused("signature-invalid", s, chain.Chain(mirror, tmp_path / "mcache", trust=s.root))


def test_key_compromise(tmp_path: Path) -> None:
    s = signed_chain(tmp_path, keys=["alice", "bob", "carol"], threshold=2)
    s.publish(signers=["carol"])  # one stolen key of a 2-of-3 root signs a revision
    refused("signature-invalid", s)
    # Revocation: a 1-of-2 root, carol's key stolen; root 2 drops carol.
    (tmp_path / "one").mkdir()
    t = signed_chain(tmp_path / "one", keys=["alice", "carol"], threshold=1, signers=["alice"])
    old = chain.read_root_file(t.root)
    root_file(t.tmp / "root2.json", "test/run", ["alice"], previous=old)  # by the root key
    t.store.joinpath("trust", "root-000000000002.json").write_bytes(
        (t.tmp / "root2.json").read_bytes()
    )
    _forge_revision(t, "carol")
    refused("signature-invalid", t)  # the node walked to root 2 (SG-2)
    # Deleting root 2 does not undo the revocation for a node that has seen it, even
    # restarted from the old trust file: it keeps the newest root beside its checkpoint.
    (t.store / "trust" / "root-000000000002.json").unlink()
    refused("signature-invalid", t)
    assert read_kept_roots(root_state_beside(t.node))[-1].version == 2
    (t.store / "trust" / "root-000000000002.json").write_bytes((t.tmp / "root2.json").read_bytes())
    # A root 3 the attacker wrote itself, signed by carol only.
    (t.store / revision_key(3)).unlink()
    evil = forged_root(3, "test/run", ["carol"], ["mallory"], ["carol"])
    t.store.joinpath("trust", "root-000000000003.json").write_bytes(evil)
    err = refused("signature-invalid", t)
    assert "root-000000000003" in str(err)


def test_a_stolen_online_key_cannot_rewrite_the_trust(tmp_path: Path) -> None:
    """The revisions key (online, the trainer's) signs revisions only: holding it at
    threshold, an attacker publishes (until rotation) but cannot write a root that
    makes its key permanent or drops the publisher's, nor sign one with the old root's
    revisions role (SG-2 counts root-role signatures only)."""
    s = signed_chain(tmp_path)  # root role: "root" (offline); revisions role: alice
    for root_keys in (["alice"], ["mallory"]):
        evil = forged_root(2, "test/run", root_keys, ["eve"], ["alice", "mallory"])
        s.store.joinpath("trust", "root-000000000002.json").write_bytes(evil)
        _forge_revision(s, "eve")
        err = refused("signature-invalid", s)
        assert "root keys of root version 1" in str(err)
        (s.store / revision_key(3)).unlink()
    assert not root_state_beside(s.node).exists()  # nothing of it was kept
    # A root of the single-role format, self-signed by alice, is refused too.
    old = json.loads(evil)
    del old["signed"]["format_version"], old["signed"]["roles"]
    old["signed"]["threshold"] = 1
    s.store.joinpath("trust", "root-000000000002.json").write_text(json.dumps(old))
    refused("unsupported-version", s)


def test_wrong_chain_replay(tmp_path: Path) -> None:
    s = signed_chain(tmp_path, chain_id="acme/a")
    s.publish()
    root_b = tmp_path / "root-b.json"
    root_file(root_b, "acme/b", ["alice"])  # same key, another chain
    with pytest.raises(WdeltaError) as info:  # a fresh node of chain b, chain a's store
        chain.pull(s.node_chain(root_b), tmp_path / "b.safetensors", state=False)
    assert info.value.category == "signature-invalid"
    # The node of chain a, given chain b's root: its state names chain a.
    assert refused("bad-argument", s, s.node_chain(root_b)).args[0].count("acme/a") == 1


def test_fast_forward(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    node = s.node_chain()
    s.pull(node)
    far = s.store / revision_key(999_999_999)
    far.write_bytes(head_bytes(s)[1])
    refused("signature-invalid", s, node)
    assert node.seen_revision == 2  # nothing was accepted from the unsigned revision
    far.unlink()  # the storage's owner removes it
    s.publish()
    assert s.pull(node).version.number == 2


def test_in_memory_follower_keeps_the_revocation(tmp_path: Path) -> None:
    """load / follow_weights with a state file keep the newest root beside it, as pull
    keeps it beside its checkpoint: a restarted follower is not fooled by a deleted root."""
    t = signed_chain(tmp_path, keys=["alice", "carol"], threshold=1, signers=["alice"])
    old = chain.read_root_file(t.root)
    root_file(t.tmp / "root2.json", "test/run", ["alice"], previous=old)
    root2 = t.store / "trust" / "root-000000000002.json"
    root2.write_bytes((t.tmp / "root2.json").read_bytes())
    state = tmp_path / "follower" / "state.json"
    state.parent.mkdir()
    weights, _ = chain.load(t.node_chain(), trust=t.root, state=state)  # walks to root 2
    assert read_kept_roots(root_state_beside(state))[-1].version == 2
    root2.unlink()  # the attacker deletes the revocation and signs with the stolen key
    _forge_revision(t, "carol")
    with pytest.raises(WdeltaError) as info:
        chain.load(t.node_chain(), trust=t.root, state=state)
    assert info.value.category == "signature-invalid"
    before = {name: w.copy() for name, w in weights.items()}
    polls = chain.follow_weights(t.node_chain(), weights, at=1, trust=t.root, state=state,
                                 max_polls=1, interval=0.0)  # fmt: skip
    with pytest.raises(WdeltaError) as info:  # its first read of the head is refused
        list(polls)
    assert info.value.category == "signature-invalid"
    assert all((weights[n] == before[n]).all() for n in before)


def test_a_restarted_group_keeps_the_revocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """follow_in_group keeps the revision it accepted and the roots it reached in its
    state file, as pull does: restarted after the store deleted the root that revoked
    carol's key, the group refuses a version carol signed and keeps its weights.  (Before,
    a group kept no trust state at all, and a restarted one accepted that version.)"""
    monkeypatch.setattr(group_follow, "Group", ThreadRanks.adopt)
    t = signed_chain(tmp_path, keys=["alice", "carol"], threshold=1, signers=["alice"])
    root_file(t.tmp / "root2.json", "test/run", ["alice"], previous=chain.read_root_file(t.root))
    root2 = t.store / "trust" / "root-000000000002.json"
    root2.write_bytes((t.tmp / "root2.json").read_bytes())
    state = tmp_path / "group" / "state.json"
    state.parent.mkdir()
    weights, _ = chain.load(t.node_chain(), trust=t.root, state=state)

    def follow(**more: Any) -> list[chain.Version]:
        rank = ThreadRanks(1).group(0)
        polls = group_follow.follow_in_group(t.node_chain(), weights, at=1, max_polls=1,
                                             interval=0, group=rank, **more)  # fmt: skip
        return list(polls)

    with pytest.raises(WdeltaError, match="needs a state file"):
        follow(trust=t.root)
    assert follow(trust=t.root, state=state) == []  # nothing new; root 2 kept beside state
    root2.unlink()  # the attacker deletes the revocation and publishes with carol's key
    t.publish(signers=["carol"])
    before = {n: w.copy() for n, w in weights.items()}
    with pytest.raises(WdeltaError) as info:
        follow(trust=t.root, state=state)
    assert info.value.category == "signature-invalid"
    assert all((weights[n] == before[n]).all() for n in before)


def _forge_far(s: Signed, signer: str, revision: int) -> None:
    """Revision ``revision`` (far above the head) with the head's content, signed by
    ``signer``: what a stolen revisions key publishes to fast-forward the nodes."""
    data = head_bytes(s)[1]
    doc = json.loads(data)
    doc["revision"], doc["parent"] = revision, {"revision": revision - 1, "digest": "0" * 64}
    new = (json.dumps(doc, indent=2) + "\n").encode()
    obj = sign_revision(key(signer), revision_payload("test/run", revision, new, FAR))
    target = s.store / signature_key(digest_bytes(new), obj.keyid)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(obj.to_bytes())
    (s.store / revision_key(revision)).write_bytes(new)


def _store_root(s: Signed, version: int, data: bytes) -> None:
    (s.store / "trust" / f"root-{version:012d}.json").write_bytes(data)


def test_fast_forward_recovery_by_root_rotation(tmp_path: Path) -> None:
    """A stolen revisions key (carol) publishes revision 999999999999 and nodes accept
    it. Rolling the storage back is refused; a root the attacker signs is refused; a
    rotation that keeps carol changes nothing; the offline root key's rotation that
    revokes carol releases the nodes from it, and they accept the writer's next revision
    without --accept-rollback (SG-10)."""
    s = signed_chain(tmp_path, keys=["alice", "carol"], threshold=1, signers=["alice"])
    node = s.node_chain()  # a long-running node: what it read is also in memory
    far = 999_999_999_999
    _forge_far(s, "carol", far)
    assert s.pull(node).revision == far
    (s.store / revision_key(far)).unlink()  # the operator cleans the storage up
    refused("manifest-invalid", s, node)
    refused("manifest-invalid", s)  # restarted: the state file
    # Without the root key, the attacker cannot release the nodes.
    _store_root(s, 2, forged_root(2, "test/run", ["carol2"], ["carol"], ["carol", "carol2"]))
    refused("signature-invalid", s)
    # A rotation that keeps carol (adds dave) leaves the record binding.
    root1 = chain.read_root_file(s.root)
    root2 = root_file(tmp_path / "r2.json", "test/run", ["alice", "carol", "dave"], previous=root1)
    _store_root(s, 2, root2.to_bytes())
    refused("manifest-invalid", s)
    # The rotation that revokes carol: the nodes start afresh from the head.
    root3 = root_file(tmp_path / "r3.json", "test/run", ["alice", "dave"], previous=root2)
    _store_root(s, 3, root3.to_bytes())
    new = s.publish()  # revision 3, signed by alice
    assert s.pull(node).revision == 3
    assert s.node.read_bytes() == new.read_bytes()
    state = acceptance.load(acceptance.state_beside(s.node))
    assert state is not None and state.revision == 3 and state.trust is not None
    assert state.trust.root == 3 and state.trust.signers == (key("alice").public.keyid,)
    # From there on RD-1 binds again.
    s.publish()
    assert s.pull().revision == 4
    (s.store / revision_key(4)).unlink()
    refused("manifest-invalid", s)


def test_a_planted_kept_root_does_not_override_the_trust_file(tmp_path: Path) -> None:
    """Whoever can write the node's folder plants a root (self-signed, same chain id)
    where the node keeps the roots it walked to: it must descend, root by root, from
    the operator's trust file, or the node refuses (and keeps its checkpoint)."""
    s = signed_chain(tmp_path)
    kept = root_state_beside(s.node)
    evil = forged_root(2, "test/run", ["mallory"], ["eve"], ["mallory"])
    _forge_revision(s, "eve")
    kept.write_bytes(evil)  # a single root, as kept before roots were chained
    refused("bad-argument", s)
    genuine = root_file(tmp_path / "r2.json", "test/run", ["alice"], previous=s_root(s))
    for roots in ([evil], [genuine.to_bytes(), forged_root(3, "test/run", ["mallory"], ["eve"],
                                                            ["mallory"])]):  # fmt: skip
        docs = [json.loads(r) for r in roots]
        kept.write_text(json.dumps({"format": "wdelta-kept-roots", "roots": docs}))
        err = refused("signature-invalid", s)
        assert str(kept) in str(err) and "does not descend from trust root version 1" in str(err)
    # The genuine root 2 alone is resumed from (the node is then at root 2).
    kept.write_text(json.dumps({"format": "wdelta-kept-roots", "roots": [genuine.to_json()]}))
    refused("signature-invalid", s)  # eve is not trusted by root 2 either
    policy = chain.Trust.from_file(s.root)
    policy.resume(kept)
    assert policy.root.version == 2


def s_root(s: Signed) -> chain.Root:
    return chain.read_root_file(s.root)


def test_fast_forward_recovery_when_the_only_trainer_key_was_stolen(tmp_path: Path) -> None:
    """The trainer's only key (alice) is stolen: the root key hands the revisions to bob,
    bob co-signs the last genuine revision (the head once the attacker's are deleted) and
    publishes; the node, which accepted the thief's revision 999999999999, follows."""
    s = signed_chain(tmp_path)
    _forge_far(s, "alice", 999_999_999_999)
    assert s.pull().revision == 999_999_999_999
    root2 = root_file(tmp_path / "r2.json", "test/run", ["bob"], previous=s_root(s))
    _store_root(s, 2, root2.to_bytes())
    (s.store / revision_key(999_999_999_999)).unlink()
    r, data = head_bytes(s)
    chain.Trust.from_file(s.root).sign(chain.LocalStorage(s.store), r, data, [key("bob")], FAR)
    new = s.publish(signers=["bob"])
    assert s.pull().revision == 3 and s.node.read_bytes() == new.read_bytes()
