"""The SGLang custom weight loader, through a test double of SGLang's
``update_weights_from_tensor`` dispatch.

SGLang 0.5.23 does not import on this CPU machine (its model runner needs
triton and a CUDA torchvision), so ``Runner.update_weights_from_tensor``
mirrors what SGLang's ``WeightUpdater.update_weights_from_tensor`` does with a
``load_format`` named by ``--custom-weight-loader``: import that function and
call ``fn(model, named_tensors)`` on each rank.  The model double has a
``load_weights(iterable of (name, tensor))``, as SGLang's model classes do."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from test_integrations import bits, publish, weights  # noqa: E402
from wdelta.errors import BadArgumentError, WdeltaError  # noqa: E402
from wdelta.integrations import sglang  # noqa: E402
from wdelta.integrations import vllm as wvllm  # noqa: E402


class Model:
    """Parameters by checkpoint name; ``load_weights`` copies what it is given."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.params = {k: v.clone() for k, v in state.items()}
        self.loaded: list[str] = []

    def load_weights(self, named: Any) -> None:
        for name, tensor in named:
            self.params[name].copy_(tensor)
            self.loaded.append(name)


class Runner:
    """SGLang's ``update_weights_from_tensor`` for custom loaders (see the module's doc)."""

    def __init__(self, model: Model, custom_weight_loader: list[str]) -> None:
        self.model, self.custom = model, custom_weight_loader

    def update_weights_from_tensor(self, named_tensors: list[Any], load_format: str) -> None:
        assert load_format in self.custom
        module, _, name = load_format.rpartition(".")
        getattr(importlib.import_module(module), name)(self.model, named_tensors)


def test_sglang_follows_versions_and_refuses_a_tampered_one(tmp_path: Path) -> None:
    states = [weights(i) for i in range(5)]
    publish(tmp_path / "c", states)
    info = wvllm.init_info(str(tmp_path / "c"), str(tmp_path / "cache"), version=0)
    info["prefetch"] = None
    runner = Runner(Model(states[0]), [sglang.LOADER])
    for to in (2, 3, 1):
        runner.update_weights_from_tensor(sglang.request(info, to), load_format=sglang.LOADER)
        assert all(bits(runner.model.params[k]) == bits(v) for k, v in states[to].items())
    node = runner.model._wdelta_node  # type: ignore[attr-defined]
    link = next(k for k in node.chain.head().links if k.target == 4)  # not fetched yet
    obj = tmp_path / "c" / link.key
    obj.write_bytes(obj.read_bytes()[:-1] + bytes([obj.read_bytes()[-1] ^ 1]))
    before = {k: bits(v) for k, v in runner.model.params.items()}
    with pytest.raises(WdeltaError):
        runner.update_weights_from_tensor(sglang.request(info, 4), load_format=sglang.LOADER)
    assert node.version == 1 and {k: bits(v) for k, v in runner.model.params.items()} == before


def test_sglang_loader_refuses_other_tensors() -> None:
    with pytest.raises(BadArgumentError, match="one tensor"):
        sglang.load_version(Model({}), [("model.norm.weight", torch.ones(2))])
    bad = [(sglang.REQUEST, torch.tensor(list(b"{]"), dtype=torch.uint8))]
    with pytest.raises(BadArgumentError, match="not a wdelta request"):
        sglang.load_version(Model({}), bad)
