"""``pull``: bring a node's local checkpoint to the head (or a named version).

The plan is the cheapest path in bytes (graph.cheapest_path) from what the
node has: its checkpoint, a finished intermediate of an interrupted pull, or
nothing (then it starts from a snapshot).  Hops run one by one; every delta
and snapshot is verified before use and every apply checks every tensor
digest.  Intermediates live in a work folder beside the checkpoint, named by
version digest and created by rename, so after a crash the pull resumes from
the last finished hop and the cache holds every file already verified.
Only the final result replaces the checkpoint, in one rename.

Rollback protection (RD-1): the head revision a pull succeeded from is
recorded (revision and BLAKE3, ``acceptance``) in a state file beside the
checkpoint, so that a later pull, also after a restart, refuses storage
rolled back below it or a rewritten revision.

``follow`` pulls forever: a failed poll is reported and retried after an
exponential, capped, jittered delay (``backoff.Backoff``) while the local
checkpoint keeps serving its version; a file that failed verification is
routed around on the next polls when another path exists.
"""

from __future__ import annotations

import contextlib
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...arguments import PathLike, as_path, check_optional_int, check_seconds
from ...errors import BadArgumentError, DeltaFormatError, WdeltaError
from ...io.atomic import temp_name
from ...io.destination import check_kind, overlaps
from ...ops import api
from ..errors import ChainBrokenError, NotFoundError
from ..model import graph
from ..model.manifest import Manifest, Version
from ..storage.backoff import Backoff
from ..storage.base import Progress
from ..storage.local import LocalStorage
from ..store import Chain, as_chain
from ..trust import acceptance
from ..trust.freshness import check_fresh, check_max_age
from ..trust.updater import Trust, as_trust, keep_roots_beside
from . import cachegc, partial, parts
from .fetch import check_link_header, fetch_link, materialize_snapshot
from .local import digest_of_path, partial_marker, replace_checkpoint
from .partial_snapshot import extract_remote

_REPLANS = 3


@dataclass
class PullResult:
    """Where the node ended: version, manifest revision, hops applied, bytes fetched."""

    version: Version
    revision: int
    hops: list[graph.Hop] = field(default_factory=list)
    downloaded: int = 0


def work_dir(local: Path) -> Path:
    """Intermediates of pulls into ``local`` (same file system, for the final rename)."""
    return local.parent / f".{local.name}.wdelta-work"


def local_version(m: Manifest, local: Path, tensors: str | None, assume: str | None) -> Version:
    """The chain version of the node's checkpoint (hashed unless ``assume``-d)."""
    if tensors is not None:
        marker = partial_marker(local)
        if marker is None or marker[1] != tensors:
            raise BadArgumentError(f"{local} is not a partial checkpoint of tensors {tensors!r}")
        digest = marker[0]
    else:
        digest = assume or digest_of_path(local)
    found = m.by_digest(digest)
    if found is None:
        raise NotFoundError(
            f"{local} (digest {digest[:16]}) is not a version of this chain: pull to another "
            "path, or remove it to pull the version whole"
        )
    return found


def check_local(chain: Chain, local: Path) -> None:
    """Refuse a node path that pulling would break (BadArgumentError): ``-``, a
    device or FIFO, a path inside the chain's own folder (or holding it).

    An existing ``local`` is the pull's input as well as its output: it is
    replaced only by a newer (or named) version of the same chain.
    """
    check_kind(local)
    if isinstance(chain.storage, LocalStorage) and overlaps(local, chain.storage.root):
        raise BadArgumentError(
            f"{local} overlaps the chain folder {chain.storage.root}: pulling there would "
            "overwrite the chain's files; choose a local path outside it"
        )


