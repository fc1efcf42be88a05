"""The trust core of a signed chain (SPEC §17.11, SG-1..SG-5): bytes in, verdicts out.

As python-tuf's ``TrustedMetadataSet``, :class:`TrustedSet` holds what a node
trusts, the roots from the operator's trust root to the newest one walked to, and
verifies bytes against them: a root (successor of the newest, signed by a
threshold of its root role and of the previous one's, roles disjoint), the
signature objects of a manifest revision (a threshold of the revisions role,
each bound to the chain, revision and BLAKE3 of the revision's bytes, unexpired
at the ``now`` it is given), and the manifest revision itself.  Each check
either accepts what it was given or raises; nothing here reads storage, files,
the network or the clock.  :mod:`.trust` does that I/O (bounded reads of roots
and signatures, the roots a node keeps on disk, the time) and feeds the bytes in,
as python-tuf's ``Updater`` does.

The document model lives here too: :class:`Root` and :class:`Role`, revision
signature objects, the payload a key signs, :func:`make_root` for writers.
"""

from __future__ import annotations

import calendar
import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...errors import BadArgumentError, UnsupportedVersionError, WdeltaError
from ...format import schemas, strictjson
from ...format.digest import digest_bytes
from ..errors import FrozenError, SignatureInvalidError
from ..model.manifest import Manifest, parse_manifest
from .signing import PublicKey, SigningKey, canonical, key_id

ROOT_FORMAT = "wdelta-trust-root"
ROOT_FORMAT_VERSION = 2  # 1: one key list and threshold for roots and revisions alike
REVISION_FORMAT = "wdelta-revision"
_TIME = "%Y-%m-%dT%H:%M:%SZ"
# What the schemas let through as a time; the ranges are checked by parse_time.
_TIME_TEXT = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z")


def format_time(seconds: float) -> str:
    """UTC ``YYYY-MM-DDThh:mm:ssZ`` of a POSIX time (whole seconds), year not padded
    (as C's strftime writes it), from the days' count: no clock, no time zone."""
    days, rest = divmod(int(seconds), 86400)
    z = days + 719468  # days since 0000-03-01 (H. Hinnant's civil_from_days)
    era, doe = divmod(z, 146097)
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    hour, minute, second = rest // 3600, rest // 60 % 60, rest % 60
    return f"{year}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}Z"


