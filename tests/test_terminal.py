"""Hostile names in human output (issue 12, finding 6).

Tensor names, the generator string and file names reach the terminal only
with control, format and bidi characters escaped; ``--json`` is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import wdelta
from kit import Delta, RawTensor, safetensors_bytes
from test_cli import assert_error, assert_ok, run
from wdelta.cli.terminal import printable

HOSTILE = ["\x1b[2J\x1b[31mred", "ok\rforged row", "\u202eevil", "c1\x9b31m", "tab\there", "\x7f"]


@given(st.text())
def test_printable_output_is_printable(text: str) -> None:
    assert printable(text).isprintable()


@given(st.text().filter(str.isprintable))
def test_printable_text_is_unchanged(text: str) -> None:
    assert printable(text) == text


def test_escapes_are_those_of_repr() -> None:
    for c in "\x00\x1b\n\r\t\x7f\x9b\u200f\u202e\u2028\ud800\U000e0001\U0010ffff":
        assert printable(c) == repr(c)[1:-1]
    assert printable("a\\b") == "a\\b"


def _delta(folder: Path) -> Path:
    base = {name: RawTensor("U8", (2,), b"\x00\x01") for name in HOSTILE}
    target = {name: RawTensor("U8", (2,), b"\x00\x02") for name in HOSTILE}
    (folder / "b.safetensors").write_bytes(safetensors_bytes(base))
    (folder / "t.safetensors").write_bytes(safetensors_bytes(target))
    delta = wdelta.diff(
        folder / "b.safetensors", folder / "t.safetensors", folder / "d.wdelta", compact=False
    )
    d = Delta.read(delta)
    d.header["generator"] = "evil\x1b]0;title\x07"
    return d.write(folder / "hostile\x1b[2J.wdelta")


def _assert_safe(text: str) -> None:
    assert all(line.isprintable() for line in text.split("\n")), repr(text)


def test_inspect_escapes_hostile_names(tmp_path: Path) -> None:
    delta = _delta(tmp_path)
    result = run("inspect", delta)
    assert_ok(result)
    _assert_safe(result.stdout)
    assert "\\x1b[2J\\x1b[31mred" in result.stdout
    assert "ok\\rforged row" in result.stdout
    assert "evil\\x1b]0;title\\x07" in result.stdout
    names = [t["name"] for t in json.loads(run("inspect", "--json", delta).stdout)["tensors"]]
    assert sorted(names) == sorted(HOSTILE)


def test_verify_and_diff_lines_escape_file_names(tmp_path: Path) -> None:
    delta = _delta(tmp_path)
    result = run("verify", delta)
    assert_ok(result)
    _assert_safe(result.stdout)
    assert "hostile\\x1b[2J.wdelta" in result.stdout
    out = tmp_path / "\u202eout.wdelta"
    result = run("diff", tmp_path / "b.safetensors", tmp_path / "t.safetensors", "-o", out)
    assert_ok(result)
    _assert_safe(result.stdout)


def test_the_error_line_escapes_hostile_text(tmp_path: Path) -> None:
    result = run("inspect", tmp_path / "missing\x1b[2J\r.wdelta")
    assert_error(result, "io-error")
    _assert_safe(result.stderr.rstrip("\n"))
    assert "\\x1b[2J" in result.stderr
