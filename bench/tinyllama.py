"""A small Llama-style model with Hugging Face tensor names, trained on real text on the CPU.

Used to produce real AdamW update traces (bench/realtrace.py) and end-to-end
tests: the weights of each step are saved as a bf16 copy and as an fp8 E4M3
copy with 128x128 block scales, the way RL frameworks ship them to inference.

Everything is deterministic for a given seed on one machine and thread count
(``torch.manual_seed``; the text comes from the Python standard library's own
sources in sorted path order, so it is available offline).

    model = build_model(dim=64, layers=2, heads=4, vocab=256, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch, _ in zip(text_batches(seq_len=64, batch=4, seed=0), range(10)):
        loss = train_step(model, opt, batch)
    weights = bf16_copy(model)      # {"model.embed_tokens.weight": bf16 tensor, ...}
"""

from __future__ import annotations

import math
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

# Largest finite magnitude of float8_e4m3fn.
E4M3_MAX = 448.0
# Text read from the standard library: enough for varied batches, quick to load (~0.1 s).
CORPUS_BYTES = 8 << 20


def ffn_dim(dim: int) -> int:
    """Llama's SwiGLU width: 8/3 of ``dim``, rounded up to a multiple of 256."""
    return (8 * dim // 3 + 255) // 256 * 256


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (``weight``, shape (dim,))."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * scale * self.weight


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim), half-split as in HF Llama."""
    seq, half = x.shape[-2], x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = torch.arange(seq, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention with rotary positions, no biases."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = functional.scaled_dot_product_attention(_rotary(q), _rotary(k), v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        hidden = ffn_dim(dim)
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """Pre-norm decoder layer."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embedding, decoder layers and the final norm (HF's ``model.`` prefix)."""

    def __init__(self, dim: int, layers: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)  # type: ignore[no-any-return]


class TinyLlama(nn.Module):
    """A causal LM: ``forward(tokens (batch, seq))`` gives logits (batch, seq, vocab)."""

    def __init__(self, dim: int, layers: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.model = Decoder(dim, layers, heads, vocab)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(tokens))  # type: ignore[no-any-return]


def build_model(dim: int, layers: int, heads: int, vocab: int, seed: int) -> torch.nn.Module:
    """A freshly initialised fp32 model (normal(0, 0.02) weights, unit norms) for ``seed``.

    ``dim`` must be a multiple of ``heads`` with an even head size.  The
    parameter names are Hugging Face Llama's (``model.embed_tokens.weight``,
    ``model.layers.{i}.self_attn.q_proj.weight``, ..., ``lm_head.weight``).
    dim=512, layers=8, heads=8, vocab=256 has 27.5 M parameters.
    """
    if dim % heads or (dim // heads) % 2:
        raise ValueError(f"dim {dim} must split into {heads} heads of even size")
    torch.manual_seed(seed)
    model = TinyLlama(dim, layers, heads, vocab)
    for name, p in model.named_parameters():
        if not name.endswith("layernorm.weight") and name != "model.norm.weight":
            nn.init.normal_(p, std=0.02)
    return model


def _corpus() -> bytes:
    """The first ``CORPUS_BYTES`` of the standard library's ``.py`` files, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or not path.is_file():
            continue
        data = path.read_bytes()
        parts.append(data)
        size += len(data)
        if size >= CORPUS_BYTES:
            break
    return b"".join(parts)[:CORPUS_BYTES]


def text_batches(seq_len: int, batch: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless int64 batches (batch, seq_len) of byte tokens (vocab 256) at seeded offsets.

    Each row is ``seq_len`` consecutive bytes of the corpus (standard-library
    sources, sorted path order) from an offset drawn by a ``torch.Generator``
    seeded with ``seed``: the same seed gives the same batches.
    """
    data = torch.frombuffer(bytearray(_corpus()), dtype=torch.uint8)
    if len(data) <= seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the corpus ({len(data)} bytes)")
    gen = torch.Generator().manual_seed(seed)
    span = torch.arange(seq_len)
    while True:
        starts = torch.randint(0, len(data) - seq_len, (batch,), generator=gen)
        yield data[starts[:, None] + span].long()


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """One next-token step on ``batch`` (tokens 0..n-2 predict 1..n-1); the loss in nats.

    The model's parameters are the fp32 master weights; ``opt`` is typically
    ``torch.optim.AdamW(model.parameters(), lr=...)``.
    """
    model.train()
    logits = model(batch[:, :-1])
    loss = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return float(loss.item())


def bf16_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter rounded to bfloat16 (contiguous, detached), by HF name."""
    return {
        name: p.detach().to(torch.bfloat16).contiguous() for name, p in model.named_parameters()
    }


def quantize_fp8(weight: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, F32 ``scale_inv``) of a 2-D tensor, per ``block`` x ``block`` tile.

    ``scale_inv`` has shape (ceil(rows/block), ceil(cols/block)) and holds each
    tile's amax / 448 (an all-zero tile gets the smallest normal float32 to
    stay finite); the stored value is ``weight / scale_inv`` rounded to E4M3,
    so ``fp8 * scale_inv`` approximates the weight.
    """
    rows, cols = weight.shape
    r, c = math.ceil(rows / block), math.ceil(cols / block)
    w = weight.detach().float()
    padded = functional.pad(w, (0, c * block - cols, 0, r * block - rows))
    tiles = padded.view(r, block, c, block)
    amax = tiles.abs().amax(dim=(1, 3))
    scale_inv = (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    expanded = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    q = (w / expanded).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.contiguous(), scale_inv.contiguous()


def fp8_copy(model: torch.nn.Module, block: int = 128) -> dict[str, torch.Tensor]:
    """2-D weights as float8_e4m3fn plus ``name + "_scale_inv"`` F32 scales; 1-D stay bf16.

    The scales are recomputed from the fp32 master on every call (as RL
    frameworks re-quantise each step), see ``quantize_fp8``.
    """
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if p.dim() == 2:
            out[name], out[name + "_scale_inv"] = quantize_fp8(p, block)
        else:
            out[name] = p.detach().to(torch.bfloat16).contiguous()
    return out
