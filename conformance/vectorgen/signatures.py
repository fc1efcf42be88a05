"""Signature cases: a signed chain (SPEC §17.11) a reader with a trust policy must accept
or refuse (SG-1 to SG-5).

Every case is the storage cases' valid revision 2 (chains._store_chain) with its files,
plus trust roots and signature objects; the trust root a node holds is the ``{trust}``
input.  Keys come from fixed seeds and Ed25519 signatures are deterministic, so the
vectors regenerate byte-identically.  Written here with ``cryptography`` and a
canonical-JSON function of its own, not with the reference's signing module, so that
the vectors check the reference rather than echo it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .chains import _key, _store_chain, _text
from .suite import Suite, accepted, invalid, sha256

Doc = dict[str, Any]
RULE = ("SPEC §17.11: SG-1 to SG-5, a node with a trust policy accepts a revision only with "
        "a threshold of valid, unexpired signatures of the revisions role of the newest root "
        "it reaches, each root signed by the root role of its predecessor and its own")
CHAIN = "conformance/run"
FAR, PAST = "2099-01-01T00:00:00Z", "2001-01-01T00:00:00Z"


def _canonical(doc: Doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _private(name: str) -> Ed25519PrivateKey:
    seed = hashlib.sha256(f"conformance {name}".encode()).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def _public(name: str) -> bytes:
    return _private(name).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def keyid(name: str) -> str:
    return hashlib.sha256(_public(name)).hexdigest()


def _sign(name: str, payload: Doc) -> str:
    return _private(name).sign(_canonical(payload)).hex()


def root(
    version: int, keys: list[str], threshold: int, signers: list[str], expires: str = FAR,
    chain: str = CHAIN, root_keys: tuple[str, ...] = ("root",), root_threshold: int = 1,
    change: Callable[[Doc], None] | None = None,
) -> bytes:  # fmt: skip
    """A root whose revisions role is ``keys`` and root role ``root_keys``, signed by
    ``signers``; ``change`` edits the signed members before they are signed."""
    public = {keyid(k): {"type": "ed25519", "public": _public(k).hex()}
              for k in [*root_keys, *keys]}  # fmt: skip
    roles = {
        "root": {"keyids": sorted(keyid(k) for k in root_keys), "threshold": root_threshold},
        "revisions": {"keyids": sorted(keyid(k) for k in keys), "threshold": threshold},
    }
    signed = {"format": "wdelta-trust-root", "format_version": 2, "version": version,
              "chain": chain, "expires": expires, "keys": public, "roles": roles}  # fmt: skip
    if change is not None:
        change(signed)
    sigs = [{"keyid": keyid(s), "sig": _sign(s, signed)} for s in signers]
    return (json.dumps({"signed": signed, "signatures": sigs}, indent=2) + "\n").encode()


def _single_role(signed: Doc) -> None:
    """Format version 1: one key list and one threshold, no roles."""
    del signed["format_version"], signed["roles"]
    signed["threshold"] = 1


def _alice_in_both_roles(signed: Doc) -> None:
    signed["roles"]["root"]["keyids"].append(keyid("alice"))


def _unlisted_revisions_key(signed: Doc) -> None:
    signed["roles"]["revisions"]["keyids"].append(keyid("mallory"))


def _revisions_threshold_2(signed: Doc) -> None:
    signed["roles"]["revisions"]["threshold"] = 2


def _keyids_descending(signed: Doc) -> None:
    """The revisions role's key ids out of sorted order: arrays are signed as they stand."""
    signed["roles"]["revisions"]["keyids"].sort(reverse=True)


def _zero_threshold(signed: Doc) -> None:
    signed["roles"]["revisions"]["threshold"] = 0


def _extra_member(signed: Doc) -> None:
    signed["x-note"] = "not a member of a trust root"


def _month_13(signed: Doc) -> None:
    signed["expires"] = "2099-13-01T00:00:00Z"


def _alice_id_mallory_key(signed: Doc) -> None:
    """Key id of alice, public key of mallory: the id is not the key's SHA-256."""
    signed["keys"][keyid("alice")]["public"] = _public("mallory").hex()


