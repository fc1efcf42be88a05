"""Commands killed part-way lose nothing and leave nothing behind.

``diff``, ``apply``, ``chain append`` and ``chain pull`` run as real CLI
processes and get SIGTERM or SIGKILL after a delay: 2 before the command's
first temporary file appears and 5 spread over its writing phase, as timed
on an uninterrupted run on this machine.  Then: the inputs are
byte-identical; the output is absent or complete and correct (a chain is
valid, at the old or the new head); after SIGTERM the process exited with
128 + 15 and ``error: interrupted (SIGTERM)`` and left no temporary; after
SIGKILL the next run, which finishes the job, leaves no stale temporary.
The default suite runs 2 points (diff, apply) on small inputs; the slow suite
(``pytest -m slow tests/test_kill.py``) runs 4 commands x 2 signals x 7
delays = 56 points on 32 MB checkpoints.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kit import RawTensor, safetensors_bytes, sha256, tree_hashes
from test_cli import ENV, WDELTA, assert_ok, run
from wdelta.chain import Chain, open_storage

TENSORS = 8
MARK = ".wdelta-tmp-"


@dataclass
class Work:
    """Checkpoints s0, s1, s2, the delta s0 -> s1 and chains in ``root``."""

    root: Path
    # Per command: seconds until a temporary first and last existed in a run.
    seconds: dict[str, tuple[float, float]]

    def s(self, i: int) -> Path:
        return self.root / f"s{i}.safetensors"


def _make_work(root: Path, elements: int, names: list[str], tensors: int = TENSORS) -> Work:
    """Inputs for the commands ``names`` (chains only if needed), each one calibrated."""
    rng = np.random.default_rng(0)
    words = {f"w{i}": rng.integers(0, 1 << 16, elements, dtype=np.uint16) for i in range(tensors)}
    w = Work(root, {})
    for step in range(3):
        raw = {k: RawTensor("BF16", (elements,), v.tobytes()) for k, v in words.items()}
        w.s(step).write_bytes(safetensors_bytes(raw))
        for v in words.values():
            v[rng.random(elements) < 0.05] ^= 1
    assert_ok(run("diff", w.s(0), w.s(1), "-o", root / "d01.wdelta", "-q"))
    if {"append", "pull"} & set(names):
        assert_ok(run("chain", "init", root / "chain01", w.s(0), "-q"))
        assert_ok(run("chain", "append", root / "chain01", w.s(1), "--base", w.s(0), "-q"))
        shutil.copytree(root / "chain01", root / "chain012")
        assert_ok(run("chain", "append", root / "chain012", w.s(2), "--base", w.s(1), "-q"))
    for name in names:
        w.seconds[name] = _calibrate(COMMANDS[name](w, Path(root / f"calibrate-{name}")))
    return w


def _calibrate(case: Case) -> tuple[float, float]:
    """When, in an uninterrupted run, a temporary first and last exists (the writing
    phase; the run's end if none was seen)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(WDELTA), *map(str, case.argv), "-q"], env=_env(case.folder),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    seen = []
    while proc.poll() is None:
        if temporaries(case.folder):
            seen.append(time.monotonic() - start)
        time.sleep(0.002)
    assert proc.returncode == 0
    case.check_done()
    end = time.monotonic() - start
    return (seen[0], seen[-1]) if seen else (end, end)


def delay(w: Work, name: str, point: float) -> tuple[bool, float]:
    """When to kill: ``point`` in [0, 1) is that fraction of the time before the first
    temporary, counted from the start; in [1, 2), that fraction of the writing phase
    (while temporaries exist), counted from the first temporary's appearance (start-up
    time varies by more than the writing phase lasts).  (after_temporary, seconds)."""
    first, last = w.seconds[name]
    return (False, first * point) if point < 1 else (True, (last - first) * (point - 1))


def _env(folder: Path) -> dict[str, str]:
    # Temporaries of the chain commands' scratch folders land in TMPDIR: keep them visible.
    return {**ENV, "TMPDIR": str(folder)}


def _run(argv: list[object], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WDELTA), *map(str, argv), "-q"], capture_output=True, text=True,
        env=_env(folder), timeout=300,
    )  # fmt: skip


@dataclass
class Case:
    """One command in its own folder: what to run, its inputs, how to judge the output."""

    folder: Path
    argv: list[object]
    inputs: list[Path]
    # Raises unless the output is absent or complete; True if complete.
    check_output: Callable[[], bool]

    def check_done(self) -> None:
        assert self.check_output(), "the output is missing"


def _file_case(folder: Path, argv: list[object], inputs: list[Path], want: str) -> Case:
    out = Path(str(argv[argv.index("-o") + 1]))

    def check() -> bool:
        if not out.exists():
            return False
        assert sha256(out) == want
        return True

    return Case(folder, argv, inputs, check)


def _diff(w: Work, folder: Path) -> Case:
    folder.mkdir(parents=True)
    argv: list[object] = ["diff", w.s(0), w.s(1), "-o", folder / "d.wdelta"]
    return _file_case(folder, argv, [w.s(0), w.s(1)], sha256(w.root / "d01.wdelta"))


def _apply(w: Work, folder: Path) -> Case:
    folder.mkdir(parents=True)
    argv: list[object] = ["apply", w.s(0), w.root / "d01.wdelta", "-o", folder / "r.safetensors"]
    return _file_case(folder, argv, [w.s(0), w.root / "d01.wdelta"], sha256(w.s(1)))


