"""The compiled kernels against the NumPy reference: the same bytes, the same refusals.

Every test runs both paths in one process (``WDELTA_NATIVE`` is read on every call)
and compares their results: the chunk encoder's fields and blobs on random and
adversarial chunks of every dtype of SPEC §5 (NaN payloads and other specials,
every density from unchanged to full, both transforms, both value codings), the
decoder's output forwards and in reverse, its refusal of corrupted payloads (same
exception class, so the same category), whole files through diff and apply, and the
conformance suite on the NumPy path and on the kernels' portable passes (the default
run of tests/test_conformance.py takes the native path wherever it is built).  The
change pass has a vector (AVX-512) and a portable form: its tests run both
(``WDELTA_NATIVE=portable``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import test_conformance as suite
import wdelta
from fuzz_targets import Seeds, blob_edited, work_folder
from kit import DTYPES, SPECIALS, RawTensor, safetensors_bytes, word_dtype
from wdelta.codec import blob, coded_values, native, positions, sparse
from wdelta.codec import chunk as chunk_codec
from wdelta.conformance import Reference
from wdelta.errors import WdeltaError
from wdelta.policy import chunk as chunk_policy
from wdelta.policy import rice
from wdelta.policy import transform as transform_policy
from wdelta.policy import values as values_policy

R = TypeVar("R")
BUILT = native._load() is not None
MODES = ["1", native.PORTABLE]  # WDELTA_NATIVE values that take the kernels
needs_kernels = pytest.mark.skipif(not BUILT, reason="the native kernels are not built here")


@contextmanager
def path(on: bool | str) -> Iterator[None]:
    """Run with the native kernels on or off (or a ``WDELTA_NATIVE`` value: ``portable``)."""
    old = os.environ.get(native.ENV)
    os.environ[native.ENV] = on if isinstance(on, str) else "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ[native.ENV]
        else:
            os.environ[native.ENV] = old


def both(fn: Callable[[], R]) -> tuple[R, R]:
    """(NumPy result, native result) of ``fn``; an exception is returned as its class."""
    out = []
    for on in (False, True):
        with path(on):
            try:
                out.append(fn())
            except WdeltaError as exc:
                out.append(type(exc))  # type: ignore[arg-type]
    return out[0], out[1]


def test_native_kernels_are_built_where_a_compiler_exists() -> None:
    # pip install (scripts/test) and pip install -e both run the build hook.
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the NumPy path is the whole package")
    assert BUILT
    with path(True):
        assert native.backend().startswith("native (")
    with path(native.PORTABLE):
        assert native.backend() == "native (portable C, WDELTA_NATIVE=portable)"
        assert not native.simd()
    with path(False):
        assert native.backend().startswith("numpy")


def test_version_names_the_backend() -> None:
    for env, want in (("1", "native" if BUILT else "numpy"), ("0", "numpy")):
        run = subprocess.run(
            [sys.executable, "-m", "wdelta", "--version"],
            capture_output=True,
            text=True,
            env={**os.environ, native.ENV: env},
            check=True,
        )
        assert f"backend {want}" in run.stdout


SIZES = sorted({size for size, _ in DTYPES.values()})
SPECIAL_WORDS = {
    size: sorted({w for n, ws in SPECIALS.items() for w in ws if DTYPES[n][0] == size})
    for size in SIZES
}


@st.composite
def chunk_pairs(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(base, target) words of one size: random, special (NaN payloads, -0, inf, fp8
    specials) or small; changed at a drawn density by small steps (sub wins), random
    words (xor wins) or specials."""
    size = draw(st.sampled_from(SIZES))
    m = draw(st.sampled_from([1, 2, 7, 8, 9, 63, 64, 65, 200, 4099, 70_000]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = word_dtype(size)
    specials = np.array(SPECIAL_WORDS[size], dtype=dtype)
    base = np.frombuffer(rng.bytes(m * size), dtype=dtype).copy()
    if draw(st.booleans()):
        base = specials[rng.integers(0, len(specials), m)]
    density = draw(st.sampled_from([0.0, 0.0005, 0.02, 0.1, 0.19, 0.21, 0.45, 0.55, 1.0]))
    changed = rng.random(m) < density
    target = base.copy()
    steps = draw(st.sampled_from(["small", "random", "special"]))
    if steps == "small":
        target[changed] += rng.integers(1, 4, int(changed.sum())).astype(dtype)
    elif steps == "random":
        target[changed] = np.frombuffer(rng.bytes(int(changed.sum()) * size), dtype=dtype)
    else:
        target[changed] = specials[rng.integers(0, len(specials), int(changed.sum()))]
    return base, target


def _encoded(e: chunk_codec.Encoded) -> tuple[dict[str, Any], bytes | None, bool]:
    return e.fields, None if e.blob is None else bytes(e.blob), e.coded


@settings(max_examples=150, deadline=None)
@given(pair=chunk_pairs(), allow_full=st.booleans(), coded=st.booleans())
def test_chunk_encoder_writes_the_same_bytes(
    pair: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]], allow_full: bool, coded: bool
) -> None:
    base, target = pair
    numpy_out, native_out = both(
        lambda: _encoded(chunk_policy.encode_modified(base, target, None, allow_full, coded))
    )
    assert native_out == numpy_out


