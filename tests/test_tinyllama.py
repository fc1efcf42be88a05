"""bench/tinyllama.py: HF names, determinism, fp8 block quantisation (needs torch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import tinyllama  # noqa: E402

sys.path.pop(0)


def _trained(seed: int, steps: int = 2) -> torch.nn.Module:
    model = tinyllama.build_model(dim=32, layers=2, heads=4, vocab=256, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = tinyllama.text_batches(seq_len=33, batch=2, seed=seed)
    for _ in range(steps):
        loss = tinyllama.train_step(model, opt, next(batches))
        assert 0 < loss < 10
    return model


def test_hugging_face_names() -> None:
    names = set(tinyllama.bf16_copy(_trained(0, steps=0)))
    layer = {f"model.layers.{i}.{part}.weight" for i in range(2) for part in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm")}  # fmt: skip
    fixed = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert names == layer | fixed


def test_deterministic_for_a_seed() -> None:
    a, b, c = (tinyllama.bf16_copy(_trained(s)) for s in (0, 0, 1))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)
    first = next(tinyllama.text_batches(16, 3, seed=5))
    assert first.shape == (3, 16) and first.dtype == torch.int64
    assert torch.equal(first, next(tinyllama.text_batches(16, 3, seed=5)))


def test_training_lowers_the_loss() -> None:
    model = tinyllama.build_model(dim=32, layers=1, heads=2, vocab=256, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = next(tinyllama.text_batches(seq_len=33, batch=4, seed=0))
    losses = [tinyllama.train_step(model, opt, batch) for _ in range(20)]
    assert losses[-1] < losses[0] - 0.5


def test_fp8_copy_block_scales() -> None:
    model = _trained(0)
    fp8 = tinyllama.fp8_copy(model, block=16)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert fp8[name].dtype == torch.bfloat16 and name + "_scale_inv" not in fp8
            continue
        q, scale = fp8[name], fp8[name + "_scale_inv"]
        assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        rows, cols = p.shape
        assert scale.shape == (-(-rows // 16), -(-cols // 16))
        expanded = scale.repeat_interleave(16, 0).repeat_interleave(16, 1)[:rows, :cols]
        w = p.detach()
        tile = w[:16, :16].abs().max() / 448
        assert scale[0, 0] == tile
        # E4M3 has 3 mantissa bits: relative error at most 2^-4 above the subnormals.
        error = (q.float() * expanded - w).abs()
        assert bool((error <= w.abs() / 16 + expanded * 2.0**-9).all())
        assert q.float().abs().max() <= 448
