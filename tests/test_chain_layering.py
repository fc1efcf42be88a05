"""The subpackages of ``wdelta.chain`` depend downwards only: storage, then the manifest
model, then trust, then the store (``Chain`` and its cache locks), then reading, writing
and live weights.  A module imports modules of its own layer or of a layer below it,
never one above: the manifest model knows no trust, trust knows no store, a reader knows
no writer.  ``errors`` sits beneath them all; ``chain/__init__`` re-exports from all.
Imports inside functions and under ``TYPE_CHECKING`` count (read with ``ast``)."""

from __future__ import annotations

import ast

import pytest

from test_cli_structure import MODULES, imported_by

CHAIN = "wdelta.chain"
# Each layer may import itself and the layers before it.
LAYERS = ("errors", "storage", "model", "trust", "store", "reading", "writing", "live")
TOP_LEVEL = {"errors": "errors", "store": "store", "cachelock": "store"}
CHAIN_MODULES = sorted(m for m in MODULES if m.startswith(CHAIN + ".") and m != CHAIN)


def layer(module: str) -> int:
    """The layer of a module of the chain (its subpackage, or the entry of a top-level one)."""
    first = module[len(CHAIN) + 1 :].split(".")[0]
    return LAYERS.index(TOP_LEVEL.get(first, first))


def upward_imports(module: str, source: str | None = None) -> list[str]:
    """The chain modules that ``module`` (or ``source`` read as it) imports from a layer above."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8") if source is None else source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target, _ in imported_by(module, node):
                inside = target.startswith(CHAIN + ".") and target in MODULES
                if inside and layer(target) > layer(module):
                    found.append(target)
    return found


def test_every_chain_module_has_a_layer() -> None:
    assert {m.split(".")[2] for m in CHAIN_MODULES} == {
        "errors", "store", "cachelock", "storage", "model", "trust", "reading", "writing", "live",
    }  # fmt: skip
    for module in CHAIN_MODULES:
        assert layer(module) >= 0


def test_chain_keeps_few_modules_at_its_top_level() -> None:
    top = {m for m in CHAIN_MODULES if m.count(".") == 2 and MODULES[m].name != "__init__.py"}
    assert len(top) + 1 <= 8, sorted(top)  # + chain/__init__.py


@pytest.mark.parametrize("module", CHAIN_MODULES)
def test_chain_module_imports_no_layer_above_it(module: str) -> None:
    assert upward_imports(module) == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("wdelta.chain.model.manifest", "from ..trust.updater import Trust"),
        ("wdelta.chain.trust.updater", "from ..store import Chain"),
        ("wdelta.chain.reading.pull", "from ..writing import append"),
        ("wdelta.chain.storage.base", "def f() -> None:\n    from ..model import graph"),
        ("wdelta.chain.store", "import wdelta.chain.live.weights"),
        ("wdelta.chain.errors", "from .storage import base"),
    ],
)
def test_an_upward_import_is_found(module: str, source: str) -> None:
    assert upward_imports(module, source)


def test_downward_imports_are_allowed() -> None:
    source = "from ..reading.pull import pull\nfrom ..store import Chain\nfrom ..errors import X"
    assert upward_imports("wdelta.chain.live.weights", source) == []