@settings(max_examples=150, deadline=None)
@given(pair=chunk_pairs(), coded=st.booleans())
def test_chunk_decoder_rebuilds_both_sides_alike(
    pair: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]], coded: bool
) -> None:
    base, target = pair
    fields, stored, is_coded = _encoded(
        chunk_policy.encode_modified(base, target, None, False, coded)
    )
    if stored is None:
        return
    payload = blob.decompress(fields["codec"], stored, fields["raw_length"])
    for source, want, reverse in ((base, target, False), (target, base, True)):
        got = both(lambda s=source, r=reverse: _decode(fields, payload, s, r, is_coded))  # type: ignore[misc]
        assert got[0] == got[1] == want.tobytes()


def _decode(
    fields: dict[str, Any], payload: bytes, source: Any, reverse: bool, coded: bool
) -> bytes:
    out = chunk_codec.decode(
        fields["encoding"],
        fields.get("transform"),
        payload,
        source.copy(),
        len(source),
        source.dtype,
        reverse,
        fields["changed"],
        coded,
    )
    return out.tobytes()


@settings(max_examples=300, deadline=None)
@given(pair=chunk_pairs(), data=st.data())
def test_decoder_refuses_corrupt_payloads_alike(
    pair: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]], data: st.DataObject
) -> None:
    """A payload with flipped bytes, cut or grown: the same words or the same refusal."""
    base, target = pair
    fields, stored, coded = _encoded(chunk_policy.encode_modified(base, target, None, False, True))
    if stored is None or fields["encoding"] != "sparse":
        return
    raw = bytearray(blob.decompress(fields["codec"], stored, fields["raw_length"]))
    for _ in range(data.draw(st.integers(1, 3))):
        edit = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if edit == "flip" and raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
        elif edit == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw += bytes(data.draw(st.binary(min_size=1, max_size=9)))
    changed = data.draw(st.sampled_from([fields["changed"], 1, len(base)]))
    fields = {**fields, "changed": changed}
    numpy_out, native_out = both(lambda: _decode(fields, bytes(raw), base, False, coded))
    assert native_out == numpy_out


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(pair=chunk_pairs())
def test_changes_kernel_matches_numpy(
    pair: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]],
) -> None:
    base, target = pair
    count = int((base != target).sum())
    want = np.flatnonzero(base != target)
    for mode in MODES:  # the vector pass (where the CPU has it) and the portable one
        with path(mode):
            copy = base.copy()  # a publisher's copy: left as it was when the pass gives up
            assert count == 0 or native.changes(base, target, count - 1, copy) is None
            assert copy.tobytes() == base.tobytes()
            found = native.changes(base, target, len(base), copy)
            assert copy.tobytes() == target.tobytes()
            # The copy may be the base itself: each word is read before it is written.
            again = native.changes(own := base.copy(), target, len(base), own)
            assert own.tobytes() == target.tobytes()
        assert found is not None and again is not None
        assert found[0].tolist() == again[0].tolist()
        assert all(found[1][w].tobytes() == again[1][w].tobytes() for w in ("xor", "sub"))
        pos, words = found
        assert pos.tolist() == want.tolist()
        assert words["xor"].tobytes() == (target[want] ^ base[want]).tobytes()
        assert (
            words["sub"].tobytes()
            == chunk_policy.transform.encode("sub", base[want], target[want]).tobytes()
        )
    mask = base != target
    estimates = both(lambda: transform_policy.value_bits_each(words["xor"], words["sub"]))
    assert estimates[0] == estimates[1]  # to the last bit: the same histograms
    idx = transform_policy.window_index(pos, len(base))
    sampled = pos if idx is None else pos[idx]
    assert sampled.tolist() == transform_policy.sample_mask(mask, len(pos)).tolist()