@dataclass
class _Puller:
    chain: Chain
    m: Manifest
    local: Path
    tensors: str | None
    progress: Progress | None
    threads: int
    avoid: set[str] = field(default_factory=set)
    downloaded: int = 0

    def count(self, n: int) -> None:
        self.downloaded += n
        if self.progress is not None:
            self.progress(n)

    def starts(self, assume: str | None) -> dict[int, Path]:
        found: dict[int, Path] = {}
        work = work_dir(self.local)
        if not work.is_dir() and (work.exists() or work.is_symlink()):
            _discard(work)  # a file (or dangling link) in the work folder's place: ours to clear
        for path in sorted(work.iterdir()) if work.is_dir() else []:
            v = self.m.by_digest(path.name)
            if v is None:
                continue
            # A partial node's intermediates are never reused: they hold only some
            # tensors, which nothing the node has could check against the version.
            if self.tensors is None and _is_version(path, v):
                found[v.number] = path
            else:  # planted or damaged: the work folder is the node's own, remove it
                _discard(path)
        if self.local.exists():
            found[local_version(self.m, self.local, self.tensors, assume).number] = self.local
        return found

    def hop(self, hop: graph.Hop, current: Path | None) -> Path:
        work_dir(self.local).mkdir(parents=True, exist_ok=True)
        out = work_dir(self.local) / self.m.version(hop.version).digest
        if hop.snapshot is not None:
            if self.tensors is None:
                return materialize_snapshot(self.chain, self.m, hop.snapshot, out, self.count)
            storage, snap = self.chain.storage, hop.snapshot
            if extract_remote(storage, self.m, snap, self.tensors, out, self.count):
                return out
            full = work_dir(self.local) / temp_name("snapshot")
            try:
                materialize_snapshot(self.chain, self.m, hop.snapshot, full, self.count)
                partial.extract(full, self.tensors, self.m.version(hop.version).digest, out)
            finally:
                _discard(full)
            return out
        assert hop.link is not None and current is not None
        if hop.link.parts:
            sources = parts.fetch_sources(self.chain, self.m, hop.link, self.tensors, self.count)
            digest = self.m.version(hop.version).digest
            parts.apply_to_file(sources, hop.reverse, current, self.tensors, digest, out,
                                self.count)  # fmt: skip
            return out
        if self.tensors is None:
            delta = fetch_link(self.chain, self.m, hop.link, self.count)
            api.apply(
                current, delta, out, reverse=hop.reverse, threads=self.threads, overwrite=True
            )
            return out
        header, data_start = partial.read_remote_header(self.chain.storage, hop.link, self.count)
        check_link_header(self.m, hop.link, header)
        partial.apply_partial(
            self.chain.storage, hop.link, header, data_start, hop.reverse, current,
            self.tensors, out, self.count,
        )  # fmt: skip
        return out


def _cached(chain: Chain, tensors: str | None) -> Callable[[str], bool]:
    # A partial pull reads byte ranges and never fills the cache with deltas.
    return (lambda digest: False) if tensors is not None else chain.is_cached


def _discard(path: Path) -> None:
    """Remove a file or folder (a symlink itself, never what it leads to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _is_version(path: Path, v: Version) -> bool:
    """Is the intermediate ``path`` version ``v``: a regular file, or a folder of
    regular files, as a hop writes them (nothing a read could block on or that
    leads elsewhere), whose checkpoint digest is ``v``'s?  An intermediate is
    checked like a download (RD-2) before it is applied or installed.
    """
    files = [path] if not path.is_dir() or path.is_symlink() else list(path.iterdir())
    if not all(stat.S_ISREG(f.lstat().st_mode) for f in files):
        return False
    try:
        return digest_of_path(path) == v.digest
    except WdeltaError:
        return False  # not even a checkpoint


def hop_files(hop: graph.Hop) -> set[str]:
    """Digests of the files ``hop`` downloads (a link's delta, a snapshot's files)."""
    if hop.link is not None:
        return {f.digest for f in hop.link.files}
    assert hop.snapshot is not None
    return {f.sha256 for f in hop.snapshot.files}


def _hop_refetching(p: _Puller, hop: graph.Hop, current: Path | None) -> Path:
    """``p.hop``; if it fails and a file it took from the cache no longer has its
    digest, that file is removed and the hop runs once more, downloading it."""
    try:
        return p.hop(hop, current)
    except WdeltaError:
        if not _evict_corrupt(p.chain, hop):
            raise
    return p.hop(hop, current)


def _evict_corrupt(chain: Chain, hop: graph.Hop) -> bool:
    """Remove the hop's cached files whose bytes no longer match; True if any was."""
    if hop.link is not None:  # every part of a multi-part link, not its combined digest
        return chain.evict_corrupt((f.digest, "blake3") for f in hop.link.files)
    assert hop.snapshot is not None
    return chain.evict_corrupt((f.sha256, "sha256") for f in hop.snapshot.files)


def _plan(p: _Puller, starts: dict[int, Path], goal: Version) -> tuple[int, list[graph.Hop]]:
    """The cheapest path avoiding ``p.avoid`` if one exists, else the cheapest path."""
    cached = _cached(p.chain, p.tensors)
    plan = graph.cheapest_path(
        p.m, starts, goal.number, cached, lambda hop: not hop_files(hop) & p.avoid
    )
    plan = plan or graph.cheapest_path(p.m, starts, goal.number, cached)
    if plan is None:
        raise ChainBrokenError(f"version {goal.number} cannot be reached")
    return plan


