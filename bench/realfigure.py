"""The peer figure: size against change density (every pair), and speed per method."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

SIZE_METHODS = ["wdelta", "zstd -3 of XOR", "zstd -19 of XOR", "TRL gaps + values, zstd -3",
                "TRL gaps + values", "ZipNN of XOR", "zstd -3 of target"]  # fmt: skip
# In-memory zstd of a sparse XOR decodes at up to 7 GB/s and would flatten the other bars.
SPEED_METHODS = ["wdelta", "zstd -3 of XOR, file to file", "ZipNN of XOR", "zstd -3 of target"]


def _density(p: dict[str, Any]) -> float:
    return float(p["bound"]["changed"] / p["bound"]["elements"])


def _sizes(ax: Any, results: list[dict[str, Any]]) -> None:
    pairs = [p for c in results for p in c["pairs"]]
    for m in SIZE_METHODS:
        xs = [_density(p) * 100 for p in pairs if m in p["methods"]]
        ys = [p["methods"][m]["bytes"] / p["full"] * 100 for p in pairs if m in p["methods"]]
        ax.scatter(xs, ys, s=12, label=m, marker="o" if m == "wdelta" else ".")
    xs = [_density(p) * 100 for p in pairs]
    ax.scatter(xs, [p["bound"]["bytes"] / p["full"] * 100 for p in pairs], s=10, marker="_",
               color="black", label="information bound")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="changed elements (%)",
           ylabel="size (% of the full target)", title="Size against change density")  # fmt: skip
    ax.legend(fontsize=7)


def _speeds(ax: Any, results: list[dict[str, Any]]) -> None:
    slots = 2 * len(SPEED_METHODS)
    width = 0.8 / slots
    for i, m in enumerate(SPEED_METHODS):
        for j, key in enumerate(("encode", "decode")):
            mbs = []
            for c in results:
                full = sum(p["full"] for p in c["pairs"])
                seconds = sum(p["methods"][m][key] or 0 for p in c["pairs"])
                mbs.append(full / seconds / 1e6 if seconds else 0)
            xs = [k + (2 * i + j - slots / 2 + 0.5) * width for k in range(len(results))]
            ax.bar(xs, mbs, width, label=f"{m} {key}",
                   hatch="" if key == "encode" else "//", alpha=1.0 if key == "encode" else 0.5,
                   color=f"C{i}")  # fmt: skip
    ax.set_xticks(range(len(results)), [c["name"] for c in results], rotation=30, ha="right",
                  fontsize=7)  # fmt: skip
    ax.set(ylabel="MB of target per second", title="Speed (encode solid, decode hatched)")
    ax.legend(fontsize=6, ncol=2)


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    """Write the two panels to ``path`` (PNG, ~100 KB) and return it."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    _sizes(left, results)
    _speeds(right, results)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
