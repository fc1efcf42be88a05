"""What a node has accepted from a chain, kept across restarts (SPEC RD-1).

A reader that has accepted manifest revision ``r`` (pulled from it) must
refuse storage rolled back below ``r``, and a revision ``r`` rewritten with
other bytes (a fork).  :class:`Accepted` records the revision and the BLAKE3
of its bytes; :func:`save` writes it as a small JSON file (schema
``chain-acceptance``) atomically (temporary file, fsync, rename), and
:func:`load` reads it back strictly: a damaged or hostile file is refused
with ``bad-argument`` naming it, never ignored (ignoring it would silently
drop the protection).  :func:`check` is the rule itself, with no storage:
the caller passes the head revision's number, digest and parent, and a
function giving the digest of an older revision still stored.

:class:`Tracker` ties these to a chain for ``pull``, ``follow`` and
``follow_weights``: it reads the head, checks it against what was accepted
(unless the operator accepts a deliberate rollback once), and records a
revision once a pull from it succeeded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...arguments import PathLike, as_path
from ...errors import BadArgumentError, StorageError, WdeltaError
from ...format import schemas, strictjson
from ...format.digest import digest_bytes
from ...io.atomic import atomic_file
from ...io.filekind import os_message
from ...io.output_file import pwrite_all
from ..errors import ManifestInvalidError, SignatureInvalidError
from ..model.manifest import Manifest, read_manifest, utc_now
from ..storage.base import Storage
from ..storage.smallfile import read_regular
from .updater import Trust

FORMAT = "wdelta-chain-accepted"
# Version 2 adds ``trust``; an old reader refuses it (its schema says 1) rather than
# silently dropping the requirement of signatures.  Version 1 files are still read.
STATE_VERSION = 2
# A state file is about 200 bytes; anything far larger is not one (checked
# before reading, so a hostile file cannot make the node allocate).
MAX_STATE_BYTES = 1 << 16
REMEDY = (
    "if the chain was rolled back or rewritten deliberately, pull once with "
    "accept_rollback=True or delete {path}"
)


@dataclass(frozen=True)
class TrustRecord:
    """The trust a revision was accepted under: the chain id of the trust root, the
    version of the root the node had reached, and the key ids of that root's
    revisions role whose valid signatures it counted (SG-4)."""

    chain: str
    root: int
    signers: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"chain": self.chain, "root": self.root, "signers": list(self.signers)}


@dataclass(frozen=True)
class Accepted:
    """Manifest revision ``revision`` (≥ 1) was accepted; ``digest``: BLAKE3 (hex) of its bytes.

    ``chain`` (informative) is the location it was read from; ``trust`` the trust
    policy it was accepted under (None: unsigned, no policy).
    """

    revision: int
    digest: str
    chain: str = ""
    trust: TrustRecord | None = None

    def to_bytes(self) -> bytes:
        doc: dict[str, object] = {
            "format": FORMAT, "version": STATE_VERSION, "revision": self.revision,
            "digest": self.digest, "chain": self.chain, "updated": utc_now(),
        }  # fmt: skip
        if self.trust is not None:
            doc["trust"] = self.trust.to_json()
        return (json.dumps(doc, indent=2, ensure_ascii=True) + "\n").encode()


def state_beside(local: Path) -> Path:
    """The default state file of a node's checkpoint ``local``: ``.NAME.wdelta-accepted.json``."""
    return local.parent / f".{local.name}.wdelta-accepted.json"


def _refuse(path: Path, why: str) -> BadArgumentError:
    return BadArgumentError(
        f"{path}: not a usable acceptance state ({why}); it records the newest chain revision "
        "this node accepted: restore it, or delete it to trust the chain's current head"
    )


def load(path: PathLike) -> Accepted | None:
    """The state in ``path``; None if there is none yet. A damaged file is refused."""
    path = as_path(path, "state")
    try:
        data = read_regular(path, MAX_STATE_BYTES, lambda why: _refuse(path, why))
    except FileNotFoundError:
        return None
    return parse(data, path)


