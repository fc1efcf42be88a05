"""One test per row of SPEC.md §15 "Chains under attack": the attacker writes straight
into the chain's storage (a local folder, or a loopback S3 mirror); a node with a trust
policy refuses, with a stable category, and keeps its checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from chainkit import S3Server, Wrapped
from signkit import FAR, PAST, Signed, key, root_file, signed_chain
from wdelta import chain
from wdelta.chain.manifest import revision_key
from wdelta.chain.storage.base import Storage
from wdelta.chain.storage.s3 import S3Storage
from wdelta.chain.trust import (
    revision_payload,
    root_state_beside,
    sign_revision,
    signature_key,
)
from wdelta.digest import digest_bytes
from wdelta.errors import WdeltaError


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
    target.parent.mkdir(parents=True)
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
    s.pull(chain.Chain(s.store, tmp_path / "ncache"))  # without a policy: silently served
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


@pytest.fixture(scope="module")
def s3() -> Any:
    server = S3Server()
    yield server
    server.stop()


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
    root_file(t.tmp / "root2.json", "test/run", ["alice"], 1, ["alice"], previous=old)
    t.store.joinpath("trust", "root-000000000002.json").write_bytes(
        (t.tmp / "root2.json").read_bytes()
    )
    _forge_revision(t, "carol")
    refused("signature-invalid", t)  # the node walked to root 2 (SG-2)
    # Deleting root 2 does not undo the revocation for a node that has seen it, even
    # restarted from the old trust file: it keeps the newest root beside its checkpoint.
    (t.store / "trust" / "root-000000000002.json").unlink()
    refused("signature-invalid", t)
    assert chain.read_root_file(root_state_beside(t.node)).version == 2
    (t.store / "trust" / "root-000000000002.json").write_bytes((t.tmp / "root2.json").read_bytes())
    # A root 3 the attacker wrote itself, signed by carol only.
    (t.store / revision_key(3)).unlink()
    root_file(t.tmp / "evil2.json", "test/run", ["carol"], 1, ["carol"], previous=None)
    evil2 = json.loads((t.tmp / "evil2.json").read_text())
    evil2["signed"]["version"] = 3
    t.store.joinpath("trust", "root-000000000003.json").write_text(json.dumps(evil2))
    err = refused("signature-invalid", t)
    assert "root-000000000003" in str(err)


def test_wrong_chain_replay(tmp_path: Path) -> None:
    s = signed_chain(tmp_path, chain_id="acme/a")
    s.publish()
    root_b = tmp_path / "root-b.json"
    root_file(root_b, "acme/b", ["alice"])  # same key, another chain
    refused("signature-invalid", s, s.node_chain(root_b))


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
    root_file(t.tmp / "root2.json", "test/run", ["alice"], 1, ["alice"], previous=old)
    root2 = t.store / "trust" / "root-000000000002.json"
    root2.write_bytes((t.tmp / "root2.json").read_bytes())
    state = tmp_path / "follower" / "state.json"
    state.parent.mkdir()
    weights, _ = chain.load(t.node_chain(), trust=t.root, state=state)  # walks to root 2
    assert chain.read_root_file(root_state_beside(state)).version == 2
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
