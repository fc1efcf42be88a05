"""Checkpoints on disk: single .safetensors files and sharded folders.

The applied output must be byte-identical to the original files (sha256 of
every file, the index included) for headers in any JSON style, any data order
and with metadata; it must load with the ``safetensors`` package; shard counts
may differ between base and target; inputs are never modified.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from kit import (
    DTYPE_NAMES,
    DTYPES,
    RawTensor,
    leftovers,
    random_words,
    safetensors_bytes,
    sha256,
    tree_hashes,
    unchanged_inputs,
    word_dtype,
    write_sharded,
)


def mixed_tensors(seed: int, bump: float = 0.0) -> dict[str, RawTensor]:
    """One tensor of every dtype; ``bump`` changes a fraction of the elements."""
    rng = np.random.default_rng(seed)
    out: dict[str, RawTensor] = {}
    for i, name in enumerate(DTYPE_NAMES):
        size, _ = DTYPES[name]
        shape = [(), (0,), (37,), (5, 31), (130,)][i % 5]
        n = math.prod(shape)
        words = random_words(np.random.default_rng(i), size, n)
        if name == "BOOL":
            words &= np.uint8(1)
        flip = rng.random(n) < bump
        words[flip] ^= word_dtype(size).type(1)
        out[f"layer.{i}.{name.lower()}"] = RawTensor(name, shape, words.tobytes())
    return out


def loads_with_safetensors(path: Path) -> dict[str, Any]:
    """Every file must parse with the reference safetensors implementation."""
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    tensors: dict[str, Any] = {}
    for f in files:
        for name, info in safetensors.deserialize(f.read_bytes()):
            tensors[name] = (info["dtype"], info["shape"], bytes(info["data"]))
    return tensors


def check_apply(base: Path, target: Path, tmp: Path, **diff_options: Any) -> Path:
    """diff then apply both ways; outputs byte-identical, inputs untouched."""
    delta = tmp / "d.wdelta"
    with unchanged_inputs(base, target):
        wdelta.diff(base, target, delta, threads=2, **diff_options)
        with unchanged_inputs(delta):
            out = tmp / ("out" + (".safetensors" if target.is_file() else ""))
            assert wdelta.apply(base, delta, out) == out
            assert tree_hashes(out) == tree_hashes(target)
            assert loads_with_safetensors(out) == loads_with_safetensors(target)
            back = tmp / ("back" + (".safetensors" if base.is_file() else ""))
            wdelta.apply(target, delta, back, reverse=True)
            assert tree_hashes(back) == tree_hashes(base)
            wdelta.verify(delta, base=base)
    assert leftovers(tmp) == []
    return delta


def test_single_file_all_dtypes(tmp_path: Path) -> None:
    base = tmp_path / "base.safetensors"
    target = tmp_path / "target.safetensors"
    base.write_bytes(safetensors_bytes(mixed_tensors(0), {"step": "1"}))
    target.write_bytes(safetensors_bytes(mixed_tensors(1, bump=0.3), {"step": "2"}))
    check_apply(base, target, tmp_path, chunk_elements=16)


def test_header_style_and_data_order_reproduced(tmp_path: Path) -> None:
    """Indented JSON, no padding, non-ASCII metadata, data in reverse order."""
    tensors = mixed_tensors(2)
    names = list(tensors)
    base = tmp_path / "base.safetensors"
    target = tmp_path / "target.safetensors"
    base.write_bytes(safetensors_bytes(tensors, None, indent=1, pad=False))
    target.write_bytes(
        safetensors_bytes(
            mixed_tensors(3, bump=0.1), {"note": "ünïcode ✓", "k": ""},
            data_order=names[::-1], indent=4, pad=False,
        )
    )  # fmt: skip
    check_apply(base, target, tmp_path, chunk_elements=64)


def test_files_written_by_safetensors(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    base_arrays = {
        "emb": rng.standard_normal((64, 33)).astype(np.float32),
        "ids": np.arange(100, dtype=np.int64),
        "mask": rng.random(77) < 0.5,
        "half": rng.standard_normal(300).astype(np.float16),
    }
    target_arrays = dict(base_arrays)
    target_arrays["emb"] = base_arrays["emb"] + (rng.random((64, 33)) < 0.05).astype(np.float32)
    target_arrays["extra"] = np.ones((2, 2), np.uint16)
    del target_arrays["ids"]
    base, target = tmp_path / "base.safetensors", tmp_path / "target.safetensors"
    safetensors.numpy.save_file(base_arrays, str(base), metadata={"format": "np"})
    safetensors.numpy.save_file(target_arrays, str(target), metadata={"format": "np"})
    check_apply(base, target, tmp_path, chunk_elements=256)
    with safetensors.safe_open(str(tmp_path / "out.safetensors"), framework="numpy") as f:
        assert set(f.keys()) == set(target_arrays)
        for name, array in target_arrays.items():
            assert f.get_tensor(name).tobytes() == array.tobytes()


def _shards(tensors: dict[str, RawTensor], count: int) -> list[dict[str, RawTensor]]:
    names = list(tensors)
    return [{n: tensors[n] for n in names[i::count]} for i in range(count)]


def test_sharded_with_different_shard_counts(tmp_path: Path) -> None:
    base, target = tmp_path / "base", tmp_path / "target"
    write_sharded(base, _shards(mixed_tensors(5), 2))
    t = mixed_tensors(6, bump=0.05)
    t["brand.new"] = RawTensor("BF16", (3, 3), bytes(range(18)))
    write_sharded(target, _shards(t, 3))
    check_apply(base, target, tmp_path, chunk_elements=32)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        p.name for p in target.iterdir()
    )


def test_single_file_to_sharded_and_back(tmp_path: Path) -> None:
    single = tmp_path / "single.safetensors"
    single.write_bytes(safetensors_bytes(mixed_tensors(7)))
    sharded = tmp_path / "sharded"
    write_sharded(sharded, _shards(mixed_tensors(8, bump=0.2), 4))
    sub = tmp_path / "a"
    sub.mkdir()
    check_apply(single, sharded, sub)
    sub = tmp_path / "b"
    sub.mkdir()
    check_apply(sharded, single, sub)


def test_base_resharded_differently_still_applies(tmp_path: Path) -> None:
    """The base is identified by its tensors, not by its files."""
    base, resharded, target = tmp_path / "base", tmp_path / "resharded", tmp_path / "target"
    write_sharded(base, _shards(mixed_tensors(9), 2))
    write_sharded(resharded, _shards(mixed_tensors(9), 5), prefix="other")
    write_sharded(target, _shards(mixed_tensors(10, bump=0.1), 2))
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta", chunk_elements=64)
    wdelta.apply(resharded, delta, tmp_path / "out")
    assert tree_hashes(tmp_path / "out") == tree_hashes(target)
    single = tmp_path / "single.safetensors"
    single.write_bytes(safetensors_bytes(mixed_tensors(9)))
    wdelta.apply(single, delta, tmp_path / "out2")
    assert tree_hashes(tmp_path / "out2") == tree_hashes(target)


def test_arrays_and_files_mix(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    base = {"a": rng.standard_normal(50).astype(np.float32), "b": np.arange(9, dtype=np.int8)}
    target_file = tmp_path / "target.safetensors"
    safetensors.numpy.save_file({"a": base["a"] * 2, "b": base["b"]}, str(target_file))
    delta = wdelta.diff(base, target_file, tmp_path / "d.wdelta")
    out = tmp_path / "out.safetensors"
    wdelta.apply(base, delta, out)
    assert sha256(out) == sha256(target_file)
    # In-memory targets get a canonical single-file layout that safetensors reads.
    delta2 = wdelta.diff(target_file, base, tmp_path / "d2.wdelta")
    wdelta.apply(target_file, delta2, tmp_path / "out2.safetensors")
    with safetensors.safe_open(str(tmp_path / "out2.safetensors"), framework="numpy") as f:
        assert {n: f.get_tensor(n).tobytes() for n in f.keys()} == {  # noqa: SIM118
            n: a.tobytes() for n, a in base.items()
        }


def test_folder_with_single_file_and_no_index(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors").write_bytes(safetensors_bytes(mixed_tensors(12)))
    target = tmp_path / "target.safetensors"
    target.write_bytes(safetensors_bytes(mixed_tensors(13, bump=0.1)))
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    wdelta.apply(base / "model.safetensors", delta, tmp_path / "o.safetensors")
    assert sha256(tmp_path / "o.safetensors") == sha256(target)


@st.composite
def raw_checkpoint(draw: st.DrawFn) -> dict[str, RawTensor]:
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9._]{0,12}", fullmatch=True), max_size=5))
    out: dict[str, RawTensor] = {}
    for name in dict.fromkeys(names):
        dtype = draw(st.sampled_from(DTYPE_NAMES))
        shape = tuple(draw(st.lists(st.integers(0, 9), max_size=3)))
        size, _ = DTYPES[dtype]
        data = draw(st.binary(min_size=size * math.prod(shape), max_size=size * math.prod(shape)))
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        out[name] = RawTensor(dtype, shape, data)
    return out


@given(base=raw_checkpoint(), target=raw_checkpoint(), data=st.data())
@settings(max_examples=30)
def test_random_files_byte_identical(
    base: dict[str, RawTensor], target: dict[str, RawTensor], data: st.DataObject
) -> None:
    with TemporaryDirectory() as name:
        tmp = Path(name)
        for path, tensors in ((tmp / "b.safetensors", base), (tmp / "t.safetensors", target)):
            order = data.draw(st.permutations(list(tensors)))
            indent = data.draw(st.sampled_from([None, 0, 2]))
            metadata = data.draw(st.none() | st.dictionaries(st.text(max_size=5), st.text()))
            path.write_bytes(
                safetensors_bytes(tensors, metadata, data_order=order, indent=indent, pad=False)
            )
        chunk = data.draw(st.sampled_from([4, 16, 1000]))
        check_apply(tmp / "b.safetensors", tmp / "t.safetensors", tmp, chunk_elements=chunk)


# ---------------------------------------------------------------- destinations


def _simple_delta(tmp: Path, sharded: bool) -> tuple[Path, Path, Path]:
    base = tmp / "base.safetensors"
    base.write_bytes(safetensors_bytes(mixed_tensors(14)))
    if sharded:
        target = tmp / "target"
        write_sharded(target, _shards(mixed_tensors(15, bump=0.1), 2))
    else:
        target = tmp / "target.safetensors"
        target.write_bytes(safetensors_bytes(mixed_tensors(15, bump=0.1)))
    return base, target, wdelta.diff(base, target, tmp / "d.wdelta")


def test_sharded_output_into_empty_existing_folder(tmp_path: Path) -> None:
    base, target, delta = _simple_delta(tmp_path, sharded=True)
    (tmp_path / "out").mkdir()
    wdelta.apply(base, delta, tmp_path / "out")
    assert tree_hashes(tmp_path / "out") == tree_hashes(target)


def test_sharded_output_into_non_empty_folder_refused(tmp_path: Path) -> None:
    base, _, delta = _simple_delta(tmp_path, sharded=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.apply(base, delta, tmp_path / "out")
    assert tree_hashes(tmp_path / "out") == {"keep.txt": sha256(tmp_path / "out" / "keep.txt")}
    assert leftovers(tmp_path) == []


def test_single_file_output_onto_folder_refused(tmp_path: Path) -> None:
    base, _, delta = _simple_delta(tmp_path, sharded=False)
    (tmp_path / "out").mkdir()
    with pytest.raises(wdelta.BadArgumentError):
        wdelta.apply(base, delta, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == [] and leftovers(tmp_path) == []


def test_single_file_output_replaces_existing_file(tmp_path: Path) -> None:
    base, target, delta = _simple_delta(tmp_path, sharded=False)
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"old")
    wdelta.apply(base, delta, out, overwrite=True)
    assert sha256(out) == sha256(target)


# ---------------------------------------------------------------- malformed checkpoints


def _raw_header_file(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def _header_file(doc: dict[str, Any], data: bytes, extra: bytes = b"") -> bytes:
    return _raw_header_file(json.dumps(doc).encode(), data + extra)


GOOD = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
MALFORMED = {
    "not-safetensors": b"hello world, not a checkpoint",
    "too-short": b"\x01\x02",
    "header-past-end": struct.pack("<Q", 1000) + b"{}",
    "not-json": struct.pack("<Q", 4) + b"{{{{",
    "trailing-bytes": _header_file(GOOD, bytes(8), b"\x00"),
    "short-data": _header_file(GOOD, bytes(7)),
    "overlap": _header_file(
        {
            "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        },
        bytes(8),
    ),
    "hole": _header_file({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),
    "size-mismatch": _header_file(
        {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)
    ),
    "duplicate-key": _raw_header_file(
        b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        b'"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
        b"\x00",
    ),
    "unknown-dtype": _header_file(
        {"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, bytes(1)
    ),
    "bad-metadata": _header_file({"__metadata__": {"a": 1}, **GOOD}, bytes(8)),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoint_refused(case: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(MALFORMED[case])
    good = tmp_path / "good.safetensors"
    good.write_bytes(_header_file(GOOD, bytes(8)))
    (tmp_path / "out").mkdir()
    with unchanged_inputs(bad, good):
        for base, target in ((bad, good), (good, bad)):
            with pytest.raises(wdelta.CheckpointInvalidError):
                wdelta.diff(base, target, tmp_path / "out" / "d.wdelta")
    assert list((tmp_path / "out").iterdir()) == []


def test_unsupported_checkpoint_dtype(tmp_path: Path) -> None:
    f = tmp_path / "f4.safetensors"
    f.write_bytes(_header_file({"x": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"1"))
    with pytest.raises(wdelta.UnsupportedFeatureError):
        wdelta.diff(f, f, tmp_path / "d.wdelta")


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(wdelta.StorageError):
        wdelta.diff(tmp_path / "nope", tmp_path / "nope", tmp_path / "d.wdelta")


@pytest.mark.parametrize("problem", ["missing-shard", "weight-map-disagrees", "two-files"])
def test_malformed_sharded_folder(problem: str, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    write_sharded(folder, _shards(mixed_tensors(16), 2))
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    if problem == "missing-shard":
        (folder / "model-00002-of-00002.safetensors").unlink()
        expected: type = wdelta.WdeltaError
    elif problem == "weight-map-disagrees":
        name, shard = next(iter(doc["weight_map"].items()))
        doc["weight_map"][name] = (
            shard.replace("00001-of", "0000X-of")
            .replace("00002-of", "00001-of")
            .replace("0000X-of", "00002-of")
        )
        index.write_text(json.dumps(doc))
        expected = wdelta.CheckpointInvalidError
    else:
        index.unlink()
        expected = wdelta.CheckpointInvalidError
    with pytest.raises(expected) as info:
        wdelta.diff(folder, folder, tmp_path / "d.wdelta")
    assert info.value.category in ("checkpoint-invalid", "io-error")
    assert not (tmp_path / "d.wdelta").exists() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_large_tensors_default_chunk_size(tmp_path: Path) -> None:
    """Real chunk sizes: 2^22 elements per chunk, a partial last chunk, 64 MiB tensors."""
    rng = np.random.default_rng(17)
    n = (1 << 22) * 3 + 12345
    big = random_words(rng, 2, n)
    changed = big.copy()
    hit = rng.random(n) < 0.02
    changed[hit] += np.uint16(1)
    floats = rng.standard_normal(1 << 22).astype(np.float32)
    base = {"big": RawTensor("BF16", (n,), big.tobytes()),
            "f": RawTensor("F32", (1 << 22,), floats.tobytes())}  # fmt: skip
    target = {"big": RawTensor("BF16", (n,), changed.tobytes()),
              "f": RawTensor("F32", (1 << 22,), (floats * 2).tobytes())}  # fmt: skip
    write_sharded(tmp_path / "base", [base])
    write_sharded(tmp_path / "target", [{"big": target["big"]}, {"f": target["f"]}])
    delta = check_apply(tmp_path / "base", tmp_path / "target", tmp_path)
    with wdelta.open_delta(delta) as d:
        big_entry = next(t for t in d.header.tensors if t.name == "big")
        assert len(big_entry.chunks) == 4
        assert sum(c.changed for c in big_entry.chunks) == int(hit.sum())
    assert delta.stat().st_size < len(big.tobytes()) // 5 + len(floats.tobytes())
