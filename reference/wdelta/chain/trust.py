"""Trust roots and revision signatures (SPEC.md "Signed revisions", SG-1..SG-7).

A *root* lists the Ed25519 keys trusted for one chain in two roles, as TUF
separates its root role from the online ones: the *root* role's keys (kept
offline) sign root versions, the *revisions* role's keys (the trainer's,
online) sign manifest revisions, each role with its threshold.  A node
starts from a root it was given out of band and walks the chain's newer
roots (``trust/root-V.json``), each signed by a threshold of the previous
root's root role and of its own, so keys can be rotated and revoked, and a
stolen online key cannot rewrite the trust.  A revision is accepted only if
a threshold of the current root's revisions role signed (chain, revision,
BLAKE3 of its bytes, expiry), each in ``signatures/<digest>/<keyid>.json``,
written only after the revision itself was created (WS-2: a writer that lost
the race signs nothing).  A writer checks its own signatures with the node's
rule before it uploads anything (:meth:`Trust.check_signers`, WS-5).  A node
keeps the roots it walked to (``.NAME.wdelta-root.json``) and resumes from
them only if they descend, root by root, from the trust root its operator gave.
"""

from __future__ import annotations

import calendar
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import BadArgumentError, LimitExceededError, UnsupportedVersionError, WdeltaError
from ..format import schemas, strictjson
from ..format.digest import digest_bytes
from ..io.atomic import atomic_file
from ..limits import MAX_DOCUMENT_BYTES
from ..ops.arguments import PathLike, as_path
from .errors import ConflictError, FrozenError, NotFoundError, SignatureInvalidError
from .signing import PublicKey, SigningKey, canonical, key_id, read_json
from .smallfile import read_regular
from .storage.base import Storage

ROOT_FORMAT = "wdelta-trust-root"
ROOT_FORMAT_VERSION = 2  # 1: one key list and threshold for roots and revisions alike
KEPT_FORMAT = "wdelta-kept-roots"
MAX_KEPT = 1 << 24  # bytes of a node's kept roots: 256 roots of the 64 KiB maximum
REVISION_FORMAT = "wdelta-revision"
MAX_ROOT_STEPS = 1024  # roots walked in one update: bounds a flood of rotations
_TIME = "%Y-%m-%dT%H:%M:%SZ"
_YEAR_10000 = 253402300800  # POSIX seconds of 10000-01-01: expiries have 4-digit years


def root_key(version: int) -> str:
    return f"trust/root-{version:012d}.json"


def signature_key(manifest_digest: str, keyid: str) -> str:
    return f"signatures/{manifest_digest}/{keyid}.json"


def format_time(seconds: float) -> str:
    """UTC ``YYYY-MM-DDThh:mm:ssZ`` of a POSIX time (whole seconds)."""
    return time.strftime(_TIME, time.gmtime(int(seconds)))


def expires_in(seconds: float, now: float | None = None) -> str:
    """The expiry, as signed, of a signature valid for ``seconds`` from ``now``;
    BadArgumentError if it is no date a signature can hold (not finite, after 9999)."""
    end = (time.time() if now is None else now) + seconds
    if not math.isfinite(end) or not 0 <= end < _YEAR_10000:
        raise BadArgumentError(f"a validity of {seconds:g} seconds gives no date a signature holds")
    return format_time(end)


def parse_time(text: str) -> int:
    """POSIX seconds of ``YYYY-MM-DDThh:mm:ssZ``; ValueError if it is not a real date."""
    return calendar.timegm(time.strptime(text, _TIME))


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
    return _root_from_json(raw, what)


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


def _root_from_json(raw: Any, what: str) -> Root:
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
        _root_from_json(root.to_json(), "the new root")
    except SignatureInvalidError as exc:
        raise BadArgumentError(f"invalid root: {exc}") from None
    payload = canonical(root.signed())
    sigs = tuple(sorted({(k.public.keyid, k.sign(payload)) for k in signers}))
    root = replace(root, signatures=sigs)
    check_signed_by(root, root, "the new root")
    if previous is not None:
        check_signed_by(root, previous, "the new root")
    return root


def read_root_file(path: PathLike) -> Root:
    """A node's trust file: a trust root signed by a threshold of its own root role (SG-1).

    Not a root at all (a private key, a delta, an HTML page) → BadArgumentError.
    """
    path = as_path(path, "trust")
    raw = read_json(Path(path), "trust root")
    if raw.get("format") is not None or not isinstance(raw.get("signed"), dict):
        kind = raw.get("format", "an unknown JSON object")
        raise BadArgumentError(f"{path} is not a trust root ({kind}); pass the root file")
    if raw["signed"].get("format") != ROOT_FORMAT:
        raise BadArgumentError(f"{path} is not a trust root (a revision signature?)")
    root = _root_from_json(raw, str(path))
    check_signed_by(root, root, str(path))
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


def _read_small(storage: Storage, key: str) -> bytes | None:
    """The object at ``key`` if it exists and is at most MAX_DOCUMENT_BYTES bytes (SG-4: a
    longer one counts as absent, whatever size the store reported for it)."""
    info = storage.stat(key)  # an object said to be longer is not even opened
    if info is None or info.size > MAX_DOCUMENT_BYTES:
        return None
    try:
        return storage.read(key, MAX_DOCUMENT_BYTES)
    except (NotFoundError, LimitExceededError):
        return None


