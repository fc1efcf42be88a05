"""Whole-delta round trips through the public API with in-memory checkpoints.

For every dtype: Hypothesis-generated base/target pairs (any bit pattern, NaN
payloads, -0.0, subnormals, fp8 specials, empty and 0-d tensors, tensors over
several chunks with a partial last chunk, densities from nothing to all
changed) must come back bit-exact forwards and, with ``reverse=True``,
backwards.  A deterministic matrix checks that the encoder really produces each
encoding (sparse with Rice and bitmap positions, dense, full, unchanged
chunks) and each transform, reading them back from the header.
"""

from __future__ import annotations

import math
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import wdelta
from kit import (
    DTYPE_NAMES,
    DTYPES,
    SPECIALS,
    arrays_digest,
    assert_same_tensors,
    encodings_used,
    ops,
    random_words,
    raw,
    transforms_used,
    word_dtype,
    words_to_array,
)
from wdelta.ops.encoder import DiffOptions, diff_checkpoints
from wdelta.ops.tensors import checkpoint_of

Arrays = dict[str, Any]


def round_trip(base: Arrays, target: Arrays, delta: Path, **diff_options: Any) -> None:
    """diff, then check apply forwards, apply in reverse (or its refusal) and verify."""
    wdelta.diff(base, target, delta, **diff_options)
    forward = wdelta.apply(base, delta, threads=2)
    assert isinstance(forward, dict)
    assert_same_tensors(forward, target)
    with wdelta.open_delta(delta) as d:
        reversible = d.header.reversible
        assert d.header.raw["base"]["digest"] == arrays_digest(base)
        assert d.header.raw["target"]["digest"] == arrays_digest(target)
    if reversible:
        back = wdelta.apply(target, delta, reverse=True, threads=1)
        assert isinstance(back, dict)
        assert_same_tensors(back, base)
    else:
        with pytest.raises(wdelta.NotReversibleError):
            wdelta.apply(target, delta, reverse=True)
    wdelta.verify(delta)
    wdelta.verify(delta, base=base)


# ---------------------------------------------------------------- Hypothesis round trips

SHAPES = [(), (0,), (1,), (7,), (64,), (65,), (200,), (3, 0), (5, 41), (2, 3, 37), (700,)]
# Header validation costs about 0.5 ms per chunk, so tiny chunks only for small tensors.
SMALL_CHUNKS = [1, 3, 7]
CHUNKS = [16, 64, 100, 4096]


@st.composite
def changed_pair(draw: st.DrawFn, name: str) -> tuple[Any, Any]:
    """A base tensor of dtype ``name`` and a target differing at some elements."""
    size, _ = DTYPES[name]
    shape = draw(st.sampled_from(SHAPES))
    n = math.prod(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = random_words(rng, size, n)
    specials = st.sampled_from(SPECIALS[name])
    for i, v in draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), specials), max_size=6)):
        if n:
            base[i] = v
    mask = rng.random(n) < draw(st.sampled_from([0.0, 0.002, 0.03, 0.2, 0.7, 1.0]))
    count = int(mask.sum())
    target = base.copy()
    mode = draw(st.sampled_from(["flip-bit", "add-small", "random", "special"]))
    word = word_dtype(size)
    if mode == "flip-bit":
        target[mask] ^= np.left_shift(np.ones(count, word), rng.integers(0, 8 * size, count, word))
    elif mode == "add-small":
        target[mask] += rng.integers(1, 4, count).astype(word)
    elif mode == "random":
        target[mask] = random_words(rng, size, count)
    else:
        target[mask] = rng.choice(np.array(SPECIALS[name], dtype=word), count)
    for i, v in draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), specials), max_size=6)):
        if n:
            target[i] = v
    return words_to_array(base, name, shape), words_to_array(target, name, shape)


@pytest.mark.parametrize("name", DTYPE_NAMES)
@given(data=st.data())
@settings(max_examples=25)
def test_round_trip_every_dtype(name: str, data: st.DataObject) -> None:
    b, t = data.draw(changed_pair(name))
    base: Arrays = {"w": b}
    target: Arrays = {"w": t}
    if data.draw(st.booleans()):
        base["gone"], target["new"] = b, t
    if data.draw(st.booleans()):
        other = "F32" if name != "F32" else "I16"
        base["retyped"], _ = data.draw(changed_pair(other))
        target["retyped"] = t
    small = max(a.size for a in (*base.values(), *target.values())) <= 64
    chunk = data.draw(st.sampled_from(SMALL_CHUNKS + CHUNKS if small else CHUNKS))
    threads = data.draw(st.sampled_from([1, 2]))
    compact = data.draw(st.booleans())  # the compact header (SPEC §4.11) or the v1 form
    with TemporaryDirectory() as tmp:
        round_trip(base, target, Path(tmp) / "d.wdelta", chunk_elements=chunk, threads=threads,
                   compact=compact)  # fmt: skip


