"""Reports: a text summary by profile and SPEC section, JSON (schema'd) and JUnit XML."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..io.atomic import atomic_file
from ..io.destination import check_output
from ..io.output_file import pwrite_all
from .judge import FAIL, NOT_TESTED, PASS, SKIPPED, SOFT
from .manifest import PROFILES, Manifest
from .runner import Options, Result

STATUSES = (PASS, FAIL, SOFT, NOT_TESTED, SKIPPED)
REPORT_VERSION = 1


def counts(results: Iterable[Result]) -> dict[str, int]:
    """Number of results per status, plus ``total``."""
    out = dict.fromkeys(STATUSES, 0)
    for r in results:
        out[r.status] += 1
    out["total"] = sum(out.values())
    return out


def _section_key(section: str) -> tuple[int, ...]:
    return tuple(int(p) for p in section.lstrip("§").split(".") if p.isdigit())


def by_profile(results: Sequence[Result]) -> dict[str, dict[str, int]]:
    return {p: counts(r for r in results if r.case.profile == p) for p in PROFILES}


def by_section(results: Sequence[Result]) -> dict[str, dict[str, int]]:
    sections = sorted({r.case.section for r in results}, key=_section_key)
    return {s: counts(r for r in results if r.case.section == s) for s in sections}


def passed(results: Sequence[Result]) -> bool:
    """True when nothing failed and at least one case was tested."""
    c = counts(results)
    return c[FAIL] == 0 and c[PASS] + c[SOFT] > 0


def _table(title: str, rows: dict[str, dict[str, int]]) -> list[str]:
    head = f"{title:10} {'pass':>6} {'fail':>6} {'soft':>6} {'not tested':>11} {'skipped':>8}"
    head += f" {'total':>6}"
    lines = [head, "-" * len(head)]
    for name, c in rows.items():
        if c["total"] == 0:
            continue
        tested = "" if c[NOT_TESTED] < c["total"] else "  (not tested)"
        lines.append(f"{name:10} {c[PASS]:6} {c[FAIL]:6} {c[SOFT]:6} {c[NOT_TESTED]:11} "
                     f"{c[SKIPPED]:8} {c['total']:6}{tested}")  # fmt: skip
    return lines


def text(results: Sequence[Result], impl_name: str, manifest: Manifest,
         judged: int | None = None) -> str:  # fmt: skip
    """The human summary: each failure with its rule and command, then the tables;
    ``judged``: the suite version whose cases were run (default: the manifest's)."""
    newest = manifest.raw["manifest_version"]
    older = f", judged against suite v{judged}'s cases" if judged and judged != newest else ""
    lines = [f"wdelta conformance suite v{newest}{older} "
             f"(format v{manifest.raw['format_version']}), {len(results)} cases, "
             f"implementation: {impl_name}", ""]  # fmt: skip
    for r in results:
        if r.status in (FAIL, SOFT):
            label = "FAIL" if r.status == FAIL else "SOFT"
            lines += [f"{label} {r.case.id}  [{r.case.section}] expected {r.case.expected}",
                      f"     {r.message}", f"     rule: {r.case.rule}",
                      f"     case: {r.case.description}", f"     command: {r.command}"]  # fmt: skip
    lines += ["", *_table("profile", by_profile(results)), ""]
    lines += [*_table("section", by_section(results)), ""]
    c = counts(results)
    verdict = "PASS" if passed(results) else "FAIL"
    lines.append(f"result: {verdict} ({c[PASS]} passed, {c[FAIL]} failed, {c[SOFT]} soft "
                 f"failures, {c[NOT_TESTED]} not tested, {c[SKIPPED]} skipped)")  # fmt: skip
    return "\n".join(lines) + "\n"


def to_json(results: Sequence[Result], manifest: Manifest, impl: dict[str, Any],
            opts: Options, filters: Sequence[str], judged: int | None = None,
            ) -> dict[str, Any]:  # fmt: skip
    """The JSON report (schema ``conformance-report``); ``judged``: the suite version
    whose cases were run (default: the manifest's)."""
    return {
        "report_version": REPORT_VERSION,
        "suite": {"manifest_version": manifest.raw["manifest_version"],
                  "judged_version": judged or manifest.raw["manifest_version"],
                  "format_version": manifest.raw["format_version"],
                  "manifest_sha256": manifest.sha256, "cases": len(manifest.cases)},
        "implementation": impl,
        "options": {"strict": opts.strict, "timeout_seconds": opts.timeout, "jobs": opts.jobs,
                    "max_size_ratio": opts.max_size_ratio,
                    "fail_fast": opts.fail_fast, "filters": list(filters)},
        "passed": passed(results),
        "totals": counts(results),
        "profiles": by_profile(results),
        "sections": by_section(results),
        "cases": [
            {"id": r.case.id, "profile": r.case.profile, "section": r.case.section,
             "status": r.status, "expected": r.case.expected, "observed": r.observed,
             "message": r.message, "command": r.command, "seconds": round(r.seconds, 4)}
            for r in results
        ],
    }  # fmt: skip


def check_destination(path: Path, vectors: Path) -> None:
    """Refuse a report path that is the suite's manifest or lies among its vector
    files (``vectors`` is the folder holding manifest.json), ``-`` or a device:
    bad-argument.  An existing report may be replaced (CI reruns write it again).
    """
    check_output(path, [vectors / "manifest.json", vectors / "vectors"], overwrite=True)


def write_report(path: Path, data: bytes, vectors: Path) -> None:
    """Write a report file atomically (temporary, fsync, rename); see check_destination."""
    check_destination(path, vectors)
    with atomic_file(path, overwrite=True) as fd:
        pwrite_all(fd, data, 0)


def json_bytes(report: dict[str, Any]) -> bytes:
    """The JSON report as written: 1-space indented UTF-8 with a final newline."""
    return (json.dumps(report, indent=1, ensure_ascii=False) + "\n").encode()


def junit_bytes(results: Sequence[Result]) -> bytes:
    """The JUnit XML report as written, with its XML declaration."""
    out = io.BytesIO()
    junit(results).write(out, encoding="utf-8", xml_declaration=True)
    return out.getvalue()


def junit(results: Sequence[Result]) -> ET.ElementTree:
    """JUnit XML: one testsuite per profile; not-tested and skipped cases are <skipped>."""
    root = ET.Element("testsuites", name="wdelta-conformance")
    for profile in PROFILES:
        mine = [r for r in results if r.case.profile == profile]
        if not mine:
            continue
        c = counts(mine)
        suite = ET.SubElement(root, "testsuite", name=profile, tests=str(c["total"]),
                              failures=str(c[FAIL]), errors="0",
                              skipped=str(c[NOT_TESTED] + c[SKIPPED]),
                              time=f"{sum(r.seconds for r in mine):.3f}")  # fmt: skip
        for r in mine:
            case = ET.SubElement(suite, "testcase", classname=f"wdelta.conformance.{profile}",
                                 name=r.case.id, time=f"{r.seconds:.3f}")  # fmt: skip
            detail = f"{r.message}\nrule [{r.case.section}]: {r.case.rule}\ncommand: {r.command}"
            if r.status == FAIL:
                ET.SubElement(case, "failure", message=r.message, type="conformance").text = detail
            elif r.status in (NOT_TESTED, SKIPPED):
                ET.SubElement(case, "skipped", message=r.message)
            elif r.status == SOFT:
                ET.SubElement(case, "system-out").text = "soft failure: " + detail
    ET.indent(root)
    return ET.ElementTree(root)
