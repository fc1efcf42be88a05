"""The ``wdelta`` command line, run as a real subprocess.

Success paths (diff, apply, apply --reverse, inspect, inspect --json, verify
with and without --base) on single files and sharded folders; and the failure
contract: exactly one stderr line ``error: CATEGORY: message``, no traceback,
exit status 2 for bad arguments and 1 otherwise, nothing left at the output
path, inputs unchanged.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import wdelta
from kit import (
    RawTensor,
    leftovers,
    random_words,
    safetensors_bytes,
    tree_hashes,
    write_sharded,
)

WDELTA = Path(sys.executable).parent / "wdelta"
# Run the console script against the same wdelta the tests import.
ENV = {**os.environ, "PYTHONPATH": str(Path(wdelta.__file__).resolve().parent.parent)}
ERROR_LINE = re.compile(r"^error: ([a-z-]+): .+$")


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WDELTA), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300
    )


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def assert_error(result: subprocess.CompletedProcess[str], category: str) -> None:
    assert result.returncode == (2 if category == "bad-argument" else 1), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    match = ERROR_LINE.match(lines[0])
    assert match is not None, lines[0]
    assert match.group(1) == category, lines[0]
    assert "Traceback" not in result.stdout


def _tensors(seed: int) -> dict[str, RawTensor]:
    rng = np.random.default_rng(seed)
    big = random_words(np.random.default_rng(0), 2, 3000)
    if seed:
        # Random new words at 400 places: blobs of ~200 bytes per 512-element chunk,
        # in the data section (blobs of <= 128 bytes are inline, SPEC §4.12).
        big[rng.choice(3000, 400, replace=False)] ^= rng.integers(1, 2**16, 400, dtype=np.uint16)
    out = {
        "model.embed": RawTensor("BF16", (30, 100), big.tobytes()),
        "model.norm": RawTensor("F32", (16,), random_words(rng, 4, 16).tobytes()),
        "scalar": RawTensor("I64", (), bytes(8)),
    }
    out["only.base" if seed == 0 else "only.target"] = RawTensor("U8", (5,), bytes(5))
    return out


@dataclass(frozen=True)
class Files:
    folder: Path
    base: Path
    target: Path
    sharded_base: Path
    sharded_target: Path
    delta: Path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    folder = tmp_path_factory.mktemp("cli")
    base, target = folder / "base.safetensors", folder / "target.safetensors"
    base.write_bytes(safetensors_bytes(_tensors(0), {"format": "pt"}))
    target.write_bytes(safetensors_bytes(_tensors(1), {"format": "pt"}))
    b, t = _tensors(0), _tensors(1)
    write_sharded(
        folder / "sbase", [{k: b[k] for k in list(b)[:2]}, {k: b[k] for k in list(b)[2:]}]
    )
    write_sharded(folder / "starget", [{k: t[k]} for k in t])
    delta = wdelta.diff(base, target, folder / "d.wdelta", chunk_elements=512)
    return Files(folder, base, target, folder / "sbase", folder / "starget", delta)


@pytest.fixture
def inputs_unchanged(files: Files) -> Iterator[None]:
    before = tree_hashes(files.folder)
    yield
    assert tree_hashes(files.folder) == before


pytestmark = pytest.mark.usefixtures("inputs_unchanged")


# ---------------------------------------------------------------- success


def test_diff_apply_reverse_verify_single_file(files: Files, tmp_path: Path) -> None:
    delta = tmp_path / "step.wdelta"
    result = run("diff", files.base, files.target, "-o", delta, "--chunk-elements", 256,
                 "--level", 5, "--threads", 1)  # fmt: skip
    assert_ok(result)
    assert result.stdout.startswith(f"wrote {delta}")
    out = tmp_path / "out.safetensors"
    assert_ok(run("apply", files.base, delta, "-o", out))
    assert out.read_bytes() == files.target.read_bytes()
    back = tmp_path / "back.safetensors"
    assert_ok(run("apply", files.target, delta, "-o", back, "--reverse", "--threads", 1))
    assert back.read_bytes() == files.base.read_bytes()
    verified = run("verify", delta)
    assert_ok(verified)
    assert verified.stdout.strip() == f"ok: {delta}"
    assert_ok(run("verify", delta, "--base", files.base))
    assert leftovers(tmp_path) == []


def test_sharded_folders(files: Files, tmp_path: Path) -> None:
    delta = tmp_path / "s.wdelta"
    assert_ok(run("diff", files.sharded_base, files.sharded_target, "-o", delta, "-q"))
    assert_ok(run("apply", files.sharded_base, delta, "-o", tmp_path / "out", "-q"))
    assert tree_hashes(tmp_path / "out") == tree_hashes(files.sharded_target)
    assert_ok(run("apply", files.sharded_target, delta, "-o", tmp_path / "back", "--reverse"))
    assert tree_hashes(tmp_path / "back") == tree_hashes(files.sharded_base)
    # A single-file base applies to a delta made from a sharded one (same tensors).
    assert_ok(run("apply", files.base, delta, "-o", tmp_path / "out2"))
    assert tree_hashes(tmp_path / "out2") == tree_hashes(files.sharded_target)


def test_quiet_diff_prints_nothing(files: Files, tmp_path: Path) -> None:
    result = run("diff", files.base, files.target, "-o", tmp_path / "q.wdelta", "--quiet")
    assert_ok(result)
    assert result.stdout == ""


def test_inspect_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`wdelta inspect --json | head -1`: the reader leaves early; no error line."""
    base = {f"t{i:04d}": np.zeros(4, np.float32) for i in range(2000)}
    target = {name: np.ones(4, np.float32) for name in base}
    delta = wdelta.diff(base, target, tmp_path / "many.wdelta")
    proc = subprocess.Popen(
        [str(WDELTA), "inspect", str(delta), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1) == b"{"
    proc.stdout.close()  # the JSON is far larger than a pipe buffer
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert stderr == b""


def test_inspect_text_and_json(files: Files) -> None:
    with wdelta.open_delta(files.delta) as d:
        header = d.header.raw
    text = run("inspect", files.delta)
    assert_ok(text)
    assert header["base"]["digest"] in text.stdout
    assert header["target"]["digest"] in text.stdout
    for name in ("model.embed", "model.norm", "only.base", "only.target"):
        assert name in text.stdout
    result = run("inspect", files.delta, "--json")
    assert_ok(result)
    summary = json.loads(result.stdout)
    assert summary["version"] == 1
    assert summary["base_digest"] == header["base"]["digest"]
    assert summary["target_digest"] == header["target"]["digest"]
    assert summary["chunk_elements"] == 512
    assert summary["reversible"] is True
    assert summary["file_bytes"] == files.delta.stat().st_size
    assert summary["ops"] == {"modified": 2, "removed": 1, "added": 1, "unchanged": 1}
    embed = next(t for t in summary["tensors"] if t["name"] == "model.embed")
    assert embed["op"] == "modified" and embed["changed"] == 400
    assert embed["raw_bytes"] == 6000 and embed["elements"] == 3000


def test_no_reverse(files: Files, tmp_path: Path) -> None:
    delta = tmp_path / "nr.wdelta"
    assert_ok(run("diff", files.base, files.target, "-o", delta, "--no-reverse", "-q"))
    assert json.loads(run("inspect", delta, "--json").stdout)["reversible"] is False
    assert_ok(run("apply", files.base, delta, "-o", tmp_path / "o.safetensors"))
    assert (tmp_path / "o.safetensors").read_bytes() == files.target.read_bytes()
    out = tmp_path / "r.safetensors"
    assert_error(run("apply", files.target, delta, "-o", out, "--reverse"), "not-reversible")
    assert not out.exists() and leftovers(tmp_path) == []


def test_version_and_help() -> None:
    result = run("--version")
    assert_ok(result)
    assert result.stdout.startswith(f"wdelta {wdelta.__version__} (format v1, ")
    assert_ok(run("--help"))
    module = subprocess.run([sys.executable, "-m", "wdelta", "--version"], capture_output=True,
                            text=True, env=ENV, timeout=60)  # fmt: skip
    assert module.returncode == 0 and module.stdout == result.stdout


# ---------------------------------------------------------------- failures


def _corrupt(files: Files, tmp: Path, kind: str) -> Path:
    data = bytearray(files.delta.read_bytes())
    if kind == "blob":
        # The last byte of the last blob of the data section (not an inline blob).
        assert struct.unpack_from("<Q", data, 56)[0] > 0, "the fixture's delta needs a data section"
        data[-1] ^= 0x01
    elif kind == "truncated":
        data = data[:-1]
    else:
        data[0] ^= 0xFF
    path = tmp / f"{kind}.wdelta"
    path.write_bytes(bytes(data))
    return path


# `wdelta` alone prints its usage (tests/test_packaging.py).
ARGUMENT_ERRORS = [
    ["frobnicate"],
    ["diff", "{base}", "{target}"],
    ["diff", "{base}", "{target}", "-o", "{out}", "--chunk-elements", "0"],
    ["diff", "{base}", "{target}", "-o", "{out}", "--chunk-elements", "many"],
    ["diff", "{base}", "{target}", "-o", "{out}", "--chunk-elements", str(2**26 + 1)],
    ["diff", "{base}", "{target}", "-o", "{out}", "--level", "99"],
    ["diff", "{base}", "{target}", "-o", "{out}", "--threads", "0"],
    ["diff", "{base}", "{target}", "-o", "{out}", "--bogus"],
    ["apply", "{base}", "{delta}", "-o", "{out}", "--threads", "0"],
    ["apply", "{base}", "{delta}"],
    ["inspect"],
    ["verify", "{delta}", "--base"],
]


@pytest.mark.parametrize("argv", ARGUMENT_ERRORS, ids=lambda a: " ".join(a[:1] + a[3:]) or "none")
def test_bad_arguments(files: Files, argv: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out.x"
    args = [
        a.format(base=files.base, target=files.target, delta=files.delta, out=out) for a in argv
    ]
    assert_error(run(*args), "bad-argument")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "category"),
    [
        ("apply {base} {tmp}/missing.wdelta -o {out}", "io-error"),
        ("apply {tmp}/missing.safetensors {delta} -o {out}", "io-error"),
        ("apply {target} {delta} -o {out}", "base-mismatch"),
        ("apply {base} {blob} -o {out}", "checksum-mismatch"),
        ("apply {base} {truncated} -o {out}", "truncated"),
        ("apply {base} {magic} -o {out}", "bad-magic"),
        ("apply {base} {base} -o {out}", "bad-magic"),
        ("apply {base} {delta} -o {tmp}/nodir/x.safetensors", "io-error"),
        ("verify {blob}", "checksum-mismatch"),
        ("verify {truncated}", "truncated"),
        ("verify {delta} --base {target}", "base-mismatch"),
        ("verify {delta} --base {sharded_target}", "base-mismatch"),
        ("inspect {magic}", "bad-magic"),
        ("inspect {tmp}/missing.wdelta --json", "io-error"),
        ("diff {base} {tmp}/missing.safetensors -o {out}", "io-error"),
        ("diff {base} {delta} -o {out}", "checkpoint-invalid"),
        ("diff {base} {target} -o {tmp}/nodir/x.wdelta", "io-error"),
    ],
)
def test_failures(files: Files, command: str, category: str, tmp_path: Path) -> None:
    out = tmp_path / "out.safetensors"
    values = {
        "base": files.base, "target": files.target, "delta": files.delta, "tmp": tmp_path,
        "sharded_target": files.sharded_target, "out": out,
        **{k: _corrupt(files, tmp_path, k) for k in ("blob", "truncated", "magic")},
    }  # fmt: skip
    before = tree_hashes(tmp_path)
    assert_error(run(*command.format(**values).split()), category)
    assert tree_hashes(tmp_path) == before  # no output, no temporary file, inputs unchanged
    assert not out.exists()