def keep_newest_root(policy: Trust, storage: Storage, path: Path) -> None:
    """Resume ``policy`` from the roots kept in ``path`` (each checked to descend from
    the policy's trust root), walk the chain's newer roots (SG-2) and keep them in
    ``path``, so that a revocation survives a restart.  The walk comes before any
    revision is read: a newer root is kept even if the revision is then refused."""
    policy.resume(path)
    policy.update(storage)
    policy.persist(path)


def root_state_beside(local: Path) -> Path:
    """Where a node keeps the trust roots it accepted: ``.NAME.wdelta-root.json``."""
    return local.parent / f".{local.name}.wdelta-root.json"


def _refuse_kept(path: Path, why: str) -> BadArgumentError:
    return BadArgumentError(
        f"{path}: not the trust roots this node keeps ({why}); delete it to walk again "
        "from the trust root"
    )


def read_kept_roots(path: Path) -> list[Root]:
    """The roots a node kept in ``path`` (oldest first); [] if there is no such file.

    Their signatures are not checked here: :meth:`Trust.resume` checks that each
    descends from the previous one, starting from the node's trust root.
    """
    try:
        data = read_regular(path, MAX_KEPT, lambda why: _refuse_kept(path, why))
    except FileNotFoundError:
        return []
    return parse_kept_roots(data, path)


