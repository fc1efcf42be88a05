"""safetensors headers are parsed once per process and text, and layouts built without a
parse (checkpoint.safetensors_header, layout, gc_pause)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import wdelta
from wdelta.checkpoint import safetensors_header as sh
from wdelta.errors import CheckpointInvalidError, WdeltaError
from wdelta.format.dtypes import DTYPES
from wdelta.io import gc_pause


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The header texts actually parsed from now on (the cache starts empty)."""
    seen: list[bytes] = []
    real: Callable[[bytes], sh.FileLayout] = sh._parse_header

    def counting(data: bytes) -> sh.FileLayout:
        seen.append(data)
        return real(data)

    sh._parse_cached.cache_clear()
    monkeypatch.setattr(sh, "_parse_header", counting)
    yield seen
    sh._parse_cached.cache_clear()


def _text(metadata: dict[str, str] | None = None, names: int = 3) -> bytes:
    listing = [(f"t{i}", DTYPES["BF16"], (i + 1, 2)) for i in range(names)]
    return sh.build_header(listing, metadata).header_text.encode("utf-8")


def _forget(text: bytes, parses: list[bytes]) -> bytes:
    """``text``, with the parses that building it made forgotten."""
    sh._parse_cached.cache_clear()
    parses.clear()
    return text


def test_same_text_parsed_once(parses: list[bytes]) -> None:
    text = _forget(_text(), parses)
    first, second = sh.parse_header(text), sh.parse_header(bytearray(text))  # type: ignore[arg-type]
    assert first == second
    assert parses == [text]


def test_metadata_is_a_fresh_dict_each_time(parses: list[bytes]) -> None:
    text = _forget(_text({"format": "pt"}), parses)
    first = sh.parse_header(text)
    assert first.metadata is not None
    first.metadata["format"] = "changed"
    assert sh.parse_header(text).metadata == {"format": "pt"}
    assert len(parses) == 1


def test_refusals_are_not_cached(parses: list[bytes]) -> None:
    bad = b'{"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,3]}}'
    for _ in range(2):
        with pytest.raises(CheckpointInvalidError):
            sh.parse_header(bad)
    assert parses == [bad, bad]


def test_large_headers_are_not_kept(parses: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    text = _forget(_text(), parses)
    monkeypatch.setattr(sh, "CACHED_MAX_BYTES", len(text) - 1)
    assert sh.parse_header(text) == sh.parse_header(text)
    assert parses == [text, text]


names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda n: n != "__metadata__")
listings = st.dictionaries(
    names,
    st.tuples(st.sampled_from(sorted(DTYPES)), st.lists(st.integers(0, 5), max_size=3)),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(listings, st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5)))
def test_built_layout_equals_the_parse_of_its_text(
    listing: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None
) -> None:
    """build_header makes its layout without parsing its text back: both must agree."""
    tensors = [(name, DTYPES[d], tuple(shape)) for name, (d, shape) in listing.items()]
    built = sh.build_header(tensors, metadata)
    text = built.header_text.encode("utf-8")
    assert len(text) % 8 == 0
    assert sh._parse_header(text) == built


@pytest.mark.parametrize(
    ("tensors", "metadata", "message"),
    [
        ([("__metadata__", "BF16", (2,))], None, "__metadata__"),
        ([("t", "BF16", (2,)), ("t", "F32", (1,))], None, "twice"),
        ([("t", "BF16", (2**25, 2**24))], None, "exceeds the limit"),
        ([("t", "BF16", (2,))], {"k": 1}, "strings to strings"),
        ([("t", "BF16", (2,))], {1: "v"}, "strings to strings"),
        ([("\ud800", "BF16", (2,))], None, "not valid Unicode"),
    ],
)
def test_build_header_refuses_what_a_parse_would(
    tensors: list[tuple[str, str, tuple[int, ...]]], metadata: Any, message: str
) -> None:
    with pytest.raises(WdeltaError, match=message):
        sh.build_header([(n, DTYPES[d], s) for n, d, s in tensors], metadata)


def test_a_delta_parses_each_layout_text_once(
    parses: list[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a delta whose sides share one stored header, too large for the cache:
    the base checkpoint's text is parsed by diff; the delta's layouts are built
    (compact canonical form) or parsed once, not once per side and use."""
    arrays = {f"w{i}": np.full((4, 4), i, np.float32) for i in range(6)}
    changed = {**arrays, "w0": arrays["w0"] + 1}
    base, target, delta = tmp_path / "b.safetensors", tmp_path / "t.safetensors", tmp_path / "d"
    save_file(arrays, str(base), metadata={"format": "pt"})
    save_file(changed, str(target), metadata={"format": "pt"})
    wdelta.diff(base, target, delta)
    stored = base.read_bytes()
    stored_text = stored[8 : 8 + int.from_bytes(stored[:8], "little")].decode()
    monkeypatch.setattr(sh, "CACHED_MAX_BYTES", 0)
    for compact in (True, False):
        wdelta.diff(base, target, delta, compact=compact, overwrite=True)
        parses.clear()
        with wdelta.open_delta(delta) as d:
            layouts = [d.header.base.files[0][1], d.header.target.files[0][1]]
        assert [lay.header_text for lay in layouts] == [stored_text, stored_text]
        assert len(parses) == (0 if compact else 1)


def test_gc_pause_restores_the_callers_setting() -> None:
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(KeyError), gc_pause.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_data_start_is_computed_once_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a checkpoint asks every tensor's offset, which needs the file's data start:
    encoding the header text each time made opening N tensors cost N header encodings."""
    import functools

    computed: list[int] = []
    real = sh.FileLayout.data_start.func

    def counting(self: sh.FileLayout) -> int:
        computed.append(1)
        return real(self)

    prop = functools.cached_property(counting)
    prop.__set_name__(sh.FileLayout, "data_start")
    monkeypatch.setattr(sh.FileLayout, "data_start", prop)
    path = tmp_path / "m.safetensors"
    save_file({f"t{i}": np.full(3, i, np.float32) for i in range(50)}, str(path))
    with wdelta.open_checkpoint(path) as ckpt:
        assert len(ckpt.tensors) == 50
        assert ckpt.tensors["t7"].read(0, 3).view(np.float32).tolist() == [7.0, 7.0, 7.0]
    assert computed == [1]