@needs_kernels
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["1", native.PORTABLE])
def test_changes_kernel_at_every_lane_and_limit(size: int, mode: str) -> None:
    # One changed element at each offset of several vector registers and of the tail
    # (whole-register stores past the last entry must stay in the outputs' slack), and
    # the limit met exactly and missed by one, at the start, middle and end of a chunk.
    dtype = word_dtype(size)
    m = 4 * 64 * 4 + 37  # four register groups of the widest lanes, then a ragged tail
    base = np.arange(m, dtype=dtype)
    with path(mode):
        for at in range(m):
            target = base.copy()
            target[at] ^= dtype.type(1 << (8 * size - 1))
            pos, words = native.changes(base, target, 1) or (None, {})
            assert pos is not None and pos.tolist() == [at]
            assert int(words["xor"][0]) == 1 << (8 * size - 1)
        target = base ^ dtype.type(1)
        for cap in (0, 1, m // 2, m - 64 // size - 1, m - 1):  # give up early, midway, late
            own = base.copy()
            assert native.changes(own, target, cap, own) is None
            assert own.tobytes() == base.tobytes()  # the words stored so far taken back
        found = native.changes(own, target, m, own)
        assert found is not None and found[0].tolist() == list(range(m))
        assert own.tobytes() == target.tobytes()


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.integers(0, 2**16), min_size=1, max_size=300), k=st.integers(0, 31))
def test_bitmap_kernel_and_rice_plan_match_numpy(gaps: list[int], k: int) -> None:
    g = np.array(gaps, dtype=np.int64)
    pos = np.cumsum(g + 1) - 1
    pos = pos[pos < 5000]
    assert (
        both(lambda: positions.bitmap_encode(pos, 5000))[1]
        == both(lambda: positions.bitmap_encode(pos, 5000))[0]
    )
    plans = both(lambda: rice.plan_positions(np.cumsum(g[:50] % 4096 + 1) - 1, 300_000))
    assert (plans[0].coding, plans[0].k, plans[0].nbytes) == (
        plans[1].coding,
        plans[1].k,
        plans[1].nbytes,
    )


def _outcome(fn: Callable[..., np.ndarray[Any, Any]], *args: Any) -> object:
    """The values of the array ``fn(*args)``, or the class of the WdeltaError raised."""
    try:
        return fn(*args).tolist()
    except WdeltaError as exc:
        return type(exc)


@needs_kernels
@settings(max_examples=100, deadline=None)
@given(
    gaps=st.lists(st.integers(0, 2**12), min_size=1, max_size=200),
    m=st.sampled_from([1, 100, 5000, 1 << 26]),
    edit=st.sampled_from(["none", "flip", "drop", "pad", "trailing", "count"]),
    at=st.integers(0, 2**16),
)
def test_rice_decoder_kernels_match_numpy(gaps: list[int], m: int, edit: str, at: int) -> None:
    # Valid streams and edited ones (a flipped bit, a byte dropped or added, a padding
    # bit set, a wrong count), for every k: the same positions or the same refusal on
    # both paths.
    for k in range(positions.MAX_RICE_K + 1):
        u, r, count = _edited_rice(gaps, k, edit, at)
        if count < 1:
            continue
        with path(False):
            numpy_out = _outcome(positions.rice_decode, u, r, k, count, m)
        with path(True):
            native_out = _outcome(positions.rice_decode, u, r, k, count, m)
            ones = positions.unary_ones_of(u).tolist()
        assert native_out == numpy_out
        bits = np.unpackbits(np.frombuffer(u, np.uint8), bitorder="little")
        assert ones == np.flatnonzero(bits).tolist()