# ---------------------------------------------------------------- encodings are exercised


# Scenarios are built with wide margins so that any encoder minimising the stored
# size makes the same choice: changed values are noise (they cost s bytes in any
# encoding) and sparse chunks are larger than 64 KiB with at most 45% changed,
# so that dense planes, which must encode every run of zeros, cannot compete.
BIG_CHUNK = 1 << 17


def _noise_at(rng: np.random.Generator, base: Any, where: Any) -> Any:
    """A copy of ``base`` whose elements at ``where`` become other random words."""
    target = base.copy()
    word = base.dtype
    target[where] ^= random_words(rng, word.itemsize, len(target[where])) | word.type(1)
    return target


def _scenario(kind: str, size: int) -> tuple[Any, Any, int]:
    """(base words, target words, chunk_elements) that steer the encoder to ``kind``."""
    rng = np.random.default_rng(7)
    word = word_dtype(size)
    if kind == "sparse-rice":  # 8 changes in 2^17: Rice ~20 bytes, a bitmap 16 KiB
        base = random_words(rng, size, BIG_CHUNK)
        return base, _noise_at(rng, base, rng.choice(BIG_CHUNK, 8, replace=False)), BIG_CHUNK
    if kind == "sparse-bitmap":  # 45% changed: no Rice code is smaller than the bitmap
        base = random_words(rng, size, BIG_CHUNK)
        return base, _noise_at(rng, base, rng.random(BIG_CHUNK) < 0.45), BIG_CHUNK
    if kind == "unchanged":  # chunks without a change are always "unchanged"
        base = random_words(rng, size, 4 * 256 + 5)
        return base, _noise_at(rng, base, [3, 100]), 256
    base = random_words(rng, size, 256) | word.type(1)
    if kind == "dense":  # every element changes to noise: sparse adds a bitmap to it
        return base, _noise_at(rng, base, slice(None)), 256
    if kind == "full":  # a constant target: full compresses to nothing
        return base, np.zeros(256, word), 256
    if kind == "sub":  # +1 everywhere: zigzag makes one constant value
        return base, base + word.type(1), 256
    assert kind == "xor"  # one random bit flipped per element
    return base, base ^ np.left_shift(np.ones(256, word), rng.integers(0, 8 * size, 256, word)), 256


# kind -> (encodings that must be used, exactly?) and the transforms used
EXPECTED: dict[str, tuple[set[str] | None, bool, set[str] | None]] = {
    "sparse-bitmap": ({"sparse-bitmap"}, True, None),
    "sparse-rice": ({"sparse-rice"}, True, None),
    "unchanged": ({"unchanged"}, False, None),
    "dense": ({"dense"}, True, None),
    "full": ({"full"}, True, None),
    "sub": (None, False, {"sub"}),
    "xor": (None, False, {"xor"}),
}


@pytest.mark.parametrize("name", DTYPE_NAMES)
@pytest.mark.parametrize("kind", list(EXPECTED))
def test_encoder_uses_each_encoding_and_transform(name: str, kind: str, tmp_path: Path) -> None:
    size, _ = DTYPES[name]
    b, t, chunk = _scenario(kind, size)
    base = {"w": words_to_array(b, name, b.shape)}
    target = {"w": words_to_array(t, name, t.shape)}
    delta = tmp_path / "d.wdelta"
    round_trip(base, target, delta, chunk_elements=chunk, reversible=kind != "full")
    encodings, exact, transforms = EXPECTED[kind]
    if encodings is not None:
        used = encodings_used(delta)
        assert used == encodings if exact else encodings <= used, used
    if transforms is not None:
        assert transforms_used(delta) == transforms


# ---------------------------------------------------------------- bit patterns


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_special_bit_patterns_survive(name: str, tmp_path: Path) -> None:
    """NaN payloads, -0.0, subnormals and fp8 specials change into one another."""
    size, _ = DTYPES[name]
    specials = np.array(SPECIALS[name], dtype=word_dtype(size))
    b = np.tile(specials, len(specials))
    t = np.concatenate([np.roll(specials, i) for i in range(len(specials))])
    base = {"w": words_to_array(b, name, b.shape), "same": words_to_array(b, name, b.shape)}
    target = {"w": words_to_array(t, name, t.shape), "same": words_to_array(b, name, b.shape)}
    delta = tmp_path / "d.wdelta"
    round_trip(base, target, delta, chunk_elements=16)
    # Tensors full of NaNs are still "unchanged" when their bits are equal.
    assert ("same", "unchanged") in ops(delta)


