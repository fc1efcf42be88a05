"""Coded values (feature ``coded-values``, SPEC §7.6.6): round trips, refusals, the writer, the CLI.

The reader's rules V1-V12 are also checked by the conformance vectors; here,
Hypothesis round trips of every form and width, refusal of every truncation
and of bit flips with a WdeltaError only, the ULEB128 helper, and what the
writer and the CLI record.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import wdelta
from kit import RawTensor, safetensors_bytes
from test_cli import assert_ok, run
from wdelta.codec import blob, chunk, coded_values, leb128, sparse
from wdelta.errors import EncodingInvalidError, IndexOutOfRangeError, WdeltaError
from wdelta.policy import chunk as chunk_policy
from wdelta.policy import rice, values
from wdelta.policy.values import SparseValues

WIDTHS = (np.uint8, np.uint16, np.uint32, np.uint64)


@st.composite
def value_arrays(draw: st.DrawFn) -> np.ndarray:
    """Skewed (a few frequent words, a tail of any word) or uniform words of any width."""
    dtype = np.dtype(draw(st.sampled_from(WIDTHS)))
    top = (1 << (8 * dtype.itemsize)) - 1
    n = draw(st.integers(0, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        return rng.integers(0, top, size=n, dtype=dtype, endpoint=True)
    common = rng.integers(0, top, size=draw(st.integers(1, 4)), dtype=dtype, endpoint=True)
    out = common[rng.integers(0, len(common), size=n)]
    tail = rng.random(n) < draw(st.floats(0, 0.5))
    out[tail] = rng.integers(0, top, size=int(tail.sum()), dtype=dtype, endpoint=True)
    small = draw(st.booleans())
    if small:  # small words: the final Rice coding pays
        out &= dtype.type(draw(st.integers(0, 300)) & top)
    return out


def _decode(data: bytes, count: int, dtype: np.dtype) -> np.ndarray:
    return coded_values.decode(memoryview(data), count, dtype)


@settings(max_examples=150, deadline=None)
@given(
    v=value_arrays(), levels=st.integers(0, coded_values.MAX_LEVELS), final=st.sampled_from([0, 1])
)
def test_every_coded_form_round_trips(v: np.ndarray, levels: int, final: int) -> None:
    coded = values.encode_as(v, levels, final)
    assert coded.data[0] == min(levels, len(np.unique(v)))
    got = _decode(coded.data, len(v), v.dtype)
    assert got.dtype == v.dtype and np.array_equal(got, v)
    assert coded.sections == sorted(coded.sections)
    assert all(0 < s <= len(coded.data) for s in coded.sections)


@settings(max_examples=150, deadline=None)
@given(v=value_arrays())
def test_the_encoder_choice_round_trips(v: np.ndarray) -> None:
    coded = values.encode(v)
    if coded is not None:
        assert np.array_equal(_decode(coded.data, len(v), v.dtype), v)


@settings(max_examples=100, deadline=None)
@given(v=value_arrays(), levels=st.integers(0, 4), final=st.sampled_from([0, 1]), data=st.data())
def test_truncated_or_extended_sections_are_refused(
    v: np.ndarray, levels: int, final: int, data: st.DataObject
) -> None:
    coded = values.encode_as(v, levels, final).data
    cut = data.draw(st.integers(0, len(coded) - 1))
    with pytest.raises(EncodingInvalidError):
        _decode(coded[:cut], len(v), v.dtype)
    with pytest.raises(EncodingInvalidError):
        _decode(coded + b"\x00", len(v), v.dtype)


@settings(max_examples=200, deadline=None)
@given(v=value_arrays(), levels=st.integers(0, 4), final=st.sampled_from([0, 1]), data=st.data())
def test_bit_flips_give_a_wdelta_error_or_other_values_never_a_crash(
    v: np.ndarray, levels: int, final: int, data: st.DataObject
) -> None:
    """A flipped bit either breaks a rule (WdeltaError) or spells other valid
    values of the same count (the blob checksum is what catches those)."""
    coded = bytearray(values.encode_as(v, levels, final).data)
    bit = data.draw(st.integers(0, 8 * len(coded) - 1))
    coded[bit >> 3] ^= 1 << (bit & 7)
    try:
        got = _decode(bytes(coded), len(v), v.dtype)
    except WdeltaError:
        return
    assert got.dtype == v.dtype and len(got) == len(v)


@settings(max_examples=150, deadline=None)
@given(v=value_arrays(), data=st.data())
def test_whole_sparse_payload_bit_flips_are_refused_or_decode_in_range(
    v: np.ndarray, data: st.DataObject
) -> None:
    """Head, positions and coded values together (what a decoder gets from a blob):
    a flipped bit is a WdeltaError or decodes to positions in the chunk, one word each."""
    assume(len(v) > 0)
    m = 2 * len(v) + data.draw(st.integers(0, 64))
    pos = np.sort(data.draw(st.permutations(range(m)))[: len(v)]).astype(np.int64)
    recoded = SparseValues(sparse.parts(pos, v, m, rice.plan_positions(pos, m))).coded(m, 1 << 20)
    assume(recoded is not None)
    assert recoded is not None
    got_pos, got = sparse.decode(recoded[0], m, v.dtype, coded=True, changed=len(v))
    assert np.array_equal(got_pos, pos) and np.array_equal(got, v)
    flipped = bytearray(recoded[0])
    bit = data.draw(st.integers(0, 8 * len(flipped) - 1))
    flipped[bit >> 3] ^= 1 << (bit & 7)
    try:
        got_pos, got = sparse.decode(bytes(flipped), m, v.dtype, coded=True, changed=len(v))
    except WdeltaError:
        return
    assert len(got_pos) == len(got) and got.dtype == v.dtype
    assert got_pos.size == 0 or (got_pos.min() >= 0 and got_pos.max() < m)


def _section(levels: int, splits: list[int], body: bytes, dtype: np.dtype) -> bytes:
    return bytes([levels]) + np.array(splits, dtype=dtype).tobytes() + body


_BAD, _OUT = EncodingInvalidError, IndexOutOfRangeError


@pytest.mark.parametrize(
    ("levels", "splits", "body", "error", "match"),
    [
        (9, [], b"", _BAD, "split levels"),  # V1
        (2, [1, 1], b"", _BAD, "equal"),  # V2
        (1, [1], b"\x20\x00\x00", _BAD, "> 31"),  # V3 level
        (0, [], b"\x01\x08\x00", _BAD, ">= 8"),  # V3 final
        (1, [1], b"\x00\x80\x00", _BAD, "minimal"),  # V4
        (1, [1], b"\x00\x05\x01", _BAD, "past"),  # V5
        (1, [1], b"\x00\x01\x00\x00", _BAD, "1 bit"),  # V6
        (1, [1], b"\x01\x01\x01\x02\x00", _BAD, "padding"),  # V7
        (1, [1], b"\x00\x01\x1f\x00", _OUT, "among"),  # V8: c_1 > n_1
        (1, [1], b"\x00\x01\x10\x00", _OUT, "past"),  # V8: position 4 of 4
        (0, [], b"\x02", _BAD, "final coding"),  # V9
        (0, [], b"\x01\x00\x01\x03", _BAD, "codes"),  # V10
        (0, [], b"\x01\x07\x01\x3c\x00\x00\x00\x00", _BAD, "bits or more"),  # V11
        (0, [], b"\x00\x05\x06\x07\x08\x09", _BAD, "after"),  # V12
    ],
)
def test_each_rule_is_refused(
    levels: int, splits: list[int], body: bytes, error: type[Exception], match: str
) -> None:
    """V1-V12 on 4 one-byte values (one case per rule and field)."""
    with pytest.raises(error, match=match):
        _decode(_section(levels, splits, body, np.dtype(np.uint8)), 4, np.dtype(np.uint8))


def test_a_final_rice_section_spelled_by_hand() -> None:
    """L = 0, final Rice k = 1 of the words 1, 0, 5: q = 0, 0, 2 and r = 1, 0, 1."""
    data = bytes([0, 1, 1, 1, 0b10011, 0b101])
    assert _decode(data, 3, np.dtype(np.uint8)).tolist() == [1, 0, 5]


@given(st.integers(0, 2**64 - 1))
def test_leb128_round_trips_minimally(value: int) -> None:
    data = leb128.encode(value)
    assert leb128.decode(data + b"\xff", 0) == (value, len(data))
    assert len(data) == max(1, -(-value.bit_length() // 7))


def test_leb128_refuses_overlong_and_too_large() -> None:
    assert leb128.encode(300) == b"\xac\x02"
    for bad in (b"\x80\x00", b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x02", b"\x80"):
        with pytest.raises(EncodingInvalidError):
            leb128.decode(bad, 0)


def test_value_coding_1_needs_the_feature() -> None:
    """S2: byte 2 = 1 is refused unless the header lists coded-values."""
    v = np.array([1, 2, 1, 1], dtype=np.uint16)
    pos = np.array([0, 3, 5, 9], dtype=np.int64)
    parts = sparse.parts(pos, v, 16, rice.plan_positions(pos, 16))
    payload, _ = SparseValues(parts).coded(16, 1 << 20) or (b"", [])
    assert payload[2] == 1
    got_pos, got = sparse.decode(payload, 16, v.dtype, coded=True, changed=4)
    assert got_pos.tolist() == pos.tolist() and got.tolist() == v.tolist()
    with pytest.raises(EncodingInvalidError, match="value coding 1 without feature"):
        sparse.decode(payload, 16, v.dtype)


@given(st.lists(st.integers(0, 4095), min_size=1, max_size=300, unique=True), st.data())
@settings(max_examples=60, deadline=None)
def test_short_head_drops_the_count_and_fixed_width_fields(
    positions: list[int], data: st.DataObject
) -> None:
    """Value coding 1 stores coding, k, 1 and (Rice) U as ULEB128 in place of the
    v1 head's 5 reserved bytes, u64 c and u64 U; c is the chunk's changed count.
    The positions decode as they were, and a wrong changed count is refused."""
    pos = np.array(sorted(positions), dtype=np.int64)
    v = np.array(data.draw(st.lists(st.sampled_from([1, 2, 3, 9]), min_size=len(pos),
                                    max_size=len(pos))), dtype=np.uint16)  # fmt: skip
    plan = rice.plan_positions(pos, 4096)
    plain = sparse.encode(pos, v, 4096, plan)
    found = SparseValues(sparse.parts(pos, v, 4096, plan)).coded(4096, 1 << 20)
    if found is None:
        return
    payload, starts = found
    streams = 16 if plan.coding == sparse.BITMAP else 24
    u = int.from_bytes(plain[16:24], "little") if plan.coding == sparse.RICE else None
    head = 3 if u is None else 3 + len(leb128.encode(u))
    assert payload[:3] == bytes([plan.coding, plan.k, 1])
    kept = plain[streams : len(plain) - 2 * len(pos)]  # the position streams
    assert payload[head : head + len(kept)] == kept
    assert all(0 < s <= len(payload) for s in starts)
    got_pos, got = sparse.decode(payload, 4096, v.dtype, coded=True, changed=len(pos))
    assert got_pos.tolist() == pos.tolist() and got.tolist() == v.tolist()
    with pytest.raises(WdeltaError):
        sparse.decode(payload, 4096, v.dtype, coded=True, changed=len(pos) + 1)


def _skewed_pair(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(5)
    base = rng.integers(0x3C00, 0x4000, size=1 << 14, dtype=np.uint16)
    # A quarter changed, 80% of those one ULP up: values entropy 0.9 bits,
    # where zstd's Huffman literals cost at least 1 bit per value.
    step = rng.choice(np.array([1] * 16 + [-1] * 3 + [3] + [0] * 60), size=base.size)
    target = (base.astype(np.int64) + step).astype(np.uint16)
    b, t = tmp_path / "b.safetensors", tmp_path / "t.safetensors"
    b.write_bytes(safetensors_bytes({"w": RawTensor("BF16", (base.size,), base.tobytes())}))
    t.write_bytes(safetensors_bytes({"w": RawTensor("BF16", (base.size,), target.tobytes())}))
    return b, t


def _features(delta: Path) -> list[str]:
    data = delta.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 16)
    features: list[str] = json.loads(data[64 : 64 + n])["required_features"]
    return features


def test_cli_diff_codes_values_by_default_and_compat_does_not(tmp_path: Path) -> None:
    base, target = _skewed_pair(tmp_path)
    coded, plain = tmp_path / "c.wdelta", tmp_path / "v1.wdelta"
    assert_ok(run("diff", base, target, "-o", coded, "-q"))
    assert_ok(run("diff", base, target, "-o", plain, "-q", "--compat"))
    assert _features(coded) == ["coded-values", "compact-header"]
    assert _features(plain) == []
    assert coded.stat().st_size < plain.stat().st_size
    shown = run("inspect", "--json", coded)
    assert_ok(shown)
    assert json.loads(shown.stdout)["required_features"] == ["coded-values", "compact-header"]
    text = run("inspect", coded)
    assert_ok(text)
    assert "coded-values" in text.stdout
    for delta in (coded, plain):
        out = tmp_path / f"{delta.stem}.out"
        assert_ok(run("apply", base, delta, "-o", out, "-q"))
        assert out.read_bytes() == target.read_bytes()
        back = tmp_path / f"{delta.stem}.back"
        assert_ok(run("apply", "--reverse", target, delta, "-o", back, "-q"))
        assert back.read_bytes() == base.read_bytes()


def test_a_reader_without_the_feature_refuses_coded_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wdelta.format import header as header_module

    base, target = _skewed_pair(tmp_path)
    delta = wdelta.diff(base, target, tmp_path / "d.wdelta")
    monkeypatch.setattr(header_module, "KNOWN_FEATURES", frozenset({"compact-header"}))
    with pytest.raises(wdelta.UnsupportedFeatureError, match="coded-values"):
        wdelta.verify(delta)


def _large_skewed_chunk(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A bf16 chunk of 1M elements, 30% changed, 90% of those by one ULP up: its sparse
    payload is over 64 KiB and its values (entropy 0.6 bits) code far below their
    byte planes (Huffman: at least 1 bit each)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0x3C00, 0x4000, size=1 << 20, dtype=np.uint16)
    step = rng.choice(np.array([1] * 18 + [-1, 2] + [0] * 46), size=base.size)
    return base, (base.astype(np.int64) + step).astype(np.uint16)


@pytest.mark.parametrize("sure_gain", [chunk_policy.SURE_GAIN, 2.0])
def test_large_payload_codes_values_with_one_or_two_compressions(
    sure_gain: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large payload whose estimate clears SURE_GAIN is compressed once, coded; with
    the bar out of reach (2.0) the v1 form is compressed first and the coded one kept
    for being smaller.  Either way the values are costed once (the histogram and
    estimates serve both attempts) and the chunk decodes to the target."""
    base, target = _large_skewed_chunk(3)
    calls: list[int] = []
    compress = blob.compress
    costed: list[int] = []
    costs = values.costs

    def counted_costs(v: np.ndarray) -> values.Costs | None:
        costed.append(len(v))
        return costs(v)

    monkeypatch.setattr(values, "costs", counted_costs)

    def counted(raw: bytes | memoryview, *args: object) -> tuple[str, bytes | memoryview]:
        calls.append(len(raw))
        return compress(raw, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(chunk_policy, "SURE_GAIN", sure_gain)
    monkeypatch.setattr(blob, "compress", counted)
    found = chunk_policy.encode_modified(base, target, None, False, coded=True)
    assert found.coded and found.fields["encoding"] == "sparse"
    assert len(calls) == (1 if sure_gain < 1 else 2)
    assert len(costed) == 1
    fields = found.fields
    raw = blob.decompress(fields["codec"], bytes(found.blob or b""), fields["raw_length"])
    out = chunk.decode("sparse", fields["transform"], raw, base.copy(), len(base), base.dtype,
                       False, fields["changed"], coded=True)  # fmt: skip
    assert np.array_equal(out, target)