def parse_kept_roots(data: bytes, path: Path) -> list[Root]:
    """The roots held in ``data`` (read from ``path``, named in errors): a damaged or
    hostile file is refused with BadArgumentError, never ignored."""
    try:
        raw = strictjson.loads(data, BadArgumentError, str(path))
    except (BadArgumentError, UnicodeDecodeError) as exc:
        raise _refuse_kept(path, f"not strict JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != KEPT_FORMAT:
        raise _refuse_kept(path, f"format is not {KEPT_FORMAT!r}")
    if not isinstance(raw.get("roots"), list) or not raw["roots"]:
        raise _refuse_kept(path, "no list of roots")
    try:
        roots = [_root_from_json(doc, str(path)) for doc in raw["roots"]]
    except WdeltaError as exc:
        raise _refuse_kept(path, str(exc)) from None
    if any(b.version != a.version + 1 for a, b in itertools.pairwise(roots)):
        raise _refuse_kept(path, "root versions not consecutive")
    return roots


class Trust:
    """A node's trust policy: the roots accepted so far, from the operator's trust
    root (``roots[0]``) to the newest (``root``); it only moves forward."""

    def __init__(self, root: Root) -> None:
        self.roots = [root]
        self.given = root.version  # the trust file's own version, never worth keeping
        self.kept = 0  # the newest root version in the node's kept roots file

    @property
    def root(self) -> Root:
        return self.roots[-1]

    @classmethod
    def from_file(cls, path: PathLike) -> Trust:
        return cls(read_root_file(path))

    def resume(self, path: Path) -> None:
        """Move to the newest root kept in ``path`` by an earlier run: each kept root
        newer than the current one must be its successor (SG-2), so that only roots
        descending from the operator's trust root are resumed from."""
        for kept in read_kept_roots(path):
            self.kept = max(self.kept, kept.version)
            if kept.chain != self.root.chain:
                raise BadArgumentError(
                    f"{path} keeps a root of chain {kept.chain!r}, the trust root is of "
                    f"{self.root.chain!r}: delete it to start again from the trust root"
                )
            if kept.version <= self.root.version:
                continue
            try:
                check_successor(kept, self.root, f"{path}: kept root version {kept.version}")
            except SignatureInvalidError as exc:
                raise SignatureInvalidError(
                    f"{exc}: it does not descend from trust root version {self.given}; "
                    f"delete {path} to walk again from the trust root"
                ) from None
            self.roots.append(kept)

    def persist(self, path: Path) -> None:
        """Keep the roots newer than the trust root in ``path`` (atomically) if the
        newest of them is newer than the kept ones."""
        if self.root.version <= max(self.given, self.kept):
            return
        doc = {"format": KEPT_FORMAT, "roots": [r.to_json() for r in self.roots[1:]]}
        with atomic_file(path, overwrite=True) as fd:
            view = memoryview((json.dumps(doc, indent=2) + "\n").encode())
            while view:
                view = view[os.write(fd, view) :]
        self.kept = self.root.version

    def update(self, storage: Storage) -> Root:
        """Walk the chain's newer roots (SG-2); each must be signed by a threshold of
        the previous root's root role and of its own."""
        for _ in range(MAX_ROOT_STEPS):
            key = root_key(self.root.version + 1)
            info = storage.stat(key)
            if info is None:
                return self.root
            if info.size > MAX_DOCUMENT_BYTES:
                raise SignatureInvalidError(f"{key}: {info.size} bytes, not a trust root")
            try:
                data = storage.read(key, MAX_DOCUMENT_BYTES)
            except LimitExceededError as exc:  # a store that lied about its size
                raise SignatureInvalidError(
                    f"{key}: over {MAX_DOCUMENT_BYTES} bytes, not a trust root"
                ) from exc
            new = parse_root(data, key)
            check_successor(new, self.root, key)
            self.roots.append(new)
        return self.root

    def check_revision(
        self, storage: Storage, revision: int, data: bytes, *, now: float | None = None,
        fresh: bool = True,
    ) -> list[str]:  # fmt: skip
        """Key ids of the current root's revisions role that validly signed revision
        ``revision`` with bytes ``data`` (SG-3..SG-5); SignatureInvalidError below
        its threshold, FrozenError if ``fresh`` and too few of them (or the root) are
        unexpired."""
        root = self.update(storage)
        now = time.time() if now is None else now
        if fresh and root.expired(now):
            raise FrozenError(f"trust root version {root.version} expired at {root.expires}")
        valid = self.valid_signatures(storage, revision, data)
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

    def valid_signatures(self, storage: Storage, revision: int, data: bytes) -> dict[str, int]:
        """Key id → expiry (POSIX seconds) of each revisions key of the current root whose stored
        signature of revision ``revision`` with bytes ``data`` is valid (SG-4), whatever
        their number or expiry: the threshold and freshness are the caller's."""
        want = revision_payload(self.root.chain, revision, data, "")
        valid: dict[str, int] = {}
        for keyid in sorted(role_keys(self.root, self.root.revisions)):
            stored = _read_small(storage, signature_key(want["manifest"], keyid))
            sig = None if stored is None else parse_revision_signature(stored)
            expiry = signature_expiry(self.root, keyid, sig, want)
            if expiry is not None:
                valid[keyid] = expiry
        return valid

    def check_signers(
        self, storage: Storage, keys: list[SigningKey], expires: str, *, now: float | None = None
    ) -> None:
        """WS-5: refuse, as a node would, signatures ``keys`` would make expiring at
        ``expires``, before a writer uploads anything: a root reached by SG-2 that has
        expired (SG-3, FrozenError), a key not in its revisions role (revoked, never
        trusted, or a root key: SG-4, SignatureInvalidError), an expiry not after ``now``
        (SG-5, FrozenError), a trust root other than the chain's own copy of that version
        (SignatureInvalidError).
        Each key signs a probe payload, read back and checked as nodes read stored
        signature objects (schema, then :func:`signature_expiry`); it is never stored."""
        root = self.update(storage)
        _same_as_stored(storage, root)
        now = time.time() if now is None else now
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

    def sign(self, storage: Storage, revision: int, data: bytes, keys: list[SigningKey],
             expires: str) -> None:  # fmt: skip
        """Store each key's signature of revision ``revision`` create-only; a writer calls
        it only once the revision is created and its own (WS-2)."""
        payload = revision_payload(self.root.chain, revision, data, expires)
        for key in keys:
            obj = sign_revision(key, payload)
            target = signature_key(payload["manifest"], obj.keyid)
            if not storage.create(target, obj.to_bytes()):
                stored = parse_revision_signature(storage.read(target, MAX_DOCUMENT_BYTES))
                if (
                    stored is None
                    or stored.keyid != obj.keyid
                    or not _binds(stored.signed, payload)
                ):
                    raise ConflictError(f"{target} exists and is not this key's signature")


def _same_as_stored(storage: Storage, root: Root) -> None:
    """The chain's copy of ``root``'s version, if it stores one, must be ``root``: a writer
    given another chain's (or a forged) trust file signs what the chain's nodes refuse."""
    key = root_key(root.version)
    data = _read_small(storage, key)
    if data is not None and parse_root(data, key).signed() != root.signed():
        raise SignatureInvalidError(
            f"{key} in the chain differs from the trust root given (chain {root.chain!r}, "
            f"version {root.version}): nodes that hold the chain's root would refuse these "
            "signatures"
        )


def signature_expiry(
    root: Root, keyid: str, sig: RevisionSignature | None, want: dict[str, Any]
) -> int | None:
    """SG-4 for one signature object: its expiry (POSIX seconds) if ``sig`` is key
    ``keyid``'s valid signature, ``keyid`` a revisions key of ``root``, of the chain, revision and
    manifest digest ``want`` names; None if it does not count."""
    public = role_keys(root, root.revisions).get(keyid)
    if public is None or sig is None or sig.keyid != keyid or not _binds(sig.signed, want):
        return None
    if not public.verify(sig.sig, canonical(sig.signed)):
        return None
    return _expiry(sig.signed["expires"])


def _binds(signed: dict[str, Any], want: dict[str, Any]) -> bool:
    """The signed payload names this chain, revision and manifest digest (SG-4)."""
    return all(signed.get(k) == want[k] for k in ("format", "chain", "revision", "manifest"))


def _expiry(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError:
        return 0  # a signature with an impossible date is expired


def as_trust(value: object) -> Trust | None:
    """None, a Trust, or a trust root file's path → Trust."""
    if value is None or isinstance(value, Trust):
        return value
    return Trust.from_file(as_path(value, "trust"))