def _run(p: _Puller, goal: Version, assume: str | None) -> PullResult:
    starts = p.starts(assume)
    start, hops = _plan(p, starts, goal)
    assert p.chain.cache is not None
    try:
        with cachegc.pin(p.chain.cache, {d for hop in hops for d in hop_files(hop)}):
            return _apply_plan(p, goal, hops, starts.get(start))
    finally:
        with contextlib.suppress(OSError):  # a failed first hop leaves the folder empty
            work_dir(p.local).rmdir()


def _apply_plan(
    p: _Puller, goal: Version, hops: list[graph.Hop], current: Path | None
) -> PullResult:
    for hop in hops:
        try:
            produced = _hop_refetching(p, hop, current)
        except (DeltaFormatError, ChainBrokenError):
            p.avoid |= hop_files(hop)  # this file failed verification: route around it
            raise
        if current is not None and current != p.local:
            _discard(current)
        current = produced
    assert current is not None
    if current != p.local:
        replace_checkpoint(current, p.local)
    shutil.rmtree(work_dir(p.local), ignore_errors=True)
    return PullResult(goal, p.m.revision, hops, p.downloaded)


def pull(
    chain: Chain | PathLike, local: PathLike, *, to: str | int = "head", tensors: str | None = None,
    progress: Progress | None = None, threads: int = 2, assume: str | None = None,
    avoid: set[str] | None = None, cache_max_bytes: int | None = None,
    trust: Trust | PathLike | None = None,
    state: PathLike | bool | acceptance.Tracker = True, accept_rollback: bool = False,
    max_age: float | None = None, allow_unsigned: bool = False,
) -> PullResult:  # fmt: skip
    """Bring ``local`` to version ``to``; ``tensors`` selects a partial pull.

    ``assume`` is the digest the caller knows ``local`` to be at (skips
    hashing it; a wrong value is still caught by apply's digest checks).
    A file missing from storage is an error unless a newer manifest revision
    no longer lists it (it was pruned meanwhile), in which case the pull is
    planned again.  Without a cache on ``chain``, ``.wdelta-cache`` beside
    ``local`` is used.  ``avoid``: digests of files to route around when
    another path exists; the pull adds to it every file that fails
    verification (``follow`` keeps one across its polls).  ``cache_max_bytes``:
    after the pull, the cache is garbage-collected (cachegc.gc) down to that size.
    ``trust`` (a Trust or a trust root file) becomes the chain's trust policy:
    a revision without a threshold of valid signatures is refused
    (``signature-invalid``, ``frozen``) before anything is downloaded.

    ``state``: where the accepted head revision is kept (RD-1): True (default)
    ``.NAME.wdelta-accepted.json`` beside ``local``, a path, False for none,
    or a ``acceptance.Tracker`` shared by several pulls.  A head lower than
    the accepted revision, or a rewritten one, is refused (manifest-invalid)
    unless ``accept_rollback`` (once: the new head is recorded instead).
    With a trust policy (and ``state`` not False) the newest trust root
    accepted is kept in ``.NAME.wdelta-root.json`` beside ``local`` and the
    next pull starts from it (SG-2), so a revocation survives a restart.
    The state records the trust a revision was accepted under: a later pull
    without ``trust`` is refused (``signature-invalid``) unless
    ``allow_unsigned``; a root rotation that revoked the keys of the accepted
    revision lets the next head be accepted afresh (fast-forward recovery).

    ``max_age`` (seconds): a head whose manifest ``updated`` time is older
    than that, or absent, is refused (``frozen``) before anything is
    downloaded; ``local`` keeps its version.
    """
    chain, local = as_chain(chain), as_path(local, "local")
    if trust is not None:
        chain.trust = as_trust(trust)
    if tensors is not None and not isinstance(tensors, str):
        raise BadArgumentError(f"tensors must be a str of patterns, not {type(tensors).__name__}")
    check_optional_int(cache_max_bytes, "cache_max_bytes", 0)
    max_age = check_max_age(max_age)
    if chain.cache is None:
        chain.cache = local.parent / ".wdelta-cache"
    check_local(chain, local)
    tracker = _tracker(chain, state, local, accept_rollback, allow_unsigned)
    keep_roots_beside(chain.trust, chain.storage, None if state is False else local)
    for attempt in range(_REPLANS):
        m, digest = tracker.head(chain)
        check_fresh(m, max_age)
        p = _Puller(
            chain, m, local, tensors, progress, threads, avoid if avoid is not None else set()
        )
        try:
            result = _run(p, m.version(to), assume)
        except NotFoundError:
            if attempt == _REPLANS - 1 or chain.revisions()[-1] == m.revision:
                raise
            continue
        tracker.accept(chain, m, digest)
        if cache_max_bytes is not None:
            cachegc.gc(chain.cache, m, cache_max_bytes)
        return result
    raise AssertionError("unreachable")


