"""A tiny real vLLM model on the CPU, and a chain of its checkpoints.

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
from pathlib import Path
from typing import Any

import torch

HIDDEN, HEADS, KV_HEADS, INTER, VOCAB, LAYERS = 64, 4, 2, 128, 256, 2
HEAD_DIM = HIDDEN // HEADS
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
    "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}  # fmt: skip


def shapes() -> dict[str, tuple[int, ...]]:
    """The Hugging Face checkpoint names and shapes of the tiny Qwen2 model."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name, rows in (("q_proj", HIDDEN), ("k_proj", kv), ("v_proj", kv)):
            out[f"{p}self_attn.{name}.weight"] = (rows, HIDDEN)
            out[f"{p}self_attn.{name}.bias"] = (rows,)
        out[f"{p}self_attn.o_proj.weight"] = (HIDDEN, HIDDEN)
        out[f"{p}mlp.gate_proj.weight"] = (INTER, HIDDEN)
        out[f"{p}mlp.up_proj.weight"] = (INTER, HIDDEN)
        out[f"{p}mlp.down_proj.weight"] = (HIDDEN, INTER)
        out[f"{p}input_layernorm.weight"] = (HIDDEN,)
        out[f"{p}post_attention_layernorm.weight"] = (HIDDEN,)
    out["model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (VOCAB, HIDDEN)
    return out


def first_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes().items()}


def rl_step(weights: dict[str, torch.Tensor], seed: int, density: float = 0.02) -> None:
    """Change about ``density`` of every tensor's elements in place (an RL-like step)."""
    g = torch.Generator().manual_seed(seed)
    for t in weights.values():
        flat = t.view(-1)
        hit = torch.rand(flat.shape, generator=g) < density
        flat[hit] = torch.randn(int(hit.sum()), generator=g).to(torch.bfloat16)


def setup_cpu() -> None:
    """What vLLM needs to build a model without an accelerator."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    torch.accelerator.empty_cache = lambda: None  # type: ignore[assignment]
    torch.accelerator.synchronize = lambda *a, **k: None  # type: ignore[assignment]


def init_vllm(folder: Path, tp: int, rank: int, rendezvous: Path) -> Any:
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

    (folder / "config.json").write_text(json.dumps(CONFIG))
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
