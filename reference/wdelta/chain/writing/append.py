"""Writing and checking a chain: ``init``, ``append``, ``log``, ``verify``."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ...arguments import PathLike, as_path, check_optional_int, check_str_mapping
from ...errors import BadArgumentError, BaseMismatchError
from ...format.container import open_delta
from ...format.digest import digest_bytes, file_sha256
from ...io.atomic import temp_dir
from ...limits import MAX_MANIFEST_BYTES
from ...ops import api
from ..errors import ChainBrokenError, ConflictError, ManifestInvalidError
from ..model.manifest import (
    Link,
    LinkPart,
    Manifest,
    Snapshot,
    SnapshotFile,
    Version,
    delta_key,
    multi_part_link,
    new_manifest,
    parse_manifest,
    revision_key,
    utc_now,
)
from ..reading import parts
from ..reading.fetch import fetch_link, materialize_snapshot
from ..reading.local import checkpoint_files, digest_of_path
from ..reading.partial import read_remote_header
from ..reading.parts import check_part_set
from ..storage import LocalStorage
from ..storage.base import Progress
from ..store import Chain, as_chain, file_digest


def upload_snapshot(
    chain: Chain, number: int, checkpoint: Path, progress: Progress | None
) -> Snapshot:
    """Store a checkpoint's files content-addressed; returns their manifest entry."""
    paths = checkpoint_files(checkpoint)
    files = []
    for path in paths:
        name = path.name if len(paths) > 1 else _single_name(path)
        entry = SnapshotFile(name, file_sha256(path), path.stat().st_size)
        chain.upload(entry.key, path, entry.sha256, "sha256", progress)
        files.append(entry)
    return Snapshot(number, tuple(sorted(files, key=lambda f: f.name)))


def _single_name(path: Path) -> str:
    from ...checkpoint.source import recorded_name

    return recorded_name(path)


def _check_version_fields(step: object, metadata: object) -> None:
    check_optional_int(step, "step", 0)
    check_str_mapping(metadata, "metadata")


def init(
    chain: Chain | PathLike, checkpoint: PathLike, *, step: int | None = None,
    metadata: Mapping[str, str] | None = None, progress: Progress | None = None,
) -> Manifest:  # fmt: skip
    """Start a chain at ``checkpoint`` (version 0, stored as a snapshot)."""
    chain, checkpoint = as_chain(chain), as_path(checkpoint, "checkpoint")
    _check_version_fields(step, metadata)
    if chain.revisions():
        raise ConflictError(f"{chain.storage.url}: a chain already exists here")
    if isinstance(chain.storage, LocalStorage) and chain.storage.root.is_file():
        raise BadArgumentError(
            f"{chain.storage.url} is a file; a chain is stored in a folder (or at s3://, "
            "hf://): give the path of a new folder"
        )
    version = Version(0, digest_of_path(checkpoint), step, utc_now(), dict(metadata or {}))
    snapshot = upload_snapshot(chain, 0, checkpoint, progress)
    return chain.create_first(new_manifest(version, snapshot))


@dataclass(frozen=True)
class AppendOptions:
    """Encoder settings for ``append`` (``level`` None: wdelta's automatic zstd
    level) and whether to also store a snapshot."""

    level: int | None = None
    chunk_elements: int | None = None
    threads: int = 2
    snapshot: bool = False


def append(
    chain: Chain | PathLike, checkpoint: PathLike, base: PathLike, *, step: int | None = None,
    metadata: Mapping[str, str] | None = None, options: AppendOptions = AppendOptions(),
    progress: Progress | None = None,
) -> Manifest:  # fmt: skip
    """Publish ``checkpoint`` as the next version, as a delta from ``base``.

    ``base`` must be a version of the chain (normally the head).  The delta is
    uploaded and verified before the manifest revision that names it exists.
    """
    _check_version_fields(step, metadata)
    chain = as_chain(chain)
    checkpoint, base = as_path(checkpoint, "checkpoint"), as_path(base, "base")
    with temp_dir(Path(tempfile.gettempdir()), "append") as tmp:
        out = Path(tmp) / "link.wdelta"
        api.diff(base, checkpoint, out, level=options.level, threads=options.threads,
                 chunk_elements=options.chunk_elements)  # fmt: skip
        _check_ends(chain, out, base, checkpoint)
        snapshot = checkpoint if options.snapshot else None
        return append_delta(chain, out, step=step, metadata=metadata, snapshot=snapshot,
                            progress=progress)  # fmt: skip


