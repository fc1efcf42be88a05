"""Errors that help (issue 12, finding 8): every message names its file, and the
usual mistakes are recognised and explained, with unchanged categories.

A delta, a Git LFS pointer, an HTML page, a zip archive, a shard index or an
empty file where a checkpoint goes (``checkpoint-invalid``); a checkpoint and
the same impostors where a delta goes (``bad-magic``; an empty file stays
``truncated``); a folder where a file goes and the reverse; a delta applied to
its own target (or ``--reverse`` to its base) is ``base-mismatch`` saying so.
Each through the CLI in a subprocess and through the API.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from kit import RawTensor, leftovers, safetensors_bytes, tree_hashes, write_sharded
from test_cli import assert_error, run
from wdelta.errors import WdeltaError
from wdelta.io import filekind

LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 4096\n"
HTML = b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head></html>\n"
ZIP = b"PK\x03\x04\x14\x00\x00\x00" + bytes(40)
INDEX = json.dumps({"metadata": {}, "weight_map": {"w": "model-1.safetensors"}}).encode()


def _tensors(step: int) -> dict[str, RawTensor]:
    w = np.arange(4096, dtype=np.uint16)
    if step:
        # Random words at every 7th element: a blob of ~1 KB in the data section, where
        # the "blob" corruption below lands (blobs of <= 128 bytes are inline, SPEC §4.12).
        w[::7] ^= np.random.default_rng(step).integers(1, 2**16, len(w[::7]), dtype=np.uint16)
    out = {"w": RawTensor("BF16", (64, 64), w.tobytes()), "b": RawTensor("U8", (3,), b"abc")}
    if step:
        out["added"] = RawTensor("F32", (2,), bytes(8))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base/target (the target adds a tensor), same/same2 (same layout), impostors."""
    root = tmp_path_factory.mktemp("mistakes")
    (root / "base.safetensors").write_bytes(safetensors_bytes(_tensors(0)))
    (root / "target.safetensors").write_bytes(safetensors_bytes(_tensors(1)))
    (root / "same.safetensors").write_bytes(safetensors_bytes(_tensors(2)))
    (root / "same2.safetensors").write_bytes(safetensors_bytes(_tensors(3)))
    wdelta.diff(root / "base.safetensors", root / "target.safetensors", root / "d.wdelta")
    wdelta.diff(root / "same.safetensors", root / "same2.safetensors", root / "s.wdelta")
    (root / "lfs.safetensors").write_bytes(LFS)
    (root / "page.safetensors").write_bytes(HTML)
    (root / "model.bin").write_bytes(ZIP)
    (root / "empty.safetensors").write_bytes(b"")
    (root / "empty.wdelta").write_bytes(b"")
    (root / "nothing").mkdir()
    write_sharded(root / "sharded", [_tensors(0)])
    return root


@pytest.fixture
def untouched(folder: Path, tmp_path: Path) -> object:
    before = tree_hashes(folder)
    yield
    assert tree_hashes(folder) == before
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