def parse_time(text: str) -> int:
    """POSIX seconds of ``YYYY-MM-DDThh:mm:ssZ``; ValueError if it is not a real date
    (as ``time.strptime``: seconds up to 61, a day the month has)."""
    match = _TIME_TEXT.fullmatch(text)
    if match is None:
        raise ValueError(f"time data {text!r} does not match format {_TIME!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups())
    if hour > 23 or minute > 59 or second > 61:
        raise ValueError(f"time data {text!r}: no such time of day")
    datetime.date(year, month, day)  # ValueError for a day no calendar has
    return calendar.timegm((year, month, day, hour, minute, second))


@dataclass(frozen=True)
class Role:
    """A role of a root: the key ids that may sign for it and how many must (TUF's roles)."""

    keyids: tuple[str, ...]
    threshold: int

    def to_json(self) -> dict[str, Any]:
        return {"keyids": list(self.keyids), "threshold": self.threshold}


@dataclass(frozen=True)
class Root:
    """One version of a chain's trust root; ``keys`` by key id, ``expires`` UTC text.

    Two roles: ``root`` (offline keys: they sign the next root version) and
    ``revisions`` (online keys: they sign manifest revisions), disjoint.
    """

    version: int
    chain: str
    expires: str
    keys: dict[str, PublicKey]
    root: Role
    revisions: Role
    signatures: tuple[tuple[str, str], ...] = ()

    def signed(self) -> dict[str, Any]:
        return {
            "format": ROOT_FORMAT, "format_version": ROOT_FORMAT_VERSION,
            "version": self.version, "chain": self.chain, "expires": self.expires,
            "keys": {k: {"type": "ed25519", "public": p.raw.hex()} for k, p in self.keys.items()},
            "roles": {"root": self.root.to_json(), "revisions": self.revisions.to_json()},
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        sigs = [{"keyid": k, "sig": s} for k, s in self.signatures]
        return {"signed": self.signed(), "signatures": sigs}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()

    def signers(self, role: Role, payload: bytes, signatures: list[tuple[str, str]]) -> set[str]:
        """Key ids of ``role`` whose signature of ``payload`` is among ``signatures``."""
        keys = role_keys(self, role)
        return {k for k, sig in signatures if k in keys and keys[k].verify(sig, payload)}

    def expired(self, now: float) -> bool:
        return parse_time(self.expires) <= now


def role_keys(root: Root, role: Role) -> dict[str, PublicKey]:
    """The public keys of ``root`` that may sign for ``role``, by key id."""
    return {k: root.keys[k] for k in role.keyids}


def parse_root(data: bytes, what: str) -> Root:
    """A root document (schema, key ids, roles); else SignatureInvalidError
    (UnsupportedVersionError for a root of another format version)."""
    raw = strictjson.loads(data, SignatureInvalidError, what)
    return root_from_json(raw, what)


def _check_format_version(raw: Any, what: str) -> None:
    """A root of another format version is refused as such, before its schema: a
    version-1 root (one key list and one threshold for everything) is not misread."""
    signed = raw.get("signed") if isinstance(raw, dict) else None
    found = signed.get("format_version", 1) if isinstance(signed, dict) else None
    if found is not None and found != ROOT_FORMAT_VERSION:
        raise UnsupportedVersionError(
            f"{what}: a trust root of format version {found!r}; this reader implements "
            f"{ROOT_FORMAT_VERSION} (separate root and revisions roles): write a new root "
            "with 'wdelta chain root --root-key ... --revision-key ...'"
        )


def _role(s: dict[str, Any], name: str, what: str) -> Role:
    raw = s["roles"][name]
    role = Role(tuple(raw["keyids"]), raw["threshold"])
    unknown = [k for k in role.keyids if k not in s["keys"]]
    if unknown:
        raise SignatureInvalidError(f"{what}: role {name} names key {unknown[0][:16]}, not listed")
    if role.threshold > len(role.keyids):
        raise SignatureInvalidError(
            f"{what}: role {name} has threshold {role.threshold} > {len(role.keyids)} keys"
        )
    return role


def root_from_json(raw: Any, what: str) -> Root:
    """The root a parsed JSON document holds (format version, schema, key ids, disjoint
    roles, a real expiry date); its signatures are not checked here."""
    _check_format_version(raw, what)
    error = schemas.violation("chain-trust-root", raw)
    if error is not None:
        raise SignatureInvalidError(f"{what}: not a trust root: schema violation {error}")
    s = raw["signed"]
    keys = {k: PublicKey(bytes.fromhex(v["public"])) for k, v in s["keys"].items()}
    for keyid, public in keys.items():
        if key_id(public.raw) != keyid:
            raise SignatureInvalidError(f"{what}: key id {keyid[:16]} is not its key's SHA-256")
    root, revisions = _role(s, "root", what), _role(s, "revisions", what)
    shared = sorted(set(root.keyids) & set(revisions.keyids))
    if shared:
        raise SignatureInvalidError(
            f"{what}: key {shared[0][:16]} is in both the root and the revisions role "
            "(root keys stay offline and sign only roots)"
        )
    try:
        parse_time(s["expires"])
    except ValueError as exc:
        raise SignatureInvalidError(f"{what}: expires {s['expires']!r} is no date") from exc
    sigs = tuple((g["keyid"], g["sig"]) for g in raw["signatures"])
    return Root(s["version"], s["chain"], s["expires"], keys, root, revisions, sigs)


_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def _v1_keys(signed: dict[str, Any], what: str) -> dict[str, PublicKey]:
    """The ``keys`` of a format-version-1 root, each checked against its key id."""
    keys = signed.get("keys")
    if not isinstance(keys, dict) or not 1 <= len(keys) <= 64:
        raise SignatureInvalidError(f"{what}: a version-1 root needs 1 to 64 keys")
    out = {}
    for keyid, entry in keys.items():
        public = entry.get("public") if isinstance(entry, dict) else None
        if not isinstance(public, str) or not _HEX64.fullmatch(public):
            raise SignatureInvalidError(f"{what}: key {keyid[:16]} has no 64-hex public key")
        if key_id(bytes.fromhex(public)) != keyid:
            raise SignatureInvalidError(f"{what}: key id {keyid[:16]} is not its key's SHA-256")
        out[keyid] = PublicKey(bytes.fromhex(public))
    return out


def parse_v1_root(raw: Any, what: str) -> Root:
    """A root of format version 1 (one key list and one ``threshold`` for roots and
    revisions alike), self-signed by that threshold, as the predecessor of the
    version-2 root that replaces it (migration, SPEC §17.11): its keys form both roles.
    Never trusted as a node's root; SignatureInvalidError for anything else."""
    signed = raw.get("signed") if isinstance(raw, dict) else None
    if (
        not isinstance(signed, dict)
        or signed.get("format") != ROOT_FORMAT
        or (signed.get("format_version", 1) != 1)
    ):
        raise SignatureInvalidError(f"{what}: not a trust root of format version 1")
    keys = _v1_keys(signed, what)
    version, chain, threshold = signed.get("version"), signed.get("chain"), signed.get("threshold")
    sigs = raw.get("signatures")
    if not (isinstance(version, int) and version >= 1 and isinstance(chain, str)
            and _CHAIN.fullmatch(chain) and isinstance(threshold, int)
            and 1 <= threshold <= len(keys) and isinstance(sigs, list)
            and all(isinstance(g, dict) and isinstance(g.get("keyid"), str)
                    and isinstance(g.get("sig"), str) for g in sigs)):  # fmt: skip
        raise SignatureInvalidError(f"{what}: not a valid trust root of format version 1")
    expires = str(signed.get("expires"))
    try:
        parse_time(expires)
    except ValueError as exc:
        raise SignatureInvalidError(f"{what}: expires {expires!r} is no date") from exc
    role = Role(tuple(sorted(keys)), threshold)
    old = Root(version, chain, expires, keys, role, role,
               tuple((g["keyid"], g["sig"]) for g in sigs))  # fmt: skip
    # Version 1 signed its whole ``signed`` object; Root.signed() would write version 2's.
    valid = old.signers(role, canonical(signed), list(old.signatures))
    if len(valid) < threshold:
        raise SignatureInvalidError(f"{what}: {len(valid)} valid signatures, {threshold} needed")
    return old


def parse_predecessor(data: bytes, what: str) -> Root:
    """A root that a new version-2 root may succeed: of format version 2, or of format
    version 1 (the migration of §17.11); a version-1 root is checked as above."""
    raw = strictjson.loads(data, SignatureInvalidError, what)
    signed = raw.get("signed") if isinstance(raw, dict) else None
    if isinstance(signed, dict) and signed.get("format_version", 1) == 1:
        return parse_v1_root(raw, what)
    return root_from_json(raw, what)


def check_signed_by(root: Root, by: Root, what: str) -> None:
    """A threshold of ``by``'s root role signed ``root`` (SG-1, SG-2)."""
    valid = by.signers(by.root, canonical(root.signed()), list(root.signatures))
    if len(valid) < by.root.threshold:
        raise SignatureInvalidError(
            f"{what}: {len(valid)} valid signatures of the root keys of root version "
            f"{by.version}, {by.root.threshold} needed"
        )


def check_successor(new: Root, old: Root, what: str) -> None:
    """``new`` is version ``old.version + 1`` of the same chain, signed by a threshold
    of ``old``'s root role and of its own (SG-2)."""
    if new.version != old.version + 1 or new.chain != old.chain:
        raise SignatureInvalidError(
            f"{what}: version {new.version} of chain {new.chain!r}, expected version "
            f"{old.version + 1} of {old.chain!r}"
        )
    check_signed_by(new, old, what)
    check_signed_by(new, new, what)


def make_root(
    chain: str, *, root_keys: list[PublicKey], root_threshold: int,
    revision_keys: list[PublicKey], revision_threshold: int, expires: str,
    signers: list[SigningKey], previous: Root | None = None,
) -> Root:  # fmt: skip
    """A signed root: version 1, or the successor of ``previous`` (same chain id).

    ``signers`` are root keys (of this root, and of ``previous``'s root role).
    Raises BadArgumentError for an invalid root (a key in both roles, a
    threshold above its keys) and SignatureInvalidError if ``signers`` do not
    meet the thresholds a node will check (its own, and ``previous``'s).
    """
    version = 1 if previous is None else previous.version + 1
    keys = {k.keyid: k for k in [*root_keys, *revision_keys]}
    root = Root(
        version, chain, expires, keys,
        Role(tuple(sorted({k.keyid for k in root_keys})), root_threshold),
        Role(tuple(sorted({k.keyid for k in revision_keys})), revision_threshold),
    )  # fmt: skip
    try:
        root_from_json(root.to_json(), "the new root")
    except SignatureInvalidError as exc:
        raise BadArgumentError(f"invalid root: {exc}") from None
    payload = canonical(root.signed())
    sigs = tuple(sorted({(k.public.keyid, k.sign(payload)) for k in signers}))
    root = replace(root, signatures=sigs)
    check_signed_by(root, root, "the new root")
    if previous is not None:
        check_signed_by(root, previous, "the new root")
    return root


@dataclass(frozen=True)
class RevisionSignature:
    """One key's signature object: what it signed (``signed``), the key id and signature."""

    signed: dict[str, Any]
    keyid: str
    sig: str

    def to_bytes(self) -> bytes:
        doc = {"signed": self.signed, "keyid": self.keyid, "sig": self.sig}
        return (json.dumps(doc, indent=2) + "\n").encode()


def revision_payload(chain: str, revision: int, data: bytes, expires: str) -> dict[str, Any]:
    """What a key signs for a revision: chain id, revision number, BLAKE3 of its bytes, expiry."""
    return {"format": REVISION_FORMAT, "chain": chain, "revision": revision,
            "manifest": digest_bytes(data), "expires": expires}  # fmt: skip


def sign_revision(key: SigningKey, payload: dict[str, Any]) -> RevisionSignature:
    return RevisionSignature(payload, key.public.keyid, key.sign(canonical(payload)))


def parse_revision_signature(data: bytes) -> RevisionSignature | None:
    """A signature object, or None if it is not one (it then counts as no signature)."""
    try:
        raw = strictjson.loads(data, SignatureInvalidError, "signature")
    except WdeltaError:
        return None
    if schemas.violation("chain-revision-signature", raw) is not None:
        return None
    return RevisionSignature(raw["signed"], raw["keyid"], raw["sig"])


def signature_expiry(
    root: Root, keyid: str, sig: RevisionSignature | None, want: dict[str, Any]
) -> int | None:
    """SG-4 for one signature object: its expiry (POSIX seconds) if ``sig`` is key
    ``keyid``'s valid signature, ``keyid`` a revisions key of ``root``, of the chain, revision and
    manifest digest ``want`` names; None if it does not count."""
    public = role_keys(root, root.revisions).get(keyid)
    if public is None or sig is None or sig.keyid != keyid or not binds(sig.signed, want):
        return None
    if not public.verify(sig.sig, canonical(sig.signed)):
        return None
    return _expiry(sig.signed["expires"])


def binds(signed: dict[str, Any], want: dict[str, Any]) -> bool:
    """The signed payload names this chain, revision and manifest digest (SG-4)."""
    return all(signed.get(k) == want[k] for k in ("format", "chain", "revision", "manifest"))


def _expiry(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError:
        return 0  # a signature with an impossible date is expired


@dataclass(frozen=True)
class VerifiedRevision:
    """A manifest revision that passed SG-3..SG-5, and the revisions keys that signed it."""

    manifest: Manifest
    signers: list[str]


# Stored signature objects of one revision, by key id: the bytes found for that key
# (bounded by the caller), None if there were none (absent, or too long to count).
StoredSignatures = Mapping[str, bytes | None]


class TrustedSet:
    """The roots a node trusts, from the operator's trust root (``roots[0]``) to the newest
    (``root``); it only moves forward, and only by roots that pass :meth:`update_root`."""

    def __init__(self, root: Root) -> None:
        self.roots = [root]

    @property
    def root(self) -> Root:
        return self.roots[-1]

    def update_root(self, data: bytes, what: str) -> Root:
        """Trust the root in ``data`` (named ``what`` in errors) if it is the successor of
        the newest trusted root (SG-2); SignatureInvalidError if not."""
        new = parse_root(data, what)
        check_successor(new, self.root, what)
        self.roots.append(new)
        return new

    def resume_root(self, kept: Root, where: str) -> None:
        """Trust ``kept``, a root a node kept at ``where`` in an earlier run, if it is newer
        than the newest trusted root and its successor (SG-2); an older one is skipped.
        A root of another chain is a bad argument; one that does not descend from the
        trust root is SignatureInvalidError (the remedy: delete ``where``)."""
        if kept.chain != self.root.chain:
            raise BadArgumentError(
                f"{where} keeps a root of chain {kept.chain!r}, the trust root is of "
                f"{self.root.chain!r}: delete it to start again from the trust root"
            )
        if kept.version <= self.root.version:
            return
        try:
            check_successor(kept, self.root, f"{where}: kept root version {kept.version}")
        except SignatureInvalidError as exc:
            raise SignatureInvalidError(
                f"{exc}: it does not descend from trust root version {self.roots[0].version}; "
                f"delete {where} to walk again from the trust root"
            ) from None
        self.roots.append(kept)

    def revision_keyids(self) -> list[str]:
        """The key ids whose signature objects count for a revision (the newest root's
        revisions role), sorted: what the caller reads before :meth:`check_revision`."""
        return sorted(role_keys(self.root, self.root.revisions))

    def check_fresh_root(self, now: float) -> None:
        """FrozenError if the newest trusted root expired at ``now`` (SG-3)."""
        root = self.root
        if root.expired(now):
            raise FrozenError(f"trust root version {root.version} expired at {root.expires}")

    def valid_signatures(
        self, revision: int, data: bytes, stored: StoredSignatures
    ) -> dict[str, int]:
        """Key id → expiry (POSIX seconds) of each revisions key of the newest root whose
        signature object in ``stored`` validly signs revision ``revision`` with bytes
        ``data`` (SG-4), whatever their number or expiry."""
        want = revision_payload(self.root.chain, revision, data, "")
        valid: dict[str, int] = {}
        for keyid in self.revision_keyids():
            found = stored.get(keyid)
            sig = None if found is None else parse_revision_signature(found)
            expiry = signature_expiry(self.root, keyid, sig, want)
            if expiry is not None:
                valid[keyid] = expiry
        return valid

    def check_revision(
        self, revision: int, data: bytes, stored: StoredSignatures, *, now: float,
        fresh: bool = True,
    ) -> list[str]:  # fmt: skip
        """Key ids of the newest root's revisions role that validly signed revision
        ``revision`` with bytes ``data`` (SG-3..SG-5); SignatureInvalidError below its
        threshold, FrozenError if ``fresh`` and too few of them (or the root) are
        unexpired at ``now``."""
        root = self.root
        if fresh:
            self.check_fresh_root(now)
        valid = self.valid_signatures(revision, data, stored)
        needed = root.revisions.threshold
        if len(valid) < needed:
            raise SignatureInvalidError(
                f"revision {revision}: {len(valid)} valid signatures of trusted keys, "
                f"{needed} needed (revisions role of root version {root.version})"
            )
        if fresh and sum(t > now for t in valid.values()) < needed:
            raise FrozenError(
                f"revision {revision} is the newest, and its signatures expired at "
                f"{format_time(max(valid.values()))}: the chain is frozen (no fresh revision)"
            )
        return sorted(valid)

    def verify_manifest(
        self, revision: int, data: bytes, stored: StoredSignatures, *, now: float,
        fresh: bool = True,
    ) -> VerifiedRevision:  # fmt: skip
        """Revision ``revision``'s manifest from its bytes, once :meth:`check_revision`
        accepted its signatures (ManifestInvalidError for bytes that are no manifest)."""
        signers = self.check_revision(revision, data, stored, now=now, fresh=fresh)
        return VerifiedRevision(parse_manifest(data, expected_revision=revision), signers)

    def check_stored_root(self, data: bytes | None, what: str) -> None:
        """The chain's copy ``data`` (``what``) of the newest root's version, if it stores
        one, must be that root: a writer given another chain's (or a forged) trust file
        signs what the chain's nodes refuse."""
        root = self.root
        if data is not None and parse_root(data, what).signed() != root.signed():
            raise SignatureInvalidError(
                f"{what} in the chain differs from the trust root given (chain "
                f"{root.chain!r}, version {root.version}): nodes that hold the chain's root "
                "would refuse these signatures"
            )

    def check_signers(self, keys: list[SigningKey], expires: str, *, now: float) -> None:
        """WS-5 without I/O: refuse, as a node would at ``now``, the signatures ``keys``
        would make expiring at ``expires`` (see :meth:`.trust.Trust.check_signers`).
        Each key signs a probe payload, parsed and checked as stored signature objects
        are (schema, then :func:`signature_expiry`); it is never stored."""
        root = self.root
        if root.expired(now):
            raise FrozenError(
                f"trust root version {root.version} expired at {root.expires}: nodes refuse "
                "every revision (SG-3); store a new root version (chain rotate) first"
            )
        probe = revision_payload(root.chain, 1, b"", expires)
        for key in keys:
            stored = parse_revision_signature(sign_revision(key, probe).to_bytes())
            if stored is None:
                raise SignatureInvalidError(
                    f"a signature expiring at {expires!r} breaks the signature schema: "
                    "nodes would count it as absent (SG-4)"
                )
            expiry = signature_expiry(root, key.public.keyid, stored, probe)
            if expiry is None:
                raise SignatureInvalidError(
                    f"key {key.public.keyid[:16]} is not a revisions key of trust root "
                    f"version {root.version} (revoked, never trusted, or a root key: root "
                    "keys sign only roots): nodes would not count its signature (SG-4)"
                )
            if expiry <= now:
                raise FrozenError(
                    f"signatures expiring at {expires} would be expired when stored: nodes "
                    "would refuse the revision as frozen (SG-5); give a positive validity "
                    "(--expires-days)"
                )
