"""A node's ranks following a chain together: all ranks at one version, or none moved.

Each rank of a process group (the tensor-parallel ranks of an inference node)
keeps its own tensors in memory.  At each poll rank 0 reads the head revision
and names it to the others; every rank reads that same revision and applies
the links from the node's version to its head, to its tensors only (ranged
reads of its blobs, every part's header for a multi-part link).  The ranks
then compare outcomes: if every rank reached the head, the version is
yielded on every rank; if any rank failed, every rank that moved applies the
links it applied backwards, from the very bytes it applied (kept until the
ranks agree, never read from the store again), so the node stays at its
version, and the poll is reported and retried.  Links the plan uses must be
reversible for that (the reference writes reversible links); a plan through
a link that is not is refused before anything is applied.  Rank 0 reads the
head under the trust policy and the node's acceptance state (RD-1), which it
keeps in a state file, as ``follow_weights`` does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from ...arguments import PathLike, check_mapping, check_optional_int, check_seconds
from ...errors import BadArgumentError, WdeltaError
from ...format.digest import digest_bytes
from ..errors import ChainBrokenError, ManifestInvalidError
from ..model import graph
from ..model.manifest import Manifest, Version
from ..reading.fetch import evicting
from ..store import Chain, as_chain
from ..trust.acceptance import Tracker
from ..trust.updater import Trust, as_trust
from .collective import Group, Outcome
from .weights import Applied, apply_link, keep_roots, needs_state


def follow_in_group(
    chain: Chain, weights: MutableMapping[str, Any], *, at: int, group: Any = None,
    tensors: str | Callable[[str], bool] | None = None, interval: float = 10.0,
    max_polls: int | None = None, backoff: tuple[float, float] = (1.0, 60.0),
    on_error: Callable[[WdeltaError, int], None] | None = None, threads: int = 2,
    trust: Trust | PathLike | None = None, state: PathLike | None = None,
    accept_rollback: bool = False, allow_unsigned: bool = False,
) -> Iterator[Version]:  # fmt: skip
    """Keep every rank's ``weights`` (its ``tensors``) at one version of the chain's head;
    yields each version the whole group reached (collective: every rank of ``group``
    iterates it, with the same arguments).  ``at`` is the number of the version the
    weights are at, the same on every rank.  A failed poll (on any rank) leaves every
    rank at its version and is passed to ``on_error(error, failures in a row)`` on every
    rank, then retried after ``backoff[0] * 2**(failures-1)`` seconds, at most
    ``backoff[1]``; without ``on_error`` the error is raised.  The chain needs a cache
    folder.

    ``trust``, ``state``, ``accept_rollback``, ``allow_unsigned``: as ``follow_weights``'s;
    rank 0 reads the head under them and records it in ``state`` once every rank reached
    it (the newest trust root walked to is kept beside it), so that a restarted group
    keeps the revision it accepted and the roots it reached.  A trust policy needs a
    ``state`` file: without one a restart would forget a root rotation that revoked a key.
    """
    chain = as_chain(chain)
    if trust is not None:
        chain.trust = as_trust(trust)
    check_mapping(weights, "weights", mutable=True)
    check_optional_int(at, "at", 0)
    interval = check_seconds(interval, "interval") or 0.0
    check_optional_int(max_polls, "max_polls", 1)
    if chain.cache is None:
        raise BadArgumentError("following a chain needs a cache folder (Chain(..., cache=))")
    needs_state(chain, state)
    ranks = Group(group, "following", "every rank kept its version")
    tracker = Tracker(state if ranks.rank == 0 else None, accept_rollback, allow_unsigned)
    current, failures, polls = at, 0, 0
    while max_polls is None or polls < max_polls:
        polls += 1
        try:
            reached = _poll(chain, ranks, tracker, weights, current, tensors, threads)
        except WdeltaError as exc:
            failures += 1
            if on_error is None:
                raise
            on_error(exc, failures)
            time.sleep(min(backoff[0] * 2 ** (failures - 1), backoff[1]))
            continue
        failures = 0
        if reached is not None:
            current = reached.number
            yield reached
        if max_polls is None or polls < max_polls:
            time.sleep(interval)


def _head(chain: Chain, tracker: Tracker) -> Outcome:
    """Rank 0: the head revision and its BLAKE3, read under the trust policy and RD-1."""
    try:
        keep_roots(chain, tracker.path)
        m, digest = tracker.head(chain)
        return Outcome(value=(m.revision, digest))
    except WdeltaError as exc:
        return Outcome.failed(exc)


def _revision(chain: Chain, revision: int, digest: str) -> Manifest:
    """Revision ``revision`` with the bytes rank 0 read (a store may answer each rank
    differently), its signatures checked under the trust policy."""
    data = chain.revision_bytes(revision)
    if data is None or digest_bytes(data) != digest:
        raise ManifestInvalidError(
            f"{chain.url}: revision {revision} is not the one rank 0 read (other bytes, or gone)"
        )
    return chain._checked(revision, data)


def _poll(
    chain: Chain, ranks: Group, tracker: Tracker, weights: MutableMapping[str, Any],
    current: int, tensors: str | Callable[[str], bool] | None, threads: int,
) -> Version | None:  # fmt: skip
    """One poll: the head revision rank 0 names, applied on every rank or on none; rank 0
    records it as accepted once every rank reached it."""
    revision, digest = ranks.from_rank0(_head(chain, tracker) if ranks.rank == 0 else None)
    applied: list[Applied] = []
    mine = Outcome()
    try:
        m = _revision(chain, revision, digest)
        hops = _plan(m, current)
        for hop in hops:
            link = hop.link
            assert link is not None
            applied.append(evicting(chain, link.files, functools.partial(
                apply_link, chain, m, link, weights, hop.reverse, tensors, threads)))  # fmt: skip
        mine.value = m.head.number if hops else None
    except WdeltaError as exc:
        mine = Outcome.failed(exc)
    try:
        reached = ranks.agree(mine)
    except WdeltaError:
        for done in reversed(applied):  # newest first, from the bytes each applied
            done.undo(weights)
        raise
    finally:
        for done in applied:
            done.close()
    if ranks.rank == 0:
        tracker.accept(chain, m, digest)
    return m.version(reached[0]) if reached[0] is not None else None


def _plan(m: Manifest, current: int) -> list[graph.Hop]:
    """The links from ``current`` to the head, each reversible (so it can be undone)."""
    if current == m.head.number:
        return []
    if not any(v.number == current for v in m.versions):
        raise ChainBrokenError(f"version {current} is no longer in the chain (pruned)")
    plan = graph.cheapest_path(
        m, [current], m.head.number, lambda d: False,
        allow=lambda h: h.link is not None and h.link.reversible,
    )  # fmt: skip
    if plan is None:
        raise ChainBrokenError(
            f"no reversible links lead from version {current} to the head {m.head.number}"
        )
    return plan[1]
