"""Helpers for the signed-chain tests: fixed test keys, roots, a small signed chain
and a node that pulled it with a trust policy."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from chainkit import Trainer
from wdelta import chain
from wdelta.chain.model.manifest import revision_key
from wdelta.chain.trust import signing
from wdelta.chain.trust import updater as trust
from wdelta.limits import MAX_MANIFEST_BYTES

FAR = "2099-01-01T00:00:00Z"
PAST = "2001-01-01T00:00:00Z"


def key(name: str) -> signing.SigningKey:
    """A fixed test key derived from ``name`` (Ed25519 signatures are deterministic)."""
    return signing.SigningKey(hashlib.sha256(f"wdelta test key {name}".encode()).digest())


def root_file(
    path: Path, chain_id: str, keys: list[str], threshold: int = 1,
    signers: list[str] | None = None, previous: trust.Root | None = None, expires: str = FAR,
    root_keys: tuple[str, ...] = ("root",), root_threshold: int = 1,
) -> trust.Root:  # fmt: skip
    """A root whose revisions role is ``keys`` (``threshold``) and whose root role is
    ``root_keys`` (the offline key "root" by default), signed by ``signers`` (default:
    the root keys)."""
    r = trust.make_root(
        chain_id, root_keys=[key(k).public for k in root_keys], root_threshold=root_threshold,
        revision_keys=[key(k).public for k in keys], revision_threshold=threshold,
        expires=expires, signers=[key(k) for k in signers or root_keys], previous=previous,
    )  # fmt: skip
    path.write_bytes(r.to_bytes())
    return r


def forged_root(
    version: int, chain_id: str, root_keys: list[str], keys: list[str], signers: list[str]
) -> bytes:
    """Root ``version`` well formed and signed over its real content by ``signers``
    (say, an attacker's stolen keys), whether or not a node should accept it."""
    pub = {k: key(k).public for k in [*root_keys, *keys]}
    r = trust.Root(
        version, chain_id, FAR, {p.keyid: p for p in pub.values()},
        trust.Role(tuple(sorted(pub[k].keyid for k in root_keys)), 1),
        trust.Role(tuple(sorted(pub[k].keyid for k in keys)), 1),
    )  # fmt: skip
    payload = signing.canonical(r.signed())
    sigs = tuple((key(k).public.keyid, key(k).sign(payload)) for k in signers)
    return replace(r, signatures=sigs).to_bytes()


@dataclass
class Signed:
    """A signed local-folder chain (versions 0, 1) and a node at version 1."""

    tmp: Path
    trainer: Trainer
    store: Path
    root: Path
    ckpts: list[Path]
    node: Path
    signers: list[str] = field(default_factory=lambda: ["alice"])

    def writer(self, sign_seconds: float = 3600.0, signers: list[str] | None = None) -> chain.Chain:
        keys = [key(k) for k in signers or self.signers]
        return chain.Chain(self.store, self.tmp / "wcache", trust=self.root, sign=keys,
                           sign_seconds=sign_seconds)  # fmt: skip

    def next_checkpoint(self) -> Path:
        n = len(self.ckpts)
        self.trainer.step(n)
        self.ckpts.append(self.trainer.save(self.tmp / f"c{n}.safetensors"))
        return self.ckpts[-1]

    def publish(self, sign_seconds: float = 3600.0, signers: list[str] | None = None) -> Path:
        """Append the next checkpoint, signed; returns it."""
        base = self.ckpts[-1]
        new = self.next_checkpoint()
        chain.append(self.writer(sign_seconds, signers), new, base)
        return new

    def publish_expired(self) -> Path:
        """Append the next checkpoint, then replace its signatures by expired ones (the
        head of a frozen chain): a writer refuses to store those itself (WS-5)."""
        new = self.publish()
        storage = chain.LocalStorage(self.store)
        r = chain.Chain(storage).revisions()[-1]
        data = storage.read(revision_key(r), MAX_MANIFEST_BYTES)
        payload = trust.revision_payload(trust.read_root_file(self.root).chain, r, data, PAST)
        for name in self.signers:
            obj = trust.sign_revision(key(name), payload)
            path = self.store / trust.signature_key(payload["manifest"], obj.keyid)
            path.write_bytes(obj.to_bytes())
        return new

    def node_chain(self, root: Path | None = None) -> chain.Chain:
        return chain.Chain(self.store, self.tmp / "ncache", trust=root or self.root)

    def pull(self, c: chain.Chain | None = None) -> chain.PullResult:
        return chain.pull(c or self.node_chain(), self.node)


def signed_chain(
    tmp: Path, keys: list[str] | None = None, threshold: int = 1,
    signers: list[str] | None = None, chain_id: str = "test/run",
) -> Signed:  # fmt: skip
    keys = keys or ["alice"]
    t = Trainer(rows=16, cols=64)
    c0 = t.save(tmp / "c0.safetensors")
    root = tmp / "root.json"
    root_file(root, chain_id, keys, threshold)
    s = Signed(tmp, t, tmp / "store", root, [c0], tmp / "node" / "m.safetensors",
               signers or keys[:threshold])  # fmt: skip
    chain.init(s.writer(), c0)
    s.publish()
    s.node.parent.mkdir()
    s.pull()
    assert s.node.read_bytes() == s.ckpts[1].read_bytes()
    return s