@pytest.mark.parametrize(
    ("dtype", "before", "after"),
    [
        (np.float32, 0x7FC00000, 0x7FC00001),  # quiet NaN -> other quiet NaN payload
        (np.float32, 0x7F800001, 0x7FC00001),  # signalling NaN -> quiet NaN
        (np.float32, 0x00000000, 0x80000000),  # +0.0 -> -0.0 (equal as floats)
        (np.float64, 0x7FF0000000000001, 0x7FF8000000000001),
        (np.float16, 0x7C01, 0x7E01),
        (ml_dtypes.bfloat16, 0x7F81, 0xFF81),
        (ml_dtypes.float8_e4m3fn, 0x7F, 0xFF),  # the two e4m3fn NaNs
        (ml_dtypes.float8_e5m2, 0x7D, 0x7E),
        (ml_dtypes.float8_e8m0fnu, 0xFF, 0x00),
    ],
)
def test_float_equal_but_bits_differ(dtype: Any, before: int, after: int, tmp_path: Path) -> None:
    size = np.dtype(dtype).itemsize
    b = np.full(10, before, word_dtype(size))
    t = b.copy()
    t[4] = after
    base = {"x": b.view(dtype)}
    target = {"x": t.view(dtype)}
    delta = tmp_path / "d.wdelta"
    round_trip(base, target, delta)
    with wdelta.open_delta(delta) as d:
        (entry,) = d.header.tensors
        assert entry.op == "modified" and sum(c.changed for c in entry.chunks) == 1


# ---------------------------------------------------------------- shapes and chunking


def test_partial_last_chunk_and_chunk_count(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    b = rng.standard_normal(5 * 64 + 17).astype(np.float32)
    t = b.copy()
    t[-3] = np.float32(9.5)  # only the partial last chunk changes
    t[70] = -t[70]
    delta = tmp_path / "d.wdelta"
    round_trip({"x": b}, {"x": t}, delta, chunk_elements=64)
    with wdelta.open_delta(delta) as d:
        (entry,) = d.header.tensors
        assert len(entry.chunks) == 6
        assert [c.changed for c in entry.chunks] == [0, 1, 0, 0, 0, 1]
        assert entry.chunks[0].encoding == "unchanged"


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 0, 5), ()])
def test_empty_and_scalar_tensors(shape: tuple[int, ...], tmp_path: Path) -> None:
    n = math.prod(shape)
    base = {"x": np.arange(n, dtype=np.float32).reshape(shape), "k": np.ones(3, np.int8)}
    target = {"x": (np.arange(n, dtype=np.float32) + 1).reshape(shape), "k": np.ones(3, np.int8)}
    round_trip(base, target, tmp_path / "d.wdelta")
    # Empty and 0-d tensors can also be added, removed and change dtype.
    renamed = {"y": base["x"].astype(np.float16), "k": base["k"], "x": base["x"].astype(np.int64)}
    round_trip(base, renamed, tmp_path / "e.wdelta", chunk_elements=2)


