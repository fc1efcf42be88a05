"""How the ``wdelta.cli`` package sits in the code: the library never imports it, its
modules import one another without cycles and without private names, and every
module that adds commands is listed once in :data:`wdelta.cli.app.GROUPS`.

The import graph is read from the source with ``ast`` (imports inside functions
included, relative imports resolved), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import wdelta
from wdelta.cli import app

PACKAGE = Path(wdelta.__file__).resolve().parent
CLI = "wdelta.cli"
# Programs whose purpose is to run the command line: thin entry points, and a demo
# that drives `wdelta diff` and `wdelta apply` end to end.
ENTRY_POINTS = {"wdelta.__main__", "wdelta.conformance.__main__", "wdelta.testing.demo"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imported_by(name: str, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str | None]]:
    """(module, name imported from it or None) for each target of one import statement."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
        return
    if node.level:
        base = name.split(".") if _is_package(name) else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        # `from . import options` imports a module; `from .options import add_quiet` a name.
        yield (submodule, None) if submodule in MODULES else (source, alias.name)


def imports_of(name: str) -> list[tuple[str, str | None]]:
    """Every (module, name) that module ``name`` of the package imports, anywhere in it."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    return [
        target
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for target in imported_by(name, node)
        if target[0] == "wdelta" or target[0].startswith("wdelta.")
    ]


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (its nodes in order, the first repeated last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def _in_cli(name: str) -> bool:
    return name == CLI or name.startswith(CLI + ".")


def cli_graph() -> dict[str, set[str]]:
    """Which ``wdelta.cli`` modules each ``wdelta.cli`` module imports."""
    return {
        name: {module for module, _ in imports_of(name) if _in_cli(module) and module != name}
        for name in MODULES
        if _in_cli(name)
    }


def test_the_graph_is_read() -> None:
    """The resolution of relative imports finds edges known to exist."""
    graph = cli_graph()
    assert {"wdelta.cli.options", "wdelta.cli.signing"} <= graph["wdelta.cli.chain"]
    assert "wdelta.cli.app" in graph["wdelta.cli"]
    signatures = ("wdelta.chain.trust.signatures", "check_signatures")
    assert signatures in imports_of("wdelta.conformance.impl")


def test_find_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_no_import_cycle_in_the_cli() -> None:
    assert find_cycle(cli_graph()) is None


def test_library_code_does_not_import_the_cli() -> None:
    offenders = sorted(
        (name, module)
        for name in MODULES
        if not _in_cli(name) and name not in ENTRY_POINTS
        for module, _ in imports_of(name)
        if _in_cli(module)
    )
    assert offenders == []


def test_cli_modules_import_no_private_name_of_another() -> None:
    private = sorted(
        (name, f"{module}.{imported}")
        for name in MODULES
        if _in_cli(name)
        for module, imported in imports_of(name)
        if _in_cli(module) and imported is not None and imported.startswith("_")
    )
    assert private == []
    for name in MODULES:
        if _in_cli(name):
            tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
            aliases = {_bound_name(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            used = {
                f"{n.value.id}.{n.attr}"
                for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id in aliases and n.attr.startswith("_")
            }  # fmt: skip
            assert used == set(), name


def _bound_name(node: ast.ImportFrom) -> str | None:
    """The local name a `from . import module` binds (None for other imports)."""
    if node.level and node.module is None and len(node.names) == 1:
        return node.names[0].asname or node.names[0].name
    return None


def test_every_command_module_is_listed_once() -> None:
    """Modules with a register(commands) are exactly those GROUPS names, each once."""
    listed = [f"{CLI}.{m}" for group in app.GROUPS for m in group.modules]
    registering = {
        name
        for name in MODULES
        if _in_cli(name)
        and any(
            isinstance(n, ast.FunctionDef) and n.name == "register"
            for n in ast.parse(MODULES[name].read_text(encoding="utf-8")).body
        )
    }
    assert sorted(listed) == sorted(registering)
    assert len(set(listed)) == len(listed)
