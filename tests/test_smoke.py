"""End-to-end round trip through the public API on a small mixed checkpoint."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

import wdelta


def test_round_trip_forward_and_reverse(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = {
        "a": rng.standard_normal((300, 1000)).astype(ml_dtypes.bfloat16),
        "b": np.arange(10, dtype=np.float32),
        "empty": np.zeros((0, 3), np.float16),
        "scalar": np.array(3.0),
        "gone": np.ones(5, np.int8),
    }
    target = dict(base)
    a = base["a"].astype(np.float32)
    hit = rng.random(a.shape) < 0.02
    a[hit] *= 1.01
    target["a"] = a.astype(ml_dtypes.bfloat16)
    target["b"] = np.arange(10, dtype=np.float64)
    del target["gone"]
    target["new"] = np.full((4, 4), np.nan, np.float32)
    out = tmp_path / "x.wdelta"
    wdelta.diff(base, target, out, chunk_elements=65536)
    rebuilt = wdelta.apply(base, out)
    assert isinstance(rebuilt, dict)
    assert set(rebuilt) == set(target)
    for name, array in target.items():
        assert rebuilt[name].dtype == array.dtype
        assert rebuilt[name].tobytes() == np.ascontiguousarray(array).tobytes()
    back = wdelta.apply(target, out, reverse=True)
    assert isinstance(back, dict)
    assert {k: v.tobytes() for k, v in back.items()} == {k: v.tobytes() for k, v in base.items()}
    wdelta.verify(out, base=base)
    with wdelta.open_delta(out) as delta:
        ops = {(t.name, t.op) for t in delta.header.tensors}
    assert ops == {
        ("a", "modified"), ("b", "removed"), ("b", "added"), ("empty", "unchanged"),
        ("gone", "removed"), ("new", "added"), ("scalar", "unchanged"),
    }  # fmt: skip
