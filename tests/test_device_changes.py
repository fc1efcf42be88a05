"""Change detection and gathering on the tensors' device (``tensors.compare_on_device``,
``TorchSlot.changes``/``gather``/``scatter``): the same bytes as the host path, and
only changed words cross to the host.

The VM has no accelerator: the device path runs on CPU tensors
(``DEVICE_PATH_ON_CPU``), and ``FakeCuda`` (a CPU tensor that says it lives on
``cuda:0`` and counts its ``.cpu()`` copies) measures what crosses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from wdelta.ops import tensors

torch = pytest.importorskip("torch")

from test_device_agnostic import TRANSFERS, host_words, on_device, same  # noqa: E402
from test_torch import _INT, DTYPES, random_tensor, stepped, words  # noqa: E402


@pytest.fixture
def device_path() -> Iterator[None]:
    tensors.DEVICE_PATH_ON_CPU = True
    try:
        yield
    finally:
        tensors.DEVICE_PATH_ON_CPU = False


def _diff_bytes(base: Any, target: Any, path: Path, on_device: bool, chunk: int) -> bytes:
    tensors.DEVICE_PATH_ON_CPU = on_device
    try:
        wdelta.diff(base, target, path, chunk_elements=chunk, overwrite=True)
    finally:
        tensors.DEVICE_PATH_ON_CPU = False
    return path.read_bytes()


def _special(t: Any) -> Any:
    """``t`` with -0.0 and a NaN payload written at its first elements (float dtypes)."""
    if not t.dtype.is_floating_point or t.numel() < 2:
        return t
    out = t.clone()
    ints = out.view(_INT[t.element_size()])
    bits, first = 8 * t.element_size(), (0,) * (t.dim() - 1)
    ints[(*first, 0)] = -(1 << (bits - 1))  # sign bit only: -0.0 (or the e8m0/fnuz NaN)
    ints[(*first, 1)] = (1 << (bits - 1)) - 1  # every bit but the sign: a NaN with a payload
    return out


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.sampled_from([(1,), (7,), (33, 17), (5, 4, 3)]),
    density=st.sampled_from([0.0, 0.001, 0.05, 0.3, 0.9, 1.0]),
    chunk=st.sampled_from([1, 16, 100, 4096]),
    seed=st.integers(0, 2**16),
    transposed=st.booleans(),
)
def test_device_diff_is_byte_identical_to_host(
    tmp_path_factory: pytest.TempPathFactory, dtype: Any, shape: tuple[int, ...],
    density: float, chunk: int, seed: int, transposed: bool,
) -> None:  # fmt: skip
    base_t = random_tensor(dtype, shape, seed)
    target_t = _special(stepped(base_t, seed + 1, density))
    if transposed and len(shape) == 2:  # non-contiguous: read through strides
        base_t, target_t = base_t.t(), target_t.t()
    base, target = {"w": base_t}, {"w": target_t}
    folder = tmp_path_factory.mktemp("d")
    host = _diff_bytes(base, target, folder / "host.wdelta", False, chunk)
    device = _diff_bytes(base, target, folder / "device.wdelta", True, chunk)
    assert device == host


def test_only_changes_cross_to_the_host(tmp_path: Path) -> None:
    """Each base tensor crosses once; of the target, only positions and words changed."""
    base = {"a": random_tensor(torch.bfloat16, (64, 32), 0),
            "b": random_tensor(torch.float8_e4m3fn, (32, 48), 1)}  # fmt: skip
    target = {n: stepped(t, 5, 0.02) for n, t in base.items()}
    changed = sum(int((words(base[n]) != words(target[n])).sum()) for n in base)
    host = tmp_path / "host.wdelta"
    wdelta.diff(base, target, host, chunk_elements=256)
    device_base, device_target = on_device(base), on_device(target)
    TRANSFERS.clear()
    wdelta.diff(device_base, device_target, tmp_path / "d.wdelta", chunk_elements=256)
    assert (tmp_path / "d.wdelta").read_bytes() == host.read_bytes()
    assert sum(TRANSFERS) == sum(t.numel() for t in base.values()) + 2 * changed


def test_mixed_devices_and_shapes_take_the_host_path(tmp_path: Path, device_path: None) -> None:
    """A base on the host, or a changed shape, is not compared on the device."""
    base = {"a": random_tensor(torch.float32, (8, 8), 0), "b": random_tensor(torch.int8, (9,), 1)}
    target = {"a": stepped(base["a"], 2, 0.2), "b": random_tensor(torch.int8, (3, 3), 3)}
    ckpt = tensors.checkpoint_of(target)
    tensors.compare_on_device({"a": base["a"].numpy(), "b": base["b"]}, target, ckpt)
    assert ckpt.tensors["a"]._changes is None and ckpt.tensors["b"]._changes is None
    tensors.compare_on_device(base, target, ckpt)
    assert ckpt.tensors["a"]._changes is not None and ckpt.tensors["b"]._changes is None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_scatters_on_the_device(tmp_path: Path, dtype: Any, device_path: None) -> None:
    base = {"a": random_tensor(dtype, (40, 30), 1), "t": random_tensor(dtype, (12, 10), 2).t()}
    target = {n: _special(stepped(t, 3, 0.01)) for n, t in base.items()}
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta, chunk_elements=128)
    live = {"a": base["a"].clone(), "t": base["t"].clone().t().contiguous().t()}
    assert isinstance(tensors.slot("a", live["a"]), tensors.TorchSlot)
    wdelta.apply_inplace(live, delta)
    assert all(np.array_equal(words(live[n]), words(target[n])) for n in base)
    wdelta.apply_inplace(live, delta, reverse=True)
    assert all(np.array_equal(words(live[n]), words(base[n])) for n in base)


def test_sparse_apply_gathers_only_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding sparse chunks copies only the changed words to the host (the
    input and output digests still read every tensor whole)."""
    # FakeCuda lives on the CPU: indices and words "sent to the device" stay there.
    monkeypatch.setattr(tensors, "to_device", lambda host, like: host)
    base = {"a": random_tensor(torch.bfloat16, (256, 64), 0)}
    target = {"a": stepped(base["a"], 4, 0.005)}
    changed = int((words(base["a"]) != words(target["a"])).sum())
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta, chunk_elements=1024)
    live = on_device(base)
    TRANSFERS.clear()
    wdelta.apply_inplace(live, delta)  # the output digest proves the input (sparse only)
    assert same(live, on_device(target))
    assert sum(TRANSFERS) == changed + base["a"].numel()  # changes + the output's digest
    assert np.array_equal(host_words(live["a"]), words(target["a"]))


def test_failed_apply_restores_scattered_chunks(tmp_path: Path, device_path: None) -> None:
    """A wrong input found by the output digest, after sparse chunks were scattered on
    the device: every word is put back."""
    base = {"a": random_tensor(torch.bfloat16, (64, 64), 0)}
    target = {"a": stepped(base["a"], 4, 0.01)}
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta, chunk_elements=512)
    live = {"a": base["a"].clone()}
    unchanged = int(np.flatnonzero(words(base["a"]) == words(target["a"]))[-1])
    live["a"].view(-1).view(torch.int16)[unchanged] ^= 1
    before = words(live["a"]).copy()
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply_inplace(live, delta)
    assert np.array_equal(words(live["a"]), before)
