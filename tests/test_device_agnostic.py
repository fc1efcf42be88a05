"""Tensors off the CPU go through torch operations only: checked here with a fake device.

The VM has no GPU.  ``FakeCuda`` is a CPU tensor that says it lives on
``cuda:0`` and, as a real CUDA tensor does, refuses ``.numpy()``; ``.cpu()``
gives a plain host tensor (a device-to-host copy, counted).  Every path that
would touch a device tensor's memory from NumPy, or copy it to the host once per
chunk instead of once per tensor, fails these tests.  Not covered (it needs a
real device): non-contiguous device tensors (their index is built with
``torch.arange(device=...)``), new tensors moved with ``.to(device)`` (added
tensors, ``changed_tensors``), streams and synchronisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdelta
from wdelta import chain
from wdelta.ops import tensors

torch = pytest.importorskip("torch")

from test_torch import random_tensor, stepped, words  # noqa: E402

TRANSFERS: list[int] = []


class FakeCuda(torch.Tensor):  # type: ignore[misc,name-defined]
    """A CPU tensor posing as a CUDA one."""

    @property
    def device(self) -> Any:
        return torch.device("cuda", 0)

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    def cpu(self, *args: Any, **kwargs: Any) -> Any:
        TRANSFERS.append(self.numel())
        return super().cpu(*args, **kwargs).as_subclass(torch.Tensor)


@pytest.fixture(autouse=True)
def _stay_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """FakeCuda lives on the CPU: indices and words "sent to the device" stay there."""
    monkeypatch.setattr(tensors, "to_device", lambda host, like: host)


def on_device(state: dict[str, Any]) -> dict[str, Any]:
    return {n: t.clone().as_subclass(FakeCuda) for n, t in state.items()}


def host_words(t: Any) -> np.ndarray[Any, Any]:
    return words(t.as_subclass(torch.Tensor))


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(host_words(a[n]), host_words(b[n])) for n in a
    )


def state(seed: int) -> dict[str, Any]:
    return {
        "embed.weight": random_tensor(torch.bfloat16, (64, 32), seed),
        "up.weight": random_tensor(torch.float8_e4m3fn, (32, 48), seed + 1),
        "norm.weight": random_tensor(torch.float32, (32,), seed + 2),
    }


def test_fake_device_refuses_numpy() -> None:
    t = on_device(state(0))["embed.weight"]
    with pytest.raises(TypeError):
        t.numpy()
    with pytest.raises(TypeError):
        t.detach().view(torch.int16).numpy()
    assert isinstance(tensors.slot("w", t), tensors.TorchSlot)


@pytest.mark.parametrize("verify_input", [False, True])
def test_apply_inplace_on_device_copies_each_tensor_whole(
    tmp_path: Path, verify_input: bool
) -> None:
    """Forward and back, bit-exact, with one host copy per tensor per pass over it
    (the chunks are small: a per-chunk transfer would be counted many times).
    Most words change, so no chunk is sparse (those gather only their changes:
    test_device_changes)."""
    base = state(0)
    target = {n: stepped(t, 7, 1.0) for n, t in base.items()}
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta, chunk_elements=256)
    live = on_device(base)
    ptrs = {n: t.data_ptr() for n, t in live.items()}
    TRANSFERS.clear()
    wdelta.apply_inplace(live, delta, verify_input=verify_input)
    assert same(live, target)
    assert {n: t.data_ptr() for n, t in live.items()} == ptrs
    passes = 3 if verify_input else 2  # (inputs,) chunks to decode, outputs to hash
    assert len(TRANSFERS) == passes * len(base)
    wdelta.apply_inplace(live, delta, reverse=True)
    assert same(live, base)


def test_chunks_read_out_of_order_share_one_host_copy() -> None:
    """Workers read a tensor's chunks in any order: the host copy lasts until every
    element was served, not until the last chunk happens to be read."""
    t = on_device(state(0))["embed.weight"]
    slot = tensors.slot("w", t)
    TRANSFERS.clear()
    parts = [slot.read(start, 256) for start in (1792, 0, 1024, 256, 768, 512, 1280, 1536)]
    assert TRANSFERS == [2048]
    order = np.argsort([1792, 0, 1024, 256, 768, 512, 1280, 1536])
    assert np.array_equal(np.concatenate([parts[i] for i in order]), host_words(t))
    slot.read(0, 2048)
    assert TRANSFERS == [2048, 2048]  # a new pass, a new copy


def test_failed_apply_on_device_restores(tmp_path: Path) -> None:
    base = state(0)
    target = {n: stepped(t, 7, 0.3) for n, t in base.items()}
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta, chunk_elements=256)
    live = on_device(base)
    live["norm.weight"].view(torch.int32)[3] ^= 1
    before = {n: host_words(t).copy() for n, t in live.items()}
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply_inplace(live, delta)
    assert all(np.array_equal(host_words(live[n]), before[n]) for n in live)


def test_stream_and_verify_on_device(tmp_path: Path) -> None:
    base = state(0)
    target = {n: stepped(t, 7, 0.3) for n, t in base.items()}
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta)
    live = on_device(base)
    for change in wdelta.changes(delta):  # the engine's own scatter, on its device
        flat = live[change.name].view(-1).view({1: torch.uint8, 2: torch.int16,
                                                4: torch.int32}[change.dtype.size])  # fmt: skip
        idx = torch.arange(change.start, change.start + change.count) if change.positions is None \
            else torch.from_numpy(change.positions)  # fmt: skip
        vals = torch.from_numpy(change.values.view(f"i{change.dtype.size}"))
        if change.op == "set":
            flat[idx] = vals
        elif change.op == "xor":
            flat[idx] ^= vals
        else:
            flat[idx] += vals
    wdelta.verify_weights(live, delta)
    with pytest.raises(wdelta.ChecksumMismatchError):
        wdelta.verify_weights(live, delta, side="base")


def test_publish_and_follow_on_device(tmp_path: Path) -> None:
    """The trainer publishes device tensors, a node follows into device tensors."""
    c = chain.Chain(chain.open_storage(str(tmp_path / "store")), cache=tmp_path / "c")
    pub = chain.Publisher(c)
    published = [state(0)]
    pub.publish(on_device(published[0]))
    node_weights = on_device(published[0])
    for k in range(1, 3):
        published.append({n: stepped(t, k, 0.1) for n, t in published[-1].items()})
        m = pub.publish(on_device(published[-1]))
        assert m.head.digest == chain.weights_digest(published[-1])
    assert chain.weights_digest(on_device(published[-1])) == m.head.digest
    node = chain.Chain(chain.open_storage(str(tmp_path / "store")), cache=tmp_path / "n")
    got = chain.follow_weights(node, node_weights, at=0, interval=0, max_polls=1)
    assert [v.number for v in got] == [1, 2]
    assert same(node_weights, published[-1])
    chain.save_weights(node_weights, tmp_path / "node.safetensors")
    assert chain.weights_digest(node_weights) == m.head.digest
