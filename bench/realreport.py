"""Markdown for the peer table (bench/realbench.py): sizes, speeds, wdelta details, targets.

A case is a list of pairs (plain dicts as in the JSON); sizes are summed over
its pairs, speeds are summed bytes over summed fastest-round seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

Case = dict[str, Any]
SIZE_ROWS = ["zstd -3 of target", "zstd -19 of target", "ZipNN of target", "zstd -3 of XOR",
             "zstd -19 of XOR", "ZipNN of XOR", "TRL gaps + values",
             "TRL gaps + values, zstd -3", "wdelta"]  # fmt: skip
# The speed reference of the targets: zstd -3 of the XOR, file to file (peers.py).
REFERENCE = "zstd -3 of XOR, file to file"
SPEED_ROWS = ["wdelta", REFERENCE, "zstd -3 of XOR", "zstd -3 of target", "ZipNN of XOR",
              "ZipNN of target", "TRL gaps + values, zstd -3"]  # fmt: skip
OUT = Path(__file__).resolve().parent / "out"


def _sum(case: Case, fn: Any) -> float:
    return float(sum(fn(p) for p in case["pairs"]))


def _tot(case: Case, group: str, key: str) -> float:
    """``pair[group][key]`` summed over the case's pairs (group "" = the pair itself)."""
    return float(sum((p[group] if group else p)[key] for p in case["pairs"]))


def _size_cell(case: Case, method: str) -> str:
    """'% of full / bound ratio' over the pairs that measured ``method`` (zstd -19: the last)."""
    pairs = [p for p in case["pairs"] if method in p["methods"]]
    size = sum(p["methods"][method]["bytes"] for p in pairs)
    full = sum(p["full"] for p in pairs)
    bound = sum(p["bound"]["bytes"] for p in pairs)
    mark = "" if len(pairs) == len(case["pairs"]) else " (last pair)"
    return f"{size / full:.3%} / {size / bound:.2f}{mark}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def size_table(results: list[Case]) -> list[str]:
    """Methods by case: size as % of the full target / size over the information bound."""
    rows = [[m, *(_size_cell(c, m) for c in results)] for m in SIZE_ROWS]
    rows.append(["wdelta, blobs only (data section and inline)", *(
        f"{_tot(c, 'wdelta', 'data_bytes') / _tot(c, '', 'full'):.3%} / "
        f"{_tot(c, 'wdelta', 'data_bytes') / _tot(c, 'bound', 'bytes'):.2f}"
        for c in results)])  # fmt: skip
    rows.append(["information bound", *(
        f"{_tot(c, 'bound', 'bytes') / _tot(c, '', 'full'):.3%} / 1.00"
        for c in results)])  # fmt: skip
    return _table(["method (% of full / x bound)", *(c["name"] for c in results)], rows)


def _rate(case: Case, method: str, key: str) -> str:
    seconds = _sum(case, lambda p: p["methods"][method][key] or 0)
    return f"{_sum(case, lambda p: p['full']) / seconds / 1e6:,.0f}" if seconds else "-"


def speed_table(results: list[Case]) -> list[str]:
    """Encode / decode MB/s of target bytes, fastest round of each pair."""
    rows = [[m, *(f"{_rate(c, m, 'encode')} / {_rate(c, m, 'decode')}" for c in results)]
            for m in SPEED_ROWS]  # fmt: skip
    return _table(["method (encode / decode MB/s)", *(c["name"] for c in results)], rows)


def ratios(case: Case, key: str) -> list[float]:
    """Per pair, REFERENCE seconds / wdelta seconds for ``key`` (> 1: wdelta faster)."""
    m = [p["methods"] for p in case["pairs"]]
    return [x[REFERENCE][key] / x["wdelta"][key] for x in m]


def whole_file_margin(p: dict[str, Any]) -> float:
    """wdelta bytes / (1.05 x bound + 300 bytes per tensor): <= 1 meets the issue's target."""
    return float(p["methods"]["wdelta"]["bytes"] / (
        1.05 * p["bound"]["bytes"] + 300 * p["wdelta"]["tensors"]))  # fmt: skip


def header_table(results: list[Case]) -> list[str]:
    """Header bytes per tensor entry of the v1 form after each cumulative compaction
    (bench/headersize.py); the delta itself is written in the compact form of SPEC §4.11."""
    steps = [name for name, _ in results[0]["pairs"][0]["wdelta"]["compaction"]]
    rows = []
    for i, step in enumerate(steps):
        cells = []
        for c in results:
            nbytes = sum(p["wdelta"]["compaction"][i][1] for p in c["pairs"])
            cells.append(f"{nbytes / _tot(c, 'wdelta', 'tensors'):.0f}")
        rows.append([step, *cells])
    return _table(["header bytes per tensor (cumulative)", *(c["name"] for c in results)], rows)


