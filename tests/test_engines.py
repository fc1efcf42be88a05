"""The engine recipe: a node follows a chain into host memory (checkpoint names) and
feeds only the tensors each version changed to a vLLM-style engine whose parameters
are fused (qkv_proj, gate_up_proj) and split across tensor-parallel ranks."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from wdelta import chain
from wdelta.errors import WdeltaError
from wdelta.ops import engines

torch = pytest.importorskip("torch")

from test_torch import random_tensor, stepped, words  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, LAYERS = 32, 4, 2, 8, 48, 64, 2


def checkpoint(seed: int) -> dict[str, Any]:
    """A small Llama/Qwen2-shaped checkpoint (bf16, random bit patterns, q/k/v biases)."""
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
              "lm_head.weight": (VOCAB, HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
            p + "self_attn.k_proj.bias": (KV_HEADS * HEAD_DIM,),
            p + "self_attn.v_proj.bias": (KV_HEADS * HEAD_DIM,),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": (FFN, HIDDEN),
            p + "mlp.up_proj.weight": (FFN, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FFN),
            p + "input_layernorm.weight": (HIDDEN,),
        }
    items = enumerate(shapes.items())
    return {n: random_tensor(torch.bfloat16, s, seed + k) for k, (n, s) in items}


def expected_shard(full: dict[str, Any], tp: int, rank: int) -> dict[str, Any]:
    """The rank's engine parameters, written out by hand: q/k/v and gate/up stacked
    along dim 0 after each is split by rows; o/down split by columns; k/v heads
    replicated when there are fewer than ranks (rank r holds head r // (tp // heads))."""

    def rows(t: Any, kv: bool = False) -> Any:
        if kv and tp > KV_HEADS:
            return t.reshape(KV_HEADS, HEAD_DIM, *t.shape[1:])[rank // (tp // KV_HEADS)]
        return t.chunk(tp, 0)[rank]

    out = {"model.embed_tokens.weight": rows(full["model.embed_tokens.weight"]),
           "lm_head.weight": rows(full["lm_head.weight"]),
           "model.norm.weight": full["model.norm.weight"]}  # fmt: skip
    for i in range(LAYERS):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for kind in ("weight", "bias"):
            q, k, v = (full[f"{a}{x}_proj.{kind}"] for x in "qkv")
            out[f"{a}qkv_proj.{kind}"] = torch.cat([rows(q), rows(k, True), rows(v, True)])
        out[f"{a}o_proj.weight"] = full[f"{a}o_proj.weight"].chunk(tp, 1)[rank]
        out[f"{m}gate_up_proj.weight"] = torch.cat(
            [rows(full[f"{m}gate_proj.weight"]), rows(full[f"{m}up_proj.weight"])]
        )
        out[f"{m}down_proj.weight"] = full[f"{m}down_proj.weight"].chunk(tp, 1)[rank]
        ln = f"model.layers.{i}.input_layernorm.weight"
        out[ln] = full[ln]
    return {n: t.contiguous() for n, t in out.items()}


class Engine:
    """One rank of a fused, tensor-parallel engine: its parameters allocated from its
    own architecture, loaded through ``load_weights(iterator of (name, tensor))``."""

    def __init__(self, mapping: engines.TensorParallel, tp: int, rank: int) -> None:
        shapes = {n: tuple(t.shape) for n, t in expected_shard(checkpoint(0), tp, rank).items()}
        assert mapping.shard_shapes() == shapes
        self.params = {n: torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16),
                                             requires_grad=False)
                       for n, s in shapes.items()}  # fmt: skip
        self.mapping: engines.TensorParallel = mapping
        self.fed: list[list[str]] = []

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        weights = list(weights)
        self.fed.append([n for n, _ in weights])
        return self.mapping.load_weights(self.params, weights)


def bits(t: Any) -> bytes:
    return bytes(words(t).tobytes())


def assert_rank_is(engine: Engine, full: dict[str, Any], tp: int, rank: int) -> None:
    want = expected_shard(full, tp, rank)
    assert engine.params.keys() == want.keys()
    for name, t in want.items():
        assert bits(engine.params[name].data) == bits(t), name


# Each step changes a few tensors only: (layer, names) by step.
CHANGES = {
    1: ["self_attn.k_proj.weight", "mlp.up_proj.weight"],
    2: ["self_attn.o_proj.weight", "self_attn.q_proj.bias", "mlp.down_proj.weight"],
    3: ["self_attn.v_proj.weight", "mlp.gate_proj.weight", "input_layernorm.weight"],
}


