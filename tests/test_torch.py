"""torch tensors in the dict API: every §5 dtype torch has, contiguous or not, bit-exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdelta

torch = pytest.importorskip("torch")

NAMES = [
    "bool", "uint8", "int8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "int16", "uint16", "float16", "bfloat16",
    "int32", "uint32", "float32", "int64", "uint64", "float64", "complex64",
]  # fmt: skip
DTYPES = [getattr(torch, n) for n in NAMES if hasattr(torch, n)]
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def words(t: Any) -> np.ndarray[Any, Any]:
    """A tensor's stored bit patterns in row-major order, as NumPy unsigned words."""
    size = t.element_size()
    w = t.detach().cpu().contiguous().view(_INT[size]).numpy()
    return w.view(f"<u{size}").reshape(-1)


def random_tensor(dtype: Any, shape: tuple[int, ...], seed: int) -> Any:
    """Random bit patterns (NaNs, -0.0, subnormals included) of ``dtype``."""
    rng = np.random.default_rng(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * size, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1
    return torch.from_numpy(raw).view(dtype).reshape(shape)


def stepped(t: Any, seed: int, density: float = 0.1) -> Any:
    """A copy of ``t`` with a fraction of its elements replaced by random bit patterns."""
    other = random_tensor(t.dtype, tuple(t.shape), seed)
    mask = torch.from_numpy(np.random.default_rng(seed + 1).random(tuple(t.shape)) < density)
    out = t.clone()
    out.view(_INT[t.element_size()])[mask] = other.view(_INT[t.element_size()])[mask]
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exact(tmp_path: Path, dtype: Any) -> None:
    base = {"a": random_tensor(dtype, (33, 17), 1), "b": random_tensor(dtype, (5,), 2)}
    target = {"a": stepped(base["a"], 3), "b": random_tensor(dtype, (5,), 4)}
    wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=64)
    out = wdelta.apply(base, tmp_path / "d.wdelta")
    assert isinstance(out, dict)
    for name, t in target.items():
        assert out[name].dtype == dtype and tuple(out[name].shape) == tuple(t.shape)
        assert np.array_equal(words(out[name]), words(t))
    back = wdelta.apply(target, tmp_path / "d.wdelta", reverse=True)
    assert isinstance(back, dict)
    assert all(np.array_equal(words(back[n]), words(t)) for n, t in base.items())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    transpose=st.booleans(),
)
def test_torch_delta_equals_numpy_delta(
    tmp_path_factory: pytest.TempPathFactory, dtype: Any, rows: int, cols: int, seed: int,
    transpose: bool,
) -> None:  # fmt: skip
    """The same bits as torch (contiguous or a transposed view) or as NumPy words
    give the same checkpoint digests, and apply rebuilds them exactly."""
    tmp = tmp_path_factory.mktemp("td")
    b = random_tensor(dtype, (rows, cols), seed)
    t = stepped(b, seed + 7, 0.3)
    if transpose:
        b, t = b.t(), t.t()
    wdelta.diff({"w": b}, {"w": t}, tmp / "t.wdelta", chunk_elements=50)
    size = b.element_size()
    as_np = {"w": words(b).reshape(tuple(b.shape)).view(f"<u{size}")}
    to_np = {"w": words(t).reshape(tuple(t.shape)).view(f"<u{size}")}
    with wdelta.open_delta(tmp / "t.wdelta") as d:
        entry = d.header.tensors[0]
    wdelta.diff(as_np, to_np, tmp / "n.wdelta", chunk_elements=50)
    with wdelta.open_delta(tmp / "n.wdelta") as d:
        assert d.header.tensors[0].target_digest == entry.target_digest
        assert d.header.tensors[0].base_digest == entry.base_digest
    out = wdelta.apply({"w": b}, tmp / "t.wdelta")
    assert isinstance(out, dict)
    assert np.array_equal(words(out["w"]), words(t))


def test_numpy_results_keep_ml_dtypes(tmp_path: Path) -> None:
    base = {"w": np.arange(64, dtype=np.float32).astype(ml_dtypes.bfloat16)}
    target = {"w": (np.arange(64, dtype=np.float32) + 1).astype(ml_dtypes.bfloat16)}
    wdelta.diff(base, target, tmp_path / "d.wdelta")
    out = wdelta.apply(base, tmp_path / "d.wdelta")
    assert isinstance(out, dict) and out["w"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_torch_and_file_checkpoint_agree(tmp_path: Path) -> None:
    """A delta from torch tensors names the same checkpoints as one from the saved files."""
    from safetensors.torch import save_file

    base = {"w": random_tensor(torch.bfloat16, (16, 8), 5)}
    target = {"w": stepped(base["w"], 6)}
    save_file(base, str(tmp_path / "b.safetensors"))
    save_file(target, str(tmp_path / "t.safetensors"))
    wdelta.diff(base, target, tmp_path / "m.wdelta")
    wdelta.diff(tmp_path / "b.safetensors", tmp_path / "t.safetensors", tmp_path / "f.wdelta")
    m, f = wdelta.open_delta(tmp_path / "m.wdelta"), wdelta.open_delta(tmp_path / "f.wdelta")
    with m, f:
        for side in ("base", "target"):
            assert m.header.raw[side]["digest"] == f.header.raw[side]["digest"]


def test_bad_values_are_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.diff({"w": torch.zeros(3)}, {"w": [1.0, 2.0, 3.0]}, tmp_path / "d.wdelta")


def test_file_tools_do_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys, wdelta, wdelta.cli.delta, wdelta.chain, wdelta.ops.tensors\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
