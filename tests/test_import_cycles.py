"""The modules of ``reference/wdelta`` import one another without a cycle: each can be
read, and loaded, after the modules it imports.  Imports made only for type checking
and inside functions count too (read from the source with ``ast``), so neither a lazy
import nor an ``if TYPE_CHECKING:`` block can hide one.  And the manifest's reachability rule,
moved out of ``graph`` to break a cycle, agrees with ``graph``'s download plans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from test_cli_structure import MODULES, find_cycle, imports_of
from wdelta.chain.graph import cheapest_path
from wdelta.chain.manifest import Link, Manifest, Snapshot, Version, unreachable_versions


def package_graph() -> dict[str, set[str]]:
    """Which modules of the package each of its modules imports (an ``__init__``
    stands for its package)."""
    return {
        name: {module for module, _ in imports_of(name) if module in MODULES and module != name}
        for name in MODULES
    }


def test_the_package_graph_is_read() -> None:
    graph = package_graph()
    assert "wdelta.chain.manifest" in graph["wdelta.chain.graph"]  # under TYPE_CHECKING
    assert "wdelta.chain.storage.transfer" in graph["wdelta.chain.storage.base"]
    assert len(graph) == len(MODULES) > 100


def test_no_import_cycle_in_the_package() -> None:
    assert find_cycle(package_graph()) is None


# The manifest rule "every version is reachable from a snapshot" was moved out of
# ``graph`` to break its cycle with ``manifest``: it must still agree with the plans.
@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 7),
    snapshots=st.sets(st.integers(0, 6), max_size=3),
    links=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.booleans()), max_size=10),
)
def test_unreachable_versions_agree_with_the_planner(
    count: int, snapshots: set[int], links: list[tuple[int, int, bool]]
) -> None:
    versions = tuple(Version(n, f"{n:064x}", None) for n in range(count))
    m = Manifest(
        1, None, versions,
        tuple(Snapshot(n, ()) for n in sorted(snapshots) if n < count),
        tuple(Link(a, b, f"{i:064x}", 1, rev) for i, (a, b, rev) in enumerate(links)
              if a < b < count),
    )  # fmt: skip
    planned = {v.number for v in versions if cheapest_path(m, [], v.number, bool) is None}
    assert unreachable_versions(m) == sorted(planned)
