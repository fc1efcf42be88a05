"""A real vLLM model class on the CPU, and RL-like steps of its checkpoint (tests, bench).

vLLM's wheel is a CUDA build, but its model classes run on the CPU with
``VLLM_TARGET_DEVICE=cpu``, ``torch.accelerator.empty_cache``/``synchronize``
stubbed (no accelerator here) and a gloo process group:
``initialize_model`` builds a real ``Qwen2ForCausalLM`` whose ``load_weights``
fuses q/k/v and gate/up and keeps this rank's slices.  Importing this module
does not import vLLM; ``build_model`` does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Size:
    """A Qwen2 model's dimensions (the default: a tiny one, 0.1 M parameters)."""

    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    inter: int = 128
    vocab: int = 256
    layers: int = 2

    def config(self) -> dict[str, Any]:
        """The model's config.json."""
        return {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": self.hidden, "intermediate_size": self.inter,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "vocab_size": self.vocab,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
            "tie_word_embeddings": False, "rope_theta": 10000.0,
        }  # fmt: skip


TINY = Size()


def shapes(size: Size = TINY) -> dict[str, tuple[int, ...]]:
    """The Hugging Face checkpoint names and shapes of the Qwen2 model."""
    hidden, inter, vocab = size.hidden, size.inter, size.vocab
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    kv = size.kv_heads * (hidden // size.heads)
    for i in range(size.layers):
        p = f"model.layers.{i}."
        for name, rows in (("q_proj", hidden), ("k_proj", kv), ("v_proj", kv)):
            out[f"{p}self_attn.{name}.weight"] = (rows, hidden)
            out[f"{p}self_attn.{name}.bias"] = (rows,)
        out[f"{p}self_attn.o_proj.weight"] = (hidden, hidden)
        out[f"{p}mlp.gate_proj.weight"] = (inter, hidden)
        out[f"{p}mlp.up_proj.weight"] = (inter, hidden)
        out[f"{p}mlp.down_proj.weight"] = (hidden, inter)
        out[f"{p}input_layernorm.weight"] = (hidden,)
        out[f"{p}post_attention_layernorm.weight"] = (hidden,)
    out["model.norm.weight"] = (hidden,)
    out["lm_head.weight"] = (vocab, hidden)
    return out


def first_weights(seed: int = 0, size: Size = TINY) -> dict[str, torch.Tensor]:
    """Random bf16 weights of the model, by checkpoint name."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes(size).items()}


def rl_step(weights: dict[str, torch.Tensor], seed: int, density: float = 0.02) -> None:
    """Change about ``density`` of every tensor's elements in place (an RL-like step)."""
    g = torch.Generator().manual_seed(seed)
    for t in weights.values():
        flat = t.view(-1)
        hit = torch.rand(flat.shape, generator=g) < density
        flat[hit] = torch.randn(int(hit.sum()), generator=g).to(torch.bfloat16)


def _nothing(*args: Any, **kwargs: Any) -> None:
    """What an accelerator's cache and stream calls do without one."""


def setup_cpu() -> None:
    """What vLLM needs to build a model without an accelerator."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    torch.accelerator.empty_cache = _nothing
    torch.accelerator.synchronize = _nothing


def init_vllm(folder: Path, tp: int, rank: int, rendezvous: Path, size: Size = TINY) -> Any:
    """A VllmConfig for the tiny model at tensor parallelism ``tp``, the group joined."""
    setup_cpu()
    from vllm.config import (
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    (folder / "config.json").write_text(json.dumps(size.config()))
    model = ModelConfig(model=str(folder), tokenizer=str(folder), skip_tokenizer_init=True,
                        dtype="bfloat16", enforce_eager=True)  # fmt: skip
    config = VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"),
                        parallel_config=ParallelConfig(tensor_parallel_size=tp))  # fmt: skip
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"file://{rendezvous}")  # fmt: skip
        initialize_model_parallel(tp)
    return config


def build_model(config: Any) -> Any:
    """A fresh Qwen2ForCausalLM (bf16 parameters) for this rank.  Several live in one
    process here (served, reference, restarted): the attention layers' names, which
    vLLM registers for the forward pass that these tests never run, are forgotten."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    config.compilation_config.static_forward_context.clear()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with set_current_vllm_config(config):
            return initialize_model(config)
    finally:
        torch.set_default_dtype(before)


def params_bits(model: Any) -> dict[str, bytes]:
    """Every parameter's stored bytes, by engine name (bit-for-bit comparisons)."""
    return {n: p.detach().contiguous().view(torch.uint8).numpy().tobytes()
            for n, p in model.named_parameters()}  # fmt: skip
