"""A chain in storage: manifest revisions, verified uploads, a verified download cache.

Publishing (SPEC §17.5): a writer uploads every new file, reads it
back and checks its digest, and only then creates the next manifest revision
with a create-only write.  If another writer took that revision number first,
the update is re-applied to the newer manifest and retried, so no version is
lost.  A signing writer signs a revision only once its create-only write has
succeeded (WS-2): a writer that lost a race has signed nothing.  Readers take
the highest revision and refuse one lower than a revision they have already
seen.

Downloads land in ``<cache>/partial/`` (kept across interruptions and
continued with ranged reads; objects of at least ``storage.transfer.threshold``
bytes with concurrent ranged reads, ``transfer.download_ranges``), are
checked against the manifest's digest and only then moved to
``<cache>/objects/<digest>``: a cached file is verified when it is stored.
A download holds its object's lock (``cachelock``), so processes and hosts
sharing the cache folder download each object once and never write one
partial file together.
It can still be damaged later (a disk, or anyone who can write the cache): a
use that fails on it checks its digest again, and a bad file is removed
(``evict_if_corrupt``) so that it is downloaded once more.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import blake3

from ..arguments import PathLike, as_path, check_seconds
from ..errors import BadArgumentError, ChecksumMismatchError, StorageError, WdeltaError
from ..format.digest import digest_bytes
from ..io.atomic import temp_name
from ..io.filekind import os_message
from ..limits import MAX_MANIFEST_BYTES
from . import cachelock
from .errors import ConflictError, ManifestInvalidError, NotFoundError, SignatureInvalidError
from .model.manifest import MANIFEST_PREFIX, Manifest, parse_manifest, revision_key, revision_of_key
from .storage import LocalStorage, open_storage
from .storage.base import Progress, Storage, download
from .storage.transfer import download_ranges, read_blocks
from .trust.signing import SigningKey
from .trust.updater import Trust, as_trust, expires_in, root_key

PUBLISH_ATTEMPTS = 50
SIGNATURE_SECONDS = 7 * 24 * 3600  # default validity of a revision signature
# How long a signing writer waits for the signatures of a head that another writer
# created and is still signing (WS-1, WS-2): storing a few small objects takes well
# under a second; a head still below the threshold after this is refused.
SIGN_WAIT_SECONDS = 10.0
_GIVE_CACHE = "open the chain as chain.Chain(LOCATION, cache=FOLDER)"
_HASH_BLOCK = 1 << 22


def file_digest(path: Path, algorithm: str) -> str:
    """BLAKE3 (``"blake3"``) or SHA-256 (``"sha256"``) of a file, hex."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO) if algorithm == "blake3" else hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(_HASH_BLOCK):
                h.update(block)
    except OSError as exc:
        raise StorageError(os_message(path, exc)) from exc
    return str(h.hexdigest())


