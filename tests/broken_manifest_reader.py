"""Deliberately broken manifest readers around ``wdelta chain check``, for the conformance tests.

    python tests/broken_manifest_reader.py MODE MANIFEST [--store STORE [--trust ROOT]]
        [--after SEEN]

``faithful`` is the reference; ``plain-json`` parses with ``json.loads``
(duplicate keys, NaN, lone surrogates and deep nesting pass); ``no-reachability``
skips CH-9; ``skip-missing`` skips listed files missing from storage (RD-3);
``ignore-signatures`` takes ``--trust`` but never checks a signature (SG-1..SG-5);
``any-role`` lets every key of a trust root sign both roots and revisions (no roles);
``forget-trust`` reads ``--state`` without the trust it records (SG-8, SG-9);
``no-reset`` never releases a state after a root rotation (SG-10);
``reset-on-rotation`` releases it after any newer root, even one that keeps the signers;
``ignore-after`` drops ``--after`` (no memory of an accepted revision, RD-1);
``revision-only`` compares revision numbers with the accepted one, never digests;
``no-part-set`` checks each part of a multi-part link alone, never the set (MP-4);
``part-headers-only`` checks each part's ``part`` member, but not that the parts' tensors
are disjoint and hash to the link's versions; ``part-member-optional`` takes a listed part
without a ``part`` member; ``no-part-count`` never compares a part's count with the list;
``no-snapshot-digest`` never compares a snapshot's checkpoint digest with its version's;
``no-digit-limit`` parses integers of any length (§4.1, §13).
Trust (SG-1, SG-2): ``trust-file-unsigned`` takes the trust file without checking its own
root role's signatures; ``successor-not-self-signed`` checks a new root against the previous
root role only; ``no-successor-identity`` never checks a stored root's version and chain;
``count-signature-entries`` counts a root's signature entries, not distinct keys;
``no-key-id-check`` never hashes a listed public key to its key id; ``no-threshold-check``
takes a role whose threshold exceeds its keys.
Acceptance state (SG-9, SG-10, RD-1): ``state-other-chain`` takes a state recorded under
another chain; ``release-when-no-signer`` releases a state only when none of its signers is
left; ``release-counts-root-keys`` counts signers moved to the root role; ``state-revision-only``
compares the state's revision number only (RD-1 (a)); ``state-no-schema`` never checks the
state file's schema; ``state-v1-trust`` reads a version-1 state carrying trust as one without.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import wdelta.chain.errors
import wdelta.chain.model.manifest
import wdelta.chain.reading.fetch
import wdelta.chain.reading.parts
import wdelta.chain.trust.acceptance
import wdelta.chain.trust.signatures
import wdelta.chain.trust.trusted_set
import wdelta.chain.trust.updater
import wdelta.chain.writing.append
import wdelta.errors
import wdelta.format.schemas
from wdelta import cli
from wdelta.chain.errors import ManifestInvalidError, NotFoundError
from wdelta.chain.reading.fetch import fetch_link, materialize_snapshot
from wdelta.chain.trust.signing import canonical
from wdelta.format.digest import checkpoint_digest
from wdelta.ops import api


def plain_json(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ManifestInvalidError("not an object")
    return value


def skip_missing(chain: Any, m: Any) -> None:
    for link in m.links:
        try:
            api.verify(fetch_link(chain, m, link))
        except NotFoundError:
            continue
    with tempfile.TemporaryDirectory() as tmp:
        for snap in m.snapshots:
            try:
                materialize_snapshot(chain, m, snap, Path(tmp) / f"v{snap.version}")
            except NotFoundError:
                continue


def revision_only(accepted: Any, revision: int, *rest: Any) -> None:
    if accepted is not None and revision < accepted.revision:
        raise ManifestInvalidError(f"revision {revision} is lower than {accepted.revision}")


def forget_trust() -> None:
    load = wdelta.chain.trust.acceptance.load
    wdelta.chain.trust.acceptance.load = lambda path: dataclasses.replace(load(path), trust=None)  # type: ignore[type-var]


def no_reset() -> None:
    rotated = wdelta.chain.trust.acceptance.trust_rotated
    wdelta.chain.trust.acceptance.trust_rotated = lambda *a: rotated(*a) and False


def reset_on_rotation() -> None:
    rotated = wdelta.chain.trust.acceptance.trust_rotated

    def any_newer_root(record: Any, policy: Any, *rest: Any) -> bool:
        rotated(record, policy, *rest)  # its refusals (another chain, an older root)
        return bool(policy.root.version > record.root)

    wdelta.chain.trust.acceptance.trust_rotated = any_newer_root


STATE_MODES = {"forget-trust": forget_trust, "no-reset": no_reset,
               "reset-on-rotation": reset_on_rotation}  # fmt: skip


def part_headers_only(m: Any, link: Any, headers: Any) -> None:
    want = (m.version(link.source).digest, m.version(link.target).digest)
    for i, h in enumerate(headers):
        if h.part != (i, len(link.parts), *want):
            raise wdelta.chain.reading.parts.ChainBrokenError(f"part {i} is not the link's")


class _Same(str):
    """Equal to anything: a comparison the mutant no longer makes."""

    __hash__ = str.__hash__

    def __ne__(self, other: object) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return True


def _set_checks(headers: Any, want: tuple[str, str], reversible: bool) -> None:
    """MP-4 after the part members: reversible, disjoint, the union's digests."""
    broken = wdelta.chain.reading.parts.ChainBrokenError
    if all(h.reversible for h in headers) != reversible:
        raise broken("reversible flag disagrees with its parts")
    for side, digest in zip(("base", "target"), want, strict=True):
        ids = [t.identity(side) for h in headers for t in h.side_tensors(side)]
        if len({i.name for i in ids}) != len(ids) or checkpoint_digest(ids) != digest:
            raise broken(f"the parts' {side} tensors are not the version's")