def revision_signature(
    name: str, manifest: bytes, revision: int = 2, expires: str = FAR, chain: str = CHAIN,
    stored_as: str | None = None, claim: str | None = None,
) -> tuple[str, bytes]:  # fmt: skip
    """(key, bytes) of ``name``'s signature object of ``manifest`` (under ``stored_as``'s id),
    its ``keyid`` that of ``claim`` (default: ``name``)."""
    digest = blake3.blake3(manifest).hexdigest()
    signed = {"format": "wdelta-revision", "chain": chain, "revision": revision,
              "manifest": digest, "expires": expires}  # fmt: skip
    doc = {"signed": signed, "keyid": keyid(claim or name), "sig": _sign(name, signed)}
    key = f"signatures/{digest}/{keyid(stored_as or name)}.json"
    return key, (json.dumps(doc, indent=2) + "\n").encode()


def _flip_sig(item: tuple[str, bytes]) -> tuple[str, bytes]:
    key, data = item
    doc = json.loads(data)
    doc["sig"] = ("0" if doc["sig"][0] != "0" else "1") + doc["sig"][1:]
    return key, (json.dumps(doc, indent=2) + "\n").encode()


# name: (what, trust file, extra stored objects for manifest bytes M, expected)
Case = tuple[str, bytes, Callable[[bytes], list[tuple[str, bytes]]], dict[str, Any]]
ROOT1 = root(1, ["alice"], 1, ["root"])
ROOT2_BOB = root(2, ["bob"], 1, ["root"])
ROOT3 = root(1, ["alice", "bob", "carol"], 2, ["root"])
ROOT_2OF2 = root(1, ["alice"], 1, ["root", "root2"], root_keys=("root", "root2"), root_threshold=2)
R2 = "trust/root-000000000002.json"
R3 = "trust/root-000000000003.json"

