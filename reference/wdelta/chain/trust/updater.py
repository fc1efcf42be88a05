"""Trust roots and revision signatures over storage (SPEC §17.11, SG-1..SG-7).

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

This module is the I/O around the pure trust core (:mod:`.trusted_set`, which
verifies bytes and holds the trusted roots), as python-tuf's ``Updater`` is
around its ``TrustedMetadataSet``: it reads roots and signature objects from
storage (bounded by MAX_DOCUMENT_BYTES), the operator's trust file and the roots
a node keeps on disk, writes signatures and kept roots, and reads the clock.
The document model and the checks are re-exported from the core under their
old names here.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from pathlib import Path

from ...arguments import PathLike, as_path
from ...errors import BadArgumentError, LimitExceededError, WdeltaError
from ...format import strictjson
from ...format.digest import digest_bytes
from ...io.atomic import atomic_file
from ...limits import MAX_DOCUMENT_BYTES
from ..errors import ConflictError, NotFoundError, SignatureInvalidError
from ..storage.base import Storage
from ..storage.smallfile import read_regular
from .signing import SigningKey, read_json
from .trusted_set import (
    REVISION_FORMAT,
    ROOT_FORMAT,
    ROOT_FORMAT_VERSION,
    RevisionSignature,
    Role,
    Root,
    TrustedSet,
    VerifiedRevision,
    binds,
    check_signed_by,
    check_successor,
    format_time,
    make_root,
    parse_predecessor,
    parse_revision_signature,
    parse_root,
    parse_time,
    parse_v1_root,
    revision_payload,
    role_keys,
    root_from_json,
    sign_revision,
    signature_expiry,
)

__all__ = [
    "KEPT_FORMAT",
    "MAX_KEPT",
    "MAX_ROOT_STEPS",
    "REVISION_FORMAT",
    "ROOT_FORMAT",
    "ROOT_FORMAT_VERSION",
    "RevisionSignature",
    "Role",
    "Root",
    "Trust",
    "VerifiedRevision",
    "as_trust",
    "check_signed_by",
    "check_successor",
    "expires_in",
    "format_time",
    "keep_newest_root",
    "keep_roots_beside",
    "make_root",
    "parse_kept_roots",
    "parse_predecessor",
    "parse_revision_signature",
    "parse_root",
    "parse_time",
    "read_kept_roots",
    "read_previous_root",
    "read_root_file",
    "revision_payload",
    "role_keys",
    "root_key",
    "root_state_beside",
    "sign_revision",
    "signature_expiry",
    "signature_key",
]

KEPT_FORMAT = "wdelta-kept-roots"
MAX_KEPT = 1 << 24  # bytes of a node's kept roots: 256 roots of the 64 KiB maximum
MAX_ROOT_STEPS = 1024  # roots walked in one update: bounds a flood of rotations
_YEAR_10000 = 253402300800  # POSIX seconds of 10000-01-01: expiries have 4-digit years


def root_key(version: int) -> str:
    return f"trust/root-{version:012d}.json"


def signature_key(manifest_digest: str, keyid: str) -> str:
    return f"signatures/{manifest_digest}/{keyid}.json"


def expires_in(seconds: float, now: float | None = None) -> str:
    """The expiry, as signed, of a signature valid for ``seconds`` from ``now``;
    BadArgumentError if it is no date a signature can hold (not finite, after 9999)."""
    end = (time.time() if now is None else now) + seconds
    if not math.isfinite(end) or not 0 <= end < _YEAR_10000:
        raise BadArgumentError(f"a validity of {seconds:g} seconds gives no date a signature holds")
    return format_time(end)


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
    root = root_from_json(raw, str(path))
    check_signed_by(root, root, str(path))
    return root


def read_previous_root(path: PathLike) -> Root:
    """The root a new root succeeds (``chain root --previous``): a trust file of format
    version 2, read as :func:`read_root_file`, or of format version 1, whose one key list
    and threshold then sign the new root as its root role would (the migration to
    version 2, SPEC §17.11)."""
    path = as_path(path, "previous")
    raw = read_json(Path(path), "trust root")
    signed = raw.get("signed")
    if (
        isinstance(signed, dict)
        and signed.get("format") == ROOT_FORMAT
        and (signed.get("format_version", 1) == 1)
    ):
        return parse_v1_root(raw, str(path))
    return read_root_file(path)


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


def _read_root(storage: Storage, key: str) -> bytes | None:
    """The bytes of the root at ``key``, None if there is none; one longer than
    MAX_DOCUMENT_BYTES is SignatureInvalidError (a root is never skipped)."""
    info = storage.stat(key)
    if info is None:
        return None
    if info.size > MAX_DOCUMENT_BYTES:
        raise SignatureInvalidError(f"{key}: {info.size} bytes, not a trust root")
    try:
        return storage.read(key, MAX_DOCUMENT_BYTES)
    except LimitExceededError as exc:  # a store that lied about its size
        raise SignatureInvalidError(
            f"{key}: over {MAX_DOCUMENT_BYTES} bytes, not a trust root"
        ) from exc


def keep_newest_root(policy: Trust, storage: Storage, path: Path) -> None:
    """Resume ``policy`` from the roots kept in ``path`` (each checked to descend from
    the policy's trust root), walk the chain's newer roots (SG-2) and keep them in
    ``path``, so that a revocation survives a restart.  The walk comes before any
    revision is read: a newer root is kept even if the revision is then refused."""
    policy.resume(path)
    policy.update(storage)
    policy.persist(path)


def keep_roots_beside(policy: Trust | None, storage: Storage, beside: Path | None) -> None:
    """With a trust policy and a file ``beside`` (a checkpoint, a state file), keep the
    roots walked to next to it (``.NAME.wdelta-root.json``, :func:`keep_newest_root`);
    otherwise they live in memory only."""
    if policy is not None and beside is not None:
        keep_newest_root(policy, storage, root_state_beside(beside))


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
        roots = [root_from_json(doc, str(path)) for doc in raw["roots"]]
    except WdeltaError as exc:
        raise _refuse_kept(path, str(exc)) from None
    if any(b.version != a.version + 1 for a, b in itertools.pairwise(roots)):
        raise _refuse_kept(path, "root versions not consecutive")
    return roots


class Trust:
    """A node's trust policy: the roots accepted so far, from the operator's trust
    root (``roots[0]``) to the newest (``root``); it only moves forward.

    The roots and every verdict are the core's (``core``, a :class:`TrustedSet`);
    this class reads what the core checks (storage, files, the clock)."""

    def __init__(self, root: Root) -> None:
        self.core = TrustedSet(root)
        self.given = root.version  # the trust file's own version, never worth keeping
        self.kept = 0  # the newest root version in the node's kept roots file

    @property
    def roots(self) -> list[Root]:
        return self.core.roots

    @property
    def root(self) -> Root:
        return self.core.root

    @classmethod
    def from_file(cls, path: PathLike) -> Trust:
        return cls(read_root_file(path))

    def resume(self, path: Path) -> None:
        """Move to the newest root kept in ``path`` by an earlier run: each kept root
        newer than the current one must be its successor (SG-2), so that only roots
        descending from the operator's trust root are resumed from."""
        for kept in read_kept_roots(path):
            self.kept = max(self.kept, kept.version)
            self.core.resume_root(kept, str(path))

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
            data = _read_root(storage, key)
            if data is None:
                break
            self.core.update_root(data, key)
        return self.root

    def stored_signatures(self, storage: Storage, data: bytes) -> dict[str, bytes | None]:
        """The signature object stored for the revision with bytes ``data`` by each key
        that counts for it (SG-4: absent, or longer than MAX_DOCUMENT_BYTES: None)."""
        digest = digest_bytes(data)
        return {
            k: _read_small(storage, signature_key(digest, k)) for k in self.core.revision_keyids()
        }

    def check_revision(
        self, storage: Storage, revision: int, data: bytes, *, now: float | None = None,
        fresh: bool = True,
    ) -> list[str]:  # fmt: skip
        """Key ids of the current root's revisions role that validly signed revision
        ``revision`` with bytes ``data`` (SG-3..SG-5); SignatureInvalidError below
        its threshold, FrozenError if ``fresh`` and too few of them (or the root) are
        unexpired."""
        now, stored = self._signatures(storage, data, now, fresh)
        return self.core.check_revision(revision, data, stored, now=now, fresh=fresh)

    def verified_manifest(
        self, storage: Storage, revision: int, data: bytes, *, now: float | None = None,
        fresh: bool = True,
    ) -> VerifiedRevision:  # fmt: skip
        """Revision ``revision``'s manifest from its bytes ``data`` and the keys that
        signed it, once accepted as :meth:`check_revision` accepts it."""
        now, stored = self._signatures(storage, data, now, fresh)
        return self.core.verify_manifest(revision, data, stored, now=now, fresh=fresh)

    def _signatures(
        self, storage: Storage, data: bytes, now: float | None, fresh: bool
    ) -> tuple[float, dict[str, bytes | None]]:
        """Walk the roots, then read the stored signatures of the revision with bytes
        ``data``; with the time of the check.  An expired root (if ``fresh``) is refused
        before any signature is read."""
        self.update(storage)
        now = time.time() if now is None else now
        if fresh:
            self.core.check_fresh_root(now)
        return now, self.stored_signatures(storage, data)

    def valid_signatures(self, storage: Storage, revision: int, data: bytes) -> dict[str, int]:
        """Key id → expiry (POSIX seconds) of each revisions key of the current root whose stored
        signature of revision ``revision`` with bytes ``data`` is valid (SG-4), whatever
        their number or expiry: the threshold and freshness are the caller's."""
        return self.core.valid_signatures(revision, data, self.stored_signatures(storage, data))

    def check_signers(
        self, storage: Storage, keys: list[SigningKey], expires: str, *, now: float | None = None
    ) -> None:
        """WS-5: refuse, as a node would, signatures ``keys`` would make expiring at
        ``expires``, before a writer uploads anything: a root reached by SG-2 that has
        expired (SG-3, FrozenError), a key not in its revisions role (revoked, never
        trusted, or a root key: SG-4, SignatureInvalidError), an expiry not after ``now``
        (SG-5, FrozenError), a trust root other than the chain's own copy of that version
        (SignatureInvalidError)."""
        root = self.update(storage)
        key = root_key(root.version)
        self.core.check_stored_root(_read_small(storage, key), key)
        now = time.time() if now is None else now
        self.core.check_signers(keys, expires, now=now)

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
                if stored is None or stored.keyid != obj.keyid or not binds(stored.signed, payload):
                    raise ConflictError(f"{target} exists and is not this key's signature")


def as_trust(value: object) -> Trust | None:
    """None, a Trust, or a trust root file's path → Trust."""
    if value is None or isinstance(value, Trust):
        return value
    return Trust.from_file(as_path(value, "trust"))