def _lax_parts(optional: bool, count: bool) -> Any:
    def check(m: Any, link: Any, headers: Any) -> None:
        want = (m.version(link.source).digest, m.version(link.target).digest)
        for i, h in enumerate(headers):
            if h.part is None and optional:
                continue
            if h.part is None:
                raise wdelta.chain.reading.parts.ChainBrokenError(f"part {i} has no part member")
            got = h.part if count else (h.part[0], len(headers), *h.part[2:])
            if got != (i, len(headers), *want):
                raise wdelta.chain.reading.parts.ChainBrokenError(f"part {i} is not the link's")
        _set_checks(headers, want, link.reversible)

    return check


def _successor(identity: bool, own: bool) -> Any:
    def check(new: Any, old: Any, what: str) -> None:
        if identity and (new.version != old.version + 1 or new.chain != old.chain):
            raise wdelta.chain.errors.SignatureInvalidError(f"{what}: not the successor")
        wdelta.chain.trust.trusted_set.check_signed_by(new, old, what)
        if own:
            wdelta.chain.trust.trusted_set.check_signed_by(new, new, what)

    return check


def count_entries(root: Any, by: Any, what: str) -> None:
    keys = wdelta.chain.trust.trusted_set.role_keys(by, by.root)
    payload = canonical(root.signed())
    valid = [k for k, sig in root.signatures if k in keys and keys[k].verify(sig, payload)]
    if len(valid) < by.root.threshold:
        raise wdelta.chain.errors.SignatureInvalidError(f"{what}: below the root threshold")


def no_threshold_check(s: Any, name: str, what: str) -> Any:
    raw = s["roles"][name]
    return wdelta.chain.trust.trusted_set.Role(tuple(raw["keyids"]), raw["threshold"])


def _rotated(chain: bool, release: Any) -> Any:
    """trust_rotated with its chain check (or not) and a release rule of the mutant's."""

    def rotated(record: Any, policy: Any, storage: Any, where: str) -> bool:
        root = policy.update(storage)
        if chain and root.chain != record.chain:
            raise wdelta.errors.BadArgumentError(f"{where}: another chain")
        if root.version < record.root:
            raise wdelta.chain.errors.SignatureInvalidError(f"{where}: an older root")
        return root.version != record.root and bool(release(set(record.signers), root))

    return rotated


def _threshold_release(signers: set[str], root: Any) -> bool:
    return len(signers & set(root.revisions.keyids)) < root.revisions.threshold


def _root_keys_release(signers: set[str], root: Any) -> bool:
    held = set(root.revisions.keyids) | set(root.root.keyids)
    return len(signers & held) < root.revisions.threshold