CASES: dict[str, Case] = {
    "valid": ("signed by the one key of the trust root", ROOT1,
              lambda m: [revision_signature("alice", m)], accepted()),
    "threshold-met": ("2 of 3 keys signed (alice, carol)", ROOT3,
                      lambda m: [revision_signature("alice", m), revision_signature("carol", m)],
                      accepted()),
    "rotated-key": ("root 2 (signed by the root key of root 1 and its own) trusts bob; bob signed",
                    ROOT1, lambda m: [("trust/root-000000000002.json", ROOT2_BOB),
                                      revision_signature("bob", m)], accepted()),
    "unsigned": ("SG-4: no signature object at all", ROOT1, lambda m: [],
                 invalid("signature-invalid")),
    "wrong-key": ("SG-4: signed by a key the root does not list (stored under its own id and "
                  "under the trusted key's id)", ROOT1,
                  lambda m: [revision_signature("mallory", m),
                             revision_signature("mallory", m, stored_as="alice")],
                  invalid("signature-invalid")),
    "tampered-signature": ("SG-4: the signature's first hex digit changed", ROOT1,
                           lambda m: [_flip_sig(revision_signature("alice", m))],
                           invalid("signature-invalid")),
    "wrong-revision": ("SG-4: the signature names revision 3", ROOT1,
                       lambda m: [revision_signature("alice", m, revision=3)],
                       invalid("signature-invalid")),
    "wrong-chain": ("SG-4: the signature names another chain", ROOT1,
                    lambda m: [revision_signature("alice", m, chain="other/run")],
                    invalid("signature-invalid")),
    "threshold-not-met": ("SG-4: 1 of the 2 signatures a 2-of-3 root needs", ROOT3,
                          lambda m: [revision_signature("alice", m)],
                          invalid("signature-invalid")),
    "revoked-key": ("SG-2, SG-4: root 2 drops alice from the revisions role; alice signed", ROOT1,
                    lambda m: [("trust/root-000000000002.json", ROOT2_BOB),
                               revision_signature("alice", m)], invalid("signature-invalid")),
    "root-not-signed-by-previous": (
        "SG-2: root 2 (root role root2) is signed by its own root2 only, not by root 1's "
        "root key", ROOT1,
        lambda m: [(R2, root(2, ["bob"], 1, ["root2"], root_keys=("root2",))),
                   revision_signature("bob", m)], invalid("signature-invalid")),
    "root-signed-by-revisions-key": (
        "SG-2: root 2 is signed by root 1's revisions key alice (and its own root key "
        "mallory), not by root 1's root role: an online key cannot rotate the trust", ROOT1,
        lambda m: [(R2, root(2, ["bob"], 1, ["alice", "mallory"], root_keys=("mallory",))),
                   revision_signature("bob", m)], invalid("signature-invalid")),
    "root-threshold-not-met": (
        "SG-2: root 1's root role needs 2 of root, root2; root 2 is signed by root only",
        ROOT_2OF2, lambda m: [(R2, root(2, ["bob"], 1, ["root"])),
                              revision_signature("bob", m)], invalid("signature-invalid")),
    "root-role-rotated": (
        "SG-2: root 2 moves the root role to root2 (signed by root and root2); root 3, "
        "signed by root2 alone, hands the revisions to bob, who signed", ROOT1,
        lambda m: [(R2, root(2, ["alice"], 1, ["root", "root2"], root_keys=("root2",))),
                   (R3, root(3, ["bob"], 1, ["root2"], root_keys=("root2",))),
                   revision_signature("bob", m)], accepted()),
    "revision-signed-by-root-key": (
        "SG-4: signed by the root's root key, which is not in the revisions role", ROOT1,
        lambda m: [revision_signature("root", m)], invalid("signature-invalid")),
    "key-in-both-roles": (
        "SG-1: alice is in the root and the revisions role of the trust root",
        root(1, ["alice"], 1, ["root", "alice"], change=_alice_in_both_roles),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "role-key-not-listed": (
        "SG-1: the revisions role names a key id that 'keys' does not list",
        root(1, ["alice"], 1, ["root"], change=_unlisted_revisions_key),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "role-threshold-above-keys": (
        "SG-1: the revisions role's threshold 2 exceeds its one key",
        root(1, ["alice"], 1, ["root"], change=_revisions_threshold_2),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "root-format-version-1": (
        "SG-1: a trust root of format version 1 (one key list, one threshold)",
        root(1, ["alice"], 1, ["alice"], change=_single_role),
        lambda m: [revision_signature("alice", m)], invalid("unsupported-version")),
    "stored-root-format-version-1": (
        "SG-2: the chain's root 2 is of format version 1, signed by root 1's root key",
        ROOT1, lambda m: [(R2, root(2, ["bob"], 1, ["root"], change=_single_role)),
                          revision_signature("bob", m)], invalid("unsupported-version")),
    "keyids-unsorted": (
        "canonical form: the revisions role lists its key ids in descending order, signed so "
        "(arrays keep their order); alice and carol signed",
        root(1, ["alice", "bob", "carol"], 2, ["root"], change=_keyids_descending),
        lambda m: [revision_signature("alice", m), revision_signature("carol", m)], accepted()),
    "trust-signed-by-revisions-key": (
        "SG-1: the trust file is signed by its revisions key alice, not by its root role",
        root(1, ["alice"], 1, ["alice"]), lambda m: [revision_signature("alice", m)],
        invalid("signature-invalid")),
    "trust-unsigned": (
        "SG-1: the trust file carries no signature", root(1, ["alice"], 1, []),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "trust-threshold-zero": (
        "SG-1: the trust file's revisions threshold is 0 (its schema says 1 to 64)",
        root(1, ["alice"], 1, ["root"], change=_zero_threshold),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "trust-extra-member": (
        "SG-1: the trust file's signed object has a member a trust root does not have",
        root(1, ["alice"], 1, ["root"], change=_extra_member),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "trust-expires-month-13": (
        "SG-1: the trust file's expires is month 13 (no date): not a valid trust root",
        root(1, ["alice"], 1, ["root"], change=_month_13),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "signature-expires-month-13": (
        "SG-5: alice's signature expires in month 13 (no date): it is valid but expired",
        ROOT1, lambda m: [revision_signature("alice", m, expires="2099-13-01T00:00:00Z")],
        invalid("frozen")),
    "trust-signature-listed-twice": (
        "SG-1: the root role needs 2 of root, root2; root's signature is listed twice "
        "(a threshold counts distinct key ids)",
        root(1, ["alice"], 1, ["root", "root"], root_keys=("root", "root2"), root_threshold=2),
        lambda m: [revision_signature("alice", m)], invalid("signature-invalid")),
    "stored-root-signature-listed-twice": (
        "SG-2: root 2's root role needs 2 of root, root2; root 2 lists root's signature twice",
        ROOT1, lambda m: [(R2, root(2, ["bob"], 1, ["root", "root"], root_keys=("root", "root2"),
                                    root_threshold=2)),
                          revision_signature("bob", m)], invalid("signature-invalid")),
    "key-id-not-its-key": (
        "SG-1: keys lists alice's key id with mallory's public key; mallory signed as alice",
        root(1, ["alice"], 1, ["root"], change=_alice_id_mallory_key),
        lambda m: [revision_signature("mallory", m, stored_as="alice", claim="alice")],
        invalid("signature-invalid")),
    "root-not-signed-by-own-role": (
        "SG-2: root 2 (root role root2) is signed by root 1's root key only, not by its own "
        "root role", ROOT1,
        lambda m: [(R2, root(2, ["bob"], 1, ["root"], root_keys=("root2",))),
                   revision_signature("bob", m)], invalid("signature-invalid")),
    "stored-root-wrong-version": (
        "SG-2: the chain's trust/root-2 holds a root of version 3, validly signed", ROOT1,
        lambda m: [(R2, root(3, ["bob"], 1, ["root"])), revision_signature("bob", m)],
        invalid("signature-invalid")),
    "stored-root-wrong-chain": (
        "SG-2: the chain's trust/root-2 is version 2 of another chain, validly signed; bob "
        "signed the revision for that chain", ROOT1,
        lambda m: [(R2, root(2, ["bob"], 1, ["root"], chain="other/run")),
                   revision_signature("bob", m, chain="other/run")],
        invalid("signature-invalid")),
    "threshold-above-keys-rotated": (
        "SG-1: the trust file's revisions threshold 2 exceeds its one key; the chain's valid "
        "root 2 would hand the revisions to bob, who signed",
        root(1, ["alice"], 1, ["root"], change=_revisions_threshold_2),
        lambda m: [(R2, root(2, ["bob"], 1, ["root"])), revision_signature("bob", m)],
        invalid("signature-invalid")),
    "expired": ("SG-5: the only signature expired in 2001", ROOT1,
                lambda m: [revision_signature("alice", m, expires=PAST)], invalid("frozen")),
    "root-expired": ("SG-3: the trust root expired in 2001", root(1, ["alice"], 1, ["root"], PAST),
                     lambda m: [revision_signature("alice", m)], invalid("frozen")),
}  # fmt: skip


def _add(suite: Suite, name: str, what: str, manifest: bytes, trust: bytes,
         store: dict[str, bytes], expect: dict[str, Any]) -> None:  # fmt: skip
    folder = f"chain/sig-{name}"
    path = suite.blob(f"{folder}/{_key(2)}", manifest)
    trust_path = suite.blob(f"{folder}/trust-root.json", trust)
    for key, data in store.items():
        suite.blob(f"{folder}/store/{key}", data)
    root_dir = f"vectors/{folder}/store"
    listing = {k: sha256(v) for k, v in sorted(store.items())}
    suite.inputs[root_dir] = {"path": root_dir, "files": listing}
    suite.add(f"manifest/signed/{name}", "manifest", what, "§17.11", RULE,
              {"manifest": path, "store": root_dir, "trust": trust_path}, expect)  # fmt: skip


def add_signature_cases(suite: Suite) -> None:
    files, doc = _store_chain()
    manifest = _text(doc)
    for name, (what, trust, extra, expect) in CASES.items():
        _add(suite, name, what, manifest, trust, {**files, **dict(extra(manifest))}, expect)
    tampered = manifest.replace(b"2026-01-02T03:04:05Z", b"2026-01-02T03:04:06Z")
    assert tampered != manifest
    signed_original = dict([revision_signature("alice", manifest)])
    _add(suite, "tampered-byte", "SG-4: one digit of the manifest's 'updated' changed after "
         "alice signed it", tampered, ROOT1, {**files, **signed_original},
         invalid("signature-invalid"))  # fmt: skip
    third = _text({**doc, "revision": 3})
    _add(suite, "revision-member-not-key", "SG-4: the file at the key of revision 2 says "
         "revision 3, and alice signed it as revision 3: R is the key's number, 2",
         third, ROOT1, {**files, **dict([revision_signature("alice", third, revision=3)])},
         invalid("signature-invalid"))  # fmt: skip
