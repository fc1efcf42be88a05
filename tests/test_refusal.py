"""Refusals: wrong base, truncated or corrupted delta files.

Every refusal must be a WdeltaError with the right category, leave nothing at
the destination (no output, no ``.*.wdelta-tmp-*`` file) and leave the inputs
byte-identical.  Truncation is tried at every offset, single-byte corruption at
every offset, and Hypothesis picks further positions, masks and cuts.
"""

from __future__ import annotations

import itertools
import json
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
import wdelta.ops.api
from kit import (
    PREFIX,
    Delta,
    RawTensor,
    encodings_used,
    expect_refusal,
    random_words,
    safetensors_bytes,
    unchanged_inputs,
    write_sharded,
)

_names = itertools.count()


@dataclass(frozen=True)
class Case:
    """A base/target file pair, its delta, and the delta's bytes and header size."""

    folder: Path
    base: Path
    target: Path
    delta: Path
    data: bytes
    header_length: int

    def corrupt(self, data: bytes) -> Path:
        """A new file holding ``data``.

        Always a fresh name: rewriting a file in place after truncating it makes
        ext4 flush it on close (auto_da_alloc), which costs milliseconds each.
        """
        path = self.folder / "work" / f"bad-{next(_names)}.wdelta"
        path.write_bytes(data)
        return path

    @property
    def out(self) -> Path:
        return self.folder / "out" / "result.safetensors"


def _tensors(seed: int) -> dict[str, RawTensor]:
    rng = np.random.default_rng(seed)
    rice = random_words(np.random.default_rng(1), 2, 4096)
    bitmap = random_words(np.random.default_rng(2), 1, 64)
    multi = random_words(np.random.default_rng(3), 2, 300)
    if seed:
        rice[rng.choice(2048, 10, replace=False)] ^= np.uint16(1)
        bitmap[[5, 50]] ^= np.uint8(4)
        multi[[10, 290]] += np.uint16(1)
    out = {
        "dense": RawTensor("F32", (8, 8), random_words(rng, 4, 64).tobytes()),
        "rice": RawTensor("BF16", (4096,), rice.tobytes()),
        "bitmap": RawTensor("I8", (64,), bitmap.tobytes()),
        "multi": RawTensor("F16", (3, 100), multi.tobytes()),
        "scalar": RawTensor("F64", (), struct.pack("<d", float("nan"))),
        "empty": RawTensor("F32", (0, 4), b""),
    }
    if seed:
        out["new"] = RawTensor("I32", (8,), random_words(rng, 4, 8).tobytes())
    else:
        out["gone"] = RawTensor("U8", (20,), bytes(range(20)))
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    folder = tmp_path_factory.mktemp("refusal")
    base, target = folder / "base.safetensors", folder / "target.safetensors"
    base.write_bytes(safetensors_bytes(_tensors(0), {"format": "pt"}))
    target.write_bytes(safetensors_bytes(_tensors(1), {"format": "pt"}))
    delta = wdelta.diff(base, target, folder / "d.wdelta", chunk_elements=512, compact=False)
    # Every kind of blob must be present for the corruption tests to mean anything
    # (which sparse position coding the encoder picks for these small chunks is its choice).
    used = encodings_used(delta)
    assert {"dense", "unchanged", "full"} <= used and used & {"sparse-rice", "sparse-bitmap"}
    (folder / "work").mkdir()
    (folder / "out").mkdir()
    data = delta.read_bytes()
    return Case(folder, base, target, delta, data, PREFIX.unpack_from(data)[3])


@pytest.fixture(autouse=True)
def _clean_out(case: Case) -> Iterator[None]:
    """A test that fails by producing output must not make the next ones fail."""
    yield
    for p in (case.folder / "out").iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def removed_blob_bytes(case: Case) -> set[int]:
    """File offsets of the blobs of removed tensors (only read by reverse apply)."""
    start = 64 + case.header_length
    return {
        start + c["offset"] + i
        for t, c in Delta.read(case.delta).chunks()
        if t["op"] == "removed"
        for i in range(c["length"])
    }


