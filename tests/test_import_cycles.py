"""The modules of ``reference/wdelta`` import one another without a cycle: each can be
read, and loaded, after the modules it imports.  Imports made only for type checking
and inside functions count too (read from the source with ``ast``), so neither a lazy
import nor an ``if TYPE_CHECKING:`` block can hide one.  And the manifest's reachability rule,
moved out of ``graph`` to break a cycle, agrees with ``graph``'s download plans.  No module
uses another module's underscore names, by import (``from .live import _digests``) or by
attribute (``live._digests``): what a module shares has a public, documented name."""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from test_cli_structure import MODULES, find_cycle, imported_by, imports_of
from wdelta.chain.model.graph import cheapest_path
from wdelta.chain.model.manifest import Link, Manifest, Snapshot, Version, unreachable_versions


def package_graph() -> dict[str, set[str]]:
    """Which modules of the package each of its modules imports (an ``__init__``
    stands for its package)."""
    return {
        name: {module for module, _ in imports_of(name) if module in MODULES and module != name}
        for name in MODULES
    }


def test_the_package_graph_is_read() -> None:
    graph = package_graph()
    assert "wdelta.chain.model.manifest" in graph["wdelta.chain.model.graph"]  # under TYPE_CHECKING
    assert "wdelta.chain.storage.transfer" in graph["wdelta.chain.storage.base"]
    assert len(graph) == len(MODULES) > 100


def test_no_import_cycle_in_the_package() -> None:
    assert find_cycle(package_graph()) is None


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(name: str, source: str | None = None) -> list[str]:
    """Underscore names of other modules that module ``name`` (or ``source`` read as it)
    imports or reads as an attribute of a module it imported."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8") if source is None else source)
    found: list[str] = []
    modules: set[str] = set()  # local names bound to modules of the package
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias, (module, imported) in zip(node.names, imported_by(name, node), strict=True):
                if not module.startswith("wdelta"):
                    continue
                if imported is not None and is_private(imported):
                    found.append(f"{module}.{imported}")
                elif imported is None:
                    modules.add(alias.asname or alias.name.partition(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and is_private(node.attr)
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    uses = {name: private_uses(name) for name in MODULES}
    assert {name: found for name, found in uses.items() if found} == {}


def test_a_private_use_is_found() -> None:
    move = "wdelta.chain.live.move"
    found = private_uses(move, "from .weights import _digests")
    assert found == ["wdelta.chain.live.weights._digests"]
    assert private_uses(move, "from . import weights\nweights._start()") == ["weights._start"]
    assert private_uses(move, "from .weights import load\nself._x = load._y") == []
    assert private_uses(move, "from .._version import __version__") == []
    assert not is_private("__version__") and not is_private("digests")


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
