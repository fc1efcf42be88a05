"""Hostile JSON in every reader (issue 12, findings 3 and 4).

A JSON integer of more than 4300 digits (Python's int conversion limit) must
be refused with the reader's own category, never a ``ValueError`` traceback;
headers whose parsed objects would cost far more memory than their bytes are
refused with ``limit-exceeded`` before they are built.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wdelta
from kit import Delta, RawTensor, safetensors_bytes, write_sharded
from test_cli import ENV, assert_error, run
from wdelta.chain.errors import ManifestInvalidError
from wdelta.chain.model.manifest import parse_manifest
from wdelta.format import jsoncost, strictjson
from wdelta.format.container import pack_prefix
from wdelta.limits import JSON_BYTES_FACTOR

HUGE = b"7" * 5000
TENSORS = {"a": RawTensor("F32", (4,), bytes(16))}
CHANGED = {"a": RawTensor("F32", (4,), bytes(15) + b"x")}


def rewrite_header(delta: Path, out: Path, edit: dict[str, object], raw: bytes) -> Path:
    """``delta`` with ``edit`` merged into its header, the string "@@" replaced by
    ``raw`` JSON text, and a fresh header digest."""
    d = Delta.read(delta)
    d.layout()
    d.header.update(edit)
    text = d.header_bytes().rstrip(b" ").replace(b'"@@"', raw)
    header = text + b" " * (-len(text) % 8)
    data = b"".join(d.blobs)
    out.write_bytes(pack_prefix(header, len(data)) + header + data)
    return out


@pytest.fixture(scope="module")
def delta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("json")
    base, target = folder / "b.safetensors", folder / "t.safetensors"
    base.write_bytes(safetensors_bytes(TENSORS))
    target.write_bytes(safetensors_bytes(CHANGED))
    return wdelta.diff(base, target, folder / "d.wdelta", compact=False)


def test_a_huge_integer_in_a_delta_header_is_header_invalid(delta: Path, tmp_path: Path) -> None:
    bad = rewrite_header(delta, tmp_path / "bad.wdelta", {"extra": "@@"}, HUGE)
    assert_error(run("inspect", bad), "header-invalid")
    with pytest.raises(wdelta.WdeltaError) as info:
        wdelta.open_delta(bad)
    assert info.value.category == "header-invalid"


def test_a_huge_integer_in_a_recorded_index_is_header_invalid(delta: Path, tmp_path: Path) -> None:
    d = Delta.read(delta)
    text = json.dumps({"metadata": {"n": "@@"}, "weight_map": {"a": "model.safetensors"}})
    index = {"path": "model.safetensors.index.json", "text": text.replace('"@@"', "7" * 5000)}
    bad = rewrite_header(delta, tmp_path / "bad.wdelta", {"target": {**d.header["target"],
                         "index": index}}, b"")  # fmt: skip
    assert_error(run("inspect", bad), "header-invalid")


def _safetensors_with_huge_shape() -> bytes:
    text = b'{"a":{"dtype":"F32","shape":[' + HUGE + b'],"data_offsets":[0,16]}}'
    return struct.pack("<Q", len(text)) + text + bytes(16)


def test_a_huge_integer_in_a_safetensors_header_is_checkpoint_invalid(
    delta: Path, tmp_path: Path
) -> None:
    base = tmp_path / "b.safetensors"
    base.write_bytes(_safetensors_with_huge_shape())
    assert_error(run("diff", base, base, "-o", tmp_path / "d.wdelta"), "checkpoint-invalid")
    assert_error(run("apply", base, delta, "-o", tmp_path / "o.safetensors"), "checkpoint-invalid")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors"]


def test_a_huge_integer_in_a_shard_index_is_checkpoint_invalid(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    write_sharded(folder, [TENSORS])
    index = folder / "model.safetensors.index.json"
    index.write_bytes(index.read_bytes().replace(b'"total_size": 16', b'"total_size": ' + HUGE))
    assert HUGE in index.read_bytes()
    assert_error(run("diff", folder, folder, "-o", tmp_path / "d.wdelta"), "checkpoint-invalid")


def test_a_huge_integer_in_a_chain_manifest_is_manifest_invalid() -> None:
    with pytest.raises(ManifestInvalidError):
        parse_manifest(b'{"format": "wdelta-chain", "revision": ' + HUGE + b"}")


# ---------------------------------------------------------------- finding 4: memory bound

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def _reference_counts(value: object, depth: int = 1) -> Counter[str]:
    counts: Counter[str] = Counter()
    counts["depth"] = depth if isinstance(value, (dict, list)) else 0
    children: list[object] = []
    if isinstance(value, dict):
        counts["objects"] += 1
        counts["members"] += len(value)
        counts["strings"] += len(value)
        children = list(value.values())
    elif isinstance(value, list):
        counts["arrays"] += 1
        children = value
    elif isinstance(value, str):
        counts["strings"] += 1
    for child in children:
        sub = _reference_counts(child, depth + 1)
        counts["depth"] = max(counts["depth"], sub.pop("depth"))
        counts.update(sub)
    return counts


@given(json_values, st.sampled_from([None, 1, 2]), st.integers(1, 64))
def test_scan_counts_the_tokens_of_any_json(value: object, indent: int | None, block: int) -> None:
    data = json.dumps(value, indent=indent, ensure_ascii=False).encode("utf-8")
    with mock.patch.object(jsoncost, "BLOCK", block):
        got = jsoncost.scan(data)
    want = _reference_counts(value)
    assert (got.objects, got.arrays, got.members, got.strings, got.depth) == (
        want["objects"], want["arrays"], want["members"], want["strings"], want["depth"],
    )  # fmt: skip


# One element of an array repeated to fill a header; the last is a legal
# header's densest entry (an unchanged chunk), which must stay readable.
SHAPES = {
    "dicts": b"{},", "lists": b"[],", "nested": b"[[[[[[[[]]]]]]]],", "one": b'{"":0},',
    "strings": b'"ab",', "floats": b"1.5,", "ints": b"1000,", "zeros": b"0,",
    "emoji": '"\U0001f600",'.encode(), "chunks": b'{"encoding":"unchanged","changed":0},',
}  # fmt: skip


def _array_of(unit: bytes, size: int) -> bytes:
    return b"[" + unit * (size // len(unit)) + b"0]"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_estimate_bounds_what_parsing_allocates(shape: str) -> None:
    data = _array_of(SHAPES[shape], 1 << 19)
    tracemalloc.start()
    strictjson._parse(data, wdelta.HeaderInvalidError, "test", None)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    estimate = jsoncost.parse_cost(jsoncost.scan(data), data)
    assert peak <= estimate
    # Dense hostile shapes are refused; a legal header's densest entries are not.
    assert (estimate <= JSON_BYTES_FACTOR * len(data)) == (shape in {"chunks", "zeros"})


_RSS_PROBE = """
import resource, sys, wdelta
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    wdelta.open_delta(sys.argv[1]).close()
    outcome = "read"