# (CLI arguments with {f} for the folder, category, words the message must hold)
CASES = [
    ("apply {f}/d.wdelta {f}/d.wdelta", "checkpoint-invalid",
     "d.wdelta is a wdelta delta, not a checkpoint"),
    ("diff {f}/d.wdelta {f}/target.safetensors", "checkpoint-invalid",
     "d.wdelta is a wdelta delta, not a checkpoint"),
    ("apply {f}/lfs.safetensors {f}/d.wdelta", "checkpoint-invalid",
     "lfs.safetensors is a Git LFS pointer, not the file: run `git lfs pull`"),
    ("apply {f}/page.safetensors {f}/d.wdelta", "checkpoint-invalid",
     "page.safetensors is an HTML page (a failed download?)"),
    ("apply {f}/model.bin {f}/d.wdelta", "checkpoint-invalid", "model.bin is a zip archive"),
    ("apply {f}/sharded/model.safetensors.index.json {f}/d.wdelta", "checkpoint-invalid",
     "model.safetensors.index.json is the index of a sharded checkpoint: pass the folder, "
     "not its index"),
    ("apply {f}/empty.safetensors {f}/d.wdelta", "checkpoint-invalid",
     "empty.safetensors is empty (0 bytes), not a checkpoint"),
    ("apply {f}/nothing {f}/d.wdelta", "checkpoint-invalid",
     "nothing is a folder with no .safetensors file"),
    ("apply {f}/base.safetensors {f}/target.safetensors", "bad-magic",
     "target.safetensors is a safetensors checkpoint, not a wdelta delta"),
    ("apply {f}/base.safetensors {f}/lfs.safetensors", "bad-magic",
     "lfs.safetensors is a Git LFS pointer, not the file: run `git lfs pull`"),
    ("apply {f}/base.safetensors {f}/page.safetensors", "bad-magic",
     "page.safetensors is an HTML page (a failed download?), not a wdelta delta"),
    ("apply {f}/base.safetensors {f}/sharded/model.safetensors.index.json", "bad-magic",
     "model.safetensors.index.json is the index of a sharded checkpoint, not a wdelta delta"),
    ("apply {f}/base.safetensors {f}/empty.wdelta", "truncated",
     "empty.wdelta is empty (0 bytes), not a wdelta delta"),
    ("apply {f}/base.safetensors {f}/nothing", "io-error",
     "nothing is a folder; a delta is one .wdelta file"),
    ("apply {f}/target.safetensors {f}/d.wdelta", "base-mismatch",
     "target.safetensors is already at the delta's target (it has the target's tensors, dtypes "
     "and shapes): nothing to do (or use --reverse to go back)"),
    ("apply {f}/same2.safetensors {f}/s.wdelta", "base-mismatch",
     "same2.safetensors is already at the delta's target (tensor 'w' has its target bytes): "
     "nothing to do (or use --reverse to go back)"),
    ("apply --reverse {f}/same.safetensors {f}/s.wdelta", "base-mismatch",
     "same.safetensors is already at the delta's base (tensor 'w' has its base bytes): nothing "
     "to do (or apply without --reverse to go forward)"),
    ("apply --reverse {f}/base.safetensors {f}/d.wdelta", "base-mismatch",
     "base.safetensors is already at the delta's base"),
]  # fmt: skip


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize(("argv", "category", "words"), CASES, ids=[c[2][:40] for c in CASES])
def test_cli_explains(folder: Path, tmp_path: Path, argv: str, category: str, words: str) -> None:
    result = run(*argv.format(f=folder).split(), "-o", tmp_path / "out")
    assert_error(result, category)
    assert words in result.stderr, result.stderr


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize(("argv", "category", "words"), CASES, ids=[c[2][:40] for c in CASES])
def test_api_explains(folder: Path, tmp_path: Path, argv: str, category: str, words: str) -> None:
    command, *rest = argv.format(f=folder).split()
    reverse = "--reverse" in rest
    a, b = (Path(p) for p in rest if p != "--reverse")
    with pytest.raises(WdeltaError) as info:
        if command == "diff":
            wdelta.diff(a, b, tmp_path / "out")
        else:
            wdelta.apply(a, b, tmp_path / "out", reverse=reverse)
    assert info.value.category == category
    assert words in str(info.value)


# A file of the other kind: the message names it and gives the usage of the command run
# (CLI arguments with {f} for the folder, category, the message after "error: CATEGORY: ").
MIX_UPS = [
    ("diff {f}/d.wdelta {f}/target.safetensors -o {o}", "checkpoint-invalid",
     "{f}/d.wdelta is a wdelta delta, not a checkpoint: usage: wdelta diff BASE TARGET -o OUT"),
    ("diff {f}/base.safetensors {f}/d.wdelta -o {o}", "checkpoint-invalid",
     "{f}/d.wdelta is a wdelta delta, not a checkpoint: usage: wdelta diff BASE TARGET -o OUT"),
    ("apply {f}/d.wdelta {f}/d.wdelta -o {o}", "checkpoint-invalid",
     "{f}/d.wdelta is a wdelta delta, not a checkpoint: usage: wdelta apply BASE DELTA -o OUT"),
    ("apply {f}/base.safetensors {f}/target.safetensors -o {o}", "bad-magic",
     "{f}/target.safetensors is a safetensors checkpoint, not a wdelta delta: "
     "usage: wdelta apply BASE DELTA -o OUT"),
    ("apply {f}/base.safetensors {f}/sharded/model.safetensors.index.json -o {o}", "bad-magic",
     "{f}/sharded/model.safetensors.index.json is the index of a sharded checkpoint, not a "
     "wdelta delta: usage: wdelta apply BASE DELTA -o OUT"),
    ("apply {f}/base.safetensors {f}/nothing -o {o}", "io-error",
     "{f}/nothing is a folder; a delta is one .wdelta file: usage: wdelta apply BASE DELTA -o OUT"),
    ("verify {f}/target.safetensors", "bad-magic",
     "{f}/target.safetensors is a safetensors checkpoint, not a wdelta delta: "
     "usage: wdelta verify DELTA [--base BASE]"),
    ("verify {f}/d.wdelta --base {f}/d.wdelta", "checkpoint-invalid",
     "{f}/d.wdelta is a wdelta delta, not a checkpoint: usage: wdelta verify DELTA [--base BASE]"),
    ("verify {f}/d.wdelta --base {f}/base.safetensors --target {f}/d.wdelta --strict-writer",
     "checkpoint-invalid",
     "{f}/d.wdelta is a wdelta delta, not a checkpoint: usage: wdelta verify DELTA [--base BASE]"),
    ("inspect {f}/target.safetensors", "bad-magic",
     "{f}/target.safetensors is a safetensors checkpoint, not a wdelta delta: "
     "usage: wdelta inspect DELTA"),
    ("inspect {f}/nothing", "io-error",
     "{f}/nothing is a folder; a delta is one .wdelta file: usage: wdelta inspect DELTA"),
    ("chain append {o} {f}/d.wdelta --base {f}/base.safetensors", "checkpoint-invalid",
     "{f}/d.wdelta is a wdelta delta, not a checkpoint: "
     "usage: wdelta chain append URL CHECKPOINT --base BASE"),
]  # fmt: skip


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize(("argv", "category", "line"), MIX_UPS, ids=[c[0][:24] for c in MIX_UPS])
def test_cli_mix_up_gives_the_usage_of_the_command_run(
    folder: Path, tmp_path: Path, argv: str, category: str, line: str
) -> None:
    out = tmp_path / "out"
    result = run(*argv.format(f=folder, o=out).split())
    assert_error(result, category)
    assert result.stderr == f"error: {category}: {line.format(f=folder)}\n"


