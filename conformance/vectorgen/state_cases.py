"""Acceptance state cases: a node's memory of what it accepted, and under which trust
(SPEC §17.11 SG-8 to SG-10, with RD-1 of §17.6), given as ``{state}``.

Every case is the signature cases' revision 2 of ``conformance/run``, signed by alice,
with its files; the node's acceptance state (schema ``chain-acceptance``) is written
here as JSON from the SPEC text.  Cases with a trust root run with the
``manifest-trust-state`` template, the others (a node reading without a trust policy)
with ``manifest-state``.
"""

from __future__ import annotations

import json
from typing import Any

import blake3

from .chains import _key, _store_chain, _text
from .signatures import CHAIN, keyid, revision_signature, root
from .suite import Suite, accepted, invalid, sha256

RULE = ("SPEC §17.11: SG-8 a node that accepted a signed revision keeps requiring signatures; "
        "SG-9 its trust never moves back to an older root; SG-10 a root rotation that revokes "
        "the keys of the accepted revision releases it from RD-1, and nothing else does")
FAR_REVISION = 999_999_999_999
OTHER = blake3.blake3(b"conformance: the attacker's revision").hexdigest()
ROOT_AC = root(1, ["alice", "carol"], 1, ["root"])
R2 = "trust/root-000000000002.json"


def state(revision: int, digest: str, root_version: int | None = None,
          signers: tuple[str, ...] = ("alice",), chain: str = CHAIN,
          version: int | None = None) -> bytes:  # fmt: skip
    """An acceptance state; with ``root_version``, accepted under the trust policy
    (``version``: the state's format version, by default 2 with trust and 1 without)."""
    doc: dict[str, Any] = {"format": "wdelta-chain-accepted", "version": 2,
                           "revision": revision, "digest": digest}  # fmt: skip
    if root_version is None:
        doc["version"] = 1
    else:
        doc["trust"] = {"chain": chain, "root": root_version,
                        "signers": sorted(keyid(k) for k in signers)}  # fmt: skip
    if version is not None:
        doc["version"] = version
    return (json.dumps(doc, indent=2) + "\n").encode()


# name: (what, trust file or None, extra stored objects, state, expected), for the manifest
# ``manifest`` of BLAKE3 ``m``
StateCase = tuple[str, bytes | None, dict[str, bytes], bytes, Any]


def _cases(m: str, manifest: bytes) -> dict[str, StateCase]:
    far_carol = state(FAR_REVISION, OTHER, 1, ("carol",))
    dave = revision_signature("dave", manifest)
    return {
        "unsigned-after-signed": (
            "SG-8: a reader without a trust policy whose state records revision 2 accepted "
            "with signatures", None, {}, state(2, m, 1), invalid("signature-invalid")),
        "unsigned-state": (
            "a reader without a trust policy whose state (format version 1) records this "
            "revision unsigned", None, {}, state(2, m), accepted()),
        "unsigned-rolled-back": (
            "RD-1 (a): the state records revision 3, unsigned", None, {},
            state(3, OTHER), invalid("manifest-invalid")),
        "signed-same": (
            "the state records this revision, signed by alice under root 1", ROOT_AC, {},
            state(2, m, 1), accepted()),
        "fast-forward-kept": (
            "RD-1 (a): carol's revision 999999999999 was accepted under root 1, which still "
            "trusts carol", ROOT_AC, {}, far_carol, invalid("manifest-invalid")),
        "fast-forward-recovered": (
            "SG-10: carol's revision 999999999999 was accepted under root 1; root 2, signed by "
            "the root key, drops carol: RD-1 starts afresh", ROOT_AC,
            {R2: root(2, ["alice"], 1, ["root"])}, far_carol, accepted()),
        "rotation-keeps-signer": (
            "SG-10: root 2 adds dave and keeps carol, who signed the accepted revision "
            "999999999999: RD-1 (a) still applies", ROOT_AC,
            {R2: root(2, ["alice", "carol", "dave"], 1, ["root"])}, far_carol,
            invalid("manifest-invalid")),
        "rotation-by-revisions-key": (
            "SG-2, SG-10: root 2 dropping alice is signed by carol (a revisions key), not by "
            "the root key: no rotation, no release", ROOT_AC,
            {R2: root(2, ["carol"], 1, ["carol", "carol2"], root_keys=("carol2",))},
            state(FAR_REVISION, OTHER, 1, ("alice",)), invalid("signature-invalid")),
        "other-chain": (
            "SG-9: the state records this revision accepted under chain other/run; the trust "
            "root is of conformance/run", ROOT_AC, {}, state(2, m, 1, chain="other/run"),
            invalid("bad-argument")),
        "rewritten": (
            "RD-1 (b): the state records revision 2 with other bytes, signed under root 1",
            ROOT_AC, {}, state(2, OTHER, 1), invalid("manifest-invalid")),
        "forked-parent": (
            "RD-1 (c): the state records revision 1 with bytes that are not revision 2's "
            "parent, signed under root 1", ROOT_AC, {}, state(1, OTHER, 1),
            invalid("manifest-invalid")),
        "release-threshold-2": (
            "SG-10: carol's revision 999999999999 was accepted under root 1; root 2 keeps "
            "carol but needs 2 of alice, carol, dave: carol alone no longer meets it, RD-1 "
            "starts afresh; alice and dave signed", ROOT_AC,
            {R2: root(2, ["alice", "carol", "dave"], 2, ["root"]), **dict([dave])},
            far_carol, accepted()),
        "release-signer-moved-to-root-role": (
            "SG-10: carol's revision 999999999999 was accepted under root 1; root 2 moves "
            "carol to its root role (root keys do not sign revisions): RD-1 starts afresh",
            ROOT_AC, {R2: root(2, ["alice"], 1, ["root"], root_keys=("root", "carol"))},
            far_carol, accepted()),
        "schema-signers-empty": (
            "the state breaks its schema (trust.signers is empty): not a usable state",
            ROOT_AC, {}, state(2, m, 1, signers=()), invalid("bad-argument")),
        "version-1-with-trust": (
            "a state of format version 1 carrying trust (a member of version 2 only): "
            "not a usable state", None, {}, state(2, m, 1, version=1), invalid("bad-argument")),
        "trust-moved-back": (
            "SG-9: the state records root version 3; the node reaches root 1 only", ROOT_AC,
            {}, state(2, m, 3), invalid("signature-invalid")),
    }  # fmt: skip


def add_state_cases(suite: Suite) -> None:
    files, doc = _store_chain()
    manifest = _text(doc)
    digest = blake3.blake3(manifest).hexdigest()
    signed = dict([revision_signature("alice", manifest)])
    for name, (what, trust, extra, accepted_state, expect) in _cases(digest, manifest).items():
        folder = f"chain/state-{name}"
        store = {**files, **signed, **extra}
        inputs = {"manifest": suite.blob(f"{folder}/{_key(2)}", manifest),
                  "state": suite.blob(f"{folder}/state.json", accepted_state)}  # fmt: skip
        for key, data in store.items():
            suite.blob(f"{folder}/store/{key}", data)
        root_dir = f"vectors/{folder}/store"
        listing = {k: sha256(v) for k, v in sorted(store.items())}
        suite.inputs[root_dir] = {"path": root_dir, "files": listing}
        inputs["store"] = root_dir
        if trust is not None:
            inputs["trust"] = suite.blob(f"{folder}/trust-root.json", trust)
        suite.add(f"manifest/state/{name}", "manifest", what, "§17.11", RULE, inputs, expect)
