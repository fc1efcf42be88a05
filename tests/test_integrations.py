"""wdelta.integrations without an engine: the node's host copy moved to any version,
the trainer's one-call sync, the plugin's declaration, and imports that stay light."""

from __future__ import annotations

import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from signkit import root_file, signed_chain  # noqa: E402
from wdelta import chain  # noqa: E402
from wdelta.errors import BadArgumentError, WdeltaError  # noqa: E402
from wdelta.integrations import InitInfo, NodeWeights  # noqa: E402
from wdelta.integrations import vllm as wvllm  # noqa: E402


def weights(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(64, 8, generator=g).to(torch.bfloat16),
            "b": torch.randn(32, generator=g)}  # fmt: skip


def publish(folder: Path, states: list[dict[str, Any]]) -> chain.Publisher:
    publisher = chain.Publisher(chain.Chain(folder))
    for step, state in enumerate(states):
        publisher.publish(state, step=step)
    return publisher


def bits(t: Any) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).numpy().tobytes())


def test_node_moves_forward_back_and_names_what_changed(tmp_path: Path) -> None:
    states = [weights(0)]
    for i in range(1, 4):
        s = {k: v.clone() for k, v in states[-1].items()}
        s["a"][i, :] += 1  # only "a" changes
        states.append(s)
    publish(tmp_path / "c", states)
    node = NodeWeights(InitInfo(str(tmp_path / "c"), str(tmp_path / "cache"), prefetch=None))
    for to in (3, 1, 2):
        changed = node.move(to)
        assert [n for n, _ in changed] == ["a"] and node.version == to
        assert all(bits(node.weights[k]) == bits(states[to][k]) for k in states[to])


def test_node_refuses_a_version_an_engine_cannot_take(tmp_path: Path) -> None:
    grown = weights(1)
    grown["a"] = torch.zeros(65, 8, dtype=torch.bfloat16)  # another shape
    added = dict(weights(0), c=torch.ones(3))
    publish(tmp_path / "c", [weights(0), grown, weights(2), added])
    node = NodeWeights(InitInfo(str(tmp_path / "c"), str(tmp_path / "cache"), prefetch=None))
    for to in (1, 3):
        with pytest.raises(BadArgumentError, match="running engine"):
            node.move(to)
        assert node.version == 0 and bits(node.weights["a"]) == bits(weights(0)["a"])
        assert set(node.weights) == {"a", "b"}
    node.move(2)
    assert bits(node.weights["b"]) == bits(weights(2)["b"])


def test_background_prefetch_downloads_new_versions_ahead(tmp_path: Path) -> None:
    publisher = publish(tmp_path / "c", [weights(0)])
    node = NodeWeights(InitInfo(str(tmp_path / "c"), str(tmp_path / "cache"), prefetch=0.02))
    try:
        publisher.publish(weights(1), step=1)
        deadline = time.monotonic() + 30
        while node.prepare(1) and time.monotonic() < deadline:
            time.sleep(0.05)  # the background thread's download is not done yet
        assert node.prepare(1) == 0  # everything the move needs is in the cache
    finally:
        node.close()


class Recorder:
    """A vLLM weight-sync client that records its calls and forwards updates to a node
    (its background prefetch off: the tests' moves download what they need)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.node: NodeWeights | None = None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.calls.append(("init", init_info))
        self.node = NodeWeights(InitInfo(**init_info, prefetch=None))

    def start_weight_update(self) -> None:
        self.calls.append(("start", None))

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.calls.append(("update", update_info))
        assert self.node is not None
        self.node.move(update_info["version"])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(("finish", weight_version))


def test_sync_publishes_then_drives_the_client_to_that_version(tmp_path: Path) -> None:
    publisher = publish(tmp_path / "c", [weights(0)])
    client = Recorder()
    client.init_weight_transfer_engine(
        wvllm.init_info(str(tmp_path / "c"), str(tmp_path / "cache"), version=0)
    )
    version = wvllm.sync(publisher, client, weights(5), step=5)
    assert version.number == 1 and version.step == 5
    assert [c for c, _ in client.calls[1:]] == ["start", "update", "finish"]
    assert client.calls[2][1] == {"version": 1}
    assert client.node is not None
    assert all(bits(client.node.weights[k]) == bits(v) for k, v in weights(5).items())


def test_bad_init_info_is_a_wdelta_error() -> None:
    for bad in ({"chain": "", "cache": "x"}, {"chain": "c", "cache": "x", "version": -1},
                {"chain": "c", "cache": "x", "prefetch": "soon"}):  # fmt: skip
        with pytest.raises(WdeltaError):
            InitInfo(**bad)


def test_the_vllm_plugin_is_declared_and_importing_wdelta_imports_no_engine() -> None:
    points = metadata.entry_points(group="vllm.general_plugins")
    assert [p.value for p in points if p.name == "wdelta"] == ["wdelta.integrations.vllm:register"]
    code = ("import sys, wdelta, wdelta.integrations, wdelta.integrations.vllm; "
            "assert not {'vllm', 'trl', 'sglang'} & set(sys.modules)")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_is_idempotent() -> None:
    pytest.importorskip("vllm")
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    wvllm.register()
    wvllm.register()  # vLLM may load its plugins more than once
    engine = WeightTransferEngineFactory._registry[wvllm.BACKEND]()
    assert engine.__name__ == "WdeltaEngine"


def test_a_signed_chain_is_checked_against_the_nodes_trust_root(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)  # versions 0 and 1, signed by "alice"
    trusted = InitInfo(str(s.store), str(tmp_path / "cache"), trust=str(s.root), version=0,
                       prefetch=None)  # fmt: skip
    node = NodeWeights(trusted)
    assert [n for n, _ in node.move(1)] and node.version == 1
    s.publish(signers=["alice"])
    root_file(tmp_path / "bob.json", "test/run", ["bob"])  # a root that does not trust alice
    distrust = InitInfo(str(s.store), str(tmp_path / "cache2"), trust=str(tmp_path / "bob.json"),
                        version=0, prefetch=None)  # fmt: skip
    with pytest.raises(WdeltaError) as refused:
        NodeWeights(distrust)
    assert refused.value.category == "signature-invalid"
    assert node.move(2) and node.version == 2


def test_the_backend_refuses_bad_info_with_wdelta_errors() -> None:
    pytest.importorskip("vllm")
    from wdelta.integrations.vllm_engine import WdeltaEngine

    engine = object.__new__(WdeltaEngine)  # parsing needs no model
    assert engine.parse_update_info({"version": 3}).version == 3
    assert engine.parse_init_info({"chain": "c", "cache": "k"}).version == 0
    for bad in ({"cache": "k"}, {"chain": "c", "cache": "k", "verison": 1}, ["c"]):
        with pytest.raises(BadArgumentError):
            engine.parse_init_info(bad)
    for bad_update in ({}, {"version": "next"}, {"version": 1, "at": 0}):
        with pytest.raises(BadArgumentError):
            engine.parse_update_info(bad_update)
