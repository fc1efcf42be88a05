"""bench/live.py runs end to end on a small case and reports every measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_live_bench_small_case(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "live.py"), "--dir", str(tmp_path / "data"),
         "--elements", "3000000", "--repeat", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    apply, publish = doc["results"]["apply"], doc["results"]["publish"]
    assert set(apply) == {"reload", "reload_cold", "reload_verified", "digest", "apply",
                          "apply_verify_input", "apply_unverified_output"}  # fmt: skip
    assert set(publish) == {"save_file", "save_file_fsync", "save_and_store", "publish",
                            "delta_bytes"}  # fmt: skip
    for entry in (*apply.values(), *(v for v in publish.values() if isinstance(v, dict))):
        assert len(entry["rounds"]) == 2 and entry["best"] == min(entry["rounds"]) > 0
        assert entry["best_cpu"] == min(entry["cpu_rounds"]) >= 0
    assert publish["delta_bytes"] > 0
    for line in ("apply vs reload (page cache)", "apply vs reload (not in the page cache)",
                 "apply vs reload + digest check", "publish vs save_file + fsync"):
        assert line in doc["markdown"]  # fmt: skip
