"""Trust roots and revision signatures (SPEC.md "Signed revisions", SG-1..SG-7).

A *root* lists the Ed25519 keys trusted to sign one chain and how many of
them (the threshold) must sign.  A node starts from a root it was given out
of band and walks the chain's newer roots (``trust/root-V.json``), each
signed by a threshold of the previous root's keys and of its own, so keys
can be rotated and revoked.  A revision is accepted only if a threshold of
the current root's keys signed (chain, revision, BLAKE3 of its bytes,
expiry), each in ``signatures/<digest>/<keyid>.json``, written only after the
revision itself was created (WS-2: a writer that lost the race signs nothing).
A writer checks its own signatures with the node's rule before it uploads
anything (:meth:`Trust.check_signers`, WS-5).
"""

from __future__ import annotations

import calendar
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import schemas, strictjson
from ..arguments import PathLike, as_path
from ..atomic import atomic_file
from ..digest import digest_bytes
from ..errors import BadArgumentError, LimitExceededError, WdeltaError
from .errors import ConflictError, FrozenError, NotFoundError, SignatureInvalidError
from .signing import MAX_DOCUMENT, PublicKey, SigningKey, canonical, key_id, read_json
from .storage.base import Storage

ROOT_FORMAT = "wdelta-trust-root"
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
class Root:
    """One version of a chain's trust root; ``keys`` by key id, ``expires`` UTC text."""

    version: int
    chain: str
    expires: str
    keys: dict[str, PublicKey]
    threshold: int
    signatures: tuple[tuple[str, str], ...] = ()

    def signed(self) -> dict[str, Any]:
        return {
            "format": ROOT_FORMAT, "version": self.version, "chain": self.chain,
            "expires": self.expires, "threshold": self.threshold,
            "keys": {k: {"type": "ed25519", "public": p.raw.hex()} for k, p in self.keys.items()},
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        sigs = [{"keyid": k, "sig": s} for k, s in self.signatures]
        return {"signed": self.signed(), "signatures": sigs}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()

    def signers(self, payload: bytes, signatures: list[tuple[str, str]]) -> set[str]:
        """Key ids of this root whose signature of ``payload`` is among ``signatures``."""
        return {k for k, sig in signatures if k in self.keys and self.keys[k].verify(sig, payload)}

    def expired(self, now: float) -> bool:
        return parse_time(self.expires) <= now


def parse_root(data: bytes, what: str) -> Root:
    """A root document (schema, key ids, threshold ≤ keys); else SignatureInvalidError."""
    raw = strictjson.loads(data, SignatureInvalidError, what)
    return _root_from_json(raw, what)


def _root_from_json(raw: Any, what: str) -> Root:
    error = schemas.violation("chain-trust-root", raw)
    if error is not None:
        raise SignatureInvalidError(f"{what}: not a trust root: schema violation {error}")
    s = raw["signed"]
    keys = {k: PublicKey(bytes.fromhex(v["public"])) for k, v in s["keys"].items()}
    for keyid, public in keys.items():
        if key_id(public.raw) != keyid:
            raise SignatureInvalidError(f"{what}: key id {keyid[:16]} is not its key's SHA-256")
    if s["threshold"] > len(keys):
        raise SignatureInvalidError(f"{what}: threshold {s['threshold']} > {len(keys)} keys")
    try:
        parse_time(s["expires"])
    except ValueError as exc:
        raise SignatureInvalidError(f"{what}: expires {s['expires']!r} is no date") from exc
    sigs = tuple((g["keyid"], g["sig"]) for g in raw["signatures"])
    return Root(s["version"], s["chain"], s["expires"], keys, s["threshold"], sigs)


def check_signed_by(root: Root, by: Root, what: str) -> None:
    """A threshold of ``by``'s keys signed ``root`` (SG-1, SG-2)."""
    valid = by.signers(canonical(root.signed()), list(root.signatures))
    if len(valid) < by.threshold:
        raise SignatureInvalidError(
            f"{what}: {len(valid)} valid signatures of the keys of root version {by.version}, "
            f"{by.threshold} needed"
        )


def make_root(
    chain: str, keys: list[PublicKey], threshold: int, expires: str,
    signers: list[SigningKey], previous: Root | None = None,
) -> Root:  # fmt: skip
    """A signed root: version 1, or the successor of ``previous`` (same chain id).

    Raises SignatureInvalidError if ``signers`` do not meet the thresholds a
    node will check (its own, and ``previous``'s).
    """
    version = 1 if previous is None else previous.version + 1
    root = Root(version, chain, expires, {k.keyid: k for k in keys}, threshold)
    error = schemas.violation("chain-trust-root", root.to_json())
    if error is not None or threshold > len(root.keys):
        raise BadArgumentError(f"invalid root: {error or f'threshold {threshold} > keys'}")
    payload = canonical(root.signed())
    sigs = tuple(sorted({(k.public.keyid, k.sign(payload)) for k in signers}))
    root = Root(version, chain, expires, root.keys, threshold, sigs)
    check_signed_by(root, root, "the new root")
    if previous is not None:
        check_signed_by(root, previous, "the new root")
    return root


def read_root_file(path: PathLike) -> Root:
    """A node's trust file: a trust root signed by a threshold of its own keys (SG-1).

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
    """The object at ``key`` if it exists and is at most MAX_DOCUMENT bytes (SG-4: a
    longer one counts as absent, whatever size the store reported for it)."""
    info = storage.stat(key)  # an object said to be longer is not even opened
    if info is None or info.size > MAX_DOCUMENT:
        return None
    try:
        return storage.read(key, MAX_DOCUMENT)
    except (NotFoundError, LimitExceededError):
        return None


def keep_newest_root(policy: Trust, storage: Storage, path: Path) -> None:
    """Resume ``policy`` from the root kept in ``path``, walk the chain's newer roots
    (SG-2) and keep the newest in ``path``, so that a revocation survives a restart.
    The walk comes before any revision is read: a newer root is kept even if the
    revision is then refused."""
    policy.resume(path)
    policy.update(storage)
    policy.persist(path)


def root_state_beside(local: Path) -> Path:
    """Where a node keeps the newest trust root it accepted: ``.NAME.wdelta-root.json``."""
    return local.parent / f".{local.name}.wdelta-root.json"


class Trust:
    """A node's trust policy: the newest root accepted so far (it only moves forward)."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.given = root.version  # the trust file's own version, never worth keeping

    @classmethod
    def from_file(cls, path: PathLike) -> Trust:
        return cls(read_root_file(path))

    def resume(self, path: Path) -> None:
        """Move to the root kept in ``path`` by an earlier run, if it is newer (SG-2)."""
        if not path.exists():
            return
        saved = read_root_file(path)
        if saved.chain != self.root.chain:
            raise BadArgumentError(
                f"{path} keeps a root of chain {saved.chain!r}, the trust root is of "
                f"{self.root.chain!r}: delete it to start again from the trust root"
            )
        if saved.version > self.root.version:
            self.root = saved

    def persist(self, path: Path) -> None:
        """Keep the current root in ``path`` (atomically) if it is newer than the kept one."""
        if self.root.version <= self.given:
            return
        if path.exists() and read_root_file(path).version >= self.root.version:
            return
        with atomic_file(path, overwrite=True) as fd:
            view = memoryview(self.root.to_bytes())
            while view:
                view = view[os.write(fd, view) :]

    def update(self, storage: Storage) -> Root:
        """Walk the chain's newer roots (SG-2); each must be signed by a threshold of
        the previous root's keys and of its own."""
        for _ in range(MAX_ROOT_STEPS):
            key = root_key(self.root.version + 1)
            info = storage.stat(key)
            if info is None:
                return self.root
            if info.size > MAX_DOCUMENT:
                raise SignatureInvalidError(f"{key}: {info.size} bytes, not a trust root")
            try:
                data = storage.read(key, MAX_DOCUMENT)
            except LimitExceededError as exc:  # a store that lied about its size
                raise SignatureInvalidError(
                    f"{key}: over {MAX_DOCUMENT} bytes, not a trust root"
                ) from exc
            new = parse_root(data, key)
            if new.version != self.root.version + 1 or new.chain != self.root.chain:
                raise SignatureInvalidError(
                    f"{key}: version {new.version} of chain {new.chain!r}, expected version "
                    f"{self.root.version + 1} of {self.root.chain!r}"
                )
            check_signed_by(new, self.root, key)
            check_signed_by(new, new, key)
            self.root = new
        return self.root

    def check_revision(
        self, storage: Storage, revision: int, data: bytes, *, now: float | None = None,
        fresh: bool = True,
    ) -> list[str]:  # fmt: skip
        """Key ids of the current root that validly signed revision ``revision`` with
        bytes ``data`` (SG-3..SG-5); SignatureInvalidError below the threshold,
        FrozenError if ``fresh`` and too few of them (or the root) are unexpired."""
        root = self.update(storage)
        now = time.time() if now is None else now
        if fresh and root.expired(now):
            raise FrozenError(f"trust root version {root.version} expired at {root.expires}")
        valid = self.valid_signatures(storage, revision, data)
        if len(valid) < root.threshold:
            raise SignatureInvalidError(
                f"revision {revision}: {len(valid)} valid signatures of trusted keys, "
                f"{root.threshold} needed (root version {root.version})"
            )
        if fresh and sum(t > now for t in valid.values()) < root.threshold:
            raise FrozenError(
                f"revision {revision} is the newest, and its signatures expired at "
                f"{format_time(max(valid.values()))}: the chain is frozen (no fresh revision)"
            )
        return sorted(valid)

    def valid_signatures(self, storage: Storage, revision: int, data: bytes) -> dict[str, int]:
        """Key id → expiry (POSIX seconds) of each key of the current root whose stored
        signature of revision ``revision`` with bytes ``data`` is valid (SG-4), whatever
        their number or expiry: the threshold and freshness are the caller's."""
        want = revision_payload(self.root.chain, revision, data, "")
        valid: dict[str, int] = {}
        for keyid in sorted(self.root.keys):
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
        expired (SG-3, FrozenError), a key that is not one of its keys (revoked or never
        trusted: SG-4, SignatureInvalidError), an expiry not after ``now`` (SG-5, FrozenError),
        a trust root other than the chain's own copy of that version (SignatureInvalidError).
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
                    f"key {key.public.keyid[:16]} is not a key of trust root version "
                    f"{root.version} (revoked, or never trusted): nodes would not count "
                    "its signature (SG-4)"
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
                stored = parse_revision_signature(storage.read(target, MAX_DOCUMENT))
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
    ``keyid``'s valid signature, ``keyid`` a key of ``root``, of the chain, revision and
    manifest digest ``want`` names; None if it does not count."""
    public = root.keys.get(keyid)
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
