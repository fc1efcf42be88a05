"""apply_inplace: live NumPy arrays / torch tensors move base <-> target, all or nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdelta
from wdelta.format.container import open_delta
from wdelta.ops import pipeline, tensors

torch = pytest.importorskip("torch")

from test_torch import DTYPES, random_tensor, stepped, words  # noqa: E402

CHUNK = 64


@pytest.fixture(autouse=True, params=["small work local", "all work pooled"])
def _pooled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: as shipped (this module's small tensors are decoded and hashed
    by the calling thread, pipeline.runs_locally) and with every item on the pool."""
    if request.param == "all work pooled":
        monkeypatch.setattr(pipeline, "LOCAL_ELEMENTS", 0)


def model(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    bf16 = rng.standard_normal((40, 30)).astype(np.float32).astype(ml_dtypes.bfloat16)
    return {
        "emb": bf16,
        "norm": rng.standard_normal(50).astype(np.float32),
        "fp8": rng.standard_normal((16, 16)).astype(ml_dtypes.float8_e4m3fn),
        "count": np.arange(7, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float16),
    }


def step(weights: dict[str, Any], seed: int, density: float = 0.05) -> dict[str, Any]:
    """A copy with ``density`` of each tensor's words replaced by random ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in weights.items():
        w = a.reshape(-1).view(f"<u{a.dtype.itemsize}").copy()
        mask = rng.random(len(w)) < density
        w[mask] = rng.integers(0, 2 ** (8 * a.dtype.itemsize), mask.sum(), dtype=w.dtype)
        out[name] = w.view(a.dtype).reshape(a.shape)
    return out


def snapshot(weights: dict[str, Any]) -> dict[str, bytes]:
    return {n: (words(v) if tensors.is_torch(v) else v).tobytes() for n, v in weights.items()}


def make_delta(tmp: Path, base: dict[str, Any], target: dict[str, Any], **kw: Any) -> Path:
    out = tmp / "d.wdelta"
    wdelta.diff(base, target, out, chunk_elements=CHUNK, overwrite=True, **kw)
    return out


def test_numpy_forward_and_back(tmp_path: Path) -> None:
    base = model(0)
    target = step(base, 1)
    delta = make_delta(tmp_path, base, target)
    live = {n: a.copy() for n, a in base.items()}
    ids = {n: id(a) for n, a in live.items()}
    wdelta.apply_inplace(live, delta)
    assert snapshot(live) == snapshot(target)
    assert {n: id(a) for n, a in live.items()} == ids  # the same arrays, updated in place
    wdelta.apply_inplace(live, delta, reverse=True)
    assert snapshot(live) == snapshot(base)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES), rows=st.integers(1, 30), cols=st.integers(1, 30),
    seed=st.integers(0, 2**16), transpose=st.booleans(), density=st.sampled_from([0.02, 0.5, 1]),
)  # fmt: skip
def test_torch_in_place_round_trip(
    tmp_path_factory: pytest.TempPathFactory, dtype: Any, rows: int, cols: int, seed: int,
    transpose: bool, density: float,
) -> None:  # fmt: skip
    """Contiguous or strided torch tensors of every dtype go to the target and back."""
    tmp = tmp_path_factory.mktemp("ip")
    b = random_tensor(dtype, (rows, cols), seed)
    t = stepped(b, seed + 1, density)
    delta = make_delta(tmp, {"w": b}, {"w": t})
    storage = b.clone()
    live = {"w": storage.t() if transpose else storage}
    if transpose:
        delta = make_delta(tmp_path_factory.mktemp("ip"), {"w": b.t()}, {"w": t.t()})
    wdelta.apply_inplace(live, delta)
    assert live["w"].data_ptr() == storage.data_ptr()
    assert np.array_equal(words(live["w"]), words(t.t() if transpose else t))
    wdelta.apply_inplace(live, delta, reverse=True)
    assert np.array_equal(words(live["w"]), words(b.t() if transpose else b))


def test_wrong_base_changes_nothing(tmp_path: Path) -> None:
    base = model(0)
    delta = make_delta(tmp_path, base, step(base, 1))
    live = {n: a.copy() for n, a in base.items()}
    live["norm"][3] = 7.0
    before = snapshot(live)
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply_inplace(live, delta)
    assert snapshot(live) == before


def _count_digests(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Tensor name -> how many times its digest was computed."""
    counts: dict[str, int] = {}
    real = tensors.Slot.digest

    def counting(self: tensors.Slot) -> str:
        counts[self.name] = counts.get(self.name, 0) + 1
        return real(self)

    monkeypatch.setattr(tensors.Slot, "digest", counting)
    return counts


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    for name in ("write", "scatter"):
        real = getattr(tensors.NumpySlot, name)

        def spy(self: tensors.NumpySlot, *a: Any, _real: Any = real, _name: str = name) -> None:
            calls.append(_name)
            _real(self, *a)

        monkeypatch.setattr(tensors.NumpySlot, name, spy)
    return calls


def test_default_hashes_each_tensor_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sparse/dense tensor's output check also proves its input (a bijection), so
    the default reads the weights once; verify_input=True reads them twice."""
    base = model(0)
    delta = make_delta(tmp_path, base, step(base, 1, 0.3))
    live = {n: a.copy() for n, a in base.items()}
    counts = _count_digests(monkeypatch)
    wdelta.apply_inplace(live, delta)
    assert counts == {n: 1 for n in base}
    counts.clear()
    wdelta.apply_inplace(live, delta, reverse=True, verify_input=True)
    modified = {n for n in base if n != "empty"}  # an empty tensor is unchanged
    assert counts == {n: 2 if n in modified else 1 for n in base}
    assert snapshot(live) == snapshot(base)


@pytest.mark.parametrize("verify_input", [False, True])
def test_wrong_base_is_base_mismatch_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify_input: bool
) -> None:
    """By default a wrong input is written, caught by the output check, undone and
    reported as base-mismatch; verify_input=True refuses it before any write."""
    base = model(0)
    target = step(base, 1, 0.3)
    delta = make_delta(tmp_path, base, target)
    flipped = {n: a.copy() for n, a in base.items()}
    flipped["emb"].reshape(-1).view(np.uint16)[5] ^= 1
    for held in (target, flipped):
        live = {n: a.copy() for n, a in held.items()}
        writes = _count_writes(monkeypatch)
        with pytest.raises(wdelta.BaseMismatchError) as err:
            wdelta.apply_inplace(live, delta, verify_input=verify_input)
        assert snapshot(live) == snapshot(held)
        assert bool(writes) is not verify_input
        monkeypatch.undo()
    assert "emb" in str(err.value)


def test_already_at_target_says_so_by_default(tmp_path: Path) -> None:
    base = model(0)
    target = step(base, 1, 0.3)
    delta = make_delta(tmp_path, base, target)
    live = {n: a.copy() for n, a in target.items()}
    with pytest.raises(wdelta.BaseMismatchError, match="already at the delta's target"):
        wdelta.apply_inplace(live, delta)
    assert snapshot(live) == snapshot(target)


def test_full_chunks_inputs_are_checked_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``full`` chunk replaces its input: its output proves nothing about the input,
    which is therefore hashed before the first write."""
    base = model(0)
    target = {n: np.zeros_like(a) for n, a in base.items()}
    delta = make_delta(tmp_path, base, target, reversible=False)
    live = {n: a.copy() for n, a in base.items()}
    live["norm"][0] = 3.0
    before = snapshot(live)
    writes = _count_writes(monkeypatch)
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply_inplace(live, delta)
    assert writes == [] and snapshot(live) == before


def test_write_failing_before_storing_anything_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that raises having stored nothing (a device error at launch, say) must
    not be 'undone' by the inverse transform, which would corrupt its chunk."""
    base = model(0)
    target = step(base, 1, 0.3)
    delta = make_delta(tmp_path, base, target)
    live = {n: a.copy() for n, a in base.items()}
    calls = 0
    original = tensors.NumpySlot.scatter

    def failing(self: tensors.NumpySlot, index: Any, w: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("device lost")
        original(self, index, w)

    monkeypatch.setattr(tensors.NumpySlot, "scatter", failing)
    with pytest.raises(RuntimeError):
        wdelta.apply_inplace(live, delta, threads=1)
    monkeypatch.undo()
    assert snapshot(live) == snapshot(base)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16), density=st.sampled_from([0.02, 0.3, 1.0]),
    side=st.sampled_from(["base", "target", "other"]), reverse=st.booleans(),
    verify_input=st.booleans(), threads=st.integers(1, 3),
)  # fmt: skip
def test_all_or_nothing_property(
    tmp_path_factory: pytest.TempPathFactory, seed: int, density: float, side: str,
    reverse: bool, verify_input: bool, threads: int,
) -> None:  # fmt: skip
    """Whatever the live weights hold, apply_inplace either reaches the output side
    exactly or raises base-mismatch with the weights untouched."""
    base = model(seed)
    target = step(base, seed + 1, density)
    delta = make_delta(tmp_path_factory.mktemp("aon"), base, target)
    held = {"base": base, "target": target, "other": step(base, seed + 2, 0.01)}[side]
    live = {n: a.copy() for n, a in held.items()}
    expected_in, expected_out = (target, base) if reverse else (base, target)
    kw: dict[str, Any] = {"verify_input": verify_input, "threads": threads}
    if snapshot(held) == snapshot(expected_in):
        wdelta.apply_inplace(live, delta, reverse, **kw)
        assert snapshot(live) == snapshot(expected_out)
    else:
        with pytest.raises(wdelta.BaseMismatchError):
            wdelta.apply_inplace(live, delta, reverse, **kw)
        assert snapshot(live) == snapshot(held)


def test_wrong_structure_is_base_mismatch(tmp_path: Path) -> None:
    base = model(0)
    delta = make_delta(tmp_path, base, step(base, 1))
    live = {n: a.copy() for n, a in base.items() if n != "norm"}
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply_inplace(live, delta)


def _corrupt_last_blob(delta: Path) -> None:
    """Flip a byte of the last blob in the file, so earlier chunks are written first.

    Callers write their deltas without inline blobs (``no_inline``): an inline
    blob is covered by the header digest, which refuses the file at open.
    """
    with open_delta(delta) as d:
        chunks = [c for t in d.header.tensors for c in t.chunks if c.length and c.inline is None]
        last = max(chunks, key=lambda c: c.offset)
        at = d.data_start + last.offset + last.length // 2
    data = bytearray(delta.read_bytes())
    data[at] ^= 0x40
    delta.write_bytes(bytes(data))


@pytest.mark.parametrize("reversible", [True, False])
def test_corrupted_blob_midway_restores_base(
    tmp_path: Path, reversible: bool, no_inline: None
) -> None:
    """Chunks written before the corrupted one are undone: by the reverse transform,
    or from the old words kept for ``full`` chunks (non-reversible deltas)."""
    base = model(0)
    # A constant target is cheapest stored as `full` chunks (when allowed).
    target = step(base, 1) if reversible else {n: np.zeros_like(a) for n, a in base.items()}
    delta = make_delta(tmp_path, base, target, reversible=reversible)
    with open_delta(delta) as d:
        encodings = {c.encoding for t in d.header.tensors for c in t.chunks}
    assert ("full" in encodings) is not reversible
    _corrupt_last_blob(delta)
    live = {n: a.copy() for n, a in base.items()}
    written: list[str] = []
    write, scatter = tensors.NumpySlot.write, tensors.NumpySlot.scatter

    def spy_write(self: tensors.NumpySlot, start: int, w: Any) -> None:
        written.append("write")
        write(self, start, w)

    def spy_scatter(self: tensors.NumpySlot, index: Any, w: Any) -> None:
        written.append("scatter")
        scatter(self, index, w)

    tensors.NumpySlot.write = spy_write  # type: ignore[method-assign]
    tensors.NumpySlot.scatter = spy_scatter  # type: ignore[method-assign]
    try:
        with pytest.raises(wdelta.ChecksumMismatchError):
            wdelta.apply_inplace(live, delta)
    finally:
        tensors.NumpySlot.write = write  # type: ignore[method-assign]
        tensors.NumpySlot.scatter = scatter  # type: ignore[method-assign]
    assert written, "the failure must come after some chunks were written"
    assert ("scatter" in written) is reversible  # sparse chunks touch changed words only
    assert snapshot(live) == snapshot(base)


def test_failure_while_writing_restores_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception in the middle of the writes (here the 4th) leaves the base."""
    base = {
        "a": random_tensor(torch.bfloat16, (30, 20), 1),
        "b": random_tensor(torch.float32, (9, 40), 2),
    }
    target = {n: stepped(t, 5, 0.3) for n, t in base.items()}
    delta = make_delta(tmp_path, base, target)
    live = {n: t.clone() for n, t in base.items()}
    calls = 0
    original = tensors.NumpySlot.scatter  # CPU tensors are written through NumPy views

    def failing(self: tensors.NumpySlot, index: Any, w: Any) -> None:
        nonlocal calls
        calls += 1
        original(self, index, w)
        if calls == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(tensors.NumpySlot, "scatter", failing)
    with pytest.raises(KeyboardInterrupt):
        wdelta.apply_inplace(live, delta)
    monkeypatch.undo()
    assert snapshot(live) == snapshot(base)
    wdelta.apply_inplace(live, delta)
    assert snapshot(live) == snapshot(target)


def test_output_digest_mismatch_restores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delta whose last tensor's target digest disagrees with its payloads (as a
    crafted or miswritten delta would): the tensors written before it are rolled back."""
    import dataclasses

    from wdelta.ops import decoder

    base = model(0)
    delta = make_delta(tmp_path, base, step(base, 1, 0.3))
    live = {n: a.copy() for n, a in base.items()}
    real = decoder.plan_steps

    def wrong_last(header: Any, reverse: bool) -> Any:
        steps = real(header, reverse)
        last = max(i for i, s in enumerate(steps) if s.entry.op == "modified")
        steps[last] = dataclasses.replace(steps[last], dst_digest="0" * 64)
        return steps

    monkeypatch.setattr(decoder, "plan_steps", wrong_last)
    with pytest.raises(wdelta.ChecksumMismatchError):
        wdelta.apply_inplace(live, delta)
    monkeypatch.undo()
    assert snapshot(live) == snapshot(base)


def test_added_and_removed_tensors_go_through_the_mapping(tmp_path: Path) -> None:
    base = model(0)
    target = step(base, 1)
    del target["count"]
    target["new"] = np.arange(100, dtype=np.float32).astype(ml_dtypes.bfloat16)
    delta = make_delta(tmp_path, base, target)
    live = {n: a.copy() for n, a in base.items()}
    wdelta.apply_inplace(live, delta)
    assert snapshot(live) == snapshot(target)
    assert live["new"].dtype == np.dtype(ml_dtypes.bfloat16)
    wdelta.apply_inplace(live, delta, reverse=True)
    assert snapshot(live) == snapshot(base)


def test_added_tensor_is_torch_for_a_torch_mapping(tmp_path: Path) -> None:
    base = {"a": random_tensor(torch.bfloat16, (8, 8), 1)}
    target = {"a": stepped(base["a"], 2), "b": random_tensor(torch.float8_e4m3fn, (4, 4), 3)}
    delta = make_delta(tmp_path, base, target)
    live = {"a": base["a"].clone()}
    wdelta.apply_inplace(live, delta)
    assert live["b"].dtype == torch.float8_e4m3fn
    assert snapshot(live) == snapshot(target)


def test_tied_weights_are_updated_once(tmp_path: Path) -> None:
    emb = random_tensor(torch.bfloat16, (16, 8), 1)
    new = stepped(emb, 2, 0.2)
    delta = make_delta(tmp_path, {"emb": emb, "head": emb}, {"emb": new, "head": new})
    shared = emb.clone()
    live = {"emb": shared, "head": shared}
    wdelta.apply_inplace(live, delta)
    assert np.array_equal(words(shared), words(new))


def test_read_only_array_is_refused_untouched(tmp_path: Path) -> None:
    base = model(0)
    delta = make_delta(tmp_path, base, step(base, 1))
    live = {n: a.copy() for n, a in base.items()}
    live["emb"].flags.writeable = False
    before = snapshot(live)
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.apply_inplace(live, delta)
    assert snapshot(live) == before


def test_skipping_output_verification_still_applies(tmp_path: Path) -> None:
    base = model(0)
    target = step(base, 1)
    delta = make_delta(tmp_path, base, target)
    live = {n: a.copy() for n, a in base.items()}
    wdelta.apply_inplace(live, delta, verify_output=False)
    assert snapshot(live) == snapshot(target)


def test_not_reversible_in_reverse_is_refused(tmp_path: Path) -> None:
    base = model(0)
    target = {n: np.zeros_like(a) for n, a in base.items()}
    delta = make_delta(tmp_path, base, target, reversible=False)
    live = {n: a.copy() for n, a in target.items()}
    with pytest.raises(wdelta.NotReversibleError):
        wdelta.apply_inplace(live, delta, reverse=True)
    assert snapshot(live) == snapshot(target)


def test_partial_selection_updates_only_the_selected_tensors(tmp_path: Path) -> None:
    """A tensor-parallel rank holds some tensors only and updates those."""
    base = model(0)
    target = step(base, 1)
    delta = make_delta(tmp_path, base, target)
    rank = {n: base[n].copy() for n in ("emb", "fp8")}
    wdelta.apply_inplace(rank, delta, tensors=lambda n: n in ("emb", "fp8"))
    assert snapshot(rank) == {n: target[n].tobytes() for n in ("emb", "fp8")}
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.apply_inplace(rank, delta, tensors="e*")  # holds fp8, not selected


@pytest.mark.parametrize("transpose", [False, True])
def test_torch_slot_reads_writes_and_hashes_like_numpy(transpose: bool) -> None:
    """The torch-only slot (used off the CPU) agrees with the NumPy view, exercised on CPU."""
    t = random_tensor(torch.bfloat16, (37, 29), 3)
    t = t.t() if transpose else t
    dev, host = tensors.TorchSlot("w", t), tensors.slot("w", t.clone())
    assert dev.digest() == host.digest() == tensors.slot("w", t).digest()
    for start, count in [(0, 100), (500, 573), (1000, 73)]:
        assert np.array_equal(dev.read(start, count), host.read(start, count))
        new = np.random.default_rng(start).integers(0, 2**16, count, dtype=np.uint16)
        dev.write(start, new)
        host.write(start, new)
        dev.invalidate()
        assert np.array_equal(dev.read(start, count), new)
    assert dev.digest() == host.digest()