def test_api_mix_up_has_no_cli_usage(folder: Path, tmp_path: Path) -> None:
    """A Python caller is told what the file is; a command's usage would mislead it."""
    with pytest.raises(WdeltaError) as info:
        wdelta.diff(folder / "d.wdelta", folder / "target.safetensors", tmp_path / "out")
    assert str(info.value) == f"{folder}/d.wdelta is a wdelta delta, not a checkpoint"
    assert info.value.mixed_up
    with pytest.raises(WdeltaError) as info:
        wdelta.verify(folder / "base.safetensors")
    assert info.value.category == "bad-magic" and "usage" not in str(info.value)


def test_other_impostors_get_no_usage(folder: Path, tmp_path: Path) -> None:
    """An LFS pointer is not a mix-up of arguments: its own remedy, no usage line."""
    result = run("apply", folder / "base.safetensors", folder / "lfs.safetensors", "-o",
                 tmp_path / "out")  # fmt: skip
    assert_error(result, "bad-magic")
    assert result.stderr.endswith("not the file: run `git lfs pull`\n"), result.stderr


def test_inspect_and_verify_name_the_file(folder: Path) -> None:
    for argv in (["inspect"], ["verify"]):
        result = run(*argv, folder / "target.safetensors")
        assert_error(result, "bad-magic")
        assert f"{folder}/target.safetensors is a safetensors checkpoint" in result.stderr
    result = run("verify", folder / "d.wdelta", "--base", folder / "target.safetensors")
    assert_error(result, "base-mismatch")
    assert "target.safetensors is already at the delta's target" in result.stderr


def _corrupt(delta: Path, tmp: Path, kind: str) -> Path:
    data = bytearray(delta.read_bytes())
    if kind == "magic":
        data[1] ^= 0xFF
    elif kind == "truncated":
        data = data[:-1]
    elif kind == "header":
        data[70] ^= 0x01
    elif kind == "version":
        data[8:12] = struct.pack("<I", 2)
    else:
        # The last byte of the last blob of the data section (not an inline blob).
        assert struct.unpack_from("<Q", data, 56)[0] > 0, "the fixture's delta needs a data section"
        data[-1] ^= 0x01
    out = tmp / f"bad-{kind}.wdelta"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize(
    ("kind", "category"),
    [("magic", "bad-magic"), ("truncated", "truncated"), ("header", "checksum-mismatch"),
     ("version", "unsupported-version"), ("blob", "checksum-mismatch")],
)  # fmt: skip
def test_every_delta_error_names_the_file(
    folder: Path, tmp_path: Path, kind: str, category: str
) -> None:
    bad = _corrupt(folder / "d.wdelta", tmp_path, kind)
    result = run("verify", bad)
    assert_error(result, category)
    assert f"{bad}" in result.stderr, result.stderr
    result = run("apply", folder / "base.safetensors", bad, "-o", tmp_path / "out")
    assert_error(result, category)
    assert f"{bad}" in result.stderr, result.stderr