def state_revision_only() -> None:
    check_state = wdelta.chain.trust.acceptance.check_state

    def only_a(*args: Any) -> None:
        exact = wdelta.chain.trust.acceptance.check
        wdelta.chain.trust.acceptance.check = revision_only
        try:
            check_state(*args)
        finally:
            wdelta.chain.trust.acceptance.check = exact

    wdelta.chain.trust.acceptance.check_state = only_a


def state_no_schema() -> None:
    real = wdelta.format.schemas.violation
    wdelta.chain.trust.acceptance.schemas = SimpleNamespace(  # type: ignore[assignment]
        violation=lambda name, raw: None if name == "chain-acceptance" else real(name, raw)
    )


def state_v1_trust() -> None:
    parse = wdelta.chain.trust.acceptance.parse

    def lax(data: bytes, path: Path) -> Any:
        raw = json.loads(data)
        if isinstance(raw, dict) and raw.get("version") == 1:
            raw.pop("trust", None)
            data = json.dumps(raw).encode()
        return parse(data, path)

    wdelta.chain.trust.acceptance.parse = lax


PATCHES: dict[str, Any] = {
    "part-member-optional": lambda: setattr(wdelta.chain.reading.parts, "check_parts",
                                            _lax_parts(True, True)),
    "no-part-count": lambda: setattr(wdelta.chain.reading.parts, "check_parts",
                                     _lax_parts(False, False)),
    "no-snapshot-digest": lambda: setattr(wdelta.chain.reading.fetch, "digest_of_path",
                                          lambda path: _Same()),
    "no-digit-limit": lambda: sys.set_int_max_str_digits(0),
    "trust-file-unsigned": lambda: setattr(wdelta.chain.trust.updater, "check_signed_by",
                                           lambda *a: None),
    "successor-not-self-signed": lambda: setattr(wdelta.chain.trust.trusted_set, "check_successor",
                                                 _successor(True, False)),
    "no-successor-identity": lambda: setattr(wdelta.chain.trust.trusted_set, "check_successor",
                                             _successor(False, True)),
    "count-signature-entries": lambda: [setattr(module, "check_signed_by", count_entries)
                                        for module in (wdelta.chain.trust.trusted_set,
                                                       wdelta.chain.trust.updater)],
    "no-key-id-check": lambda: setattr(wdelta.chain.trust.trusted_set, "key_id",
                                       lambda raw: _Same()),
    "no-threshold-check": lambda: setattr(wdelta.chain.trust.trusted_set, "_role",
                                          no_threshold_check),
    "state-other-chain": lambda: setattr(wdelta.chain.trust.acceptance, "trust_rotated",
                                         _rotated(False, _threshold_release)),
    "release-when-no-signer": lambda: setattr(
        wdelta.chain.trust.acceptance, "trust_rotated",
        _rotated(True, lambda signers, root: not signers & set(root.revisions.keyids))),
    "release-counts-root-keys": lambda: setattr(wdelta.chain.trust.acceptance, "trust_rotated",
                                                _rotated(True, _root_keys_release)),
    "state-revision-only": state_revision_only,
    "state-no-schema": state_no_schema,
    "state-v1-trust": state_v1_trust,
}  # fmt: skip


def main(mode: str, args: list[str]) -> int:
    if mode == "plain-json":
        wdelta.chain.model.manifest._load_json = plain_json  # type: ignore[assignment]
    if mode == "no-reachability":
        wdelta.chain.model.manifest.unreachable_versions = lambda m: []  # type: ignore[assignment]
    if mode == "skip-missing":
        wdelta.chain.writing.append.check_files = skip_missing
    if mode == "ignore-signatures":
        wdelta.chain.trust.signatures.check_signatures = lambda *args: []
    if mode == "any-role":
        wdelta.chain.trust.trusted_set.role_keys = lambda root, role: root.keys
    if mode in STATE_MODES:
        STATE_MODES[mode]()
    if mode in PATCHES:
        PATCHES[mode]()
    if mode == "ignore-after" and "--after" in args:
        at = args.index("--after")
        args = args[:at] + args[at + 2 :]
    if mode == "no-part-set":
        wdelta.chain.reading.parts.check_parts = lambda *args: None
    if mode == "part-headers-only":
        wdelta.chain.reading.parts.check_parts = part_headers_only
    if mode == "revision-only":
        wdelta.chain.trust.acceptance.check = revision_only
    return cli.run(["chain", "check", "-q", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
