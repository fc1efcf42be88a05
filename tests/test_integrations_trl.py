"""The TRL adapter against the real ``trl`` package's weight-transfer protocol
(``AsyncGRPOTrainer(weight_transfer=...)``), driven as the trainer drives it.

The vLLM side is a client that forwards to a node's host copy (the backend's
own logic, tested on a real vLLM model in test_integrations_vllm.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trainer = pytest.importorskip("trl.experimental.async_grpo.async_grpo_trainer")

from test_integrations import Recorder, bits, weights  # noqa: E402
from wdelta import chain  # noqa: E402
from wdelta.integrations.trl import WdeltaWeightTransfer  # noqa: E402


class Server:
    def __init__(self) -> None:
        self.paused = 0

    def pause(self) -> None:
        self.paused += 1

    def resume(self) -> None:
        self.paused -= 1


def test_it_has_trls_protocol() -> None:
    protocol = trainer.WeightTransferProtocol
    wanted = {n for n in vars(protocol) if not n.startswith("_")}
    assert wanted == {"init_weight_transfer", "pause", "send_weights", "resume", "destroy"}
    for name in wanted:
        ours = inspect.signature(getattr(WdeltaWeightTransfer, name))
        assert list(ours.parameters) == list(inspect.signature(getattr(protocol, name)).parameters)


def test_each_sync_is_one_version_and_the_server_follows(tmp_path: Path) -> None:
    client, server = Recorder(), Server()
    transfer = WdeltaWeightTransfer(
        chain.Chain(tmp_path / "c"), client, location=str(tmp_path / "c"),
        cache=str(tmp_path / "cache"), server=server,
    )  # fmt: skip
    transfer.init_weight_transfer()
    for step in range(4):  # as AsyncGRPOTrainer._sync_weight_merged: pause, send, resume
        state = weights(step)
        transfer.pause()
        assert server.paused == 1
        transfer.send_weights(iter(state.items()))
        transfer.resume()
        assert client.node is not None and client.node.version == step
        assert all(bits(client.node.weights[k]) == bits(v) for k, v in state.items())
    transfer.destroy()
    assert [c for c, _ in client.calls].count("init") == 1
    assert client.calls[0][1]["version"] == 0  # the server holds the first version
    assert [info for c, info in client.calls if c == "update"] == [
        {"version": v} for v in (1, 2, 3)
    ]