def test_checkpoint_errors_name_the_file(folder: Path, tmp_path: Path) -> None:
    data = bytearray((folder / "base.safetensors").read_bytes())
    bad = tmp_path / "short.safetensors"
    bad.write_bytes(bytes(data[:-3]))
    result = run("apply", bad, folder / "d.wdelta", "-o", tmp_path / "out")
    assert_error(result, "checkpoint-invalid")
    assert str(bad) in result.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- sniffing


@settings(max_examples=200, deadline=None)
@given(
    header_pad=st.integers(0, 600),
    data=st.binary(max_size=64),
)
def test_a_real_safetensors_file_is_never_taken_for_something_else(
    header_pad: int, data: bytes
) -> None:
    # Header lengths cover every low byte, "{" (0x7B) and "<" (0x3C) included.
    tensors = {"t": RawTensor("U8", (len(data),), data)}
    body = safetensors_bytes(tensors, {"pad": "x" * header_pad}, pad=False)
    assert filekind.sniff(body[: filekind.SNIFF_BYTES], len(body)) == filekind.SAFETENSORS


@pytest.mark.parametrize(
    ("head", "name", "kind"),
    [(LFS, "x.safetensors", filekind.LFS_POINTER), (HTML, "x", filekind.HTML),
     (b"\xef\xbb\xbf  <html>", "x", filekind.HTML), (ZIP, "x.bin", filekind.ZIP),
     (b'{"a": 1}', "m.safetensors.index.json", filekind.INDEX), (INDEX, "i.json", filekind.INDEX),
     (b'{"a": 1}', "config.json", filekind.JSON), (b"\x89WDELTA\n" + bytes(8), "", filekind.WDELTA),
     (b"\x00\x01garbage", "g", filekind.OTHER)],
)  # fmt: skip
def test_sniff_kinds(head: bytes, name: str, kind: str) -> None:
    assert filekind.sniff(head, len(head), name) == kind
    assert filekind.sniff(b"", 0, name) == filekind.EMPTY


def test_a_delta_made_by_diff_is_sniffed_as_one(folder: Path) -> None:
    head = (folder / "d.wdelta").read_bytes()[: filekind.SNIFF_BYTES]
    assert filekind.sniff(head, (folder / "d.wdelta").stat().st_size) == filekind.WDELTA


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("where", ["missing/out.safetensors", "base.safetensors/out"])
def test_an_output_in_a_missing_folder_is_refused_before_reading(
    folder: Path, tmp_path: Path, where: str
) -> None:
    """A mistyped -o: a folder that does not exist, or a file where the folder goes."""
    (tmp_path / "base.safetensors").write_bytes(b"a file, not a folder")
    out = tmp_path / where
    what = "is not a folder" if where.startswith("base") else "does not exist"
    expected = f"{out}: its folder {out.parent} {what}: nothing was written; "
    for argv in (
        ("diff", folder / "base.safetensors", folder / "target.safetensors", "-o", out),
        ("apply", folder / "base.safetensors", folder / "d.wdelta", "-o", out),
    ):
        result = run(*argv)
        assert_error(result, "io-error")  # as a missing input is
        assert expected in result.stderr, result.stderr
    with pytest.raises(WdeltaError, match="choose another output path") as info:
        wdelta.apply(folder / "base.safetensors", folder / "d.wdelta", out)
    assert info.value.category == "io-error"
    assert not (tmp_path / "missing").exists()
    (tmp_path / "base.safetensors").unlink()  # for the fixture's leftover check


def test_a_file_where_a_folder_goes(folder: Path) -> None:
    result = run("chain", "log", folder / "base.safetensors")
    assert_error(result, "not-found")
    assert "base.safetensors: no chain here (is a file, not a chain folder)" in result.stderr
    result = run("conformance", "run", "--vectors", folder / "base.safetensors")
    assert_error(result, "bad-argument")
    assert "base.safetensors is a file; the vectors are the folder" in result.stderr


def test_a_partial_pull_names_the_stored_delta(tmp_path: Path) -> None:
    from chainkit import Trainer
    from wdelta import chain

    t = Trainer(rows=8, cols=64)
    store = tmp_path / "store"
    chain.init(store, t.save(tmp_path / "v0.safetensors"))
    t.step(1)
    chain.append(store, t.save(tmp_path / "v1.safetensors"), tmp_path / "v0.safetensors")
    (stored,) = (store / "deltas").iterdir()
    data = bytearray(stored.read_bytes())
    data[1] ^= 0xFF
    stored.write_bytes(bytes(data))
    local = tmp_path / "node.safetensors"
    chain.pull(store, local, to=0, tensors="layer1.*")
    with pytest.raises(WdeltaError) as info:
        chain.pull(store, local, tensors="layer1.*")
    assert info.value.category == "bad-magic"
    assert f"deltas/{stored.name}" in str(info.value)
