"""The pure trust core (wdelta.chain.trust.trusted_set) from bytes alone: no storage, no files,
no clock.  Roots walked by successor, threshold and role rules (SG-1, SG-2); revision
signatures by the revisions role, bound to chain, revision and manifest digest, unexpired
at the ``now`` given (SG-3..SG-5); and the core's imports (no I/O, no clock)."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from wdelta.chain.model.manifest import Snapshot, SnapshotFile, Version, new_manifest
from wdelta.chain.trust import trusted_set
from wdelta.chain.trust.signing import SigningKey, canonical
from wdelta.chain.trust.trusted_set import (
    Role,
    Root,
    TrustedSet,
    parse_time,
    revision_payload,
    sign_revision,
)
from wdelta.errors import WdeltaError

FAR = "2099-01-01T00:00:00Z"
CHAIN = "run-1"


def key(name: str) -> SigningKey:
    return SigningKey(hashlib.sha256(f"trust core test key {name}".encode()).digest())


def root(
    version: int, root_keys: list[str], revision_keys: list[str], signers: list[str], *,
    root_threshold: int = 1, threshold: int = 1, chain: str = CHAIN, expires: str = FAR,
) -> bytes:  # fmt: skip
    """Root ``version`` signed over its content by ``signers``, whether it should pass or not."""
    pub = {k: key(k).public for k in [*root_keys, *revision_keys]}
    r = Root(
        version, chain, expires, {p.keyid: p for p in pub.values()},
        Role(tuple(sorted(pub[k].keyid for k in root_keys)), root_threshold),
        Role(tuple(sorted(pub[k].keyid for k in revision_keys)), threshold),
    )  # fmt: skip
    payload = canonical(r.signed())
    return replace(
        r, signatures=tuple((key(k).public.keyid, key(k).sign(payload)) for k in signers)
    ).to_bytes()


def trusted(data: bytes) -> TrustedSet:
    """A trusted set started from an operator's root (its self-signature checked)."""
    first = trusted_set.parse_root(data, "trust root")
    trusted_set.check_signed_by(first, first, "trust root")
    return TrustedSet(first)


MANIFEST = new_manifest(
    Version(0, "ab" * 32), Snapshot(0, (SnapshotFile("model.safetensors", "cd" * 32, 10),))
).to_bytes()
OTHER = MANIFEST + b" "  # the same revision, other bytes: another digest


def signatures(
    names: list[str], revision: int = 1, data: bytes = MANIFEST, expires: str = FAR,
    chain: str = CHAIN,
) -> dict[str, bytes | None]:  # fmt: skip
    """Each named key's signature object of ``revision`` with bytes ``data``, as a node
    reads them: by the key id they are stored under."""
    payload = revision_payload(chain, revision, data, expires)
    return {key(n).public.keyid: sign_revision(key(n), payload).to_bytes() for n in names}


def refused(category: str, call: object, *args: object, **kw: object) -> str:
    assert callable(call)
    with pytest.raises(WdeltaError) as info:
        call(*args, **kw)
    assert info.value.category == category, info.value
    return str(info.value)


NOW = parse_time("2030-01-01T00:00:00Z")


# ------------------------------------------------------------------ roots


def test_a_chain_of_roots_rotating_keys_is_walked() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    t.update_root(root(2, ["r2"], ["w2"], ["r1", "r2"]), "root 2")  # root key rotated
    t.update_root(root(3, ["r2"], ["w3"], ["r2"]), "root 3")  # revisions key rotated
    assert [r.version for r in t.roots] == [1, 2, 3]
    assert t.revision_keyids() == [key("w3").public.keyid]


def test_a_root_signed_below_threshold_is_refused() -> None:
    t = trusted(root(1, ["r1", "r2"], ["w1"], ["r1", "r2"], root_threshold=2))
    why = refused(
        "signature-invalid", t.update_root,
        root(2, ["r1", "r2"], ["w2"], ["r1"], root_threshold=2), "trust/root-2.json",
    )  # fmt: skip
    assert "1 valid signatures of the root keys of root version 1, 2 needed" in why
    assert t.root.version == 1