def test_output_folder_not_empty(files: Files, tmp_path: Path) -> None:
    delta = tmp_path / "s.wdelta"
    assert_ok(run("diff", files.base, files.sharded_target, "-o", delta, "-q"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine").write_text("keep")
    assert_error(run("apply", files.base, delta, "-o", tmp_path / "out"), "bad-argument")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine"]
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- progress bars


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_on_tty(monkeypatch: pytest.MonkeyPatch, *args: object) -> tuple[int, str]:
    """Run the CLI in-process with stderr looking like a terminal; (status, what it drew)."""
    from wdelta import cli

    terminal = _Terminal()
    with monkeypatch.context() as m:
        m.setattr(sys, "stderr", terminal)
        status = cli.run([str(a) for a in args])
    return status, terminal.getvalue()


def test_progress_bars_on_a_terminal(
    files: Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a TTY each long command draws a bar whose total is the bytes it will process."""
    delta, out = tmp_path / "d.wdelta", tmp_path / "out.safetensors"
    nbytes = sum(t.nbytes for t in wdelta.open_checkpoint(files.target).tensors.values())
    status, drawn = _run_on_tty(monkeypatch, "diff", files.base, files.target, "-o", delta)
    assert status == 0 and "diff: 100%" in drawn, drawn
    status, drawn = _run_on_tty(monkeypatch, "apply", files.base, delta, "-o", out)
    assert status == 0 and "apply: 100%" in drawn, drawn
    assert f"{nbytes / 1000:.2f}k/{nbytes / 1000:.2f}k" in drawn, drawn
    status, drawn = _run_on_tty(monkeypatch, "verify", delta, "--base", files.base)
    assert status == 0 and "verify: 100%" in drawn, drawn
    assert out.read_bytes() == files.target.read_bytes()
