"""Running cases: staging inputs, calling the implementation, judging, in parallel.

Each case runs in a fresh folder holding private copies of its inputs (so a
tool that writes into its inputs cannot damage the suite, and is caught);
``{out}`` is a path in that folder that does not exist yet.
"""

from __future__ import annotations

import fnmatch
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadArgumentError
from .impl import Implementation
from .judge import FAIL, NOT_TESTED, SKIPPED, SOFT, Verdict, judge, reference_output
from .manifest import Case, Manifest, sha256_file


@dataclass(frozen=True)
class Options:
    """How to run: ``timeout`` in seconds per case, ``jobs`` cases at a time.

    ``work_dir``: keep every case folder there; otherwise case folders are
    made under ``scratch`` (default: the system temporary folder) and removed.
    ``max_size_ratio``: fail an encoder's delta larger than this multiple of
    the reference encoder's (size is otherwise reported, never judged).
    """

    timeout: float = 60.0
    jobs: int = 1
    strict: bool = False
    fail_fast: bool = False
    work_dir: Path | None = None
    scratch: Path | None = None
    max_size_ratio: float | None = None


@dataclass(frozen=True)
class Result:
    """The outcome of one case: ``observed`` says what the implementation did."""

    case: Case
    status: str
    message: str
    observed: str
    command: str
    seconds: float


def of_version(manifest: Manifest, version: int | None) -> list[Case]:
    """The cases of suite version ``version`` (those that it, or an older one, introduced);
    every case for None.  A version above the manifest's, or below 1, is a bad argument."""
    newest = manifest.raw["manifest_version"]
    if version is None:
        return list(manifest.cases)
    if not 1 <= version <= newest:
        raise BadArgumentError(
            f"--suite-version {version}: this suite holds versions 1 to {newest}"
        )
    return [c for c in manifest.cases if c.since <= version]


def select(cases: Iterable[Case], patterns: Sequence[str]) -> list[Case]:
    """Cases whose id matches any glob pattern (all cases without patterns)."""
    if not patterns:
        return list(cases)
    return [c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def _stage(manifest: Manifest, case: Case, work: Path) -> dict[str, Path]:
    paths: dict[str, Path] = {}
    for role, item in case.inputs.items():
        src = manifest.root / item.path
        dest = work / "in" / role / src.name
        dest.parent.mkdir(parents=True)
        if item.is_folder:
            shutil.copytree(src, dest)
        else:
            shutil.copyfile(src, dest)
        paths[role] = dest
    if case.out is not None:
        paths["out"] = work / case.out
    return paths


def _modified_inputs(case: Case, paths: dict[str, Path]) -> list[str]:
    """The staged input files that no longer hash as the manifest says."""
    changed = []
    for role, item in case.inputs.items():
        for name, digest in item.files.items():
            path = paths[role] if name == "." else paths[role] / name
            if not path.is_file() or sha256_file(path) != digest:
                changed.append(f"{role}/{path.name}")
    return changed


def run_case(manifest: Manifest, case: Case, impl: Implementation, opts: Options,
             work: Path) -> Result:  # fmt: skip
    """Run one case in the empty folder ``work``."""
    paths = _stage(manifest, case, work)
    start = time.monotonic()
    outcome = impl.run(case.profile, paths, opts.timeout)
    seconds = time.monotonic() - start
    modified = _modified_inputs(case, paths)
    if modified:
        verdict = Verdict(FAIL, f"modified its input files {modified}")
    else:
        verdict = judge(case, outcome, paths,
                        lambda: reference_output(case, paths, work / "expected"),
                        opts.max_size_ratio)  # fmt: skip
    if opts.strict and verdict.status == SOFT:
        verdict = Verdict(FAIL, verdict.message + " (--strict)")
    return Result(case, verdict.status, verdict.message, outcome.describe(), outcome.command,
                  seconds)  # fmt: skip


def _folder_name(index: int, case: Case) -> str:
    return f"{index:04d}-" + case.id.replace("/", "__")


def run_all(
    manifest: Manifest, cases: Sequence[Case], impl: Implementation, opts: Options,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:  # fmt: skip
    """Every case's result, in the order of ``cases``."""
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="wdelta-conformance-", dir=opts.scratch) as tmp:
        root = opts.work_dir or Path(tmp)

        def one(index: int, case: Case) -> Result:
            if not impl.supports(case.profile):
                return Result(case, NOT_TESTED, f"no {case.profile} command given", "", "", 0.0)
            lacks = getattr(impl, "lacks", lambda p, r: None)(case.profile, case.inputs)
            if lacks is not None:
                return Result(case, NOT_TESTED, f"the template has no {lacks}", "", "", 0.0)
            if stop.is_set():
                return Result(case, SKIPPED, "not run after an earlier failure (--fail-fast)",
                              "", "", 0.0)  # fmt: skip
            work = root / _folder_name(index, case)
            work.mkdir(parents=True)
            try:
                result = run_case(manifest, case, impl, opts, work)
            finally:
                if opts.work_dir is None:
                    shutil.rmtree(work, ignore_errors=True)
            if result.status == FAIL and opts.fail_fast:
                stop.set()
            if on_result is not None:
                on_result(result)
            return result

        with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            futures = [pool.submit(one, i, c) for i, c in enumerate(cases)]
            return [f.result() for f in futures]
