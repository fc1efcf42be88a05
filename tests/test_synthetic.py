"""The synthetic checkpoint generator: bit-exact encoders against ml_dtypes, and its files."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import wdelta
from wdelta.errors import BadArgumentError
from wdelta.testing import synthetic

TINY = synthetic.ModelSpec(hidden=128, layers=2, intermediate=384, vocab=512, kv_hidden=32)
TINY_FP8 = synthetic.ModelSpec(128, 2, 384, 512, 32, fp8=True)


def _f32(patterns: list[int] | np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.asarray(patterns, dtype=np.uint32).view(np.float32)


SPECIALS = _f32(
    [
        0x00000000, 0x80000000,  # +-0
        0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,  # f32 subnormals
        0x7F800000, 0xFF800000,  # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FFFFFFF, 0xFFFFFFFF,  # NaNs
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF,  # around the bf16 overflow
        0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  # bf16 ties and near-ties at 1.0
        0x00008000, 0x00018000, 0x00807FFF,  # ties among subnormals
    ]
)  # fmt: skip


def _random_patterns(n: int, seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    return _f32(np.random.default_rng(seed).integers(0, 2**32, size=n, dtype=np.uint32))


def _ref_bf16(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN inputs
        return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def test_bf16_matches_ml_dtypes_on_specials() -> None:
    got = synthetic.bf16_bits(SPECIALS)
    assert got.tolist() == _ref_bf16(SPECIALS).tolist()
    assert got[1] == 0x8000 and got[6] == 0x7F80 and got[7] == 0xFF80
    assert got[8] == 0x7FC0 and got[9] == 0xFFC0 and got[11] == 0xFFC0


def test_bf16_matches_ml_dtypes_on_every_upper_half_and_random_patterns() -> None:
    upper = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    x = np.concatenate([_f32((upper[:, None] | lows).reshape(-1)), _random_patterns(1 << 20, 1)])
    assert np.array_equal(synthetic.bf16_bits(x), _ref_bf16(x))


def test_bf16_to_f32_is_exact_inverse_on_all_patterns() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = synthetic.bf16_to_f32(bits)
    assert np.array_equal(
        values.view(np.uint32), bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    )
    finite = ~np.isnan(values)
    assert np.array_equal(synthetic.bf16_bits(values)[finite], bits[finite])


def _ref_e4m3(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """ml_dtypes with saturation: ml_dtypes itself maps |x| > 464 and inf to NaN."""
    clipped = np.clip(x, -448, 448).astype(np.float32)
    clipped[np.isnan(x)] = x[np.isnan(x)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out: np.ndarray[Any, Any] = clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return out


def test_e4m3_specials() -> None:
    got = synthetic.e4m3fn_bits(SPECIALS)
    assert got[0] == 0x00 and got[1] == 0x80  # -0.0 keeps its sign
    assert got[2:6].tolist() == [0x00, 0x80, 0x00, 0x00]  # f32 subnormals underflow to +-0
    assert got[6] == 0x7E and got[7] == 0xFE  # inf saturates to +-448
    assert got[8:14].tolist() == [0x7F, 0xFF, 0x7F, 0xFF, 0x7F, 0xFF]  # NaN keeps its sign
    assert got[14] == 0x7E and got[15] == 0xFE  # huge finite values saturate
    finite = ~np.isinf(SPECIALS)
    assert np.array_equal(got[finite], _ref_e4m3(SPECIALS[finite]))


def _e4m3_grid() -> np.ndarray[Any, np.dtype[np.float32]]:
    """Every finite e4m3 value, every midpoint between neighbours, and points beside them."""
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    pos = np.unique(values[(values >= 0) & np.isfinite(values)])
    mids = (pos[:-1] + pos[1:]) / 2  # exact in f32: neighbours differ in few bits
    grid = np.concatenate([pos, mids, [464.0, 480.0, 500.0, 2.0**-10, 2.0**-11]]).astype(np.float32)
    near = np.concatenate([np.nextafter(grid, np.float32(0)), np.nextafter(grid, np.float32(1e9))])
    both = np.concatenate([grid, near.astype(np.float32)])
    return np.concatenate([both, -both]).astype(np.float32)


def test_e4m3_matches_ml_dtypes_on_grid_ties_and_subnormals() -> None:
    x = _e4m3_grid()
    assert np.array_equal(synthetic.e4m3fn_bits(x), _ref_e4m3(x))
    assert synthetic.e4m3fn_bits(np.array([2.0**-10, 3 * 2.0**-10], np.float32)).tolist() == [0, 2]


def test_e4m3_matches_ml_dtypes_on_random_patterns_and_scaled_normals() -> None:
    rng = np.random.default_rng(2)
    scaled = rng.standard_normal(1 << 20) * 2.0 ** rng.integers(-14, 10, 1 << 20)
    x = np.concatenate([_random_patterns(1 << 21, 3), scaled.astype(np.float32)])
    finite = ~np.isinf(x)
    assert np.array_equal(synthetic.e4m3fn_bits(x)[finite], _ref_e4m3(x[finite]))


def test_encoders_refuse_other_dtypes() -> None:
    with pytest.raises(BadArgumentError):
        synthetic.bf16_bits(np.zeros(3, np.float64))
    with pytest.raises(BadArgumentError):
        synthetic.e4m3fn_bits(np.zeros(3, np.float16))


@pytest.mark.parametrize("shape", [(256, 384), (200, 130), (1, 5)])
def test_block_quantization_maps_each_block_max_to_448(shape: tuple[int, int]) -> None:
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    codes, scale = synthetic.quantize_e4m3_blocks(x)
    assert codes.shape == shape and scale.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    per = np.repeat(np.repeat(scale, 128, 0), 128, 1)[: shape[0], : shape[1]]
    back = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * per
    assert np.all(np.abs(back - x) <= np.abs(x) / 16 + per * 2.0**-9)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = codes[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            assert (block & 0x7F).max() == 0x7E


def _read_all(path: Path) -> dict[str, bytes]:
    with wdelta.open_checkpoint(path) as ckpt:
        return {n: t.read(0, t.elements).tobytes() for n, t in ckpt.tensors.items()}


def test_checkpoint_layout_and_determinism(tmp_path: Path) -> None:
    a = synthetic.write_checkpoint(tmp_path / "a.safetensors", TINY_FP8, lr=1e-5, threads=2)
    synthetic.write_checkpoint(tmp_path / "b.safetensors", TINY_FP8, lr=1e-5, threads=1)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    with wdelta.open_checkpoint(tmp_path / "a.safetensors") as ckpt:
        t = ckpt.tensors
        assert t["model.layers.1.mlp.down_proj.weight"].dtype.name == "F8_E4M3"
        assert t["model.layers.1.mlp.down_proj.weight_scale_inv"].shape == (1, 3)
        assert t["model.embed_tokens.weight"].dtype.name == "BF16"
        assert t["model.norm.weight"].shape == (128,)
        assert sum(x.elements for x in t.values()) == TINY_FP8.elements == a.elements
    assert a.file_bytes == (tmp_path / "a.safetensors").stat().st_size
    assert not list(tmp_path.glob(".*partial"))


def test_zero_step_keeps_every_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synthetic, "BLOCK_ELEMENTS", 5000)  # several row blocks per tensor
    monkeypatch.setattr(synthetic, "WEIGHT_DECAY", 0.0)
    base = synthetic.write_checkpoint(tmp_path / "b.safetensors", TINY)
    same = synthetic.write_checkpoint(tmp_path / "t.safetensors", TINY, lr=0.0)
    assert same.changed == 0 and base.changed == 0
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "t.safetensors").read_bytes()


def test_fp8_row_blocks_cover_whole_scale_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synthetic, "BLOCK_ELEMENTS", 40_000)  # 312 rows -> 256
    w = next(w for w in TINY_FP8.weights() if w.fp8 and w.rows == 384)
    blocks = w.row_blocks()
    assert blocks == [(0, 256), (256, 384)]


@pytest.mark.parametrize("spec", [TINY, TINY_FP8], ids=["bf16", "fp8"])
def test_calibrated_step_hits_density_and_changes_scales(tmp_path: Path, spec: Any) -> None:
    pair = synthetic.make_pair(tmp_path, spec, 0.05)
    assert abs(pair.achieved_density - 0.05) < 0.01
    base, target = _read_all(pair.base), _read_all(pair.target)
    changed = [n for n in base if base[n] != target[n]]
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    if spec.fp8:
        assert "model.layers.0.self_attn.q_proj.weight_scale_inv" in changed


def test_density_grows_with_lr() -> None:
    low = synthetic.calibrate_lr(TINY, 0.01)
    high = synthetic.calibrate_lr(TINY, 0.2)
    assert 0 < low.lr < high.lr
    assert abs(high.estimated_density - 0.2) < 0.01
    with pytest.raises(BadArgumentError):
        synthetic.calibrate_lr(TINY, 1.0)


def test_sharded_checkpoint_holds_the_same_tensors(tmp_path: Path) -> None:
    report = synthetic.make_sharded(tmp_path / "sh", TINY_FP8, 3, lr=1e-6)
    synthetic.write_checkpoint(tmp_path / "one.safetensors", TINY_FP8, lr=1e-6)
    names = sorted(p.name for p in (tmp_path / "sh").iterdir())
    assert names == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors", "model.safetensors.index.json",
    ]  # fmt: skip
    assert len(report.paths) == 3
    assert _read_all(tmp_path / "sh") == _read_all(tmp_path / "one.safetensors")


def test_shard_split_never_leaves_a_shard_empty() -> None:
    weights = TINY.weights()
    for shards in range(1, len(weights) + 1):
        parts = synthetic.shard_weights(weights, shards)
        assert len(parts) == shards and all(parts)
        assert [w for p in parts for w in p] == weights
    with pytest.raises(BadArgumentError):
        synthetic.shard_weights(weights, 0)


def test_spec_for_elements_reaches_the_budget() -> None:
    for n in (10**6, 64 * 10**6, 5 * 10**8):
        spec = synthetic.spec_for_elements(n)
        assert n <= spec.elements < 1.25 * n + 20 * 10**6


def test_synthetic_pair_round_trips_through_wdelta(tmp_path: Path) -> None:
    pair = synthetic.make_pair(tmp_path, TINY_FP8, 0.02, shards=2)
    out = tmp_path / "d.wdelta"
    wdelta.diff(pair.base, pair.target, out, chunk_elements=1 << 14)
    wdelta.apply(pair.base, out, tmp_path / "rebuilt")
    for name in ("model-00001-of-00002.safetensors", "model.safetensors.index.json"):
        assert (tmp_path / "rebuilt" / name).read_bytes() == (pair.target / name).read_bytes()