def parse(data: bytes, path: Path) -> Accepted:
    """The state held in ``data`` (read from ``path``, named in errors)."""
    if len(data) > MAX_STATE_BYTES:
        raise _refuse(path, f"over {MAX_STATE_BYTES} bytes")
    try:
        raw = strictjson.loads(data, BadArgumentError, "state")
    except (BadArgumentError, UnicodeDecodeError) as exc:
        raise _refuse(path, f"not strict JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise _refuse(path, f"format is not {FORMAT!r}")
    error = schemas.violation("chain-acceptance", raw)
    if error is not None:
        raise _refuse(path, f"schema violation {error}")
    trust = raw.get("trust")
    record = None
    if trust is not None:
        record = TrustRecord(trust["chain"], trust["root"], tuple(trust["signers"]))
    return Accepted(raw["revision"], raw["digest"], raw.get("chain", ""), record)


def save(path: PathLike, accepted: Accepted) -> None:
    """Write ``accepted`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = as_path(path, "state")
    with atomic_file(path, overwrite=True) as fd:
        pwrite_all(fd, accepted.to_bytes(), 0)


def check(
    accepted: Accepted | None, revision: int, digest: str, parent: tuple[int, str] | None,
    stored_digest: Callable[[int], str | None], remedy: str = "",
) -> None:  # fmt: skip
    """Refuse (``manifest-invalid``) a head revision that contradicts ``accepted``.

    ``revision``, ``digest`` (BLAKE3 of its bytes) and ``parent`` are the head's;
    ``stored_digest(r)`` gives the digest of revision ``r`` if storage still
    holds it, else None.  Refused: a lower revision (rolled back); the
    accepted revision with other bytes; the next revision naming another
    parent; a higher revision while storage holds the accepted one with
    other bytes (forks).  Revisions in between are not read: without
    signatures they prove nothing an attacker could not write.
    """
    if accepted is None:
        return
    was = f"revision {accepted.revision} (BLAKE3 {accepted.digest[:16]}) accepted before"
    hint = f"; {remedy}" if remedy else ""
    if revision < accepted.revision:
        raise ManifestInvalidError(
            f"storage rolled back: head revision {revision} is lower than {was}{hint}"
        )
    if revision == accepted.revision:
        found = digest
    elif revision == accepted.revision + 1:
        assert parent is not None  # CH-5: every revision after 1 names its parent
        found = parent[1]
    else:
        found = stored_digest(accepted.revision) or accepted.digest
    if found != accepted.digest:
        raise ManifestInvalidError(
            f"chain forked: revision {accepted.revision} is now BLAKE3 {found[:16]} "
            f"(head revision {revision}), not the {was}{hint}"
        )


def accepted_file(path: PathLike) -> Accepted:
    """What a reader that accepted the manifest revision file ``path`` remembers.

    For ``wdelta chain check MANIFEST --after SEEN`` (the conformance suite's
    ``{seen}``); a file that is not a valid revision is a bad argument.
    """
    path = as_path(path, "after")
    try:
        m = read_manifest(path)
        data = path.read_bytes()
    except (OSError, WdeltaError) as exc:
        raise BadArgumentError(
            f"--after {path}: not a manifest revision accepted before: {exc}"
        ) from None
    return Accepted(m.revision, digest_bytes(data), str(path))


def check_after(path: PathLike, m: Manifest, seen: PathLike,
                stored_digest: Callable[[int], str | None] = lambda r: None) -> None:  # fmt: skip
    """RD-1 for the revision ``m`` read from file ``path``, given revision file ``seen``."""
    path = as_path(path, "manifest")
    try:
        digest = digest_bytes(path.read_bytes())
    except OSError as exc:
        raise StorageError(os_message(path, exc)) from exc
    check(accepted_file(seen), m.revision, digest, m.parent, stored_digest)


def check_state(
    path: PathLike, m: Manifest, state: PathLike, policy: Trust | None, storage: Storage,
    stored_digest: Callable[[int], str | None],
) -> None:  # fmt: skip
    """RD-1 and SG-8 to SG-10 for the revision ``m`` read from file ``path`` (its
    signatures already checked with ``policy``, if any), by a reader whose acceptance
    state is the file ``state`` (``wdelta chain check --state``: the conformance
    suite's ``{state}``); roots are walked in ``storage``, ``stored_digest`` as
    :func:`check`'s."""
    path, state = as_path(path, "manifest"), as_path(state, "state")
    accepted = load(state)
    if accepted is None:
        raise BadArgumentError(f"--state {state}: no such file")
    try:
        digest = digest_bytes(path.read_bytes())
    except OSError as exc:
        raise StorageError(os_message(path, exc)) from exc
    record = accepted.trust
    if record is not None and policy is None:
        raise SignatureInvalidError(_unsigned_refusal(str(state), accepted.revision, record))
    if record is not None and policy is not None and trust_rotated(record, policy, storage,
                                                                   str(state)):  # fmt: skip
        return
    check(accepted, m.revision, digest, m.parent, stored_digest)


def _unsigned_refusal(where: str, revision: int, record: TrustRecord) -> str:
    return (
        f"{where} records revision {revision} accepted with signatures (trust root "
        f"version {record.root} of chain {record.chain!r}): read with trust=ROOT, or "
        "with allow_unsigned=True to stop requiring signatures"
    )


class Head(Protocol):
    """What a tracker needs of a chain (``store.Chain``)."""

    seen_revision: int
    trust: Trust | None
    head_signers: list[str]
    storage: Storage

    @property
    def url(self) -> str: ...

    def read_head(self) -> tuple[Manifest, str]: ...

    def revision_bytes(self, revision: int) -> bytes | None: ...


class Tracker:
    """RD-1 for one reader: the accepted revision, in memory and (with ``path``) on disk,
    and the trust it was accepted under (SG-8 to SG-10).

    ``accept_rollback``: the next head is accepted whatever it is (an
    operator's deliberate rollback), once; later heads are checked again.
    ``allow_unsigned``: a reader without a trust policy may read on although it
    accepted a signed revision before (the requirement is then forgotten).
    """

    def __init__(
        self, path: PathLike | None, accept_rollback: object = False,
        allow_unsigned: object = False,
    ) -> None:  # fmt: skip
        for name, value in (("accept_rollback", accept_rollback),
                            ("allow_unsigned", allow_unsigned)):  # fmt: skip
            if not isinstance(value, bool):
                raise BadArgumentError(f"{name} must be a bool, not {type(value).__name__}")
        self.path = None if path is None else as_path(path, "state")
        self.accepted = None if self.path is None else load(self.path)
        self.accept_rollback = accept_rollback
        self.allow_unsigned = allow_unsigned

    def head(self, chain: Head) -> tuple[Manifest, str]:
        """The chain's head manifest and its digest, checked against what was accepted."""
        # The recorded trust is checked even for a deliberate rollback: accepting a lower
        # revision is not accepting an unsigned one, nor an older root.
        rotated = self._trust_rotated(chain)
        fresh = self.accept_rollback or rotated
        if fresh:
            chain.seen_revision = 0  # what this process read before is overruled too
        m, digest = chain.read_head()
        if not fresh:
            check(self.accepted, m.revision, digest, m.parent, stored_digests(chain),
                  self._remedy(chain.url))  # fmt: skip
        return m, digest

    def _where(self) -> str:
        return "this reader" if self.path is None else str(self.path)

    def _trust_rotated(self, chain: Head) -> bool:
        """SG-8 to SG-10 against the trust the accepted revision was recorded under:
        True if a root rotation since then revoked the keys that signed it (RD-1 then
        starts afresh from the head), False if RD-1 applies."""
        accepted = self.accepted
        record = None if accepted is None else accepted.trust
        if accepted is None or record is None:
            return False
        if chain.trust is None:
            if self.allow_unsigned:
                return False
            raise SignatureInvalidError(_unsigned_refusal(self._where(), accepted.revision, record))
        return trust_rotated(record, chain.trust, chain.storage, self._where())

    def _remedy(self, url: str) -> str:
        """What to tell an operator whose chain was refused; names another chain's state."""
        remedy = "" if self.path is None else REMEDY.format(path=self.path)
        was = "" if self.accepted is None else self.accepted.chain
        if was and was != url:
            return f"that revision was accepted from {was}, not {url}; {remedy}".rstrip("; ")
        return remedy

    def accept(self, chain: Head, m: Manifest, digest: str) -> None:
        """Record head ``m`` (BLAKE3 ``digest``) as accepted, with the trust it passed;
        on disk only when it changed."""
        trust = None
        if chain.trust is not None:
            root = chain.trust.root
            trust = TrustRecord(root.chain, root.version, tuple(sorted(chain.head_signers)))
        new = Accepted(m.revision, digest, chain.url, trust)
        old = self.accepted
        changed = old is None or (new.revision, new.digest, new.trust) != (
            old.revision, old.digest, old.trust,
        )  # fmt: skip
        if changed and self.path is not None:
            save(self.path, new)
        self.accepted, self.accept_rollback = new, False


def trust_rotated(record: TrustRecord, policy: Trust, storage: Storage, where: str) -> bool:
    """Whether a revision accepted under ``record`` is released from RD-1 by the root
    ``policy`` reaches in ``storage`` (SG-2): only if that root is newer than the one
    recorded and the keys that signed the revision no longer hold a threshold of its
    revisions role (fast-forward recovery, SG-10).  A root of another chain (bad
    argument) or older than the recorded one (SG-9) is refused."""
    root = policy.update(storage)
    if root.chain != record.chain:
        raise BadArgumentError(
            f"{where} records revisions accepted under chain {record.chain!r}, the trust root "
            f"is of {root.chain!r}: delete it to start again from this trust root"
        )
    if root.version < record.root:
        raise SignatureInvalidError(
            f"{where} records trust root version {record.root}, the newest root reached is "
            f"version {root.version}: the newer roots were deleted; restore the node's kept "
            "roots or pass the newest root as --trust"
        )
    if root.version == record.root:
        return False
    still = set(record.signers) & set(root.revisions.keyids)
    return len(still) < root.revisions.threshold


def stored_digests(chain: Head | None) -> Callable[[int], str | None]:
    """``check``'s ``stored_digest`` for ``chain``'s storage (None: no storage at hand)."""

    def stored(revision: int) -> str | None:
        data = None if chain is None else chain.revision_bytes(revision)
        return None if data is None else digest_bytes(data)

    return stored
