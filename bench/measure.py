"""Timed operations for the benchmark: the wdelta CLI in a child process, zstd, file copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import zstandard

from wdelta.format.digest import file_sha256

# The real CLI entry point, run by the same interpreter (and so the same install).
CLI = [sys.executable, "-c", "from wdelta.cli import main; main()"]

# An installed wdelta runs from the bytecode pip compiled.  A source tree on
# PYTHONPATH under PYTHONDONTWRITEBYTECODE would be compiled afresh by every
# child (~40 ms of each run here), so children keep bytecode in a cache of
# the bench's own (see warm_up).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {
    "PYTHONPYCACHEPREFIX": str(Path(__file__).resolve().parent / "out" / "pycache")
}

# Linux carries a process's peak RSS across fork and exec, so a child forked
# straight from this (large) process would report at least our own RSS.  A
# small helper forks the CLI instead and reports the grandchild's wait4 usage:
# its floor is the helper's few MiB.
_HELPER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss} {seconds!r}")
"""


@dataclass(frozen=True)
class ChildRun:
    """Wall-clock seconds and peak resident set size (bytes) of one child process."""

    seconds: float
    max_rss: int


def run_cli(args: list[str]) -> ChildRun:
    """Run ``wdelta ARGS`` in a grandchild; time and ru_maxrss come from the helper's wait4."""
    with tempfile.TemporaryDirectory() as tmp:
        result, err = Path(tmp) / "result", Path(tmp) / "stderr"
        with open(err, "wb") as err_file:
            subprocess.run(
                [sys.executable, "-S", "-c", _HELPER, str(result), *CLI, *args],
                stdout=subprocess.DEVNULL, stderr=err_file, check=True, env=CHILD_ENV,
            )  # fmt: skip
        status, rss_kib, seconds = result.read_text().split()
        if int(status) != 0:
            message = err.read_text(errors="replace").strip()
            raise RuntimeError(f"wdelta {' '.join(args)} failed ({status}): {message}")
    return ChildRun(float(seconds), int(rss_kib) * 1024)  # Linux reports KiB


def warm_up() -> None:
    """Fill the children's bytecode cache: every wdelta module and its imports."""
    code = "import wdelta.cli, wdelta.io.malloc_tuning, wdelta.policy.chunk"
    subprocess.run([sys.executable, "-c", code], check=True, env=CHILD_ENV)


def helper_floor() -> ChildRun:
    """The same measurement of a bare ``python -c pass``: the floor of every RSS figure."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result"
        subprocess.run([sys.executable, "-S", "-c", _HELPER, str(result), sys.executable,
                        "-c", "pass"], check=True, env=CHILD_ENV)  # fmt: skip
        _, rss_kib, seconds = result.read_text().split()
    return ChildRun(float(seconds), int(rss_kib) * 1024)


class _Counter:
    """A write-only sink that only counts bytes."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)


@dataclass(frozen=True)
class Compressed:
    """Compressed size in bytes of ``input_bytes`` and the seconds it took."""

    input_bytes: int
    output_bytes: int
    seconds: float


def zstd_file(path: Path, level: int, threads: int) -> Compressed:
    """Stream ``path`` through python-zstandard (threads 0 = single-threaded)."""
    cctx = zstandard.ZstdCompressor(level=level, threads=threads)
    sink = _Counter()
    start = time.perf_counter()
    with open(path, "rb") as f:
        read, _ = cctx.copy_stream(f, cast(IO[bytes], sink), read_size=1 << 22, write_size=1 << 22)
    return Compressed(read, sink.count, time.perf_counter() - start)


def zstd_bytes(data: bytes, level: int) -> Compressed:
    """One single-threaded zstd frame of ``data``."""
    start = time.perf_counter()
    out = zstandard.ZstdCompressor(level=level).compress(data)
    return Compressed(len(data), len(out), time.perf_counter() - start)


@dataclass(frozen=True)
class Copy:
    """``shutil.copyfile`` then fsync of the copy (apply fsyncs its output too)."""

    bytes: int
    copy_seconds: float
    fsync_seconds: float

    @property
    def seconds(self) -> float:
        return self.copy_seconds + self.fsync_seconds


def copy_file(src: Path, dst: Path) -> Copy:
    """Copy ``src`` to ``dst`` (removed afterwards), timing copy and fsync apart."""
    start = time.perf_counter()
    shutil.copyfile(src, dst)
    copied = time.perf_counter()
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    done = time.perf_counter()
    size = dst.stat().st_size
    dst.unlink()
    return Copy(size, copied - start, done - copied)


sha256 = file_sha256
