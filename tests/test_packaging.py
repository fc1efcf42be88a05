"""Packaging (issue 12, finding 9): the licence file, project URLs, usage and versions.

``wdelta`` run without a command prints the usage summary on stderr and exits
2 (like git); ``--version`` names the package and every format version.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import wdelta
from test_cli import ENV, run
from wdelta.chain.model.manifest import MANIFEST_VERSION
from wdelta.codec import native
from wdelta.format.header import FORMAT_VERSION

ROOT = Path(__file__).resolve().parent.parent


def test_license_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 150


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_pyproject_declares_license_file_and_urls() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert set(project["urls"]) == {"Homepage", "Documentation", "Source", "Issues"}
    assert all(url.startswith("https://") for url in project["urls"].values())


def test_version_names_package_and_format_versions() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stderr == ""
    manifest = json.loads((ROOT / "conformance" / "manifest.json").read_text(encoding="utf-8"))
    assert result.stdout == (
        f"wdelta {wdelta.__version__} (format v{manifest['format_version']}, "
        f"chain manifest v{MANIFEST_VERSION}, "
        f"conformance suite v{manifest['manifest_version']}, backend {native.backend()})\n"
    )
    assert manifest["format_version"] == FORMAT_VERSION


@pytest.mark.parametrize(
    ("words", "commands"),
    [
        ((), ["diff", "apply", "inspect", "verify", "chain", "conformance"]),
        (("chain",), ["init", "append", "pull", "log"]),
        (("conformance",), ["run"]),
    ],
)
def test_no_command_prints_usage(words: tuple[str, ...], commands: list[str]) -> None:
    result = run(*words)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"usage: {' '.join(('wdelta', *words))} ")
    assert all(re.search(rf"^\s+{c}\s", result.stderr, re.M) for c in commands), result.stderr
    assert "Traceback" not in result.stderr and "error:" not in result.stderr


def test_an_option_without_a_command_is_one_error_line() -> None:
    result = run("--quiet")
    assert result.returncode == 2
    assert re.fullmatch(r"error: bad-argument: [^\n]+\n", result.stderr)


# Import names of the optional dependencies whose distribution name differs.
_MODULE_OF = {"pytest-xdist": "xdist"}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_demo_needs_only_the_runtime_dependencies(tmp_path: Path) -> None:
    """``./scripts/demo`` installs the package without extras: the demo must run with
    every optional dependency (torch, the test and bench tools) unimportable."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {
        re.split(r"[\[<>=]", requirement)[0]
        for extra in project["optional-dependencies"].values()
        for requirement in extra
    }
    blocked = sorted(_MODULE_OF.get(n, n.replace("-", "_")) for n in names)
    assert "torch" in blocked and "pytest" in blocked
    code = (
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({blocked!r}))\n"  # None: ImportError on import
        "from wdelta.testing.demo import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "--elements", "300000", "--dir", str(tmp_path)],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"rebuilt == target \(sha256\) +yes", result.stdout), result.stdout