def test_fused_tp_ranks_follow_a_chain_with_changed_tensors_only(tmp_path: Path) -> None:
    store = tmp_path / "store"
    pub = chain.Publisher(chain.Chain(store, tmp_path / "pub-cache"))
    published = [checkpoint(0)]
    pub.publish(published[0])
    node = chain.Chain(store, tmp_path / "node-cache")
    weights, v0 = chain.load(node, device="cpu")
    shapes = {n: tuple(t.shape) for n, t in weights.items()}
    maps = [engines.TensorParallel(shapes, 2, r, head_dim=HEAD_DIM) for r in range(2)]
    ranks = [Engine(mapping, 2, r) for r, mapping in enumerate(maps)]
    for engine in ranks:  # the engine starts at version 0: every tensor
        engine.load_weights(engines.updates(weights, None))
        assert_rank_is(engine, published[0], 2, ranks.index(engine))
    for k, names in CHANGES.items():
        changed = {f"model.layers.{k % LAYERS}.{n}" for n in names}
        new = dict(published[-1])
        for i, name in enumerate(sorted(changed)):
            new[name] = stepped(new[name], 10 * k + i, 0.3)
        published.append(new)
        pub.publish(new)
    at = v0.number
    for version in chain.follow_weights(node, weights, at=at, interval=0, max_polls=1):
        names = engines.changed_names(node, node.head(), at, version.number)
        at = version.number
        assert names is not None
        assert set(names) == {f"model.layers.{at % LAYERS}.{n}" for n in CHANGES[at]}
        for rank, engine in enumerate(ranks):
            loaded = engine.load_weights(engines.updates(weights, names))
            assert len(loaded) <= len(names)
            assert_rank_is(engine, published[at], 2, rank)
    assert at == 3 and all(len(e.fed) == 4 for e in ranks)
    assert all(sorted(e.fed[-1]) == sorted(f"model.layers.1.{n}" for n in CHANGES[3])
               for e in ranks)  # fmt: skip
    # The link read backwards names the same tensors; over three links, every one's.
    assert engines.changed_names(node, node.head(), 3, 2) == names
    every = {f"model.layers.{k % LAYERS}.{n}" for k in CHANGES for n in CHANGES[k]}
    assert engines.changed_names(node, node.head(), 0, 3) == sorted(every)


def test_kv_heads_fewer_than_ranks_are_replicated() -> None:
    """TP 4 with 2 kv heads: ranks 0,1 hold kv head 0 and ranks 2,3 head 1, as vLLM's
    QKVParallelLinear does; without head_dim the split is refused."""
    full = checkpoint(5)
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    for rank in range(4):
        mapping = engines.TensorParallel(shapes, 4, rank, head_dim=HEAD_DIM)
        engine = Engine(mapping, 4, rank)
        engine.load_weights(full.items())
        assert_rank_is(engine, full, 4, rank)
    with pytest.raises(WdeltaError) as info:
        engines.TensorParallel(shapes, 4, 0).shard_shapes()
    assert info.value.category == "bad-argument" and "head_dim" in str(info.value)


def test_wrong_ways_are_refused_before_copying() -> None:
    full = checkpoint(7)
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    engine = Engine(engines.TensorParallel(shapes, 2, 1, head_dim=HEAD_DIM), 2, 1)
    engine.load_weights(full.items())
    before = {n: bits(p.data) for n, p in engine.params.items()}
    name = "model.layers.0.self_attn.k_proj.weight"
    bad_settings: list[dict[str, Any]] = [
        {"tp_size": 3, "rank": 0},  # 4 q heads over 3 ranks
        {"tp_size": 2, "rank": 0, "head_dim": 5},  # 32 rows are no whole heads of 5
        {"tp_size": 2, "rank": 0, "head_dim": None},  # q/k/v stacked: heads needed
        {"tp_size": 2, "rank": 2},  # no rank 2 of 2
        {"tp_size": 0, "rank": 0},
        {"tp_size": 2, "rank": 0, "shapes": [1, 2]},
    ]
    for bad in bad_settings:
        kwargs = {"shapes": shapes, "head_dim": HEAD_DIM} | bad
        with pytest.raises(WdeltaError) as info:
            engines.TensorParallel(**kwargs).shard_shapes()
        assert info.value.category == "bad-argument", bad
    bad_inputs = [
        [("model.layers.9.mlp.up_proj.weight", full[name])],  # unknown tensor
        [(name, full[name][:8])],  # another shape than the checkpoint's
        [(name, full[name].to(torch.float32))],  # not bit for bit
    ]
    for weights in bad_inputs:
        with pytest.raises(WdeltaError) as info:
            engine.load_weights(weights)
        assert info.value.category == "bad-argument"
    del engine.params["lm_head.weight"]
    with pytest.raises(WdeltaError, match=r"no parameter 'lm_head\.weight'"):
        engine.load_weights([("lm_head.weight", full["lm_head.weight"])])
    assert {n: bits(p.data) for n, p in engine.params.items()} == {
        n: b for n, b in before.items() if n != "lm_head.weight"
    }
