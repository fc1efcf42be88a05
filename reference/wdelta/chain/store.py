"""A chain in storage: manifest revisions, verified uploads, a verified download cache.

Publishing (SPEC.md "Concurrency"): a writer uploads every new file, reads it
back and checks its digest, and only then creates the next manifest revision
with a create-only write.  If another writer took that revision number first,
the update is re-applied to the newer manifest and retried, so no version is
lost.  Readers take the highest revision and refuse one lower than a revision
they have already seen.

Downloads land in ``<cache>/partial/`` (kept across interruptions and
continued with ranged reads; objects of at least ``storage.transfer.threshold``
bytes with concurrent ranged reads, ``transfer.download_ranges``), are
checked against the manifest's digest and only then moved to
``<cache>/objects/<digest>``: a cached file is verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import blake3

from ..arguments import PathLike, as_path
from ..digest import digest_bytes
from ..errors import BadArgumentError, ChecksumMismatchError, StorageError
from .errors import ConflictError, ManifestInvalidError, NotFoundError
from .manifest import MANIFEST_PREFIX, Manifest, parse_manifest, revision_key, revision_of_key
from .signing import SigningKey
from .storage import LocalStorage, open_storage
from .storage.base import Progress, Storage, download
from .storage.transfer import download_ranges, read_blocks
from .trust import Trust, as_trust, format_time, root_key

PUBLISH_ATTEMPTS = 50
SIGNATURE_SECONDS = 7 * 24 * 3600  # default validity of a revision signature
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
        raise StorageError(f"cannot read {path}: {exc}") from exc
    return str(h.hexdigest())


class Chain:
    """One chain: ``storage`` holds it, ``cache`` (optional) keeps verified downloads.

    ``storage`` may also be given as its location (a folder, ``s3://`` or
    ``hf://`` URL, see :func:`open_storage`).  ``trust`` (a :class:`Trust` or
    a trust root file) makes every head read refuse revisions without a
    threshold of valid, unexpired signatures; ``sign`` (needs ``trust``) makes
    every revision this object publishes signed by those keys, valid for
    ``sign_seconds``.  A signing writer checks the head it extends but not its
    expiry (it is the one that publishes a fresh revision).
    """

    def __init__(
        self, storage: Storage | PathLike, cache: PathLike | None = None, *,
        trust: Trust | PathLike | None = None, sign: list[SigningKey] | None = None,
        sign_seconds: float = SIGNATURE_SECONDS,
    ) -> None:  # fmt: skip
        self.storage = storage if isinstance(storage, Storage) else open_storage(storage)
        self.cache = None if cache is None else as_path(cache, "cache")
        self.seen_revision = 0
        self.trust = as_trust(trust)
        self.signers = list(sign or [])
        if self.signers and self.trust is None:
            raise BadArgumentError("signing needs the chain's trust root (trust=, --trust)")
        self.sign_seconds = sign_seconds
        self.head_signers: list[str] = []  # key ids that signed the last head read

    # ------------------------------------------------------------ manifests

    def revisions(self) -> list[int]:
        """Manifest revision numbers present in storage, ascending."""
        found = (revision_of_key(o.key) for o in self.storage.list(MANIFEST_PREFIX))
        return sorted(r for r in found if r is not None)

    def manifest(self, revision: int) -> Manifest:
        """Revision ``revision``, its signatures checked first if there is a trust policy."""
        return self._checked(revision, self.storage.read(revision_key(revision)))

    def _checked(self, revision: int, data: bytes) -> Manifest:
        """Parse revision ``revision``'s bytes, after SG-1..SG-5 if there is a trust policy
        (a writer skips freshness: it publishes the fresh revision)."""
        if self.trust is not None:
            self.head_signers = self.trust.check_revision(
                self.storage, revision, data, fresh=not self.signers
            )
        return parse_manifest(data, expected_revision=revision)

    @property
    def url(self) -> str:
        return self.storage.url

    def revision_bytes(self, revision: int) -> bytes | None:
        """The bytes of manifest revision ``revision``; None if storage no longer holds it."""
        try:
            return self.storage.read(revision_key(revision))
        except NotFoundError:
            return None

    def head(self) -> Manifest:
        """The highest manifest revision; NotFoundError if the chain has none."""
        return self.read_head()[0]

    def read_head(self) -> tuple[Manifest, str]:
        """The highest manifest revision and the BLAKE3 (hex) of its bytes."""
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
        data = self.storage.read(revision_key(revisions[-1]))
        m = self._checked(revisions[-1], data)
        self.seen_revision = m.revision
        return m, digest_bytes(data)

    def create_first(self, m: Manifest) -> Manifest:
        if self.revisions():
            raise ConflictError(f"{self.storage.url}: a chain already exists here")
        if self.trust is not None and self.signers:
            root = self.trust.root
            self.storage.create(root_key(root.version), root.to_bytes())
            self.trust.update(self.storage)  # a newer root already stored must sign too
        self._sign(m)
        if not self.storage.create(revision_key(1), m.to_bytes()):
            raise ConflictError(f"{self.storage.url}: a chain already exists here")
        self.seen_revision = 1
        return m

    def publish(self, update: Callable[[Manifest], Manifest]) -> Manifest:
        """Create the revision ``update(head)``; on a lost race re-read and retry."""
        for attempt in range(PUBLISH_ATTEMPTS):
            current = self.head()
            new = update(current)
            self._check_files(current, new)
            self._sign(new)
            if self.storage.create(revision_key(new.revision), new.to_bytes()):
                self.seen_revision = new.revision
                return new
            time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
        raise ConflictError(f"{self.storage.url}: gave up after {PUBLISH_ATTEMPTS} lost races")

    def _sign(self, m: Manifest) -> None:
        """Store the signatures of ``m`` before ``m`` itself (WS-2)."""
        if self.trust is not None and self.signers:
            expires = format_time(time.time() + self.sign_seconds)
            self.trust.sign(self.storage, m.revision, m.to_bytes(), self.signers, expires)

    def _check_files(self, old: Manifest, new: Manifest) -> None:
        """Every file ``new`` adds must already be stored with its recorded size."""
        known = {k.key for k in old.links} | {f.key for s in old.snapshots for f in s.files}
        wanted = [(k.key, k.size) for k in new.links]
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
        are idempotent); a wrong one is replaced.
        """
        size = path.stat().st_size
        info = self.storage.stat(key)
        if info is None or info.size != size or self._stored_digest(key, algorithm, size) != digest:
            self.storage.put_file(key, path, progress)
            stored = self.storage.stat(key)
            if stored is None or stored.size != size:
                raise ChecksumMismatchError(f"{key}: stored size differs from the upload's")
            if self._stored_digest(key, algorithm, size) != digest:
                raise ChecksumMismatchError(f"{key}: stored bytes differ from the upload")

    def _stored_digest(self, key: str, algorithm: str, size: int) -> str:
        """The digest of the stored object, read with concurrent ranges if it is large."""
        h = blake3.blake3() if algorithm == "blake3" else hashlib.sha256()
        t = self.storage.transfer
        large = size >= t.threshold
        blocks = read_blocks(self.storage, key, 0, size, t) if large else self.storage.stream(key)
        for block in blocks:
            h.update(block)
        return str(h.hexdigest())

    def cached_path(self, digest: str) -> Path | None:
        if self.cache is None:
            return None
        path = self.cache / "objects" / digest
        return path if path.is_file() else None

    def is_cached(self, digest: str) -> bool:
        return self.cached_path(digest) is not None

    def fetch(
        self, key: str, size: int, digest: str, algorithm: str,
        progress: Progress | None = None,
    ) -> Path:  # fmt: skip
        """A verified local copy of ``key`` (from the cache, else downloaded into it)."""
        if self.cache is None:
            raise StorageError(f"a cache folder is needed to download files: {_GIVE_CACHE}")
        done = self.cached_path(digest)
        if done is not None:
            with contextlib.suppress(OSError):
                os.utime(done)  # last use, for the cache's least-recently-used order
            return done
        for sub in ("partial", "objects"):
            (self.cache / sub).mkdir(parents=True, exist_ok=True)
        part = self.cache / "partial" / f"{digest}.part"
        if size >= self.storage.transfer.threshold:
            download_ranges(self.storage, key, part, size, progress, self.storage.transfer)
        else:
            download(self.storage, key, part, size, progress)
        if file_digest(part, algorithm) != digest:
            part.unlink()
            raise ChecksumMismatchError(f"{key}: downloaded bytes do not match the manifest digest")
        final = self.cache / "objects" / digest
        os.replace(part, final)
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