def _edited_rice(gaps: list[int], k: int, edit: str, at: int) -> tuple[bytes, bytes, int]:
    """Both Rice streams of ``gaps`` and their count, with one ``edit`` at ``at``."""
    unary, rem = positions.rice_encode(np.array(gaps, dtype=np.int64), k)
    count = len(gaps)
    streams = [bytearray(unary), bytearray(rem)]
    target = streams[at % 2] if streams[at % 2] else streams[0]
    if edit == "flip":
        target[at % len(target)] ^= 1 << (at % 8)
    elif edit == "drop":
        del target[at % len(target)]
    elif edit == "trailing":
        target.append(0)
    elif edit == "pad" and count * k % 8:
        streams[1][-1] |= 0x80
    elif edit == "count":
        count += 1 if at % 2 else -1
    return bytes(streams[0]), bytes(streams[1]), count


def _checkpoint(path: Path, tensors: dict[str, tuple[str, np.ndarray[Any, Any]]]) -> Path:
    raws = {n: RawTensor(d, (len(w),), w.tobytes()) for n, (d, w) in tensors.items()}
    path.write_bytes(safetensors_bytes(raws))
    return path


def test_files_are_byte_identical_through_diff_and_apply(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    base, target = {}, {}
    for i, (name, (size, _)) in enumerate(sorted(DTYPES.items())):
        m = [1, 1000, 150_000][i % 3]
        words = np.frombuffer(rng.bytes(m * size), dtype=word_dtype(size)).copy()
        changed = words.copy()
        hit = rng.random(m) < [0.02, 0.3, 0.9][i % 3]
        changed[hit] += np.ones(1, dtype=words.dtype)
        base[f"t{i}"], target[f"t{i}"] = (name, words), (name, changed)
    b, t = (
        _checkpoint(tmp_path / "b.safetensors", base),
        _checkpoint(tmp_path / "t.safetensors", target),
    )
    outs = []
    for on in (False, True):
        with path(on):
            delta = wdelta.diff(b, t, tmp_path / f"{on}.wdelta", chunk_elements=40_000)
            fwd = wdelta.apply(b, delta, tmp_path / f"{on}.fwd")
            rev = wdelta.apply(t, delta, tmp_path / f"{on}.rev", reverse=True)
        outs.append([Path(p).read_bytes() for p in (delta, fwd, rev)])  # type: ignore[arg-type]
    assert outs[0] == outs[1]
    assert outs[1][1] == t.read_bytes() and outs[1][2] == b.read_bytes()


@pytest.mark.parametrize("mode", ["0", native.PORTABLE])
def test_conformance_suite_passes_on_the_other_paths(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tests/test_conformance.py runs the suite on the default path (native where built,
    # with its vector passes where the CPU has them); here the NumPy path and, where the
    # kernels are built, their portable passes.
    if mode == native.PORTABLE and not BUILT:
        pytest.skip("the native kernels are not built here")
    monkeypatch.setenv(native.ENV, mode)
    known_bug = suite._generator().known_bug
    manifest = suite.load(suite.VECTORS)
    with contextmanager(suite.scratch.__wrapped__)() as scratch:  # type: ignore[attr-defined]
        results = suite._run(manifest, [], Reference(), scratch, strict=True)
    failed = {i for i, r in results.items() if r.status != "pass"}
    assert failed == {i for i in results if known_bug(i)}


@needs_kernels
def test_bench_prints_both_paths_and_the_targets(tmp_path: Path) -> None:
    bench = Path(__file__).resolve().parent.parent / "bench" / "native.py"
    run = subprocess.run(
        [sys.executable, str(bench), "--dir", str(tmp_path), "--elements", "1000000",
         "--repeat", "1", "--publish-bytes", "1500000"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for case in ("bf16 2%", "fp8 e4m3 2%"):
        for method in ("numpy", "native", "zstd -3 of XOR", "floor"):
            assert re.search(rf"\| {case}, [0-9.]+ GB \| {method} \|", run.stdout), run.stdout
        for op in ("encode", "decode"):
            assert re.search(rf"\*\*native {op}: (PASS|MISS)\*\*", run.stdout)
        assert re.search(rf"\| {case}, [0-9.]+ GB \| native x NumPy \| encode [0-9.]+x", run.stdout)
    # Both publishers timed on both paths for the cases of --publish-bytes or more.
    for publisher in ("Publisher", "DistributedPublisher"):
        row = rf"\| bf16 2%, [0-9.]+ GB \| \*\*publish: (PASS|MISS)\*\* \| {publisher}.publish"
        assert re.search(row, run.stdout), run.stdout


def test_bench_measures_the_real_trace_series(tmp_path: Path) -> None:
    # A tiny trace (bench/realtrace.py, generated into tmp_path): one series per dtype.
    bench = Path(__file__).resolve().parent.parent / "bench" / "native.py"
    run = subprocess.run(
        [sys.executable, str(bench), "--no-synthetic", "--trace", "--repeat", "1",
         "--trace-root", str(tmp_path), "--trace-dim", "32", "--trace-layers", "1",
         "--trace-heads", "2", "--trace-seq", "9", "--trace-batch", "1",
         "--trace-pretrain", "1", "--trace-lrs", "1e-5", "--trace-steps", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for series in ("real bf16 lr1e-05, 2 steps", "real fp8 lr1e-05, 2 steps"):
        for method in ("numpy", "native", "zstd -3 of XOR", "floor", "native x NumPy"):
            assert f"| {series} | {method} |" in run.stdout, run.stdout


def _parts(found: Any) -> Any:
    if found is None:
        return None
    c, kind, p = found[:3]
    return c, kind, p.coding, p.k, p.unary_len, bytes(p.streams), p.values.tobytes()


@needs_kernels
@settings(max_examples=150, deadline=None)
@given(pair=chunk_pairs())
def test_native_changes_at_any_density_match_numpy(
    pair: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]],
) -> None:
    # The encoder sends chunks whose sample looks dense to NumPy (_dense); the native
    # positions must still give the same payload parts at every density.
    base, target = pair
    with path(False):
        want = _parts(chunk_policy._changes(base, target, None))
    for mode in MODES:
        with path(mode):
            found = native.changes(base, target, len(base))
            assert found is not None
            parts = chunk_policy._native_changes(base, *found) if len(found[0]) else None
            assert _parts(parts) == want


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    return Seeds(tmp_path_factory.mktemp("fuzz"))


def _apply_outcome(seeds: Seeds, delta: Path, work: Path) -> str | bytes:
    """The rebuilt file's bytes, or the refusal's category."""
    out = work / "out.safetensors"
    try:
        wdelta.apply(seeds.base, delta, out, threads=1)
    except WdeltaError as exc:
        assert not out.exists()
        return exc.category
    data = out.read_bytes()
    out.unlink()
    return data


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_mutated_blobs_same_outcome_on_both_paths(seeds: Seeds, data: st.DataObject) -> None:
    # tests/test_fuzz.py's blob edits (fresh checksums, so they reach the decoder):
    # both paths rebuild the same bytes or refuse with the same category.
    work = work_folder(seeds.folder)
    delta = blob_edited(seeds, data, work)
    outcomes = both(lambda: _apply_outcome(seeds, delta, work))
    assert outcomes[0] == outcomes[1]


def test_a_read_only_source_is_refused_on_both_paths() -> None:
    base = np.arange(50_000, dtype=np.uint16)
    target = base.copy()
    target[5] += 1
    fields, stored, _ = _encoded(chunk_policy.encode_modified(base, target, None, False, False))
    assert stored is not None and fields["encoding"] == "sparse"
    payload = blob.decompress(fields["codec"], stored, fields["raw_length"])
    source = base.copy()
    source.flags.writeable = False
    for on in (False, True):
        with path(on), pytest.raises(ValueError, match="read-only"):
            chunk_codec.decode(
                "sparse",
                fields["transform"],
                payload,
                source,
                len(source),
                source.dtype,
                False,
                fields["changed"],
            )
        assert source.tobytes() == base.tobytes()


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([0, 1, 5, 1000, rice.K_SAMPLE, rice.K_SAMPLE + 1, 3 * rice.K_SAMPLE + 7]),
    mean=st.sampled_from([0.0, 0.3, 3.0, 50.0, 4000.0, 2.0**20]),
    seed=st.integers(0, 2**32 - 1),
)
def test_rice_parameter_is_the_same_on_both_paths(n: int, mean: float, seed: int) -> None:
    # The native plan sums a strided sample of the gaps exactly, from the positions;
    # NumPy's float mean of the sample must give the same k, and the same sizes.
    if n == 0:
        return
    gaps = np.random.default_rng(seed).geometric(1 / (mean + 1), n).astype(np.int64) - 1
    pos = np.cumsum(gaps + 1) - 1
    plans = both(lambda: rice.plan_positions(pos, int(pos[-1]) + 1))
    assert (plans[0].coding, plans[0].k, plans[0].nbytes) == (
        plans[1].coding, plans[1].k, plans[1].nbytes,
    )  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(
    size=st.sampled_from(SIZES),
    n=st.sampled_from([1, 2, 9, 300, 5000]),
    levels=st.integers(0, 5),
    final=st.sampled_from([values_policy.PLANES, values_policy.RICE]),
    seed=st.integers(0, 2**32 - 1),
)
def test_coded_values_levels_are_the_same_on_both_paths(
    size: int, n: int, levels: int, final: int, seed: int
) -> None:
    # Skewed words (a few values most of the time), as an optimizer step's are.
    rng = np.random.default_rng(seed)
    words = rng.geometric(rng.uniform(0.05, 0.9), n).astype(word_dtype(size))
    coded = both(lambda: values_policy.encode_as(words, levels, final))
    assert (coded[0].data, coded[0].sections) == (coded[1].data, coded[1].sections)


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(size=st.sampled_from(SIZES), n=st.sampled_from([1, 2, 7, 8, 9, 300]),
       spread=st.integers(0, 12), seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_final_rice_streams_are_the_same_on_both_paths(
    size: int, n: int, spread: int, seed: int
) -> None:
    # Every k below the word width (fields of 0 to 63 bits, straddling up to 9 bytes),
    # words whose quotients stay below 2^spread so that the unary stream stays small.
    rng = np.random.default_rng(seed)
    for k in range(8 * size):
        top = min(8 * size, k + spread)
        words = (
            (rng.integers(0, 2**62, n, dtype=np.uint64) >> np.uint64(64 - top))
            if top
            else (np.zeros(n, dtype=np.uint64))
        )
        words = words.astype(word_dtype(size))
        streams = both(lambda: coded_values._rice_final(words, k))  # noqa: B023
        assert streams[0] == streams[1], k


@needs_kernels
def test_final_rice_streams_past_2_62_bits_fall_back_to_numpy() -> None:
    huge = np.full(4, 2**63, dtype=np.uint64)
    with path(True):
        assert native.rice_words(huge, 0) is None
        assert native.rice_words(huge, 63) == (b"\xaa", bytes(32))  # quotients 1: 0b01 x 4


@st.composite
def sorted_positions(draw: st.DrawFn) -> tuple[np.ndarray[Any, Any], int]:
    """(strictly increasing positions, chunk size m): one, a few, around K_SAMPLE (the
    Rice judge's sample strides 1 to 3), all of a chunk, or spread by gaps up to 2^31 (the
    NumPy writer's unary stream of k = 0 holds their sum in bits: at most 2^28)."""
    sampled = [rice.K_SAMPLE + 1, 2 * rice.K_SAMPLE, 2 * rice.K_SAMPLE + 1, 3 * rice.K_SAMPLE]
    n = draw(st.sampled_from([1, 2, 7, 8, 9, 17, 300, *sampled]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    top = min(draw(st.sampled_from([0, 1, 3, 50, 4000, 2**20, 2**31])), 2**28 // n)
    gaps = rng.integers(0, top + 1, n, dtype=np.int64)
    pos = np.cumsum(gaps + 1) - 1
    return pos, int(pos[-1]) + 1 + draw(st.sampled_from([0, 5, 2**20]))


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(found=sorted_positions(), k=st.integers(0, 31))
def test_position_streams_come_from_the_positions_alike(
    found: tuple[np.ndarray[Any, Any], int], k: int
) -> None:
    # The planner sums the gaps without an array and the writer codes them from the
    # positions: the same plan, the same payload parts, and for any k the same streams.
    pos, m = found
    plans = both(lambda: rice.plan_positions(pos, m))
    assert (plans[0].coding, plans[0].k, plans[0].nbytes) == (
        plans[1].coding,
        plans[1].k,
        plans[1].nbytes,
    )
    values = np.arange(len(pos), dtype=np.uint16)
    parts = both(lambda: _parts((len(pos), "xor", sparse.parts(pos, values, m, plans[1]), None)))
    assert parts[0] == parts[1]
    gaps = positions.gaps_of(pos)
    unary, rem = both(lambda: positions.rice_encode(gaps, k))[0]
    with path(True):
        for step in (1, 2, 3):
            ks = range(k, min(k + 3, 32))
            sample = [int(np.sum(gaps[::step] >> j)) for j in ks]
            full = [int(np.sum(gaps >> j)) for j in ks] if step <= 2 else None
            assert native.gap_quotients(pos, step, ks) == (sample, full)
        assert bytes(native.rice_positions(pos, k, len(unary))) == unary + rem
        # A unary length that is not the codes' stops the writer before it leaves its room.
        for wrong in (len(unary) - 1, len(unary) + 1):
            with pytest.raises(AssertionError, match="disagree"):
                native.rice_positions(pos, k, wrong)


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(
    size=st.sampled_from(SIZES),
    n=st.sampled_from([1, 2, 7, 8, 9, 63, 64, 65, 1000, 5000]),
    share=st.sampled_from([0.0, 0.01, 0.2, 0.5, 0.9, 0.99, 1.0]),
    k=st.integers(0, 31),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_levels_come_from_one_pass_alike(
    size: int, n: int, share: float, k: int, seed: int
) -> None:
    # A level splits a word off the open values: none, some or all of them equal to it
    # (k = 0 from a share kept of DENSE_KEEP, Rice-coded below), the split word the
    # largest of its size; the level's bytes, the kept words, the mask, its length up to
    # the last kept, and for any k the Rice streams of the kept indices match NumPy's.
    rng = np.random.default_rng(seed)
    dtype = word_dtype(size)
    split = np.iinfo(dtype).max
    rest = np.frombuffer(rng.bytes(n * size), dtype=dtype).copy()
    rest[rest == split] = 0
    rest[rng.random(n) < share] = split
    level = both(lambda: values_policy._split(rest, np.array([split], dtype=dtype)))
    assert (level[0].data, level[0].rem_at) == (level[1].data, level[1].rem_at)
    assert level[0].rest.tobytes() == level[1].rest.tobytes()
    keep = np.flatnonzero(rest != split)
    with path(True):
        count, kept, mask, used = native.split_mask(rest, int(split))
    assert (count, kept.tobytes()) == (len(keep), rest[keep].tobytes())
    bits = np.packbits(rest != split, bitorder="little")
    assert mask.tobytes() == bits.tobytes() + bytes(len(mask) - len(bits))
    assert used == (int(keep[-1]) // 8 + 1 if count else 0)
    if count:
        with path(False):
            numpy_streams = positions.rice_encode(positions.gaps_of(keep), k)
        with path(True):
            assert native.rice_mask(mask, n, count, k) == numpy_streams
            # A count the mask does not hold is refused before anything is written.
            with pytest.raises(AssertionError, match="disagree"):
                native.rice_mask(mask, n, count + 1, k)


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(
    size=st.sampled_from(SIZES),
    n=st.sampled_from([0, 1, 2, 5, 300, 5000, 70_000]),
    step=st.sampled_from([1, 2, 3, 7, 1000]),
    spread=st.sampled_from(["one", "few", "all"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_histograms_are_exact_alike(size: int, n: int, step: int, spread: str, seed: int) -> None:
    # The coded values' histograms (a strided sample, or every value) and the transform
    # pick's byte-plane counts: one word throughout, a few skewed ones (an optimizer
    # step's), or any word of the size, extremes included; 4- and 8-byte words and the
    # byte planes of every size go through NumPy's and the kernel's own paths.
    rng = np.random.default_rng(seed)
    dtype = word_dtype(size)
    if spread == "all":
        values = np.frombuffer(rng.bytes(n * size), dtype=dtype).copy()
        values[: min(n, 2)] = [np.iinfo(dtype).max, 0][: min(n, 2)]
    else:
        values = (rng.geometric(0.4, n) * (spread == "few")).astype(dtype)
    numpy_hist, native_hist = both(lambda: values_policy._histogram(values, step))
    assert [a.dtype for a in numpy_hist] == [a.dtype for a in native_hist]
    assert [a.tolist() for a in numpy_hist] == [a.tolist() for a in native_hist]
    ranked = both(lambda: values_policy._ranked(values))
    assert [a.tolist() for a in ranked[0]] == [a.tolist() for a in ranked[1]]
    planes = both(lambda: transform_policy._plane_counts((values, values[::-1].copy()), size))
    assert planes[0].tolist() == planes[1].tolist()


def _estimates(found: values_policy.Costs | None) -> tuple[list[int], ...] | None:
    return None if found is None else (found.plane, found.rice, found.spent, found.scanned)


@needs_kernels
@settings(max_examples=300, deadline=None)
@given(
    size=st.sampled_from(SIZES),
    n=st.sampled_from([1, 2, 3, 9, 50, 300, 5000, 40_000]),
    spread=st.sampled_from(["one", "skewed", "scaled", "all"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_size_estimates_are_the_same_on_both_paths(
    size: int, n: int, spread: str, seed: int
) -> None:
    # The kernel's coded-values estimates (every number of levels: byte planes, final
    # Rice, the levels' bytes, the values scanned) and the transform pick's score are
    # the integers NumPy computes: one word throughout, an optimizer step's skewed
    # words, skewed words times a large factor (wide Rice parameters, sums near the
    # top of 4-byte words), any word (extremes included), and a sampled histogram
    # (40,000 values: scaled counts).
    rng = np.random.default_rng(seed)
    dtype = word_dtype(size)
    if spread == "all":
        values = np.frombuffer(rng.bytes(n * size), dtype=dtype).copy()
        values[: min(n, 2)] = [np.iinfo(dtype).max, 0][: min(n, 2)]
    elif spread == "scaled":
        top = np.iinfo(dtype).max // 64
        values = (rng.geometric(0.2, n) * int(rng.integers(1, top + 1))).astype(dtype)
    else:
        values = (rng.geometric(rng.uniform(0.05, 0.9), n) * (spread == "skewed")).astype(dtype)
    found = both(lambda: _estimates(values_policy.costs(values)))
    assert found[0] == found[1]
    # One estimate per number of levels, up to 8 (the words a sample found, at most).
    assert found[0] is not None and 2 <= len(found[0][0]) <= min(8, len(np.unique(values))) + 1
    scores = both(lambda: transform_policy.plane_score(values))
    assert scores[0] == scores[1]
    assert len(set(both(lambda: transform_policy.pick_words(values, values[::-1].copy())))) == 1
