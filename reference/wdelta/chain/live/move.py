"""Bring in-memory weights to any version of a chain; download a move ahead of time.

``follow_weights`` keeps a mapping at the chain's head; an inference engine
asked for version N (below the head, or several versions ahead) needs to go
exactly there, to apply without network I/O inside its update call, and to
hand the model only the tensors that changed.  ``prefetch`` downloads what a
move needs into the cache (verified); ``move_weights`` applies it.

Which way a move goes.  Forward over links, backward over reversible links
(``Publisher`` and ``append`` write reversible links), skipping any
number of versions: the cheapest path in bytes over links only.  When no
links join the two versions (a version pruned, or a backward move over a
link that is not reversible) the target is loaded from its snapshot into
host memory, diffed against the weights and applied in place (``jump``;
``jump=False`` refuses instead, ``chain-broken``).

All or nothing.  A full mapping's move downloads every file first, so a
network failure leaves the weights untouched.  Each link is applied all or
nothing (``apply_inplace``); if one after the first fails, the links already
applied are undone in reverse order from the bytes they applied (the cached
files, or the blobs a partial mapping's ranged reads kept: never a new read),
and the error raised.  Should undoing be impossible (a link that is not
reversible) the error says so.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...arguments import PathLike, check_mapping
from ...errors import BadArgumentError, WdeltaError
from ...format.container import open_delta
from ...format.header import Header
from ...ops import api
from ...ops import tensors as live_tensors
from ...ops.inplace import apply_inplace
from ...ops.tensors import Select
from ..errors import ChainBrokenError
from ..model import graph
from ..model.manifest import Link, Manifest, Version
from ..reading import cachegc, parts
from ..reading.fetch import check_link_header, evicting
from ..reading.partial import read_remote_header
from ..reading.pull import hop_files
from ..storage.base import Progress
from ..store import Chain, as_chain
from ..trust.acceptance import Tracker
from ..trust.freshness import check_fresh, check_max_age
from ..trust.updater import Trust, as_trust
from .weights import Applied, apply_link, keep_roots, load, start_version


@dataclass(frozen=True)
class Moved:
    """Where a move ended.

    ``version``: the version the weights are at now.  ``changed``: the names of
    the tensors whose bytes the move changed or added (a superset when a
    tensor changed by one link is changed back by the next); tensors the move
    removed are no longer in the mapping and not listed.  ``downloaded``: bytes
    of whole files this call downloaded into the cache (0 after a ``prefetch``).  ``jumped``:
    True if no links led there and the target was loaded through a snapshot.
    """

    version: Version
    changed: frozenset[str]
    downloaded: int = 0
    jumped: bool = False


def link_changes(chain: Chain, m: Manifest, link: Link, reverse: bool) -> set[str]:
    """Tensors that applying ``link`` (``reverse``: backward) changes or adds, from its
    header or its parts' headers: the cached files, else two ranged reads per file
    (header digests checked, headers checked against the link: chain-broken)."""
    headers = [_file_header(chain, f.key, f.size, f.digest) for f in link.files]
    if link.parts:
        parts.check_parts(m, link, headers)
    else:
        check_link_header(m, link, headers[0])
    new = "removed" if reverse else "added"
    return {t.name for h in headers for t in h.tensors if t.op in ("modified", new)}


def _file_header(chain: Chain, key: str, size: int, digest: str) -> Header:
    cached = chain.cached_path(digest)
    if cached is not None:
        with open_delta(cached) as d:
            return d.header
    return read_remote_header(chain.storage, _Stored(key, size))[0]


@dataclass(frozen=True)
class _Stored:
    key: str
    size: int


def plan_move(chain: Chain, m: Manifest, at: int | None, to: int) -> list[graph.Hop] | None:
    """The links from version ``at`` to ``to`` with the fewest bytes to download (over
    reversible links backwards); None if none join them (or ``at`` is None)."""
    if at is None or not any(v.number == at for v in m.versions):
        return None
    found = graph.cheapest_path(
        m, [at], to, chain.is_cached,
        # A multi-part link is undone part by part when one fails: it must be reversible.
        allow=lambda h: h.link is not None and (h.link.reversible or not h.link.parts),
    )  # fmt: skip
    return None if found is None else found[1]


def _jump_plan(chain: Chain, m: Manifest, to: int) -> list[graph.Hop]:
    """The snapshot and links that loading version ``to`` from nothing downloads."""
    found = graph.cheapest_path(m, [], to, chain.is_cached)
    if found is None:
        raise ChainBrokenError(f"version {to} cannot be reached")
    return found[1]


def _download(chain: Chain, hops: Iterable[graph.Hop], progress: Progress | None) -> None:
    """Every file of ``hops`` into the cache, each verified against the manifest."""
    for hop in hops:
        if hop.link is not None:
            for f in hop.link.files:
                chain.fetch(f.key, f.size, f.digest, "blake3", progress)
        else:
            assert hop.snapshot is not None
            for s in hop.snapshot.files:
                chain.fetch(s.key, s.size, s.sha256, "sha256", progress)


@dataclass
class _Options:
    """A move's head-reading options (as ``follow_weights``'s)."""

    trust: Trust | PathLike | None = None
    state: PathLike | None = None
    accept_rollback: bool = False
    allow_unsigned: bool = False
    max_age: float | None = None


def _head(chain: Chain, o: _Options) -> tuple[Manifest, str, Tracker]:
    """The head revision (trust and acceptance state checked), its digest, the tracker."""
    if chain.cache is None:
        raise BadArgumentError("moving weights needs a cache folder (Chain(..., cache=))")
    if o.trust is not None:
        chain.trust = as_trust(o.trust)
    tracker = Tracker(o.state, o.accept_rollback, o.allow_unsigned)
    keep_roots(chain, o.state)
    m, digest = tracker.head(chain)
    check_fresh(m, check_max_age(o.max_age))
    return m, digest, tracker


def prefetch(
    chain: Chain | PathLike, *, at: int | str, to: int | str = "head",
    progress: Progress | None = None, trust: Trust | PathLike | None = None,
    state: PathLike | None = None, accept_rollback: bool = False, allow_unsigned: bool = False,
    max_age: float | None = None,
) -> int:  # fmt: skip
    """Download into the chain's cache every file that moving from version ``at`` to
    ``to`` needs (the links, or for a jump the snapshot and links that load ``to``),
    each verified against the manifest; the bytes downloaded (0 if all were cached).

    ``at`` is a version (number, digest or ``step:N``; a number pruned from the
    chain plans a jump).  Afterwards ``move_weights`` between the same versions
    reads no object from storage, as long as the cache keeps the files (a gc
    with a byte limit can remove them; pins protect only running moves).  Safe
    with other processes using the same cache folder: each object is downloaded
    by one of them, the others wait for it.  The head-reading options are
    ``move_weights``'s.
    """
    c = as_chain(chain)
    m, _, _ = _head(c, _Options(trust, state, accept_rollback, allow_unsigned, max_age))
    goal = m.version(to).number
    start = start_version(m, {}, at, partial=True)
    hops = plan_move(c, m, start, goal)
    hops = _jump_plan(c, m, goal) if hops is None else hops
    count = _Counter(progress)
    assert c.cache is not None
    with cachegc.pin(c.cache, {d for hop in hops for d in hop_files(hop)}):
        _download(c, hops, count)
    return count.total


@dataclass
class _Counter:
    """A progress callback that also sums the bytes it is told of; ``on_link`` is told
    of each link applied."""

    inner: Progress | None
    total: int = 0
    on_link: Callable[[Version, frozenset[str]], None] | None = None

    def __call__(self, n: int) -> None:
        self.total += n
        if self.inner is not None:
            self.inner(n)


def move_weights(
    chain: Chain | PathLike, weights: MutableMapping[str, Any], *, at: int | str | None,
    to: int | str = "head", tensors: Select = None, threads: int = 2, jump: bool = True,
    progress: Progress | None = None,
    on_link: Callable[[Version, frozenset[str]], None] | None = None,
    trust: Trust | PathLike | None = None, state: PathLike | None = None,
    accept_rollback: bool = False, allow_unsigned: bool = False, max_age: float | None = None,
) -> Moved:  # fmt: skip
    """Bring ``weights`` (NumPy arrays / torch tensors by name, in place) from version
    ``at`` to version ``to`` of the chain; where they ended and what changed.

    ``at``: the weights' version (number, digest or ``step:N``; a pruned number
    is accepted and jumps); None hashes the weights to find it (a partial
    mapping needs ``at``).  ``to``: any version (number, digest, ``step:N``,
    ``head``), above or below ``at``.  ``tensors``: the mapping holds only
    those tensors (a pattern or a predicate, as ``follow_weights``'s); links
    not in the cache are then read by ranges (the selected blobs only).
    ``jump``: see the module's doc; a jump needs a pattern, not a predicate.
    Progress: ``progress(n)`` is called with each downloaded block's size in
    bytes (whole files into the cache; a partial mapping's ranged reads are not
    counted), ``on_link(version, names)`` after each link is applied, with the
    version reached and the tensors that link changed or added.

    Every link is verified (BLAKE3 of its file, header against the manifest,
    every tensor digest on apply: SPEC §10.2), the move is all or nothing as
    the module's doc says, and a cached file that fails is evicted and the
    link fetched once more (SPEC §17.7).  The head revision read is checked
    and accepted as ``follow_weights`` does (``trust``, ``state``,
    ``accept_rollback``, ``allow_unsigned``, ``max_age`` seconds).  Needs a
    cache folder on ``chain``.
    """
    c = as_chain(chain)
    check_mapping(weights, "weights", mutable=True)
    o = _Options(trust, state, accept_rollback, allow_unsigned, max_age)
    m, digest, tracker = _head(c, o)
    goal = m.version(to)
    start = start_version(m, weights, at, tensors is not None)
    count = _Counter(progress, on_link=on_link)
    hops = plan_move(c, m, start, goal.number)
    if hops is None:
        if not jump:
            raise ChainBrokenError(
                f"no links lead from version {at} to version {goal.number}, and no jump "
                "through a snapshot was allowed"
            )
        changed = _jump(c, m, goal, weights, start, tensors, threads, count)
    else:
        changed = _move(c, m, hops, weights, tensors, threads, count)
    tracker.accept(c, m, digest)
    return Moved(goal, frozenset(changed), count.total, hops is None)


def _move(
    chain: Chain, m: Manifest, hops: list[graph.Hop], weights: MutableMapping[str, Any],
    tensors: Select, threads: int, count: _Counter,
) -> set[str]:  # fmt: skip
    """Apply ``hops`` (links) in order, all or nothing; the names they change or add."""
    assert chain.cache is not None
    keep = live_tensors.selector(tensors)
    changed: set[str] = set()
    applied: list[tuple[Link, Applied]] = []
    with cachegc.pin(chain.cache, {d for hop in hops for d in hop_files(hop)}):
        if tensors is None:
            _download(chain, hops, count)
        try:
            for hop in hops:
                link = hop.link
                assert link is not None
                apply = functools.partial(_apply_hop, chain, m, link, weights, hop.reverse,
                                          tensors, threads)  # fmt: skip
                try:
                    names, done = evicting(chain, link.files, apply)
                except WdeltaError as exc:
                    _undo(applied, weights, exc)
                    raise
                applied.append((link, done))
                names = {n for n in names if keep(n)}
                changed |= names
                if count.on_link is not None:
                    count.on_link(m.version(hop.version), frozenset(names))
        finally:
            for _, done in applied:
                done.close()
    return changed


def _apply_hop(
    chain: Chain, m: Manifest, link: Link, weights: MutableMapping[str, Any], reverse: bool,
    tensors: Select, threads: int,
) -> tuple[set[str], Applied]:  # fmt: skip
    """Apply ``link`` in place (all or nothing); the names it changes or adds, and the
    link applied (kept open: its bytes undo it)."""
    changed = link_changes(chain, m, link, reverse)
    return changed, apply_link(chain, m, link, weights, reverse, tensors, threads)


def _undo(applied: list[tuple[Link, Applied]], weights: MutableMapping[str, Any],
          exc: WdeltaError) -> None:  # fmt: skip
    """Undo the ``applied`` links, newest first, from the bytes each applied (never a new
    read, SPEC §15); if one is not reversible, note on ``exc`` the version the weights
    are at."""
    if not applied:
        return
    if all(link.reversible for link, _ in applied):
        for _, done in reversed(applied):
            done.undo(weights)
        return
    exc.message = (f"{exc}; the weights are at the version a non-reversible link "
                   "applied before reached (it cannot be undone)")  # fmt: skip
    exc.args = (exc.message,)


def _jump(
    chain: Chain, m: Manifest, goal: Version, weights: MutableMapping[str, Any],
    start: int | None, tensors: Select, threads: int, count: Progress,
) -> set[str]:  # fmt: skip
    """Load ``goal`` into host memory (its snapshot and links, downloaded first for a
    full mapping; a pattern's byte ranges for a partial one), diff it against the
    weights and apply that delta in place; the names it changes or adds."""
    if tensors is not None and not isinstance(tensors, str):
        where = "the weights' version" if start is None else f"version {start}"
        raise ChainBrokenError(
            f"no links lead from {where} to version {goal.number}, and a snapshot's "
            "tensors can be selected by a pattern only, not a predicate"
        )
    if tensors is None:
        _download(chain, _jump_plan(chain, m, goal.number), count)
    target, _ = load(chain, to=goal.number, tensors=tensors)
    with tempfile.TemporaryDirectory(prefix="wdelta-jump-", dir=chain.cache) as tmp:
        delta = Path(tmp) / "jump.wdelta"
        api.diff(weights, target, delta, threads=threads)
        del target  # the delta holds what changes
        with open_delta(delta) as d:
            changed = {t.name for t in d.header.tensors if t.op in ("modified", "added")}
        apply_inplace(weights, delta, threads=threads)
    return changed