def _tracker(
    chain: Chain, state: object, local: Path, accept_rollback: object,
    allow_unsigned: object = False,
) -> acceptance.Tracker:  # fmt: skip
    """The acceptance tracker of a pull into ``local`` (see ``pull``'s ``state``)."""
    if isinstance(state, acceptance.Tracker):
        return state
    if state is False:
        return acceptance.Tracker(None, accept_rollback, allow_unsigned)
    path = acceptance.state_beside(local) if state is True else as_path(state, "state")
    root = chain.storage.root if isinstance(chain.storage, LocalStorage) else None
    for other, what in ((local, "the local checkpoint"), (root, "the chain folder")):
        if other is not None and overlaps(path, other):
            raise BadArgumentError(
                f"state {path} overlaps {what} {other}: writing the state there would "
                "overwrite it; choose another path"
            )
    return acceptance.Tracker(path, accept_rollback, allow_unsigned)


def follow(
    chain: Chain | PathLike, local: PathLike, *, interval: float, max_iterations: int | None = None,
    timeout: float | None = None, on_update: Callable[[PullResult], None] | None = None,
    on_error: Callable[[WdeltaError, float], None] | None = None, backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep, **options: object,
) -> PullResult | None:  # fmt: skip
    """Pull the head every ``interval`` seconds; stop after ``max_iterations`` polls
    or ``timeout`` seconds (None: forever).  Returns the last result.

    A poll that fails with a WdeltaError (other than bad-argument, which no
    retry can fix) is reported to ``on_error(error, delay)`` and retried after
    ``backoff``'s delay (default ``Backoff()``) instead of ``interval``; the
    local checkpoint stays at its version meanwhile.  If the last poll before
    stopping failed, its error is raised (and not reported to ``on_error``).
    ``state``, ``accept_rollback`` and ``allow_unsigned`` are ``pull``'s, shared by every poll: a
    rolled-back head fails the poll (manifest-invalid) and is retried.
    """
    chain, local = as_chain(chain), as_path(local, "local")
    if options.get("trust") is not None:
        chain.trust = as_trust(options.pop("trust"))  # once: the walked root persists
    interval = check_seconds(interval, "interval") or 0.0
    timeout = check_seconds(timeout, "timeout")
    check_optional_int(max_iterations, "max_iterations", 1)
    # One tracker for every poll: a deliberate rollback is accepted once, and
    # what was accepted is known between polls even without a state file.
    options["state"] = _tracker(chain, options.get("state", True), local,
                                options.pop("accept_rollback", False),
                                options.pop("allow_unsigned", False))  # fmt: skip
    state = _Follow(backoff or Backoff(), None if timeout is None else time.monotonic() + timeout)
    polls = 0
    while max_iterations is None or polls < max_iterations:
        polls += 1
        wait = state.poll(chain, local, options, on_update)
        failed = wait is not None
        wait = interval if wait is None else wait
        if state.deadline is not None:
            wait = min(wait, state.deadline - time.monotonic())
        if (max_iterations is not None and polls >= max_iterations) or wait < 0:
            break
        if failed and on_error is not None and state.error is not None:
            on_error(state.error, wait)
        sleep(wait)
    if state.error is not None:
        raise state.error
    return state.last


@dataclass
class _Follow:
    """A follower's state between polls: last result, failures in a row, files to avoid."""

    backoff: Backoff
    deadline: float | None
    last: PullResult | None = None
    failures: int = 0
    error: WdeltaError | None = None
    avoid: set[str] = field(default_factory=set)

    def poll(
        self, chain: Chain, local: Path, options: dict[str, object],
        on_update: Callable[[PullResult], None] | None,
    ) -> float | None:  # fmt: skip
        """One pull; None after a success, else the delay before the retry."""
        assume = self.last.version.digest if self.last is not None else None
        try:
            result = pull(chain, local, assume=assume, avoid=self.avoid, **options)  # type: ignore[arg-type]
        except BadArgumentError:
            raise
        except WdeltaError as exc:
            self.failures += 1
            self.error = exc
            return self.backoff.delay(self.failures)
        if on_update is not None and (self.last is None or result.version != self.last.version):
            on_update(result)
        self.last, self.failures, self.error = result, 0, None
        self.avoid.clear()
        return None
