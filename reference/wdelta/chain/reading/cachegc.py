"""The pull cache's size: pins of running pulls, and garbage collection.

A cache folder holds verified files (``objects/<digest>``) and partial
downloads (``partial/<digest>.part``).  A pull *pins* the digests its plan
uses in ``pins/<pid>-<random>.json`` while it runs; a pin whose process is
gone is ignored (and removed).  ``gc`` removes first every entry the chain's
head manifest no longer names, then, if a byte limit is given, the least
recently used of the rest (a cache hit refreshes a file's mtime) until the
cache fits.  Pinned entries are never removed, so the limit can be exceeded
while a pull needs more than it allows.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...arguments import check_optional_int
from ...errors import BadArgumentError, StorageError, WdeltaError
from ...io.atomic import TMP_MARK, temp_name
from .. import cachelock
from ..model.manifest import Manifest
from ..storage.smallfile import read_regular
from ..store import Chain

MAX_PIN_BYTES = 1 << 24  # a pin lists a plan's file digests, ~70 bytes each


@dataclass(frozen=True)
class Entry:
    """A cached file: the digest it is named by, its size in bytes, last use (epoch s)."""

    digest: str
    path: Path
    size: int
    used: float


@dataclass
class GcResult:
    """Removed paths, bytes freed, and what the cache holds afterwards (bytes)."""

    removed: list[Path] = field(default_factory=list)
    freed: int = 0
    kept: int = 0


def entries(cache: Path) -> list[Entry]:
    """Every cached object and partial download, oldest use first."""
    found = []
    for sub, suffix in (("objects", ""), ("partial", ".part")):
        folder = cache / sub
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if TMP_MARK in path.name or not path.name.endswith(suffix):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                digest = path.name.removesuffix(suffix) if suffix else path.name
                found.append(Entry(digest, path, st.st_size, st.st_mtime))
    return sorted(found, key=lambda e: (e.used, e.path.name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pinned(cache: Path) -> set[str]:
    """Digests pinned by running pulls; pins of dead processes are removed."""
    out: set[str] = set()
    folder = cache / "pins"
    if not folder.is_dir():
        return out
    for path in folder.glob("*.json"):
        pid = path.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
            continue
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError, WdeltaError):
            # Read without blocking or without end: a FIFO, a huge file or other JSON
            # put in the cache pins nothing (and is not waited on).
            data = read_regular(path, MAX_PIN_BYTES, StorageError)
            out.update(str(d) for d in json.loads(data))
    return out


@contextlib.contextmanager
def pin(cache: Path, digests: Iterable[str]) -> Iterator[None]:
    """Keep ``digests`` out of every gc while the block runs."""
    folder = cache / "pins"
    path = folder / f"{os.getpid()}-{uuid.uuid4().hex}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / temp_name(path.name)
        tmp.write_text(json.dumps(sorted(digests)))
        os.replace(tmp, path)
    except OSError as exc:
        raise StorageError(f"cannot pin cache entries in {folder}: {exc}") from exc
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def named(m: Manifest) -> set[str]:
    """Digests of every file the manifest names (delta BLAKE3s, snapshot SHA-256s)."""
    links = {f.digest for k in m.links for f in k.files}
    return links | {f.sha256 for s in m.snapshots for f in s.files}


def gc(cache: Path, head: Manifest | None, max_bytes: int | None = None) -> GcResult:
    """Remove entries ``head`` does not name (skipped if None), then LRU down to ``max_bytes``.

    Pins are read again just before each removal, so a pull that starts
    meanwhile keeps what it pinned.
    """
    wanted = named(head) if head is not None else None
    result = GcResult()
    live = []
    for e in entries(cache):
        if wanted is None or e.digest in wanted or not _remove(cache, e, result):
            live.append(e)
    total = sum(e.size for e in live)
    for e in live:
        if max_bytes is None or total <= max_bytes:
            break
        if _remove(cache, e, result):
            total -= e.size
    result.kept = total
    return result


def _remove(cache: Path, e: Entry, result: GcResult) -> bool:
    """Remove ``e`` unless a running pull pinned it or another process holds its lock
    (``cachelock``); True if removed."""
    if e.digest in pinned(cache):
        return False
    with cachelock.unless_busy(cache, e.digest) as free:
        if not free:  # another process is downloading it: its partial file is in use
            return False
        try:
            e.path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot remove {e.path}: {exc}") from exc
    result.removed.append(e.path)
    result.freed += e.size
    return True


def gc_chain(chain: Chain, max_bytes: int | None = None) -> GcResult:
    """``gc`` of ``chain``'s cache against its head manifest (``wdelta chain gc``)."""
    check_optional_int(max_bytes, "max_bytes", 0)
    if chain.cache is None:
        raise BadArgumentError("gc needs the cache folder (--cache or $WDELTA_CACHE)")
    return gc(chain.cache, chain.head(), max_bytes)
