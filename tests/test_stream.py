"""The engine-facing stream: per-chunk changes applied by a scatter, changed tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import wdelta

torch = pytest.importorskip("torch")

from test_inplace import model, snapshot, step  # noqa: E402
from test_torch import random_tensor, stepped, words  # noqa: E402

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def scatter(weights: dict[str, Any], delta: Path, reverse: bool = False) -> None:
    """Apply ``wdelta.changes`` the way a GPU engine would: index_put_ on flat int views."""
    for c in wdelta.changes(delta, reverse=reverse):
        flat = weights[c.name].view(_INT[c.dtype.size]).view(-1)
        values = torch.from_numpy(c.values.view(f"<i{c.dtype.size}" if c.dtype.size > 1 else "u1"))
        index = (
            torch.arange(c.start, c.start + c.count)
            if c.positions is None
            else torch.from_numpy(c.positions)
        )
        if c.op == "set":
            flat.index_put_((index,), values)
        elif c.op == "xor":
            flat.index_put_((index,), flat[index] ^ values)
        else:  # wrapping add of unsigned words == two's-complement add of signed ones
            flat.index_put_((index,), flat[index] + values)


@pytest.mark.parametrize("density", [0.02, 0.6, 1.0])
def test_scatter_of_changes_reaches_the_target_and_back(tmp_path: Path, density: float) -> None:
    base = {
        "a": random_tensor(torch.bfloat16, (40, 30), 1),
        "b": random_tensor(torch.float8_e4m3fn, (17, 9), 2),
        "c": random_tensor(torch.int64, (33,), 3),
    }
    target = {n: stepped(t, 7, density) for n, t in base.items()}
    wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=100)
    live = {n: t.clone() for n, t in base.items()}
    scatter(live, tmp_path / "d.wdelta")
    wdelta.verify_weights(live, tmp_path / "d.wdelta")
    assert snapshot(live) == snapshot(target)
    scatter(live, tmp_path / "d.wdelta", reverse=True)
    wdelta.verify_weights(live, tmp_path / "d.wdelta", side="base")
    assert snapshot(live) == snapshot(base)


def test_changes_reports_positions_ops_and_selection(tmp_path: Path) -> None:
    base = model(0)
    target = step(base, 1, 0.02)
    target["new"] = np.ones(10, dtype=np.float32)
    wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=64)
    found = list(wdelta.changes(tmp_path / "d.wdelta"))
    assert {c.op for c in found if c.name != "new"} <= {"xor", "add"}
    assert [c.op for c in found if c.name == "new"] == ["set"]
    for c in found:
        if c.positions is not None:
            assert np.all((c.positions >= c.start) & (c.positions < c.start + c.count))
            assert np.all(np.diff(c.positions) > 0) and len(c.values) == len(c.positions)
    only = list(wdelta.changes(tmp_path / "d.wdelta", tensors="em*"))
    assert only and {c.name for c in only} == {"emb"}


def test_verify_weights_names_the_wrong_tensor(tmp_path: Path) -> None:
    base = model(0)
    target = step(base, 1)
    wdelta.diff(base, target, tmp_path / "d.wdelta")
    wdelta.verify_weights(target, tmp_path / "d.wdelta")
    wrong = {n: a.copy() for n, a in target.items()}
    wrong["fp8"][0, 0] = ml_dtypes.float8_e4m3fn(3.0) if wrong["fp8"][0, 0] != 3.0 else 1.0
    with pytest.raises(wdelta.ChecksumMismatchError, match="fp8"):
        wdelta.verify_weights(wrong, tmp_path / "d.wdelta")
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.verify_weights({}, tmp_path / "d.wdelta")
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.verify_weights(target, tmp_path / "d.wdelta", side="middle")


def test_changed_tensors_yields_only_changed_verified(tmp_path: Path) -> None:
    base = {"a": random_tensor(torch.bfloat16, (20, 20), 1), "same": torch.zeros(5)}
    target = {"a": stepped(base["a"], 2), "same": torch.zeros(5)}
    wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=64)
    got = dict(wdelta.changed_tensors(base, tmp_path / "d.wdelta"))
    assert list(got) == ["a"] and got["a"].dtype == torch.bfloat16
    assert np.array_equal(words(got["a"]), words(target["a"]))
    wrong = {"a": target["a"], "same": base["same"]}
    with pytest.raises(wdelta.BaseMismatchError):
        list(wdelta.changed_tensors(wrong, tmp_path / "d.wdelta"))


def test_corrupted_blob_is_refused_by_changes(tmp_path: Path, no_inline: None) -> None:
    from test_inplace import _corrupt_last_blob

    base = model(0)
    wdelta.diff(base, step(base, 1), tmp_path / "d.wdelta", chunk_elements=64)
    _corrupt_last_blob(tmp_path / "d.wdelta")
    with pytest.raises(wdelta.ChecksumMismatchError):
        list(wdelta.changes(tmp_path / "d.wdelta"))