def _check_ends(chain: Chain, delta: Path, base: Path, checkpoint: Path) -> None:
    """Refuse the link ``delta`` that ``append`` encoded from ``base`` to ``checkpoint``
    unless it leads from a version to a new one, naming the files the caller gave
    (``delta`` is a temporary file it never saw)."""
    m = chain.head()
    with open_delta(delta) as d:
        src, dst = d.header.raw["base"]["digest"], d.header.raw["target"]["digest"]
    if m.by_digest(src) is None:
        raise BaseMismatchError(
            f"{base} is not a version of the chain at {chain.url}: base=BASE must be the "
            f"checkpoint of one of its versions, normally the head (version "
            f"{m.head.number}, as pulled from the chain)"
        )
    if (known := m.by_digest(dst)) is not None:
        raise ConflictError(_already(str(checkpoint), known, chain))


def _already(what: str, version: Version, chain: Chain) -> str:
    return (
        f"{what} is already version {version.number} of the chain at {chain.url} "
        f"(digest {version.digest[:16]}): nothing to publish"
    )


def append_delta(
    chain: Chain, delta: Path, *, step: int | None = None,
    metadata: Mapping[str, str] | None = None, snapshot: Path | None = None,
    progress: Progress | None = None,
) -> Manifest:  # fmt: skip
    """Publish the target of an already encoded ``delta`` as the next version.

    The delta's base must be a version of the chain; ``snapshot`` (the target
    as a checkpoint file or folder) is also stored whole when given.
    """
    _check_version_fields(step, metadata)
    chain, delta = as_chain(chain), as_path(delta, "delta")
    snapshot = None if snapshot is None else as_path(snapshot, "snapshot")
    m = chain.head()
    with open_delta(delta) as d:
        src, dst = d.header.raw["base"]["digest"], d.header.raw["target"]["digest"]
        reversible = d.header.reversible
    if m.by_digest(src) is None:
        raise BaseMismatchError(f"the base of {delta} is not a version of the chain")
    if (known := m.by_digest(dst)) is not None:
        raise ConflictError(_already(f"the target of {delta}", known, chain))
    digest, size = file_digest(delta, "blake3"), delta.stat().st_size
    chain.upload(delta_key(digest), delta, digest, "blake3", progress)
    snap = upload_snapshot(chain, 0, snapshot, progress) if snapshot is not None else None
    link_of = partial(Link, digest=digest, size=size, reversible=reversible)
    return chain.publish(append_update(src, dst, step, metadata, link_of, snap))


def append_update(
    src: str, dst: str, step: int | None, metadata: Mapping[str, str] | None,
    link_of: Callable[..., Link], snap: Snapshot | None,
) -> Callable[[Manifest], Manifest]:  # fmt: skip
    """The update appending version ``dst`` linked from version ``src`` by
    ``link_of(source=, target=)``, with the files of ``snap`` as its snapshot."""

    def update(cur: Manifest) -> Manifest:
        source = cur.by_digest(src)
        if source is None:
            # Checked before the upload by append and append_parts, not by a publisher
            # resumed with previous=: the one case that is no race.
            raise ConflictError(
                f"the new link's base (digest {src[:16]}) is not a version of the chain: it "
                "was pruned meanwhile, or a publisher's previous= is not one of its versions"
            )
        if cur.by_digest(dst) is not None:
            raise ConflictError("the chain changed: the version was published meanwhile")
        number = cur.head.number + 1
        steps = [v.step for v in cur.versions if v.step is not None]
        if step is not None and steps and steps[-1] >= step:
            raise ConflictError(f"step {step} is not after the head's step {steps[-1]}")
        version = Version(number, dst, step, utc_now(), dict(metadata or {}))
        link = link_of(source=source.number, target=number)
        snaps = cur.snapshots + ((Snapshot(number, snap.files),) if snap else ())
        return cur.successor(versions=(*cur.versions, version), links=(*cur.links, link),
                             snapshots=snaps)  # fmt: skip

    return update


# Parts' headers read back at once by a multi-part publish: one ranged read each.
HEADER_READERS = 32


