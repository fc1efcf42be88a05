"""The build hook (hatch_build.py) compiles the kernels, or falls back with a message.

The hook's module imports hatchling, which only the isolated build environment has:
the tests give it a stand-in base class and call its compile step directly, with
compilers that are missing, that fail, and that refuse only the AVX-512 pass.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def hook() -> Any:
    interface = types.ModuleType("hatchling.builders.hooks.plugin.interface")
    interface.BuildHookInterface = type("BuildHookInterface", (), {})  # type: ignore[attr-defined]
    names = ["hatchling", "hatchling.builders", "hatchling.builders.hooks",
             "hatchling.builders.hooks.plugin"]  # fmt: skip
    saved = {n: sys.modules.get(n) for n in [*names, interface.__name__]}
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[interface.__name__] = interface
    try:
        spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def _compiler(tmp_path: Path, body: str) -> str:
    """A stand-in compiler: a shell script running ``body`` with the arguments in $@."""
    script = tmp_path / "cc"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_no_compiler_installs_the_numpy_path(
    hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert not hook.compile_kernels(ROOT, tmp_path / "k.so")
    assert "no C compiler" in capsys.readouterr().err
    assert not (tmp_path / "k.so").exists()


def test_a_failing_compiler_installs_the_numpy_path(
    hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", _compiler(tmp_path, 'echo "cc: internal error" >&2; exit 1'))
    assert not hook.compile_kernels(ROOT, tmp_path / "k.so")
    err = capsys.readouterr().err
    assert "cc: internal error" in err and "NumPy reference path only" in err


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_a_compiler_refusing_avx512_builds_the_portable_kernels(
    hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Fails unless asked for the portable passes only, as an old GCC would on the
    # AVX-512 intrinsics; the library it then builds has no vector pass.
    body = 'case " $* " in *" -DWD_PORTABLE_ONLY "*) exec cc "$@";; esac\n'
    body += 'echo "unknown intrinsic _mm512_maskz_compress_epi16" >&2; exit 1'
    monkeypatch.setenv("CC", _compiler(tmp_path, body))
    out = tmp_path / "k.so"
    assert hook.compile_kernels(ROOT, out)
    assert "compiled the portable kernels" in capsys.readouterr().err
    assert ctypes.CDLL(str(out)).wd_simd() == 0


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_the_full_build_has_the_vector_pass_where_the_cpu_does(
    hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "cc")
    out = tmp_path / "k.so"
    assert hook.compile_kernels(ROOT, out)
    flags = Path("/proc/cpuinfo").read_text() if os.path.exists("/proc/cpuinfo") else ""
    has = all(f" {f}" in flags for f in ("avx512f", "avx512bw", "avx512_vbmi2"))
    assert ctypes.CDLL(str(out)).wd_simd() == int(has and sys.platform == "linux")