def test_a_new_root_must_sign_itself_and_be_signed_by_the_old() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    refused("signature-invalid", t.update_root, root(2, ["r2"], ["w1"], ["r1"]), "root 2")
    refused("signature-invalid", t.update_root, root(2, ["r2"], ["w1"], ["r2"]), "root 2")
    stolen = root(2, ["r1"], ["thief"], ["thief"])
    refused("signature-invalid", t.update_root, stolen, "root 2")
    online = root(2, ["r1"], ["w1"], ["w1"])  # a revisions key cannot rewrite the trust
    refused("signature-invalid", t.update_root, online, "root 2")
    assert t.root.version == 1


def test_a_rolled_back_or_skipped_root_version_is_refused() -> None:
    v1 = root(1, ["r1"], ["w1"], ["r1"])
    t = trusted(v1)
    t.update_root(root(2, ["r1"], ["w2"], ["r1"]), "root 2")
    why = refused("signature-invalid", t.update_root, v1, "root 1")
    assert "version 1 of chain 'run-1', expected version 3" in why
    refused("signature-invalid", t.update_root, root(4, ["r1"], ["w2"], ["r1"]), "root 4")
    other = root(3, ["r1"], ["w2"], ["r1"], chain="run-2")
    refused("signature-invalid", t.update_root, other, "root 3")
    assert t.root.version == 2


def test_a_root_with_a_key_in_both_roles_is_refused() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    why = refused("signature-invalid", t.update_root, root(2, ["r1"], ["r1"], ["r1"]), "root 2")
    assert "in both the root and the revisions role" in why


def test_kept_roots_resume_only_from_descendants() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    kept = trusted_set.parse_root(root(2, ["r1"], ["w2"], ["r1"]), "kept")
    t.resume_root(kept, "kept.json")
    t.resume_root(kept, "kept.json")  # not newer: skipped, not refused
    assert t.root.version == 2
    forged = trusted_set.parse_root(root(3, ["x"], ["w2"], ["x"]), "kept")
    why = refused("signature-invalid", t.resume_root, forged, "kept.json")
    assert "does not descend from trust root version 1; delete kept.json" in why
    alien = trusted_set.parse_root(root(3, ["r1"], ["w2"], ["r1"], chain="b"), "kept")
    refused("bad-argument", t.resume_root, alien, "kept.json")


# ------------------------------------------------------------------ revisions


def test_a_revision_signed_by_a_threshold_is_accepted_as_a_manifest() -> None:
    t = trusted(root(1, ["r1"], ["w1", "w2"], ["r1"], threshold=2))
    stored = signatures(["w1", "w2"])
    verified = t.verify_manifest(1, MANIFEST, stored, now=NOW)
    assert verified.manifest.revision == 1
    assert verified.signers == sorted(stored)
    why = refused("signature-invalid", t.check_revision, 1, MANIFEST, signatures(["w1"]), now=NOW)
    assert "1 valid signatures of trusted keys, 2 needed" in why


def test_a_revision_signed_by_a_root_key_only_is_refused() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    by_root = signatures(["r1"])
    refused("signature-invalid", t.check_revision, 1, MANIFEST, by_root, now=NOW)
    # Stored where the revisions key's signature belongs: still not the revisions key's.
    slot = {key("w1").public.keyid: next(iter(by_root.values()))}
    assert t.valid_signatures(1, MANIFEST, slot) == {}
    refused("signature-invalid", t.check_revision, 1, MANIFEST, slot, now=NOW)
    why = refused("signature-invalid", t.check_signers, [key("r1")], FAR, now=NOW)
    assert "root keys sign only roots" in why


def test_an_expired_signature_is_frozen_at_now_but_valid_for_history() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    stored = signatures(["w1"], expires="2030-01-01T00:00:00Z")
    assert t.check_revision(1, MANIFEST, stored, now=NOW - 1) == [key("w1").public.keyid]
    why = refused("frozen", t.check_revision, 1, MANIFEST, stored, now=NOW)
    assert "signatures expired at 2030-01-01T00:00:00Z" in why
    assert t.check_revision(1, MANIFEST, stored, now=NOW, fresh=False)
    assert t.valid_signatures(1, MANIFEST, stored) == {key("w1").public.keyid: NOW}
    refused("frozen", t.check_signers, [key("w1")], "2030-01-01T00:00:00Z", now=NOW)


