"""The benchmark scripts run end to end on a tiny case (about 12 s).

Speeds are not checked (tests never judge wall-clock time); what is checked is
that bench/run.py measures every case, rebuilds the target byte for byte,
writes its JSON and report, and that bench/stages.py accounts for every element.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_bench_run_and_stages(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--dir", str(tmp_path / "data"),
         "--elements", "3000000", "--densities", "0.02,0.3", "--fp8-density", "0.02",
         "--repeat", "2", "--xor-sample-mib", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    names = [r["name"] for r in doc["results"]]
    assert names == ["bf16 2.0%", "bf16 30.0%", "fp8 e4m3 2.0%"]
    for r in doc["results"]:
        assert r["identical"]
        assert len(r["diff_vs_zstd3"]) == len(r["apply_vs_copy"]) == 2
        assert all(x > 0 for x in r["diff_vs_zstd3"] + r["apply_vs_copy"])
        assert 0 < r["delta_bytes"] < r["full_bytes"]
    assert "### Targets" in run.stdout and "apply >= 50% of file copy" in run.stdout

    case = next((tmp_path / "data").glob("bf16-*"))
    stages = subprocess.run(
        [sys.executable, str(REPO / "bench" / "stages.py"), str(case / "base.safetensors"),
         str(case / "target-0.3.safetensors")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert stages.returncode == 0, stages.stderr
    elements = int(stages.stdout.split(" elements")[0].replace(",", ""))
    with open(case / "base.safetensors", "rb") as f:
        tensors = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    tensors.pop("__metadata__", None)
    assert elements == sum(math.prod(t["shape"]) for t in tensors.values())
    for step in ("BLAKE3", "positions", "values", "zstd", "read"):
        assert step in stages.stdout


def test_xor_note_says_measured_only_for_the_whole_stream() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import run as bench_run
    finally:
        sys.path.remove(str(REPO / "bench"))
    z19 = {"input_bytes": 1_000_000 - 448, "seconds": 1.0, "stream_bytes": 1_000_000}
    assert "is measured" in bench_run._xor_note(z19, 64)
    assert "is an estimate: 64 MiB" in bench_run._xor_note({**z19, "input_bytes": 500_000}, 64)


def test_real_peer_table_end_to_end(tmp_path: Path) -> None:
    """bench/run.py --real on a tiny trace: every peer measured, every round trip identical.

    (The synthetic cases of --real reuse bench/cases.py, run by the test above.)
    """
    for module in ("torch", "zipnn", "matplotlib"):
        pytest.importorskip(module)
    out = tmp_path / "peers.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--real", "--dir", str(tmp_path),
         "--trace-root", str(tmp_path / "trace"), "--trace-dim", "32", "--trace-layers", "1",
         "--trace-heads", "2", "--trace-seq", "17", "--trace-batch", "2", "--trace-pretrain",
         "2", "--trace-steps", "2", "--trace-lrs", "1e-5", "--pair-stride", "1", "--densities", "",
         "--fp8-density", "0", "--repeat", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    names = [c["name"] for c in doc["results"]]
    assert names == ["real bf16 lr1e-05", "real fp8 lr1e-05"]
    assert [len(c["pairs"]) for c in doc["results"]] == [2, 2]
    for case in doc["results"]:
        for pair in case["pairs"]:
            methods = pair["methods"]
            assert set(methods) >= {"wdelta", "zstd -3 of XOR", "TRL gaps + values, zstd -3",
                                    "ZipNN of XOR", "ZipNN of target",
                                    "zstd -3 of XOR, file to file"}
            assert all(m["bytes"] > 0 for m in methods.values())
            assert 0 < pair["bound"]["bytes"] < methods["wdelta"]["bytes"] < pair["full"]
        assert {"zstd -19 of target", "zstd -19 of XOR"} <= set(case["pairs"][-1]["methods"])
    fp8 = doc["results"][1]["pairs"][0]
    assert fp8["bound"]["scale_bytes"] > 0 and fp8["wdelta"]["scale_bytes"] > 0
    compaction = fp8["wdelta"]["compaction"]
    # The stored header (compact form, prefix, alignment padding) is smaller than the v1 JSON.
    assert 64 < fp8["wdelta"]["header_bytes"] <= compaction[0][1] + 4096 + 64
    assert fp8["wdelta"]["header_json_bytes"] <= fp8["wdelta"]["header_bytes"] - 64
    assert [n for _, n in compaction] == sorted((n for _, n in compaction), reverse=True)
    assert "### Targets (issue 15)" in run.stdout and "real fp8 lr1e-05: scale" in run.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000

    scales = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scales.py"), fp8["base"], fp8["target"]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert scales.returncode == 0, scales.stderr
    rows = [re.match(r"(.*?) +([\d,]+) bytes", line) for line in scales.stdout.splitlines()]
    found = {m[1]: float(m[2].replace(",", "")) for m in rows if m}
    assert found["encoder's choice"] == fp8["wdelta"]["scale_bytes"]
    assert found["information bound"] == pytest.approx(fp8["bound"]["scale_bytes"], abs=1)
    assert found["encoder's choice"] <= found["dense xor, zstd 3"]


def test_fp8speed_on_a_tiny_trace(tmp_path: Path) -> None:
    """bench/fp8speed.py: one row per measured pair, every ratio and size filled in."""
    pytest.importorskip("torch")
    trace = ["--trace-root", str(tmp_path / "trace"), "--trace-dim", "32", "--trace-layers", "1",
             "--trace-heads", "2", "--trace-seq", "17", "--trace-batch", "2",
             "--trace-pretrain", "1", "--trace-steps", "1", "--trace-lrs", "1e-5"]  # fmt: skip
    made = subprocess.run([sys.executable, str(REPO / "bench" / "realtrace.py"), *trace],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stderr
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fp8speed.py"), *trace, "--rounds", "1",
         "--pair-stride", "1", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| lr1e-05 step-")]
    assert len(rows) == 1
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        # Ratios print 3 significant digits: a positive one never reads 0 on a tiny trace.
        assert float(cells[1]) > 0 and float(cells[2]) > 0
        assert int(cells[7].replace(",", "")) > 0 and float(cells[8]) > 0.5
        # Hashing only adds to the reference's time (3 digits: maybe not visibly here).
        assert float(cells[9]) >= float(cells[1]) and float(cells[10]) >= float(cells[2])
        assert float(cells[11]) > 0
    assert list(tmp_path.glob("tmp*")) == []  # its work folder is removed


def test_manytensors_on_a_tiny_case(tmp_path: Path) -> None:
    """bench/manytensors.py: a row per operation with both costs per tensor, and the
    checkpoints it builds hold the stated number of tensors, 2% of them changed."""
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "manytensors.py"), "--tensors", "30", "--scale",
         "2", "--rounds", "1", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and "us/" not in line]
    ops = [r.strip("|").split("|")[0].strip() for r in rows]
    assert ops == ["diff", "open_delta (parse)", "apply", "verify (no base)"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0
        assert float(cells[3]) == pytest.approx(float(cells[2]) / float(cells[1]), abs=0.02)
    import wdelta

    with wdelta.open_checkpoint(tmp_path / "base-60.safetensors") as ckpt:
        assert len(ckpt.tensors) == 60
    rebuilt = tmp_path / "base-60.out.safetensors"
    assert rebuilt.read_bytes() == (tmp_path / "target-60.safetensors").read_bytes()
    with wdelta.open_delta(tmp_path / "base-60.wdelta") as d:
        changed = sum(c.changed for t in d.header.tensors for c in t.chunks)
    assert 0.01 < changed / (60 * 32 * 64) < 0.03


def test_distributed_bench_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/distributed.py end to end (1 and 2 gloo ranks, the paper model) at a size a
    test can afford: it measures, so only its shape and sanity are checked."""
    pytest.importorskip("torch")
    out = tmp_path / "d.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "distributed.py"), "--elements", "2000000",
         "--steps", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Speed-up of 2 ranks over 1 rank" in run.stdout
    result = json.loads(out.read_text())
    runs = {r["run"]: r for r in result["runs"]}
    assert set(runs) == {"1 rank, 1 thread", "2 ranks, 1 thread each", "1 rank, 2 threads"}
    assert runs["2 ranks, 1 thread each"]["parts"] == 2 and runs["1 rank, 1 thread"]["parts"] == 1
    assert all(r["ram_ratio"] >= 0 and r["best"] > 0 for r in runs.values())
    assert {row["ranks"] for row in result["paper"]} == {64, 256, 1024}
