"""Paths through a chain: reachability and the cheapest download plan.

The graph's nodes are version numbers.  A link is an edge from its older to
its newer version and, when the delta is reversible, also back; a snapshot is
an edge from "nothing" to its version.  Edge costs are bytes to download.
(Which versions no path reaches is a rule of the manifest: ``manifest.unreachable_versions``.)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .manifest import Link, Manifest, Snapshot

NOTHING = -1


@dataclass(frozen=True)
class Hop:
    """One step of a plan: fetch a snapshot, or apply a link (maybe in reverse)."""

    version: int
    snapshot: Snapshot | None = None
    link: Link | None = None
    reverse: bool = False


def _edges(m: Manifest) -> dict[int, list[Hop]]:
    edges: dict[int, list[Hop]] = {v.number: [] for v in m.versions}
    edges[NOTHING] = [Hop(s.version, snapshot=s) for s in m.snapshots]
    for k in m.links:
        edges[k.source].append(Hop(k.target, link=k))
        if k.reversible:
            edges[k.target].append(Hop(k.source, link=k, reverse=True))
    return edges


def hop_cost(hop: Hop, cached: Callable[[str], bool]) -> int:
    """Bytes to download for ``hop``; files whose digest is in the cache are free."""
    if hop.link is not None:
        return sum(f.size for f in hop.link.files if not cached(f.digest))
    assert hop.snapshot is not None
    return sum(f.size for f in hop.snapshot.files if not cached(f.sha256))


def cheapest_path(
    m: Manifest, starts: Collection[int], goal: int, cached: Callable[[str], bool],
    allow: Callable[[Hop], bool] = lambda hop: True,
) -> tuple[int, list[Hop]] | None:  # fmt: skip
    """(start, hops) reaching ``goal`` with the fewest bytes to download.

    ``starts`` are versions already at hand (cost 0); a path may also begin
    with a snapshot (start ``NOTHING``).  Dijkstra over (bytes, hops): among
    equally cheap paths the one with fewer applies wins.  None if unreachable.
    """
    edges = _edges(m)
    best: dict[int, tuple[int, int]] = {}
    back: dict[int, tuple[int, Hop]] = {}
    tie = itertools.count()
    queue: list[tuple[int, int, int, int]] = []
    for node in (NOTHING, *starts):
        best[node] = (0, 0)
        queue.append((0, 0, next(tie), node))
    while queue:
        cost, hops, _, node = heapq.heappop(queue)
        if (cost, hops) > best[node] or node == goal:
            continue
        for hop in edges[node]:
            key = (cost + hop_cost(hop, cached), hops + 1)
            if allow(hop) and key < best.get(hop.version, (1 << 62, 0)):
                best[hop.version] = key
                back[hop.version] = (node, hop)
                heapq.heappush(queue, (key[0], key[1], next(tie), hop.version))
    if goal not in best:
        return None
    path: list[Hop] = []
    node = goal
    while node in back:
        node, hop = back[node]
        path.append(hop)
    return node, path[::-1]