def interesting_offsets(case: Case) -> Iterator[int]:
    n = case.header_length
    yield from (0, 1, 7, 8, 12, 16, 24, 56, 63, 64, 65, 64 + n - 1, 64 + n, len(case.data) - 1)
    for _, c in Delta.read(case.delta).chunks():
        yield 64 + n + c["offset"]
        yield 64 + n + c["offset"] + c["length"] - 1


def flip(data: bytes, position: int, mask: int) -> bytes:
    out = bytearray(data)
    out[position] ^= mask
    return bytes(out)


def test_the_case_applies(case: Case) -> None:
    wdelta.apply(case.base, case.delta, case.out)
    assert case.out.read_bytes() == case.target.read_bytes()
    case.out.unlink()


# ---------------------------------------------------------------- truncation


def test_truncation_at_every_offset(case: Case) -> None:
    for cut in range(len(case.data)):
        path = case.corrupt(case.data[:cut])
        with pytest.raises(wdelta.TruncatedError):
            wdelta.open_delta(path).close()
        path.unlink()


def test_truncation_at_interesting_offsets_refused_by_apply_and_verify(case: Case) -> None:
    for cut in sorted(set(interesting_offsets(case))):
        bad = case.corrupt(case.data[:cut])
        expect_refusal(case.base, bad, case.out, "truncated")
        with pytest.raises(wdelta.TruncatedError):
            wdelta.verify(bad)


@given(cut=st.integers(0, 2**20))
@settings(max_examples=30)
def test_truncation_hypothesis(case: Case, cut: int) -> None:
    bad = case.corrupt(case.data[: cut % len(case.data)])
    expect_refusal(case.base, bad, case.out, "truncated")


def test_bytes_past_the_data_section(case: Case) -> None:
    for extra in (b"\x00", b" " * 8, case.data):
        expect_refusal(case.base, case.corrupt(case.data + extra), case.out, "header-invalid")


# ---------------------------------------------------------------- corruption


def test_every_single_byte_flip_refused(case: Case) -> None:
    """No byte of a delta file is unprotected: any flip fails, before writing."""
    removed = removed_blob_bytes(case)
    for position in range(len(case.data)):
        path = case.corrupt(flip(case.data, position, 1 << (position % 8)))
        # In memory and on one thread to keep this loop fast; refusals on
        # files are checked by the tests below.
        with pytest.raises(wdelta.WdeltaError):
            wdelta.apply(case.base, path, threads=1)
        if position in removed:
            with pytest.raises(wdelta.ChecksumMismatchError):
                wdelta.apply(case.target, path, case.out, reverse=True)
            with pytest.raises(wdelta.ChecksumMismatchError):
                wdelta.verify(path)
        path.unlink()


def test_corrupt_removed_tensor_blob_refused_forward(case: Case) -> None:
    bad = case.corrupt(flip(case.data, min(removed_blob_bytes(case)), 0x01))
    expect_refusal(case.base, bad, case.out, "checksum-mismatch")


@given(
    flips=st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)), min_size=1, max_size=3)
)
@settings(max_examples=60)
def test_random_corruption_refused(case: Case, flips: list[tuple[int, int]]) -> None:
    data = case.data
    positions = set()
    for position, mask in flips:
        positions.add(position % len(data))
        data = flip(data, position % len(data), mask)
    if data == case.data:
        return  # two flips cancelled out
    bad = case.corrupt(data)
    with unchanged_inputs(case.base, case.target, bad):
        if not positions <= removed_blob_bytes(case):
            with pytest.raises(wdelta.WdeltaError):
                wdelta.apply(case.base, bad, case.out)
            with pytest.raises(wdelta.WdeltaError):
                wdelta.verify(bad, base=case.base)
        with pytest.raises(wdelta.WdeltaError):
            wdelta.apply(case.target, bad, case.out, reverse=True)
        with pytest.raises(wdelta.WdeltaError):
            wdelta.verify(bad)
    assert sorted(case.out.parent.iterdir()) == []