def test_an_expired_root_freezes_every_revision() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"], expires="2029-01-01T00:00:00Z"))
    why = refused("frozen", t.check_revision, 1, MANIFEST, signatures(["w1"]), now=NOW)
    assert "trust root version 1 expired at 2029-01-01T00:00:00Z" in why
    assert t.check_revision(1, MANIFEST, signatures(["w1"]), now=NOW, fresh=False)


@pytest.mark.parametrize(
    "stored",
    [
        signatures(["w1"], revision=2),  # another revision's signature
        signatures(["w1"], data=OTHER),  # another manifest's digest
        signatures(["w1"], chain="run-2"),  # another chain's
        {key("w1").public.keyid: b"{not json"},
        {key("w1").public.keyid: None},
    ],
    ids=["revision", "manifest", "chain", "garbage", "absent"],
)
def test_a_signature_bound_to_something_else_does_not_count(
    stored: dict[str, bytes | None],
) -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    assert t.valid_signatures(1, MANIFEST, stored) == {}
    why = refused("signature-invalid", t.verify_manifest, 1, MANIFEST, stored, now=NOW)
    assert "0 valid signatures of trusted keys, 1 needed" in why


def test_signatures_count_for_the_newest_root_only() -> None:
    t = trusted(root(1, ["r1"], ["w1"], ["r1"]))
    stored = signatures(["w1"])
    assert t.check_revision(1, MANIFEST, stored, now=NOW)
    t.update_root(root(2, ["r1"], ["w2"], ["r1"]), "root 2")  # w1 revoked
    refused("signature-invalid", t.check_revision, 1, MANIFEST, stored, now=NOW)


def test_a_stored_root_other_than_the_trusted_one_is_refused() -> None:
    data = root(1, ["r1"], ["w1"], ["r1"])
    t = trusted(data)
    t.check_stored_root(None, "trust/root-1.json")
    t.check_stored_root(data, "trust/root-1.json")
    other = root(1, ["r1"], ["w9"], ["r1"])
    why = refused("signature-invalid", t.check_stored_root, other, "trust/root-1.json")
    assert why.startswith("trust/root-1.json in the chain differs from the trust root given")


def test_times_are_parsed_and_written_without_a_clock() -> None:
    assert trusted_set.format_time(parse_time("2030-02-28T23:59:59Z")) == "2030-02-28T23:59:59Z"
    assert trusted_set.format_time(0) == "1970-01-01T00:00:00Z"
    for bad in ("2030-02-30T00:00:00Z", "2030-01-01T24:00:00Z", "2030-01-01 00:00:00Z"):
        with pytest.raises(ValueError):
            parse_time(bad)


# ------------------------------------------------------------------ purity

CORE = Path(trusted_set.__file__)
FORBIDDEN = ("os", "pathlib", "socket", "time", "wdelta.chain.storage")


def _imports(tree: ast.Module, package: str) -> set[str]:
    """Absolute names of every module the source imports (relative imports resolved)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return found


def _forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names for f in FORBIDDEN if n == f or n.startswith(f"{f}."))


def test_the_core_imports_no_storage_files_network_or_clock() -> None:
    names = _imports(ast.parse(CORE.read_text()), "wdelta.chain.trust")
    assert "wdelta.chain.trust.signing" in names  # relative imports are resolved
    assert _forbidden(names) == []


def test_the_import_check_catches_io() -> None:
    bad = "import os.path\nfrom time import time\nfrom ..storage.base import Storage\n"
    found = _forbidden(_imports(ast.parse(bad), "wdelta.chain.trust"))
    assert found == ["os.path", "time", "time.time", "wdelta.chain.storage.base",
                     "wdelta.chain.storage.base.Storage"]  # fmt: skip
