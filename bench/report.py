"""Markdown tables and PASS/FAIL targets from benchmark results (plain dicts, as in the JSON)."""

from __future__ import annotations

from typing import Any

GIB = 1 << 30
Result = dict[str, Any]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


def _rate(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def size_table(results: list[Result]) -> list[str]:
    """Sizes: delta against the full target, zstd baselines and the information bound."""
    rows = []
    for r in results:
        full, delta = r["full_bytes"], r["delta_bytes"]
        bound, xor19 = r["bound"]["bytes"], r["xor_zstd19"]["estimate_bytes"]
        rows.append([
            r["name"], f"{r['achieved_density']:.3%}", _mb(full),
            f"{_mb(delta)} ({delta / full:.3%})",
            f"{_mb(r['zstd3']['output_bytes'])} ({r['zstd3']['output_bytes'] / full:.1%})",
            f"{_mb(xor19)} ({xor19 / full:.3%})",
            f"{_mb(bound)} ({bound / full:.3%})", f"{delta / bound:.3f}",
            f"{r['bound']['position_bits'] / 8 / bound:.0%}",
            r["encodings_text"],
        ])  # fmt: skip
    head = ["case", "changed", "full (target)", "delta", "zstd -3 of target",
            "zstd -19 of dense XOR (est.)", "info bound", "delta / bound",
            "positions share of bound", "chunks (encoding:transform)"]  # fmt: skip
    return _table(head, rows)


def speed_table(results: list[Result]) -> list[str]:
    """Throughput in GB (1e9 bytes) of target checkpoint per second, and peak RSS."""
    rows = []
    for r in results:
        full = r["full_bytes"]
        rows.append([
            r["name"],
            f"{r['diff']['seconds']:.2f} s = {_rate(full, r['diff']['seconds']):.3f}",
            f"{r['apply']['seconds']:.2f} s = {_rate(full, r['apply']['seconds']):.3f}",
            f"{_rate(full, r['zstd3']['seconds']):.3f}",
            f"{_rate(full, r['zstd3_threads2']['seconds']):.3f}",
            f"{r['diff']['max_rss'] / 2**20:,.0f} MiB", f"{r['apply']['max_rss'] / 2**20:,.0f} MiB",
            "yes" if r["identical"] else "**NO**",
        ])  # fmt: skip
    head = ["case", "wdelta diff (GB/s)", "wdelta apply (GB/s)", "zstd -3, 1 thread (GB/s)",
            "zstd -3, 2 threads (GB/s)", "diff peak RSS", "apply peak RSS",
            "rebuilt == target"]  # fmt: skip
    return _table(head, rows)


def copy_lines(results: list[Result]) -> list[str]:
    """Per case, the fastest copy of the base (measured between that case's applies)."""
    lines = []
    for r in results:
        c = r["copy"]
        lines.append(
            f"- {r['name']}: fastest copy of the base ({_mb(c['bytes'])}) "
            f"{_rate(c['bytes'], c['seconds']):.3f} GB/s (shutil.copyfile "
            f"{c['copy_seconds']:.2f} s + fsync {c['fsync_seconds']:.2f} s); all copies: "
            + ", ".join(f"{x:.2f} s" for x in c["all_seconds"])
        )
    return lines


def _rounds_text(ratios: list[float]) -> str:
    return "rounds " + ", ".join(f"{x:.2f}" for x in ratios)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "**FAIL**"


def targets(results: list[Result]) -> list[list[str]]:
    """[target, measured, verdict] rows; speeds compare runs of the same rounds."""
    rows = []
    for r in results:
        if r["headline"]:
            delta, xor19, bound = (
                r["delta_bytes"], r["xor_zstd19"]["estimate_bytes"], r["bound"]["bytes"]
            )  # fmt: skip
            rows.append([f"{r['name']}: delta < zstd -19 of dense XOR",
                         f"{_mb(delta)} vs {_mb(xor19)} ({delta / xor19:.2f}x)",
                         _verdict(delta < xor19)])  # fmt: skip
            rows.append([f"{r['name']}: delta <= 1.15x information bound",
                         f"{delta / bound:.3f}x", _verdict(delta <= 1.15 * bound)])  # fmt: skip
        full = r["full_bytes"]
        diff, zstd = _rate(full, r["diff"]["seconds"]), _rate(full, r["zstd3"]["seconds"])
        rows.append([f"{r['name']}: diff faster than zstd -3 (1 thread)",
                     f"{diff:.3f} vs {zstd:.3f} GB/s ({diff / zstd:.2f}x; "
                     f"{_rounds_text(r['diff_vs_zstd3'])})",
                     _verdict(diff > zstd)])  # fmt: skip
        apply, copy = _rate(full, r["apply"]["seconds"]), _rate(full, r["copy"]["seconds"])
        rows.append([f"{r['name']}: apply >= 50% of file copy",
                     f"{apply:.3f} vs {copy:.3f} GB/s ({apply / copy:.0%}; "
                     f"{_rounds_text(r['apply_vs_copy'])})",
                     _verdict(apply >= 0.5 * copy)])  # fmt: skip
        d_rss, a_rss = r["diff"]["max_rss"], r["apply"]["max_rss"]
        rows.append([f"{r['name']}: peak RSS of diff and apply < 1 GiB",
                     f"{d_rss / 2**20:,.0f} / {a_rss / 2**20:,.0f} MiB",
                     _verdict(max(d_rss, a_rss) < GIB)])  # fmt: skip
    return rows


def markdown(results: list[Result], notes: list[str]) -> str:
    """The whole report: sizes, speeds, copies, targets, notes."""
    lines = ["### Sizes", "", *size_table(results), "", "### Speed", "", *speed_table(results)]
    lines += ["", *copy_lines(results), "", "### Targets", ""]
    lines += _table(["target", "measured", "verdict"], targets(results))
    lines += ["", "### Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