@pytest.mark.parametrize(
    ("offset", "value", "category"),
    [
        (0, b"\x88", "bad-magic"),
        (1, b"w", "bad-magic"),
        (7, b"\x00", "bad-magic"),
        (8, struct.pack("<I", 2), "unsupported-version"),
        (8, struct.pack("<I", 0), "unsupported-version"),
        (8, struct.pack("<I", 2**32 - 1), "unsupported-version"),
        (12, struct.pack("<I", 1), "header-invalid"),
        (16, struct.pack("<Q", 100_000_008), "limit-exceeded"),
        (16, struct.pack("<Q", 2**64 - 8), "limit-exceeded"),
        (16, struct.pack("<Q", 0), "header-invalid"),
        (24, b"\x00" * 32, "checksum-mismatch"),
        (56, struct.pack("<Q", 2**63), "truncated"),
    ],
)
def test_prefix_field_categories(case: Case, offset: int, value: bytes, category: str) -> None:
    data = case.data[:offset] + value + case.data[offset + len(value) :]
    expect_refusal(case.base, case.corrupt(data), case.out, category)


def test_header_length_not_multiple_of_8(case: Case) -> None:
    n = case.header_length
    data = case.data[:16] + struct.pack("<Q", n - 1) + case.data[24:]
    expect_refusal(case.base, case.corrupt(data), case.out, "header-invalid")


def test_data_length_too_small(case: Case) -> None:
    d = len(case.data) - 64 - case.header_length
    data = case.data[:56] + struct.pack("<Q", d - 1) + case.data[64:]
    expect_refusal(case.base, case.corrupt(data), case.out, "header-invalid")


def test_not_a_delta_file(case: Case) -> None:
    for data in (case.base.read_bytes(), b"\x89WDELTX\n" + bytes(100), b"\x89WDE\x00"):
        expect_refusal(case.base, case.corrupt(data), case.out, "bad-magic")
    for data in (b"", b"\x89", b"\x89WDELTA", b"\x89WDELTA\n\x01"):
        expect_refusal(case.base, case.corrupt(data), case.out, "truncated")