class Chain:
    """One chain: ``storage`` holds it, ``cache`` (optional) keeps verified downloads.

    ``storage`` may also be given as its location (a folder, ``s3://`` or
    ``hf://`` URL, see :func:`open_storage`).  ``trust`` (a :class:`Trust` or
    a trust root file) makes every head read refuse revisions without a
    threshold of valid, unexpired signatures; ``sign`` (needs ``trust``) makes
    every revision this object publishes signed by those keys, valid for
    ``sign_seconds``.  A signing writer checks the head it extends but not its
    expiry (it is the one that publishes a fresh revision), waiting up to
    ``sign_wait`` seconds for signatures the head's writer is still storing, and
    checks its own signatures as a node would before it uploads anything (WS-5).
    """

    def __init__(
        self, storage: Storage | PathLike, cache: PathLike | None = None, *,
        trust: Trust | PathLike | None = None, sign: list[SigningKey] | None = None,
        sign_seconds: float = SIGNATURE_SECONDS, sign_wait: float = SIGN_WAIT_SECONDS,
    ) -> None:  # fmt: skip
        self.storage = storage if isinstance(storage, Storage) else open_storage(storage)
        self.cache = None if cache is None else as_path(cache, "cache")
        self.seen_revision = 0
        self.trust = as_trust(trust)
        self.signers = list(sign or [])
        if self.signers and self.trust is None:
            raise BadArgumentError("signing needs the chain's trust root (trust=ROOT)")
        self.sign_seconds = sign_seconds
        self.sign_wait = check_seconds(sign_wait, "sign_wait") or 0.0
        self.head_signers: list[str] = []  # key ids that signed the last head read

    # ------------------------------------------------------------ manifests

    def revisions(self) -> list[int]:
        """Manifest revision numbers present in storage, ascending."""
        found = (revision_of_key(o.key) for o in self.storage.list(MANIFEST_PREFIX))
        return sorted(r for r in found if r is not None)

    def manifest(self, revision: int) -> Manifest:
        """Revision ``revision``, its signatures checked first if there is a trust policy."""
        return self._checked(
            revision, self.storage.read(revision_key(revision), MAX_MANIFEST_BYTES)
        )

    def _checked(self, revision: int, data: bytes) -> Manifest:
        """Parse revision ``revision``'s bytes, after SG-1..SG-5 if there is a trust policy
        (a writer skips freshness: it publishes the fresh revision)."""
        if self.trust is None:
            return parse_manifest(data, expected_revision=revision)
        verified = self.trust.verified_manifest(
            self.storage, revision, data, fresh=not self.signers
        )
        self.head_signers = verified.signers
        return verified.manifest

    @property
    def url(self) -> str:
        return self.storage.url

    def revision_bytes(self, revision: int) -> bytes | None:
        """The bytes of manifest revision ``revision``; None if storage no longer holds it."""
        try:
            return self.storage.read(revision_key(revision), MAX_MANIFEST_BYTES)
        except NotFoundError:
            return None

    def head(self) -> Manifest:
        """The highest manifest revision; NotFoundError if the chain has none."""
        return self.read_head()[0]

    def read_head(self) -> tuple[Manifest, str]:
        """The highest manifest revision and the BLAKE3 (hex) of its bytes.

        A signing writer retries a head below the signature threshold for up to
        ``sign_wait`` seconds: its writer signs it only after creating it (WS-2)."""
        if not self.signers:
            return self._read_head_once()
        self.check_signers()  # before the head: what it would sign is refused first
        deadline, pause = time.monotonic() + self.sign_wait, 0.05
        while True:
            try:
                return self._read_head_once()
            except SignatureInvalidError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SignatureInvalidError(
                        f"{exc}; waited {self.sign_wait:g} s for its signatures (WS-1)"
                    ) from exc
            time.sleep(min(pause, left))
            pause = min(2 * pause, 1.0)

    def _read_head_once(self) -> tuple[Manifest, str]:
        revisions = self.revisions()
        if not revisions:
            local = isinstance(self.storage, LocalStorage) and self.storage.root.is_file()
            why = "is a file, not a chain folder" if local else "no manifest revision"
            raise NotFoundError(f"{self.storage.url}: no chain here ({why})")
        if revisions[-1] < self.seen_revision:
            raise ManifestInvalidError(
                f"storage rolled back: head revision {revisions[-1]} is lower than revision "
                f"{self.seen_revision} read before"
            )
        data = self.storage.read(revision_key(revisions[-1]), MAX_MANIFEST_BYTES)
        m = self._checked(revisions[-1], data)
        self.seen_revision = m.revision
        return m, digest_bytes(data)

    def create_first(self, m: Manifest) -> Manifest:
        if self.revisions():
            raise ConflictError(f"{self.storage.url}: a chain already exists here")
        self.check_signers()
        if self.trust is not None and self.signers:
            root = self.trust.root
            self.storage.create(root_key(root.version), root.to_bytes())
            self.trust.update(self.storage)  # a newer root already stored must sign too
        if not self.storage.create(revision_key(1), m.to_bytes()):
            raise ConflictError(f"{self.storage.url}: a chain already exists here")
        self._check_stored(m)
        self._sign(m)
        self.seen_revision = 1
        return m

    def publish(self, update: Callable[[Manifest], Manifest]) -> Manifest:
        """Create the revision ``update(head)``; on a lost race re-read and retry.
        Only a revision this writer created is signed (WS-2); reading the head checks
        the writer's own signatures first (WS-5)."""
        for attempt in range(PUBLISH_ATTEMPTS):
            current = self.head()
            new = update(current)
            self._check_files(current, new)
            if self._create(new):
                self._check_stored(new)
                self._sign(new)
                self.seen_revision = new.revision
                return new
            time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
        raise ConflictError(f"{self.storage.url}: gave up after {PUBLISH_ATTEMPTS} lost races")

    def _create(self, m: Manifest) -> bool:
        """The create-only write of ``m`` (WR-2): True if this writer created it. A write
        whose outcome is unknown (an error) leaves ``m`` unsigned, even if it was created."""
        try:
            return self.storage.create(revision_key(m.revision), m.to_bytes())
        except WdeltaError as exc:
            if self.trust is None or not self.signers:
                raise
            raise type(exc)(
                f"{exc}; whether revision {m.revision} was created is unknown, so it was not "
                f"signed (WS-2): if the chain's head is revision {m.revision} with your version, "
                f"sign it with {self._sign_command(m)}"
            ) from exc

    def _check_stored(self, m: Manifest) -> None:
        """WS-2: revision ``m`` holds the bytes this writer created. A store that breaks ST-1
        (another writer's create-only write of the same revision overwrote ours, both told
        they won) must not get this writer's signature on the other's manifest, or on ours
        while nodes may already hold the other: either way a fork."""
        stored = self.storage.read(revision_key(m.revision), MAX_MANIFEST_BYTES)
        if stored != m.to_bytes():
            raise ConflictError(
                f"{self.storage.url}: revision {m.revision} holds other bytes than this writer "
                "created, so the store does not keep create-only writes (ST-1; 'wdelta chain "
                "check-storage URL' tests a store); nothing was signed"
            )

    def _sign_command(self, m: Manifest) -> str:
        return (f"'wdelta chain sign URL --trust ROOT --sign KEY --expect-revision {m.revision} "
                f"--expect-digest {m.head.digest}'")  # fmt: skip

    def check_signers(self) -> None:
        """WS-5: for a signing writer, refuse (as a node would) the signatures it would
        store: revoked key, expired root, validity not in the future."""
        if self.trust is not None and self.signers:
            expires = expires_in(self.sign_seconds)
            self.trust.check_signers(self.storage, self.signers, expires)

    def _sign(self, m: Manifest) -> None:
        """Store the signatures of ``m``, which this writer has just created (WS-2).
        Should that fail, the revision stays below the threshold: nodes refuse it until
        it is signed with ``chain sign`` (the error says how)."""
        if self.trust is None or not self.signers:
            return
        try:
            expires = expires_in(self.sign_seconds)
            self.trust.sign(self.storage, m.revision, m.to_bytes(), self.signers, expires)
        except WdeltaError as exc:
            raise type(exc)(
                f"revision {m.revision} was created but its signatures were not all stored "
                f"({exc}): nodes refuse it until they are; sign it with {self._sign_command(m)}"
            ) from exc

    def _check_files(self, old: Manifest, new: Manifest) -> None:
        """Every file ``new`` adds must already be stored with its recorded size."""
        known = {f.key for k in old.links for f in k.files}
        known |= {f.key for s in old.snapshots for f in s.files}
        wanted = [(f.key, f.size) for k in new.links for f in k.files]
        wanted += [(f.key, f.size) for s in new.snapshots for f in s.files]
        for key, size in wanted:
            if key in known:
                continue
            info = self.storage.stat(key)
            if info is None or info.size != size:
                raise NotFoundError(f"refusing to publish: {key} is not stored with {size} bytes")

    # ------------------------------------------------------------ files

    def upload(
        self, key: str, path: Path, digest: str, algorithm: str,
        progress: Progress | None = None,
    ) -> None:  # fmt: skip
        """Store ``path`` at content-addressed ``key``, then read it back and check it.

        An object already at ``key`` with the right digest is kept (uploads
        are idempotent); a wrong one is replaced.  A signing writer first checks
        the signatures it will make (WS-5), so it uploads nothing nodes would refuse.
        """
        self.check_signers()
        size = path.stat().st_size
        info = self.storage.stat(key)
        if info is None or info.size != size or self._stored_digest(key, algorithm, size) != digest:
            self.storage.put_file(key, path, progress)
            stored = self.storage.stat(key)
            if stored is None or stored.size != size:
                raise ChecksumMismatchError(f"{key}: stored size differs from the upload's")
            if self._stored_digest(key, algorithm, size) != digest:
                raise ChecksumMismatchError(f"{key}: stored bytes differ from the upload")

    def _stored_digest(self, key: str, algorithm: str, size: int) -> str | None:
        """The digest of the object at ``key``, read with concurrent ranges if it is
        large; None if it is longer than ``size`` bytes (read no further: a store can
        answer without end, RD-5)."""
        h = blake3.blake3() if algorithm == "blake3" else hashlib.sha256()
        t = self.storage.transfer
        large = size >= t.threshold
        blocks = read_blocks(self.storage, key, 0, size, t) if large else self.storage.stream(key)
        have = 0
        for block in blocks:
            have += len(block)
            if have > size:
                return None
            h.update(block)
        return str(h.hexdigest())

    def cached_path(self, digest: str) -> Path | None:
        if self.cache is None:
            return None
        path = self.cache / "objects" / digest
        return path if path.is_file() else None

    def is_cached(self, digest: str) -> bool:
        return self.cached_path(digest) is not None

    def evict_corrupt(self, files: Iterable[tuple[str, str]]) -> bool:
        """``evict_if_corrupt`` of every ``(digest, algorithm)``; True if any was removed."""
        return [self.evict_if_corrupt(d, a) for d, a in files].count(True) > 0

    def evict_if_corrupt(self, digest: str, algorithm: str) -> bool:
        """Remove the cached file ``digest`` if its bytes no longer have that digest
        (damaged on disk, or written by someone else); True if it was removed.  A
        file another process removed meanwhile is not an error (False)."""
        path = self.cached_path(digest)
        try:
            if path is None or file_digest(path, algorithm) == digest:
                return False
        except StorageError:
            if path is not None and not path.exists():
                return False
            raise
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot remove the damaged cache file {path}: {exc}") from exc
        return True

    def fetch(
        self, key: str, size: int, digest: str, algorithm: str,
        progress: Progress | None = None,
    ) -> Path:  # fmt: skip
        """A verified local copy of ``key`` (from the cache, else downloaded into it).

        Safe for many processes sharing the cache folder (``cachelock``): one
        downloads the object, the others wait for it and download nothing."""
        if self.cache is None:
            raise StorageError(f"a cache folder is needed to download files: {_GIVE_CACHE}")
        done = self._hit(digest)
        if done is not None:
            return done
        try:
            for sub in ("partial", "objects"):
                (self.cache / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the cache folder {self.cache}: {exc}") from exc
        with cachelock.locked(self.cache, digest) as held:
            done = self._hit(digest)  # stored by another process while this one waited
            if done is not None:
                return done
            return self._download(key, size, digest, algorithm, progress, held)

    def _hit(self, digest: str) -> Path | None:
        done = self.cached_path(digest)
        if done is not None:
            with contextlib.suppress(OSError):
                os.utime(done)  # last use, for the cache's least-recently-used order
        return done

    def _download(
        self, key: str, size: int, digest: str, algorithm: str, progress: Progress | None,
        held: bool,
    ) -> Path:  # fmt: skip
        """Download ``key`` into a partial file, check it, store it as ``objects/<digest>``.

        ``held``: this process holds the entry's lock, so it alone writes the shared
        ``partial/<digest>.part`` and continues what an earlier download left there;
        else (no locks) it writes a fresh partial file of its own."""
        assert self.cache is not None
        folder = self.cache / "partial"
        part = folder / (f"{digest}.part" if held else temp_name(f"{digest}.part"))
        while True:
            resumed = held and part.exists()
            try:
                if size >= self.storage.transfer.threshold:
                    download_ranges(self.storage, key, part, size, progress, self.storage.transfer)
                else:
                    download(self.storage, key, part, size, progress)
                good = file_digest(part, algorithm) == digest
            except BaseException:
                if not held:
                    part.unlink(missing_ok=True)
                raise
            if good:
                break
            part.unlink(missing_ok=True)
            if not resumed:
                raise ChecksumMismatchError(
                    f"{key}: downloaded bytes do not match the manifest digest"
                )
            # The bytes kept from an earlier download were bad (damaged or planted):
            # they are gone now, and the whole file is fetched once more.
        final = self.cache / "objects" / digest
        try:
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)  # put in the node's own cache by someone else
            os.replace(part, final)
        except OSError as exc:
            raise StorageError(f"cannot store {final}: {exc}") from exc
        return final

    def scratch(self) -> Path:
        """The folder for temporary files (atomic.temp_dir): the cache folder."""
        if self.cache is None:
            raise StorageError(f"a cache folder is needed: {_GIVE_CACHE}")
        self.cache.mkdir(parents=True, exist_ok=True)
        return self.cache


def as_chain(value: object) -> Chain:
    """``value`` if it is a Chain, or the chain at a location (str or os.PathLike)."""
    if isinstance(value, Chain):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Chain(value)
    raise BadArgumentError(
        f"chain must be a wdelta.chain.Chain or its location, not {type(value).__name__}"
    )