def _append(w: Work, folder: Path) -> Case:
    folder.mkdir(parents=True)
    chain = folder / "chain"
    shutil.copytree(w.root / "chain01", chain)
    want = Chain(open_storage(str(w.root / "chain012"))).head().head.digest

    def check() -> bool:
        m = Chain(open_storage(str(chain))).head()
        assert len(m.versions) in (2, 3)
        assert run("chain", "verify", chain, "-q").returncode == 0
        return m.head.digest == want

    argv: list[object] = ["chain", "append", chain, w.s(2), "--base", w.s(1)]
    return Case(folder, argv, [w.s(1), w.s(2)], check)


def _pull(w: Work, folder: Path) -> Case:
    (folder / "node").mkdir(parents=True)
    local = folder / "node" / "m.safetensors"
    shutil.copyfile(w.s(0), local)
    old, new = sha256(w.s(0)), sha256(w.s(2))

    def check() -> bool:
        got = sha256(local)
        assert got in (old, new)
        return got == new

    argv: list[object] = ["chain", "pull", w.root / "chain012", local]
    return Case(folder, argv, [w.root / "chain012"], check)


COMMANDS: dict[str, Callable[[Work, Path], Case]] = {
    "diff": _diff, "apply": _apply, "append": _append, "pull": _pull,
}  # fmt: skip


def temporaries(folder: Path) -> list[Path]:
    # os.walk, not rglob: the command under test removes its temporary folders while
    # we look, and rglob raises FileNotFoundError for a folder that vanished mid-walk.
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        found += [Path(root, name) for name in dirs + files if MARK in name]
    return found


def _killed(
    case: Case, sig: signal.Signals, when: tuple[bool, float]
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [str(WDELTA), *map(str, case.argv), "-q"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=_env(case.folder),
    )  # fmt: skip
    after_temporary, seconds = when
    while after_temporary and proc.poll() is None and not temporaries(case.folder):
        time.sleep(0.002)
    time.sleep(seconds)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _again(name: str, case: Case) -> list[object]:
    """A command that goes over the same folders once the job is done."""
    if name == "append":
        return ["chain", "verify", case.folder / "chain"]
    return case.argv if name == "pull" else [*case.argv, "--force"]


def kill_point(w: Work, tmp: Path, name: str, sig: signal.Signals, point: float) -> bool:
    """Run one kill point (see :func:`delay`); True if the kill left a temporary."""
    case = COMMANDS[name](w, tmp / "case")
    before = [tree_hashes(p) for p in case.inputs]
    result = _killed(case, sig, delay(w, name, point))
    assert [tree_hashes(p) for p in case.inputs] == before
    case.check_output()
    left = temporaries(case.folder)
    if sig == signal.SIGTERM:
        # Killed before the handler was installed (-15), interrupted (143) or finished (0).
        assert result.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), result.stderr
        if result.returncode == 128 + signal.SIGTERM:
            assert result.stderr.splitlines() == ["error: interrupted (SIGTERM)"]
            assert left == []
    else:
        assert result.returncode in (0, -signal.SIGKILL), result.stderr
    if not case.check_output():
        assert_ok(_run(case.argv, case.folder))  # the rerun finishes the job ...
    elif left:
        assert_ok(_run(_again(name, case), case.folder))
    case.check_done()
    assert temporaries(case.folder) == []  # ... and removes what the kill left
    assert [tree_hashes(p) for p in case.inputs] == before
    return bool(left)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Work:
    return _make_work(tmp_path_factory.mktemp("kill-small"), 1 << 19, ["diff", "apply"])


@pytest.mark.parametrize(("name", "sig"), [("diff", signal.SIGTERM), ("apply", signal.SIGKILL)])
def test_kill_midway(small: Work, tmp_path: Path, name: str, sig: signal.Signals) -> None:
    kill_point(small, tmp_path, name, sig, 1.5)


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Work:
    """3,000 tensors of 2,048 elements: chunks this small are decoded and encoded by the
    main thread (pipeline.runs_locally), where the signal lands, not on the pool."""
    return _make_work(tmp_path_factory.mktemp("kill-many"), 1 << 11, ["diff", "apply"], 3000)


@pytest.mark.parametrize("name", ["diff", "apply"])
def test_terminated_midway_on_many_small_tensors(many: Work, tmp_path: Path, name: str) -> None:
    """SIGTERM a quarter into the writing phase interrupts the command (exit 143, one
    line), leaves no temporary and no output, and a rerun does the job."""
    case = COMMANDS[name](many, tmp_path / "case")
    before = [tree_hashes(p) for p in case.inputs]
    result = _killed(case, signal.SIGTERM, delay(many, name, 1.25))
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert result.stderr.splitlines() == ["error: interrupted (SIGTERM)"]
    assert temporaries(case.folder) == [] and not case.check_output()
    assert [tree_hashes(p) for p in case.inputs] == before
    assert_ok(_run(case.argv, case.folder))
    case.check_done()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Work:
    return _make_work(tmp_path_factory.mktemp("kill-big"), 1 << 21, list(COMMANDS))


# 2 points before the first temporary, 5 spread over the writing phase.
POINTS = [1 / 3, 2 / 3, *(1 + (i + 0.5) / 5 for i in range(5))]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_kill_points(big: Work, tmp_path: Path, name: str, sig: signal.Signals) -> None:
    left = 0
    for i, point in enumerate(POINTS):
        left += kill_point(big, tmp_path / str(i), name, sig, point)
    if sig == signal.SIGKILL and name != "append":
        assert left > 0, "no kill point hit a temporary: the delays miss the writing phase"
