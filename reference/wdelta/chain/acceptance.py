"""What a node has accepted from a chain, kept across restarts (SPEC.md RD-1).

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

from .. import schemas, strictjson
from ..arguments import PathLike, as_path
from ..atomic import atomic_file
from ..digest import digest_bytes
from ..errors import BadArgumentError, StorageError, WdeltaError
from ..output_file import pwrite_all
from .errors import ManifestInvalidError
from .manifest import Manifest, read_manifest, utc_now
from .smallfile import read_regular

FORMAT = "wdelta-chain-accepted"
# A state file is about 200 bytes; anything far larger is not one (checked
# before reading, so a hostile file cannot make the node allocate).
MAX_STATE_BYTES = 1 << 16
REMEDY = (
    "if the chain was rolled back or rewritten deliberately, pull once with "
    "accept_rollback=True or delete {path}"
)


@dataclass(frozen=True)
class Accepted:
    """Manifest revision ``revision`` (≥ 1) was accepted; ``digest``: BLAKE3 (hex) of its bytes.

    ``chain`` (informative) is the location it was read from.
    """

    revision: int
    digest: str
    chain: str = ""

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "version": 1, "revision": self.revision, "digest": self.digest,
               "chain": self.chain, "updated": utc_now()}  # fmt: skip
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
    return Accepted(raw["revision"], raw["digest"], raw.get("chain", ""))


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
        raise StorageError(f"cannot read {path}: {exc}") from exc
    check(accepted_file(seen), m.revision, digest, m.parent, stored_digest)


class Head(Protocol):
    """What a tracker needs of a chain (``store.Chain``)."""

    seen_revision: int

    @property
    def url(self) -> str: ...

    def read_head(self) -> tuple[Manifest, str]: ...

    def revision_bytes(self, revision: int) -> bytes | None: ...


class Tracker:
    """RD-1 for one reader: the accepted revision, in memory and (with ``path``) on disk.

    ``accept_rollback``: the next head is accepted whatever it is (an
    operator's deliberate rollback), once; later heads are checked again.
    """

    def __init__(self, path: PathLike | None, accept_rollback: object = False) -> None:
        if not isinstance(accept_rollback, bool):
            kind = type(accept_rollback).__name__
            raise BadArgumentError(f"accept_rollback must be a bool, not {kind}")
        self.path = None if path is None else as_path(path, "state")
        self.accepted = None if self.path is None else load(self.path)
        self.accept_rollback = accept_rollback

    def head(self, chain: Head) -> tuple[Manifest, str]:
        """The chain's head manifest and its digest, checked against what was accepted."""
        if self.accept_rollback:
            chain.seen_revision = 0  # what this process read before is overruled too
        m, digest = chain.read_head()
        if not self.accept_rollback:
            check(self.accepted, m.revision, digest, m.parent, stored_digests(chain),
                  self._remedy(chain.url))  # fmt: skip
        return m, digest

    def _remedy(self, url: str) -> str:
        """What to tell an operator whose chain was refused; names another chain's state."""
        remedy = "" if self.path is None else REMEDY.format(path=self.path)
        was = "" if self.accepted is None else self.accepted.chain
        if was and was != url:
            return f"that revision was accepted from {was}, not {url}; {remedy}".rstrip("; ")
        return remedy

    def accept(self, chain: Head, m: Manifest, digest: str) -> None:
        """Record head ``m`` (BLAKE3 ``digest``) as accepted; on disk only when it changed."""
        new = Accepted(m.revision, digest, chain.url)
        changed = self.accepted is None or (new.revision, new.digest) != (
            self.accepted.revision, self.accepted.digest,
        )  # fmt: skip
        if changed and self.path is not None:
            save(self.path, new)
        self.accepted, self.accept_rollback = new, False


def stored_digests(chain: Head | None) -> Callable[[int], str | None]:
    """``check``'s ``stored_digest`` for ``chain``'s storage (None: no storage at hand)."""

    def stored(revision: int) -> str | None:
        data = None if chain is None else chain.revision_bytes(revision)
        return None if data is None else digest_bytes(data)

    return stored