def append_parts(
    chain: Chain | PathLike, files: Sequence[LinkPart], *, versions: tuple[str, str],
    step: int | None = None, metadata: Mapping[str, str] | None = None,
    snapshot: Snapshot | None = None,
) -> Manifest:  # fmt: skip
    """Publish the next version as a multi-part link (SPEC §17.12) whose parts ``files``
    (in part order, each with its ``header`` digest: ``parts.part_file``) are already
    stored and verified (WR-1).  ``versions``: the link's base and target checkpoint
    digests as this writer computed them (§9.4, from its ranks' tensor digests).  The
    revision takes its digests from these, never from storage (WS-7): the parts'
    headers are read back and must be the ones written (checksum-mismatch) and form
    the link ``versions`` (chain-broken), else nothing is published.  ``snapshot``:
    the new version's files, already stored (its version number is set on publishing)."""
    _check_version_fields(step, metadata)
    chain = as_chain(chain)
    if len(files) < 2:
        raise BadArgumentError("a multi-part link has at least two parts")
    if any(f.header is None for f in files):
        raise BadArgumentError("every part needs the digest of the header written (part_file)")
    with ThreadPoolExecutor(min(len(files), HEADER_READERS)) as pool:  # latency-bound
        headers = list(pool.map(lambda f: read_remote_header(chain.storage, f, None, f.header)[0],
                                files))  # fmt: skip
    reversible = all(h.reversible for h in headers)
    check_part_set(headers, versions, reversible, "the new link")
    if chain.head().by_digest(versions[0]) is None:
        raise BaseMismatchError("the base of the parts is not a version of the chain")
    link_of = partial(multi_part_link, parts=tuple(files), reversible=reversible)
    return chain.publish(append_update(*versions, step, metadata, link_of, snapshot))


def log_rows(m: Manifest) -> list[dict[str, Any]]:
    """One row per version: how it is stored (snapshot bytes, links in and out)."""
    if not isinstance(m, Manifest):
        raise BadArgumentError(f"log_rows takes a Manifest, not {type(m).__name__}")
    rows = []
    for v in m.versions:
        snap = m.snapshot(v.number)
        links_in = [{"from": k.source, "size": k.size} for k in m.links if k.target == v.number]
        rows.append({
            "number": v.number, "digest": v.digest, "step": v.step, "time": v.time,
            "metadata": v.metadata, "snapshot_bytes": snap.size if snap else None,
            "links_in": links_in,
        })  # fmt: skip
    return rows


def verify(
    chain: Chain | PathLike, *, deep: bool = False, progress: Progress | None = None
) -> Manifest:
    """Check every revision's rules and parent digest, every file's digest and header.

    ``deep`` also rebuilds every version from a snapshot and checks each link
    applies to its source with every tensor digest (needs disk for the chain's
    versions in the cache's scratch folder).
    """
    chain = as_chain(chain)
    m = chain.head()
    previous: tuple[int, bytes] | None = None
    for r in chain.revisions():
        data = chain.storage.read(revision_key(r), MAX_MANIFEST_BYTES)
        rev = parse_manifest(data, expected_revision=r)
        want = None if previous is None else (previous[0], digest_bytes(previous[1]))
        if want is not None and want[0] == r - 1 and rev.parent != want:
            raise ManifestInvalidError(f"revision {r}: parent digest differs from {r - 1}")
        previous = (r, data)
    for link in m.links:
        for path in parts.link_files(chain, m, link, progress):
            api.verify(path)
    with temp_dir(chain.scratch(), "verify") as tmp:
        for snap in m.snapshots:
            materialize_snapshot(chain, m, snap, Path(tmp) / f"v{snap.version}", progress)
        if deep:
            _verify_deep(chain, m, Path(tmp))
    return m


def check_files(chain: Chain, m: Manifest) -> None:
    """Every file ``m`` lists: stored (RD-3 not-found), digest and size (checksum-mismatch),
    delta headers and snapshot checkpoints against their versions (RD-2 chain-broken)."""
    for link in m.links:
        for path in parts.link_files(chain, m, link):
            api.verify(path)
    with tempfile.TemporaryDirectory(prefix="wdelta-check-", dir=chain.scratch()) as tmp:
        for snap in m.snapshots:
            materialize_snapshot(chain, m, snap, Path(tmp) / f"v{snap.version}")


def _verify_deep(chain: Chain, m: Manifest, tmp: Path) -> None:
    built = {s.version: tmp / f"v{s.version}" for s in m.snapshots}
    pending = list(m.links)
    while pending:
        ready = [k for k in pending if k.source in built or (k.reversible and k.target in built)]
        if not ready:
            raise ChainBrokenError(
                f"links {[(k.source, k.target) for k in pending][:5]} unreachable"
            )
        for k in ready:
            pending.remove(k)
            forward = k.source in built
            src, dst = (k.source, k.target) if forward else (k.target, k.source)
            out = tmp / f"v{dst}.{k.source}-{k.target}"
            if k.parts:
                sources = parts.fetch_sources(chain, m, k, None, None)
                parts.apply_to_file(sources, not forward, built[src], None,
                                    m.version(dst).digest, out)  # fmt: skip
            else:
                api.apply(built[src], fetch_link(chain, m, k), out, reverse=not forward)
            if dst in built:
                shutil.rmtree(out) if out.is_dir() else out.unlink()
            else:
                built[dst] = out
