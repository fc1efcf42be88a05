"""``wdelta conformance run`` (also ``python -m wdelta.conformance run``).

Without command templates the reference implementation runs in-process;
with templates only the profiles given are tested, the others are reported
as not tested.  Exit status: 0 when every tested case passed (soft failures
allowed unless ``--strict``), 1 on any failure, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

from ..conformance import report
from ..conformance.impl import Implementation, Reference, Templates
from ..conformance.manifest import PROFILES, default_vectors, load
from ..conformance.runner import Options, Result, of_version, run_all, select
from ..errors import BadArgumentError
from .options import Commands
from .terminal import printable

TEMPLATE_OPTIONS = (
    ("reader", "--reader", "'tool verify {delta}'"),
    ("decoder", "--decoder", "'tool apply {base} {delta} {out}'"),
    ("reverse", "--reverse-decoder", "'tool apply --reverse {target} {delta} {out}'"),
    ("encoder", "--encoder", "'tool diff {base} {target} {out}'"),
    ("manifest", "--manifest", "'tool check {manifest}'"),
    ("manifest-store", "--manifest-store", "'tool check {manifest} --store {store}'"),
    (
        "manifest-trust",
        "--manifest-trust",
        "'tool check {manifest} --store {store} --trust {trust}'",
    ),
    ("manifest-seen", "--manifest-seen", "'tool check {manifest} --after {seen}'"),
    (
        "manifest-state",
        "--manifest-state",
        "'tool check {manifest} --store {store} --state {state}'",
    ),
    (
        "manifest-trust-state",
        "--manifest-trust-state",
        "'tool check {manifest} --store {store} --trust {trust} --state {state}'",
    ),
)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``conformance run``."""
    for profile, flag, example in TEMPLATE_OPTIONS:
        # The manifest-* templates are command lines of the one manifest profile.
        what = "profile" if profile in PROFILES else "template of the manifest profile"
        p.add_argument(flag, dest=profile.replace("-", "_"), metavar="TEMPLATE",
                       help=f"command for the {profile} {what}, e.g. {example}")  # fmt: skip
    p.add_argument(
        "--vectors",
        type=Path,
        default=None,
        help="folder holding manifest.json (default: the installed suite)",
    )
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="GLOB",
        help="run only cases whose id matches (repeatable), e.g. 'decoder/*'",
    )
    p.add_argument(
        "--suite-version",
        type=int,
        metavar="N",
        help="judge against suite version N: run only the cases it (or an older one) "
        "introduced (default: every case of this suite)",
    )
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--strict", action="store_true", help="a wrong error category fails")
    p.add_argument("--fail-fast", action="store_true", help="stop after the first failure")
    p.add_argument("--jobs", "-j", type=int, default=1, help="cases run in parallel")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    p.add_argument(
        "--max-size-ratio",
        type=float,
        metavar="R",
        help="fail an encoder case whose delta exceeds R times the reference encoder's "
        "(default: size is reported, never failed)",
    )
    p.add_argument("--json-report", type=Path, metavar="FILE", help="write a JSON report")
    p.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML")
    p.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="keep every case's folder (inputs, outputs) under DIR",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="print every case's result")


def register(commands: Commands) -> None:
    """Add ``run`` to ``wdelta conformance``."""
    p = commands.add_parser("run", help="run the conformance suite against an implementation")
    _add_run_arguments(p)
    p.set_defaults(func=_cmd_run)


def _implementation(args: argparse.Namespace) -> tuple[Implementation, dict[str, Any]]:
    given = {p: getattr(args, p.replace("-", "_")) for p, _, _ in TEMPLATE_OPTIONS}
    templates = {p: t for p, t in given.items() if t}
    described: dict[str, Any] = {"templates": given}
    if not templates:
        return Reference(), {"kind": "reference", **described}
    return Templates(templates), {"kind": "templates", **described}


def _printer(verbose: bool) -> Any:
    lock = threading.Lock()

    def show(r: Result) -> None:
        if verbose:
            with lock:
                print(printable(f"{r.status:10} {r.case.id}  {r.message}"), flush=True)

    return show


def _cmd_run(args: argparse.Namespace) -> int:
    if args.jobs < 1 or args.timeout <= 0:
        raise BadArgumentError("--jobs must be >= 1 and --timeout > 0")
    if args.max_size_ratio is not None and not args.max_size_ratio > 0:
        raise BadArgumentError("--max-size-ratio must be > 0")
    manifest = load(args.vectors or default_vectors(), check_files=not args.list)
    cases = select(of_version(manifest, args.suite_version), args.filter)
    if not cases:
        raise BadArgumentError(f"no case matches {args.filter}")
    if args.list:
        for c in cases:
            print(f"{c.id}\t{c.profile}\t{c.section}\t{c.expected}")
        return 0
    for destination in (args.json_report, args.junit):
        if destination is not None:
            report.check_destination(destination, manifest.root)
    impl, described = _implementation(args)
    opts = Options(args.timeout, args.jobs, args.strict, args.fail_fast, args.work_dir,
                   max_size_ratio=args.max_size_ratio)  # fmt: skip
    results = run_all(manifest, cases, impl, opts, _printer(args.verbose))
    judged = args.suite_version or manifest.raw["manifest_version"]
    sys.stdout.write(report.text(results, impl.name, manifest, judged))
    if args.json_report is not None:
        data = report.json_bytes(
            report.to_json(results, manifest, described, opts, args.filter, judged)
        )
        report.write_report(args.json_report, data, manifest.root)
    if args.junit is not None:
        report.write_report(args.junit, report.junit_bytes(results), manifest.root)
    return 0 if report.passed(results) else 1
