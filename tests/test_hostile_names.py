"""Names ending in a line feed (issue 12, finding 5).

Python's ``$`` also matches before a final ``\\n``; the format's patterns are
full matches (SPEC.md §2.2), so a name ``m.safetensors\\n`` is not portable:
an input index naming it is refused, an input file called so is recorded
under the default name, and no refused command leaves its output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import wdelta
from kit import RawTensor, leftovers, safetensors_bytes, tree_hashes
from test_cli import assert_error, assert_ok, run
from wdelta import cli
from wdelta.checkpoint.source import is_index_name, is_shard_name, open_checkpoint
from wdelta.cli import delta

BASE = {"a": RawTensor("F32", (4,), bytes(16))}
TARGET = {"a": RawTensor("F32", (4,), bytes(15) + b"x")}


def _sharded(folder: Path, shard: str, tensors: dict[str, RawTensor]) -> Path:
    folder.mkdir()
    (folder / shard).write_bytes(safetensors_bytes(tensors))
    index = {"weight_map": dict.fromkeys(tensors, shard)}
    (folder / "m.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("name", ["m.safetensors\n", "m.safetensors\n\n", "\nm.safetensors"])
def test_a_name_with_a_line_feed_is_not_portable(name: str) -> None:
    assert not is_shard_name(name)
    assert not is_index_name(name.replace(".safetensors", ".safetensors.index.json"))
    assert is_shard_name(name.strip())


def test_an_input_index_naming_a_shard_with_a_line_feed_is_refused(tmp_path: Path) -> None:
    base = _sharded(tmp_path / "base", "m.safetensors\n", BASE)
    target = _sharded(tmp_path / "target", "m.safetensors", TARGET)
    good = wdelta.diff(target, target, tmp_path / "ok.wdelta")
    before = tree_hashes(base)
    for args in (("diff", base, target, "-o", tmp_path / "d.wdelta"),
                 ("apply", base, good, "-o", tmp_path / "out")):  # fmt: skip
        assert_error(run(*args), "checkpoint-invalid")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "ok.wdelta", "target"]
    assert tree_hashes(base) == before


def test_a_file_named_with_a_line_feed_is_recorded_under_the_default_name(tmp_path: Path) -> None:
    base = tmp_path / "b.safetensors\n"
    base.write_bytes(safetensors_bytes(BASE))
    (tmp_path / "t.safetensors").write_bytes(safetensors_bytes(TARGET))
    out = tmp_path / "d.wdelta"
    assert_ok(run("diff", base, tmp_path / "t.safetensors", "-o", out, "--threads", "1"))
    with wdelta.open_delta(out) as d:
        assert [p for p, _ in d.header.base.files] == ["model.safetensors"]


def test_the_encoder_refuses_an_unrecordable_layout_before_writing(tmp_path: Path) -> None:
    with open_checkpoint(_write(tmp_path / "b.safetensors", BASE)) as base:
        base.files = {"m.safetensors\n": base.files["b.safetensors"]}
        with pytest.raises(wdelta.WdeltaError) as info:
            wdelta.diff(base, {"a": np.ones(4, np.float32)}, tmp_path / "d.wdelta")
    assert info.value.category == "checkpoint-invalid"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors"]


def test_a_tensor_name_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    arrays = {"\ud800": np.zeros(2, np.float32)}
    with pytest.raises(wdelta.WdeltaError) as info:
        wdelta.diff(arrays, arrays, tmp_path / "d.wdelta")
    assert info.value.category == "checkpoint-invalid"
    assert list(tmp_path.iterdir()) == []


def test_diff_leaves_no_output_when_its_summary_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(_: object) -> object:
        raise wdelta.WdeltaError("summary refused")

    monkeypatch.setattr(delta, "summarize", refuse)
    base, target = (
        _write(tmp_path / "b.safetensors", BASE),
        _write(tmp_path / "t.safetensors", TARGET),
    )
    assert cli.run(["diff", str(base), str(target), "-o", str(tmp_path / "d.wdelta")]) == 1
    assert capsys.readouterr().err.startswith("error: error: summary refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors", "t.safetensors"]
    assert leftovers(tmp_path) == []


def _write(path: Path, tensors: dict[str, RawTensor]) -> Path:
    path.write_bytes(safetensors_bytes(tensors))
    return path