def _span(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def _described(case: Case) -> float:
    """Header JSON bytes per tensor entry that describe the delta: the JSON text less the
    base64 text of inline blobs (SPEC §4.12), which are data and count in the data
    section's target at their stored size.  The 64-byte prefix and the alignment padding
    (at most 4 KiB, from 4 MiB of data on) are not entries; they count in the whole file."""
    text = _tot(case, "wdelta", "header_json_bytes") - _tot(case, "wdelta", "inline_text_bytes")
    return text / _tot(case, "wdelta", "tensors")


def _with_inline(case: Case) -> float:
    """Header JSON bytes per tensor entry, inline blobs' text included."""
    return _tot(case, "wdelta", "header_json_bytes") / _tot(case, "wdelta", "tensors")


def detail_table(results: list[Case]) -> list[str]:
    """wdelta per case: density, header per tensor, scales, margins, speed ratios, RSS."""
    rows = []
    for c in results:
        ps = c["pairs"]
        scale_bound = _tot(c, "bound", "scale_bytes")
        rows.append([
            c["name"], str(len(ps)),
            f"{_tot(c, 'bound', 'changed') / _tot(c, 'bound', 'elements'):.3%}",
            f"{_described(c):.0f} ({_with_inline(c):.0f})",
            f"{_tot(c, 'wdelta', 'scale_bytes') / scale_bound:.2f}" if scale_bound else "-",
            _span([whole_file_margin(p) for p in ps]),
            _span(ratios(c, "encode")), _span(ratios(c, "decode")),
            f"{max(p['wdelta']['diff_rss'] for p in ps) / 2**20:.0f} / "
            f"{max(p['wdelta']['apply_rss'] for p in ps) / 2**20:.0f} MiB",
        ])  # fmt: skip
    head = ["case", "pairs", "changed", "header JSON B / tensor (with inline blobs' text)",
            "scales / bound",
            "whole / (1.05 bound + 300 B/tensor), by pair", "encode vs zstd -3 XOR files, by pair",
            "decode vs zstd -3 XOR files, by pair", "peak RSS diff / apply"]  # fmt: skip
    return _table(head, rows)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "**FAIL**"


def targets(results: list[Case]) -> list[list[str]]:
    """The issue's targets on the real trace: [target, measured, verdict]."""
    rows = []
    for c in (c for c in results if c["name"].startswith("real")):
        worst = max(whole_file_margin(p) for p in c["pairs"])
        rows.append([f"{c['name']}: whole file <= 1.05 bound + 300 B/tensor, every pair",
                     f"worst pair {worst:.3f}x the allowance", _verdict(worst <= 1)])  # fmt: skip
        data = _tot(c, "wdelta", "data_bytes") / _tot(c, "bound", "bytes")
        rows.append([f"{c['name']}: data section <= 1.03 bound", f"{data:.3f}x",
                     _verdict(data <= 1.03)])  # fmt: skip
        per = _described(c)
        rows.append([f"{c['name']}: header <= 300 B per tensor",
                     f"{per:.0f} B ({_with_inline(c):.0f} B with inline blobs' text)",
                     _verdict(per <= 300)])  # fmt: skip
        if "fp8" not in c["name"]:
            continue
        enc, dec = ratios(c, "encode"), ratios(c, "decode")
        rows.append([f"{c['name']}: encode >= 1.5x zstd -3 of XOR (files), every pair",
                     f"{_span(enc)}x", _verdict(min(enc) >= 1.5)])  # fmt: skip
        rows.append([f"{c['name']}: decode >= 1.2x zstd -3 of XOR (files), every pair",
                     f"{_span(dec)}x", _verdict(min(dec) >= 1.2)])  # fmt: skip
        scales = _sum(c, lambda p: p["wdelta"]["scale_bytes"]) / _sum(
            c, lambda p: p["bound"]["scale_bytes"]
        )
        rows.append([f"{c['name']}: scale tensors <= 1.5x bound", f"{scales:.2f}x",
                     _verdict(scales <= 1.5)])  # fmt: skip
    return rows


def notes(args: argparse.Namespace) -> list[str]:
    return [
        "Sizes: summed over the pairs of a case; % of the full target file; 'x bound' over "
        "the zeroth-order information bound (bench/bound.py, per chunk of wdelta's chunking). "
        "XOR = byte-wise XOR of the two whole files (ZipNN's delta).",
        f"Speeds: MB (1e6 bytes) of target file per second, fastest of {args.repeat} "
        "interleaved rounds per pair. wdelta: `wdelta.diff`/`wdelta.apply` in-process, "
        f"files in the page cache, threads={args.threads}, writing, fsyncing and renaming its "
        "output, apply checking every digest. Peers: single-threaded work on bytes already in "
        "memory (no file I/O; the XOR itself is not counted), except the speed reference "
        f"'{REFERENCE}': read both files, XOR, zstd -3 (1 thread), write + fsync; decode: read "
        "base and delta, decompress, XOR, write + fsync. TRL: building the layout, then "
        "zstd -3 (its decode is not measured).",
        "Peak RSS: ru_maxrss of one `wdelta diff` and one `wdelta apply` CLI child per pair.",
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{args.provenance}; 1-minute load "
        f"average at the end: {os.getloadavg()[0]:.1f}.",
    ]


def markdown(results: list[Case], args: argparse.Namespace) -> str:
    lines = ["### Sizes", "", *size_table(results), "", "### Speed", "", *speed_table(results)]
    lines += ["", "### wdelta by case", "", *detail_table(results)]
    lines += ["", "### Header: what a compact one would save", "", *header_table(results)]
    lines += ["", "### Targets (issue 15)"]
    lines += ["", *_table(["target", "measured", "verdict"], targets(results))]
    lines += ["", "### Notes", "", *(f"- {n}" for n in notes(args))]
    return "\n".join(lines) + "\n"


def write_json(results: list[Case], text: str, args: argparse.Namespace) -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.json) if args.json else OUT / f"peers-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv, "date": stamp, "results": results,
                               "markdown": text}, indent=2))  # fmt: skip
    return out
