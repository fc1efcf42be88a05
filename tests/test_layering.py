"""The normative modules (``wdelta.codec``, ``wdelta.format``) import nothing from the
encoder's policy or the layers built on them: a reader of the format needs none of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "reference" / "wdelta"
NORMATIVE = ("codec", "format")
FORBIDDEN = ("wdelta.policy", "wdelta.ops", "wdelta.chain", "wdelta.cli")


def module_name(path: Path) -> str:
    """The dotted name of a module file under the package (``__init__`` names its package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules (and imported names) that ``source`` imports."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def violations(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def normative_modules() -> list[Path]:
    return sorted(p for folder in NORMATIVE for p in (PACKAGE / folder).rglob("*.py"))


def test_there_are_normative_modules() -> None:
    assert {module_name(p) for p in normative_modules()} >= {
        "wdelta.codec", "wdelta.codec.chunk", "wdelta.codec.sparse", "wdelta.format.header",
    }  # fmt: skip


def module_violations(path: Path) -> list[str]:
    """The forbidden names ``path`` imports."""
    module = module_name(path)
    return violations(imported(path.read_text(encoding="utf-8"), module, path.stem == "__init__"))


@pytest.mark.parametrize("path", normative_modules(), ids=lambda p: module_name(p))
def test_normative_module_imports_no_policy_or_upper_layer(path: Path) -> None:
    assert not module_violations(path), f"{module_name(path)} imports {module_violations(path)}"


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("from ..policy import chunk", "wdelta.codec.sparse", False),
        ("from ..policy.rice import best_rice_k", "wdelta.codec.sparse", False),
        ("from .. import ops", "wdelta.format.header", False),
        ("from ..chain import local", "wdelta.format", True),
        ("import wdelta.cli.delta", "wdelta.codec.blob", False),
        ("def f() -> None:\n    from wdelta.policy import values", "wdelta.codec.chunk", False),
    ],
)
def test_a_forbidden_import_is_found(source: str, module: str, is_package: bool) -> None:
    assert violations(imported(source, module, is_package))


def test_allowed_imports_are_not_flagged() -> None:
    source = "from ..errors import EncodingInvalidError\nfrom . import leb128\nimport numpy"
    assert not violations(imported(source, "wdelta.codec.sparse", False))