def test_all_changed(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    b = rng.standard_normal((33, 31)).astype(ml_dtypes.bfloat16)
    t = (b.astype(np.float32) * -1.5 + 1e-3).astype(ml_dtypes.bfloat16)
    assert np.all(b.view(np.uint16) != t.view(np.uint16))
    delta = tmp_path / "d.wdelta"
    round_trip({"x": b}, {"x": t}, delta, chunk_elements=100)
    with wdelta.open_delta(delta) as d:
        assert [c.changed for c in d.header.tensors[0].chunks] == [100] * 10 + [23]


def test_nothing_changed(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    arrays = {f"t{i}": rng.standard_normal(100 + i).astype(np.float32) for i in range(3)}
    arrays["nan"] = np.full(5, np.nan, np.float64)
    delta = tmp_path / "d.wdelta"
    round_trip(arrays, dict(arrays), delta, chunk_elements=64)
    with wdelta.open_delta(delta) as d:
        assert {t.op for t in d.header.tensors} == {"unchanged"}
        assert d.data_length == 0


def test_empty_checkpoints(tmp_path: Path) -> None:
    round_trip({}, {}, tmp_path / "a.wdelta")
    round_trip({}, {"x": np.ones(3, np.float32)}, tmp_path / "b.wdelta")
    round_trip({"x": np.ones(3, np.float32)}, {}, tmp_path / "c.wdelta")


# ---------------------------------------------------------------- tensor sets


def test_added_removed_and_changed_identity(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    w = rng.standard_normal((20, 10)).astype(np.float32)
    base = {
        "keep": w,
        "gone": np.arange(100, dtype=np.int32),
        "retyped": w,
        "reshaped": w,
        "zz": np.zeros(1, np.uint8),
    }
    target = {
        "keep": w,
        "new": np.arange(50, dtype=np.uint64),
        "retyped": w.astype(np.float64),
        "reshaped": w.reshape(10, 20),
        "zz": np.zeros(1, np.uint8),
    }
    delta = tmp_path / "d.wdelta"
    round_trip(base, target, delta, chunk_elements=64)
    assert ops(delta) == {
        ("keep", "unchanged"), ("gone", "removed"), ("new", "added"), ("zz", "unchanged"),
        ("retyped", "removed"), ("retyped", "added"),
        ("reshaped", "removed"), ("reshaped", "added"),
    }  # fmt: skip
    with wdelta.open_delta(delta) as d:
        names = [(t.name, t.op) for t in d.header.tensors]
    # Sorted by name; a removal sorts before the addition of the same name.
    assert names.index(("retyped", "removed")) + 1 == names.index(("retyped", "added"))
    assert [n for n, _ in names] == sorted(n for n, _ in names)


def test_unicode_names_sorted_by_utf8(tmp_path: Path) -> None:
    names = ["b", "B", "a.weight", "é", "z", "\u4e2d", "\U0001f600", "_x", "0", "", "a/../b"]
    base = {n: np.full(3, i, np.int16) for i, n in enumerate(names)}
    target = {n: np.full(3, i + (i % 2), np.int16) for i, n in enumerate(names)}
    delta = tmp_path / "d.wdelta"
    round_trip(base, target, delta)
    with wdelta.open_delta(delta) as d:
        listed = [t.name for t in d.header.tensors]
    assert listed == sorted(names, key=lambda n: n.encode("utf-8"))


def test_in_memory_inputs_untouched_and_outputs_independent(tmp_path: Path) -> None:
    """Sparse chunks decode in place: that must never reach the caller's arrays."""
    rng = np.random.default_rng(12)
    base = {"w": rng.standard_normal(1000).astype(np.float32), "same": np.arange(5.0)}
    target = {"w": base["w"].copy(), "same": base["same"].copy()}
    target["w"][::97] += 1
    saved = {k: (raw(base[k]), raw(target[k])) for k in base}
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=100)
    forward = wdelta.apply(base, delta)
    back = wdelta.apply(target, delta, reverse=True)
    assert isinstance(forward, dict) and isinstance(back, dict)
    for out in (forward, back):
        for array in out.values():
            array[...] = 0
    assert {k: (raw(base[k]), raw(target[k])) for k in base} == saved


@pytest.mark.parametrize("threads", [1, 2])
def test_in_memory_tensors_of_many_chunks_have_their_file_digests(
    threads: int, tmp_path: Path
) -> None:
    # An in-memory tensor of several chunks is hashed whole by its first chunk's worker,
    # a file's chunk by chunk in order: both give the same tensor entries (digests and
    # chunks; the sides' file layouts differ), the base hashed or taken as known (a
    # publisher's own copy) alike.
    rng = np.random.default_rng(31)
    base = {n: rng.standard_normal(m).astype(np.float32) for n, m in (("a", 1000), ("b", 37))}
    target = {n: w.copy() for n, w in base.items()}
    target["a"][::13] += 1
    target["b"][5] = 0
    save_file(base, str(tmp_path / "b.safetensors"))
    save_file(target, str(tmp_path / "t.safetensors"))
    files = wdelta.diff(tmp_path / "b.safetensors", tmp_path / "t.safetensors",
                        tmp_path / "f.wdelta", chunk_elements=64, threads=threads)  # fmt: skip
    memory = wdelta.diff(base, target, tmp_path / "m.wdelta", chunk_elements=64, threads=threads)
    with wdelta.open_delta(files) as d:
        want = d.header.tensors
    digests = {t.name: t.base_digest for t in want if t.base_digest}
    assert len(want) == 2 and all(len(t.chunks) > 1 for t in want if t.name == "a")
    known = tmp_path / "k.wdelta"
    options = DiffOptions(chunk_elements=64, threads=threads)
    diff_checkpoints(checkpoint_of(base), checkpoint_of(target), known, options,
                     base_digests=digests)  # fmt: skip
    for delta in (memory, known):
        with wdelta.open_delta(delta) as d:
            assert d.header.tensors == want


def test_non_contiguous_arrays_are_read_in_c_order(tmp_path: Path) -> None:
    w = np.arange(60, dtype=np.float32).reshape(6, 10)
    base = {"t": w.T, "s": w[:, ::2]}
    target = {"t": (w + 1).T, "s": w[:, 1::2]}
    out = wdelta.apply(base, wdelta.diff(base, target, tmp_path / "d.wdelta"))
    assert isinstance(out, dict)
    assert raw(out["t"]) == raw(target["t"]) and raw(out["s"]) == raw(target["s"])


# ---------------------------------------------------------------- reversibility


def test_non_reversible_with_full_chunks_and_removals(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    b = rng.integers(1, 2**31, 512, dtype=np.int32)
    base = {"w": b, "gone": np.arange(10, dtype=np.float32), "empty_gone": np.zeros(0, np.int8)}
    target = {"w": np.zeros(512, np.int32)}
    delta = tmp_path / "d.wdelta"
    round_trip(base, target, delta, reversible=False, chunk_elements=128)
    assert encodings_used(delta) == {"full"}
    with wdelta.open_delta(delta) as d:
        assert d.header.reversible is False
        gone = next(t for t in d.header.tensors if t.name == "gone")
        assert gone.op == "removed" and gone.chunks == ()
    # A reversible delta of the same pair keeps removed bytes and never uses full
    # for a modified tensor.
    round_trip(base, target, tmp_path / "r.wdelta", chunk_elements=128)
    with wdelta.open_delta(tmp_path / "r.wdelta") as d:
        assert d.header.reversible is True
        by_op = {t.name: (t.op, {c.encoding for c in t.chunks}) for t in d.header.tensors}
    assert by_op["w"][0] == "modified" and "full" not in by_op["w"][1]
    assert by_op["gone"] == ("removed", {"full"})


def test_non_reversible_removal_only(tmp_path: Path) -> None:
    base = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    round_trip(base, {"a": base["a"]}, tmp_path / "d.wdelta", reversible=False)


def test_non_reversible_without_full_chunks_applies(tmp_path: Path) -> None:
    b = np.arange(100, dtype=np.float32)
    t = b.copy()
    t[3] = 7
    delta = wdelta.diff({"a": b}, {"a": t}, tmp_path / "d.wdelta", reversible=False)
    out = wdelta.apply({"a": b}, delta)
    assert isinstance(out, dict) and raw(out["a"]) == raw(t)


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "options",
    [
        {"chunk_elements": -1},
        {"chunk_elements": 2**26 + 1},
        {"level": 23},
        {"level": -8},
        {"threads": 0},
    ],
)
def test_bad_diff_arguments(options: dict[str, int], tmp_path: Path) -> None:
    a = {"x": np.ones(3, np.float32)}
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.diff(a, a, tmp_path / "d.wdelta", **options)
    assert list(tmp_path.iterdir()) == []


def test_zero_chunk_elements_refused(tmp_path: Path) -> None:
    a = {"x": np.ones(3, np.float32)}
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.diff(a, a, tmp_path / "d.wdelta", chunk_elements=0)


def test_bad_apply_arguments(tmp_path: Path) -> None:
    a = {"x": np.ones(3, np.float32)}
    delta = wdelta.diff(a, a, tmp_path / "d.wdelta")
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.apply(a, delta, threads=0)


def test_unsupported_array_dtype(tmp_path: Path) -> None:
    a = {"x": np.ones(3, np.complex128)}
    with pytest.raises(wdelta.UnsupportedFeatureError):
        wdelta.diff(a, a, tmp_path / "d.wdelta")
    assert list(tmp_path.iterdir()) == []


def test_big_endian_arrays(tmp_path: Path) -> None:
    be = {"x": np.arange(4, dtype=">f4")}
    try:
        delta = wdelta.diff(be, be, tmp_path / "d.wdelta")
    except wdelta.WdeltaError:
        return  # a refusal is acceptable
    out = wdelta.apply(be, delta)
    assert isinstance(out, dict)
    assert out["x"].astype(np.float64).tolist() == [0.0, 1.0, 2.0, 3.0]
