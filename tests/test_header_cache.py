"""safetensors headers are parsed once per process and text (checkpoint.safetensors_header)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from wdelta.checkpoint import safetensors_header as sh
from wdelta.dtypes import DTYPES
from wdelta.errors import CheckpointInvalidError


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
