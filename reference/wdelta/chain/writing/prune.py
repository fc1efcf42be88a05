"""``prune``: drop old links and snapshots under a retention policy, then their files.

Policy: keep the snapshots of every ``snapshot_every``-th version (by
number; the newest snapshot is always kept) and the last ``keep_links``
links.  The versions this promises are the kept snapshots' versions, the
endpoints of the kept links and the head; every link on the cheapest path
from a kept snapshot to a promised version is kept too, so no promised
version is stranded.  Versions nothing reaches any more are dropped.  Files
are deleted only after the new revision that no longer names them exists,
and a dropped revision's signature objects after the revision.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...arguments import PathLike, check_int
from ...errors import BadArgumentError
from ...format.digest import digest_bytes
from ..errors import ChainBrokenError
from ..model import graph
from ..model.manifest import Link, Manifest, Snapshot, revision_key, unreachable_versions
from ..store import Chain, as_chain


@dataclass(frozen=True)
class Policy:
    """``snapshot_every`` >= 1, ``keep_links`` >= 0, ``keep_revisions`` >= 1."""

    snapshot_every: int = 10
    keep_links: int = 20
    keep_revisions: int = 10

    def check(self) -> None:
        check_int(self.snapshot_every, "snapshot_every", 1)
        check_int(self.keep_links, "keep_links", 0)
        check_int(self.keep_revisions, "keep_revisions", 1)


def retained(m: Manifest, policy: Policy) -> tuple[tuple[Snapshot, ...], tuple[Link, ...]]:
    """The snapshots and links the policy keeps (pure; see the module doc)."""
    snaps = [s for s in m.snapshots if s.version % policy.snapshot_every == 0]
    if m.snapshots and m.snapshots[-1] not in snaps:
        snaps.append(m.snapshots[-1])
    links = set(m.links[len(m.links) - policy.keep_links :] if policy.keep_links else ())
    promised = {m.head.number} | {s.version for s in snaps}
    promised |= {n for k in links for n in (k.source, k.target)}
    # Paths may only start from kept snapshots.
    only_kept = Manifest(m.revision, m.parent, m.versions, tuple(snaps), m.links)
    for number in sorted(promised):
        plan = graph.cheapest_path(only_kept, (), number, lambda d: False)
        if plan is None:
            raise ChainBrokenError(f"version {number} is not reachable from a kept snapshot")
        links |= {h.link for h in plan[1] if h.link is not None}
    return tuple(sorted(snaps, key=lambda s: s.version)), tuple(
        sorted(links, key=lambda k: (k.target, k.source))
    )


def _reachable_versions(
    m: Manifest, snaps: tuple[Snapshot, ...], links: tuple[Link, ...]
) -> set[int]:
    trial = Manifest(m.revision, m.parent, m.versions, snaps, links)
    return {v.number for v in m.versions} - set(unreachable_versions(trial))


def _pruned(cur: Manifest, policy: Policy) -> Manifest:
    """The successor of ``cur`` that keeps only what ``policy`` retains."""
    snaps, links = retained(cur, policy)
    keep = _reachable_versions(cur, snaps, links)
    versions = tuple(v for v in cur.versions if v.number in keep)
    return cur.successor(versions=versions, snapshots=snaps, links=links)


def _doomed(chain: Chain, new: Manifest, revisions: list[int], policy: Policy) -> list[str]:
    """Keys to delete once ``new`` exists: unreferenced files, revisions past the newest few."""
    referenced = {f.key for k in new.links for f in k.files}
    referenced |= {f.key for s in new.snapshots for f in s.files}
    doomed = [
        obj.key
        for prefix in ("deltas/", "snapshots/")
        for obj in chain.storage.list(prefix)
        if obj.key not in referenced
    ]
    dropped = revisions[: -policy.keep_revisions]
    return doomed + [revision_key(r) for r in dropped] + _signatures_of(chain, dropped)


def _signatures_of(chain: Chain, revisions: list[int]) -> list[str]:
    """The signature objects (SPEC §17.11) of ``revisions``, deleted after them."""
    keys = []
    for r in revisions:
        data = chain.revision_bytes(r)
        if data is not None:
            keys += [o.key for o in chain.storage.list(f"signatures/{digest_bytes(data)}/")]
    return keys


def prune(
    chain: Chain | PathLike, policy: Policy, *, dry_run: bool = False
) -> tuple[Manifest, list[str]]:
    """Publish the pruned manifest, then delete unreferenced files; returns both.

    ``dry_run``: publish and delete nothing; return the revision that would be
    published and the keys that would be deleted (as of now).
    """
    chain = as_chain(chain)
    if not isinstance(policy, Policy):
        raise BadArgumentError(f"policy must be a wdelta.chain.Policy, not {type(policy).__name__}")
    policy.check()
    if dry_run:
        new = _pruned(chain.head(), policy)
        return new, _doomed(chain, new, [*chain.revisions(), new.revision], policy)
    new = chain.publish(lambda cur: _pruned(cur, policy))
    doomed = _doomed(chain, new, chain.revisions(), policy)
    for key in doomed:
        chain.storage.delete(key)
    return new, doomed