except wdelta.WdeltaError as exc:
    outcome = exc.category
# VmHWM is this process's own peak; ru_maxrss survives exec on Linux and would
# report the peak of the pytest worker that spawned us (torch tests included).
try:
    with open("/proc/self/status") as status:
        hwm = next(line for line in status if line.startswith("VmHWM:"))
    peak = int(hwm.split()[1]) * 1024
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(outcome, peak)
"""


def _peak_rss(delta: Path, n: int) -> tuple[str, int]:
    """Read ``delta`` in a subprocess capped at 10 x n + 4 GiB of address space (a guard)."""
    cap = 10 * n + (4 << 30)
    result = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(delta), str(cap)],
        capture_output=True, text=True, env=ENV, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    outcome, rss = result.stdout.split()
    return outcome, int(rss)


def _hostile_headers(delta: Path, folder: Path, size: int) -> list[tuple[str, Path]]:
    return [
        (
            name,
            rewrite_header(
                delta, folder / f"{name}.wdelta", {"extra": "@@"}, _array_of(unit, size)
            ),
        )
        for name, unit in SHAPES.items()
    ]


def _check_rss(delta: Path, folder: Path, size: int) -> None:
    for name, path in _hostile_headers(delta, folder, size):
        n = path.stat().st_size
        outcome, rss = _peak_rss(path, n)
        print(f"{name}: {outcome}, peak RSS {rss >> 20} MiB for a {n >> 20} MiB header")
        assert outcome in ({"read"} if name in {"chunks", "zeros"} else {"read", "limit-exceeded"})
        assert rss <= 10 * n + (300 << 20), f"{name}: {rss >> 20} MiB for {n >> 20} MB"
        path.unlink()


def test_reading_hostile_headers_stays_within_10n_plus_300_mib(delta: Path, tmp_path: Path) -> None:
    _check_rss(delta, tmp_path, 4 << 20)


@pytest.mark.slow
def test_reading_30_mb_hostile_headers_stays_within_10n_plus_300_mib(
    delta: Path, tmp_path: Path
) -> None:
    _check_rss(delta, tmp_path, 30 << 20)