def test_header_byte_flip_is_a_checksum_mismatch(case: Case) -> None:
    for position in (64, 64 + case.header_length // 2, 64 + case.header_length - 1):
        bad = case.corrupt(flip(case.data, position, 0x01))
        expect_refusal(case.base, bad, case.out, "checksum-mismatch")


def test_blob_byte_flip_is_a_checksum_mismatch(case: Case) -> None:
    start = 64 + case.header_length
    for t, c in Delta.read(case.delta).chunks():
        for position in (c["offset"], c["offset"] + c["length"] - 1):
            bad = case.corrupt(flip(case.data, start + position, 0x80))
            if t["op"] == "removed":
                expect_refusal(case.target, bad, case.out, "checksum-mismatch", reverse=True)
            else:
                expect_refusal(case.base, bad, case.out, "checksum-mismatch")
            with pytest.raises(wdelta.ChecksumMismatchError):
                wdelta.verify(bad)


def test_missing_delta_file(case: Case) -> None:
    expect_refusal(case.base, case.folder / "work" / "absent.wdelta", case.out, "io-error")


def test_delta_path_is_a_folder(case: Case) -> None:
    expect_refusal(case.base, case.folder / "work", case.out, "io-error")


# ---------------------------------------------------------------- wrong base


def _modify(path: Path, dest: Path, tensor: str, xor: int = 0x01) -> Path:
    """Copy a safetensors file with one bit of one tensor's data flipped."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    begin, end = json.loads(data[8 : 8 + n])[tensor]["data_offsets"]
    assert end > begin
    data[8 + n + (begin + end) // 2] ^= xor
    dest.write_bytes(bytes(data))
    return dest


@pytest.mark.parametrize("tensor", ["dense", "rice", "bitmap", "multi", "scalar", "gone"])
def test_one_flipped_bit_in_the_base(case: Case, tensor: str) -> None:
    wrong = _modify(case.base, case.folder / "work" / "wrong.safetensors", tensor)
    expect_refusal(wrong, case.delta, case.out, "base-mismatch")
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.verify(case.delta, base=wrong)


@pytest.mark.parametrize("tensor", ["dense", "rice", "multi", "new"])
def test_one_flipped_bit_in_the_target_for_reverse(case: Case, tensor: str) -> None:
    wrong = _modify(case.target, case.folder / "work" / "wrong.safetensors", tensor)
    expect_refusal(wrong, case.delta, case.out, "base-mismatch", reverse=True)


def test_base_metadata_is_not_part_of_its_identity(case: Case) -> None:
    other = case.folder / "work" / "meta.safetensors"
    other.write_bytes(safetensors_bytes(_tensors(0), {"format": "np", "extra": "x"}, indent=2))
    wdelta.apply(other, case.delta, case.out)
    assert case.out.read_bytes() == case.target.read_bytes()
    case.out.unlink()


def test_applying_to_the_target_is_refused(case: Case) -> None:
    expect_refusal(case.target, case.delta, case.out, "base-mismatch")
    expect_refusal(case.base, case.delta, case.out, "base-mismatch", reverse=True)


@pytest.fixture
def no_output_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if apply opens any output before refusing."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an output was opened before the input was checked")

    monkeypatch.setattr(wdelta.ops.api, "atomic_file", forbidden)
    monkeypatch.setattr(wdelta.ops.api, "atomic_folder", forbidden)


def _variant(case: Case, change: str) -> Path:
    tensors = _tensors(0)
    if change == "missing":
        del tensors["gone"]
    elif change == "extra":
        tensors["surplus"] = RawTensor("U8", (1,), b"\x00")
    elif change == "shape":
        tensors["dense"] = RawTensor("F32", (64,), tensors["dense"].data)
    elif change == "dtype":
        tensors["dense"] = RawTensor("I32", (8, 8), tensors["dense"].data)
    elif change == "renamed":
        tensors["dense2"] = tensors.pop("dense")
    path = case.folder / "work" / f"{change}.safetensors"
    path.write_bytes(safetensors_bytes(tensors))
    return path


@pytest.mark.parametrize("change", ["missing", "extra", "shape", "dtype", "renamed"])
@pytest.mark.usefixtures("no_output_opened")
def test_wrong_tensor_set_refused_before_writing(case: Case, change: str) -> None:
    expect_refusal(_variant(case, change), case.delta, case.out, "base-mismatch")
    with pytest.raises(wdelta.BaseMismatchError):
        wdelta.verify(case.delta, base=_variant(case, change))


@pytest.mark.usefixtures("no_output_opened")
def test_wrong_tensor_set_refused_before_writing_sharded_output(case: Case) -> None:
    folder = case.folder / "work" / "sharded-target"
    t = _tensors(1)
    names = list(t)
    write_sharded(folder, [{n: t[n] for n in names[:3]}, {n: t[n] for n in names[3:]}])
    delta = case.folder / "work" / "sharded.wdelta"
    wdelta.diff(case.base, folder, delta, chunk_elements=64)
    out = case.folder / "out" / "folder"
    expect_refusal(_variant(case, "missing"), delta, out, "base-mismatch")


@pytest.mark.usefixtures("no_output_opened")
def test_not_reversible_refused_before_writing(case: Case, tmp_path: Path) -> None:
    delta = wdelta.diff(case.base, case.target, tmp_path / "nr.wdelta", reversible=False)
    with wdelta.open_delta(delta) as d:
        assert d.header.reversible is False
    expect_refusal(case.target, delta, case.out, "not-reversible", reverse=True)
