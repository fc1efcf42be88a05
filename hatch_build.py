"""Build hook: compile wdelta's optional C kernels into the wheel where a C compiler exists.

The library (``reference/wdelta/codec/_kernels.c``) has no Python API and is loaded
with ctypes, so it needs no Python headers and serves every Python version.  Without
a compiler the wheel is the pure NumPy reference, which is complete on its own:
install goes on with a message, and ``wdelta --version`` names the backend in use.
``WDELTA_BUILD_NATIVE=0`` skips the compile.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from packaging.tags import sys_tags

SOURCE = "reference/wdelta/codec/_kernels.c"
LIBRARY = "_wdelta_kernels.so"  # the name wdelta/codec/native.py loads
FLAGS = ["-O3", "-std=c99", "-shared", "-fPIC", "-Wall"]
PORTABLE_ONLY = "-DWD_PORTABLE_ONLY"  # the kernels without their AVX-512 pass


def _say(message: str) -> None:
    print(f"wdelta build: {message}", file=sys.stderr, flush=True)


def compile_kernels(root: Path, out: Path) -> bool:
    """Compile the kernels to ``out``; False (with a message) where that fails.

    A compiler that refuses the AVX-512 pass (an old GCC or clang) gets a second try
    without it (``-DWD_PORTABLE_ONLY``): the portable passes give the same bytes.
    """
    compiler = shlex.split(os.environ.get("CC", "cc"))
    if shutil.which(compiler[0]) is None:
        _say(f"no C compiler ({compiler[0]}): installing the NumPy reference path only")
        return False
    failure = _compile([*compiler, *FLAGS, "-o", str(out), str(root / SOURCE)])
    if failure is None:
        _say(f"compiled the native kernels ({' '.join(compiler[:1] + FLAGS[:1])})")
        return True
    portable = _compile([*compiler, *FLAGS, PORTABLE_ONLY, "-o", str(out), str(root / SOURCE)])
    if portable is None:
        _say(f"compiling the AVX-512 pass failed ({failure}); compiled the portable kernels")
        return True
    _say(f"compiling the kernels failed: {portable}")
    _say("installing the NumPy reference path only")
    return False


def _compile(command: list[str]) -> str | None:
    """Run one compile; None if it succeeded, else why it failed (the end of stderr)."""
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if run.returncode == 0:
        return None
    return run.stderr.strip()[-2000:] or f"exit status {run.returncode}"


class KernelsHook(BuildHookInterface):  # type: ignore[type-arg]
    """Adds the compiled kernels to the wheel (to the source tree for editable installs)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("WDELTA_BUILD_NATIVE") == "0":
            return
        root = Path(self.root)
        if version == "editable":
            # An editable install imports the source tree: the library goes beside
            # native.py there (git ignores it).
            out = root / SOURCE.replace("_kernels.c", LIBRARY)
        else:
            self._tmp = tempfile.mkdtemp(prefix="wdelta-kernels-")
            out = Path(self._tmp) / LIBRARY
        if not compile_kernels(root, out):
            return
        build_data["pure_python"] = False
        # No Python API in the library: one wheel per platform serves every Python 3.
        build_data["tag"] = f"py3-none-{next(iter(sys_tags())).platform}"
        if version != "editable":
            build_data["force_include"][str(out)] = f"wdelta/codec/{LIBRARY}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
