"""The optional compiled kernels (``_kernels.c``), or None where they are not built.

The NumPy code of :mod:`wdelta.codec` and :mod:`wdelta.policy` stays the normative
reference; each kernel is a fused, exact equivalent of a few of its passes, and the
callers fall back to NumPy when :func:`kernels` returns None.  ``pip install`` builds the
library where a C compiler exists; ``WDELTA_NATIVE=0`` in the environment selects the
NumPy path, ``WDELTA_NATIVE=portable`` the kernels without their vector (AVX-512)
paths (read on every call, so tests can compare all three in one process).

The library has no Python API: it is loaded with ctypes, which releases the GIL around
each call, so the encoder's and decoder's threads run kernels in parallel.  Callers
pass only buffers they allocated or validated, of the lengths the kernels expect.
"""

from __future__ import annotations

import ctypes
import os
import threading
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

Positions = np.ndarray[Any, np.dtype[np.int64]]
# The vector change pass stores whole registers past the last entry it keeps: its
# outputs need this many entries of room beyond the limit (CHANGES_SLACK in _kernels.c).
CHANGES_SLACK = 64
LIBRARY = "_wdelta_kernels.so"
ENV = "WDELTA_NATIVE"
PORTABLE = "portable"  # WDELTA_NATIVE=portable: the kernels without their vector paths

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
# Bytes past the end of a bit stream that its compiled writer may store into (then
# overwritten or cut off): it stores a whole 64-bit register at a time.
SLACK = 8
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "wd_find_changes": (_I64, [_P, _P, _I64, _I64, _INT, _P, _P, _P, _P, _INT]),
    "wd_simd": (_INT, []),
    "wd_apply": (_I64, [_P, _I64, _P, _I64, _P, _INT, _INT, _INT]),
    "wd_set_bits": (_I64, [_P, _I64, _P, _I64]),
    "wd_rice_decode": (None, [_P, _I64, _P, _INT, _P]),
    "wd_bitmap": (None, [_P, _I64, _P, _I64]),
    "wd_rice_words_bits": (_I64, [_P, _I64, _INT]),
    "wd_rice_words": (None, [_P, _I64, _INT, _P, _I64, _P]),
    "wd_plane_counts": (None, [_P, _I64, _INT, _P]),
    "wd_gap_quotients": (None, [_P, _I64, _I64, _INT, _INT, _P]),
    "wd_rice_positions": (_INT, [_P, _I64, _INT, _P, _I64]),
    "wd_split_mask": (_I64, [_P, _I64, _INT, ctypes.c_uint64, _P, _P, _P]),
    "wd_rice_mask": (_I64, [_P, _I64, _I64, _INT, _P, _P, _I64]),
    "wd_histogram": (_I64, [_P, _I64, _I64, _INT, _P, _P, _P, _P]),
    "wd_plane_score": (_I64, [_P, _I64, _INT, _P]),
    "wd_value_costs": (None, [_P, _P, _I64, _INT, _INT, _P, _P, _P, _P, _P, _P]),
}


@cache
def _load() -> ctypes.CDLL | None:
    path = Path(__file__).with_name(LIBRARY)
    if not path.exists():
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None  # built for another platform, or damaged: the NumPy path serves
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            return None  # built from an older _kernels.c (an editable install not rebuilt)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def kernels() -> ctypes.CDLL | None:
    """The loaded library, or None (not built, or ``WDELTA_NATIVE=0``)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    return _load()


def simd() -> bool:
    """True if the kernels take their vector (AVX-512) paths: the CPU has them, and
    ``WDELTA_NATIVE=portable`` does not ask for the portable C paths (tests compare both)."""
    return kernels() is not None and os.environ.get(ENV) != PORTABLE and _cpu_has_vectors()


@cache
def _cpu_has_vectors() -> bool:
    lib = _load()
    return lib is not None and bool(lib.wd_simd())


def backend() -> str:
    """The path the codec takes now, for ``--version``: ``native (AVX-512)``,
    ``native (portable C)`` or ``numpy``, and why where an environment variable chose it."""
    if kernels() is not None:
        if simd():
            return "native (AVX-512)"
        forced = os.environ.get(ENV) == PORTABLE
        return f"native (portable C{', WDELTA_NATIVE=portable' if forced else ''})"
    return "numpy (disabled by WDELTA_NATIVE=0)" if _load() is not None else "numpy"


def ptr(array: np.ndarray[Any, Any]) -> int:
    """The address of a C-contiguous array's first element."""
    flags = array.flags
    assert flags.c_contiguous
    if flags.writeable and array.size:  # 0.3 us, against 1 us for array.ctypes.data
        return ctypes.addressof(ctypes.c_char.from_buffer(array.data))
    address: int = array.ctypes.data  # from_buffer refuses read-only and empty buffers
    return address


def usable(*arrays: np.ndarray[Any, Any]) -> bool:
    """True if the kernels are on and take these word arrays (C-contiguous, 1-8 bytes,
    in the machine's byte order: the kernels do arithmetic on them)."""
    return kernels() is not None and all(
        a.flags.c_contiguous and a.dtype.itemsize in (1, 2, 4, 8) and a.dtype.isnative
        for a in arrays
    )


def _lib() -> ctypes.CDLL:
    # The library without reading WDELTA_NATIVE again (0.7 us): callers asked kernels()
    # or usable() first, which did.
    lib = _load()
    assert lib is not None, "native kernels called where they are not built"
    return lib


def changes(
    base: np.ndarray[Any, Any], target: np.ndarray[Any, Any], limit: int,
    advance: np.ndarray[Any, Any] | None = None,
) -> tuple[Positions, dict[str, np.ndarray[Any, Any]]] | None:  # fmt: skip
    """Sorted positions where ``base`` and ``target`` (same length and dtype) differ, and
    the words there of each transform (``xor``, and ``sub`` zigzag-coded), in one pass;
    None if more than ``limit`` differ.  ``advance`` (words equal to ``base``, which may
    be ``base`` itself) is brought to ``target`` in the same pass, and left as it was when
    the result is None.  Memory: ``limit + CHANGES_SLACK`` entries of each output."""
    room = limit + CHANGES_SLACK
    pos = np.empty(room, dtype=np.int64)
    xor, sub = np.empty(room, dtype=base.dtype), np.empty(room, dtype=base.dtype)
    size = base.dtype.itemsize
    dst = None if advance is None else ptr(advance)
    assert advance is None or (advance.dtype == base.dtype and len(advance) == len(base))
    args = (ptr(base), ptr(target), len(base), limit, size, ptr(pos), ptr(xor), ptr(sub), dst)
    n = _lib().wd_find_changes(*args, simd())
    return None if n < 0 else (pos[:n], {"xor": xor[:n], "sub": sub[:n]})


def apply(
    sub: bool, reverse: bool, source: np.ndarray[Any, Any], pos: Positions,
    values: np.ndarray[Any, Any],
) -> None:  # fmt: skip
    """Undo the transform in place at the validated positions ``pos`` of ``source``."""
    lib = _lib()
    size = source.dtype.itemsize
    bad = lib.wd_apply(
        ptr(source), len(source), ptr(pos), len(pos), ptr(values), size, sub, reverse
    )
    assert bad < 0, f"position {bad} outside the chunk reached the apply kernel"


def set_bits(data: bytes | memoryview) -> Positions:
    """The stream indices of the set bits of ``data`` (LSB first), increasing: counted,
    then written into an array of exactly that many."""
    lib = _lib()
    raw = np.frombuffer(data, dtype=np.uint8)
    count = lib.wd_set_bits(ptr(raw), len(raw), None, 0)
    out = np.empty(count, dtype=np.int64)
    lib.wd_set_bits(ptr(raw), len(raw), ptr(out), count)
    return out


def rice_decode(ones: Positions, remainders: bytes | memoryview, k: int) -> Positions:
    """Positions from the unary stream's 1-bit indices ``ones`` and the remainder stream
    (validated: exactly ceil(len(ones) * k / 8) bytes, quotients within the chunk)."""
    raw = np.frombuffer(remainders, dtype=np.uint8)
    assert len(raw) == (len(ones) * k + 7) // 8 and ones.dtype == np.int64
    out = np.empty(len(ones), dtype=np.int64)
    _lib().wd_rice_decode(ptr(ones), len(ones), ptr(raw), k, ptr(out))
    return out


def rice_words(wide: np.ndarray[Any, np.dtype[np.uint64]], k: int) -> tuple[bytes, bytes] | None:
    """(unary stream, remainder stream) of the non-empty words ``wide`` with parameter k
    (0..63); None where the unary stream would pass 2^62 bits (the caller's NumPy path
    then refuses it as it always did)."""
    lib = _lib()
    bits = lib.wd_rice_words_bits(ptr(wide), len(wide), k)
    if bits < 0:
        return None
    unary = np.empty((bits + 7) // 8, dtype=np.uint8)
    rem = np.empty((len(wide) * k + 7) // 8, dtype=np.uint8)
    lib.wd_rice_words(ptr(wide), len(wide), k, ptr(unary), len(unary), ptr(rem))
    return unary.tobytes(), rem.tobytes()


def bitmap(pos: Positions, m: int) -> bytes:
    """ceil(m / 8) bytes, bit p set for each p in ``pos`` (all below m)."""
    out = np.empty((m + 7) // 8, dtype=np.uint8)
    _lib().wd_bitmap(ptr(pos), len(pos), ptr(out), len(out))
    return out.tobytes()


def plane_counts(words: np.ndarray[Any, Any], counts: np.ndarray[Any, np.dtype[np.int64]]) -> None:
    """Add each byte plane's 256-bin histogram of ``words`` into ``counts`` (int64,
    ``256 * itemsize`` bins, plane after plane)."""
    assert counts.dtype == np.int64 and len(counts) == 256 * words.dtype.itemsize
    _lib().wd_plane_counts(ptr(words), len(words), words.dtype.itemsize, ptr(counts))


def gap_quotients(pos: Positions, step: int, ks: range) -> tuple[list[int], list[int] | None]:
    """For each k of ``ks`` (at most 3), the sum of ``gaps_of(pos)[::step] >> k``, and the
    sum over all gaps where the same pass has it (step 1 or 2), else None."""
    assert 1 <= len(ks) <= 3 and ks.step == 1
    out = np.empty(6, dtype=np.int64)
    _lib().wd_gap_quotients(ptr(pos), len(pos), step, ks.start, len(ks), ptr(out))
    sums: list[int] = out[:3].tolist()[: len(ks)]
    full: list[int] = out[3:].tolist()[: len(ks)]
    return sums, full if step <= 2 else None


def rice_positions(pos: Positions, k: int, unary_len: int) -> memoryview:
    """Both Rice streams of the gaps of the non-empty, strictly increasing ``pos`` with
    parameter k, one after the other: the unary stream of ``unary_len`` bytes (from
    :func:`gap_quotients`), then the remainders."""
    length = unary_len + (len(pos) * k + 7) // 8
    out = np.empty(length + SLACK, dtype=np.uint8)
    status = _lib().wd_rice_positions(ptr(pos), len(pos), k, ptr(out), unary_len)
    assert status == 0, "positions and unary length disagree"
    return out[:length].data


def split_mask(
    rest: np.ndarray[Any, Any], word: int
) -> tuple[int, np.ndarray[Any, Any], np.ndarray[Any, np.dtype[np.uint8]], int]:
    """(how many words of ``rest`` are not ``word``, those words, the mask of them: bit i
    set where ``rest[i] != word``, LSB first, padded with zeros to 8-byte words, and its
    length up to the byte of its last set bit)."""
    kept = np.empty(len(rest), dtype=rest.dtype)
    mask = np.empty((len(rest) + 63) // 64 * 8, dtype=np.uint8)
    used = np.empty(1, dtype=np.int64)
    size = rest.dtype.itemsize
    count = _lib().wd_split_mask(ptr(rest), len(rest), size, word, ptr(kept), ptr(mask), ptr(used))
    return count, kept[:count], mask, int(used[0])


def rice_mask(
    mask: np.ndarray[Any, np.dtype[np.uint8]], n: int, count: int, k: int
) -> tuple[bytes, bytes]:
    """(unary stream, remainder stream) with parameter k of the gaps between the ``count``
    (>= 1) set bits of a :func:`split_mask` mask of ``n`` bits."""
    # The quotients sum to at most (n - count) >> k: the gaps sum to n - count or less.
    room = (((n - count) >> k) + count + 7) // 8 + (count * k + 7) // 8 + SLACK
    out = np.empty(room, dtype=np.uint8)
    scratch = np.empty(count, dtype=np.int64)  # the set bits' indices
    lib = _lib()
    unary = lib.wd_rice_mask(ptr(mask), len(mask) // 8, count, k, ptr(scratch), ptr(out), room)
    assert unary > 0, "the mask and its count disagree"
    return out[:unary].tobytes(), out[unary : unary + (count * k + 7) // 8].tobytes()


# Word sizes whose exact histograms the kernel counts in tables (256 or 65536 bins).
HISTOGRAM_SIZES = (1, 2)
_scratch = threading.local()


def histogram(
    values: np.ndarray[Any, Any], step: int
) -> tuple[np.ndarray[Any, np.dtype[np.uint64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """(distinct words, their counts) of ``values[::step]`` (1- or 2-byte words, fewer than
    2^32 taken), words increasing."""
    size = values.dtype.itemsize
    assert size in HISTOGRAM_SIZES
    span = 1 << (8 * size)
    # Each thread's zeroed tables (1 MiB for 2-byte words), which the kernel leaves
    # zeroed: zeroing or faulting in a megabyte per call would cost more than the count.
    tables = _scratch.__dict__.setdefault("tables", {})
    if size not in tables:
        tables[size] = np.zeros(4 * span, np.uint32), np.zeros(span // 64, np.uint64)
    bins, present = tables[size]
    most = min(len(range(0, len(values), step)), span)
    words, counts = np.empty(most, dtype=np.uint64), np.empty(most, dtype=np.int64)
    lib = _lib()
    args = (ptr(values), len(values), step, size, ptr(bins), ptr(present), ptr(words), ptr(counts))
    distinct = lib.wd_histogram(*args)
    return words[:distinct], counts[:distinct]


def plane_score(words: np.ndarray[Any, Any], table: np.ndarray[Any, np.dtype[np.int32]]) -> int:
    """The sum over the byte planes' 256-bin histograms of ``words`` of h · lg(h), lg
    the fixed-point logarithm whose 1024 fractions are ``table`` (wdelta.policy.fixedlog)."""
    assert table.dtype == np.int32 and len(table) == 1024 and table.flags.c_contiguous
    score: int = _lib().wd_plane_score(ptr(words), len(words), words.dtype.itemsize, ptr(table))
    return score


def value_costs(
    words: np.ndarray[Any, np.dtype[np.uint64]], counts: np.ndarray[Any, np.dtype[np.int64]],
    size: int, levels: int, table: np.ndarray[Any, np.dtype[np.int32]],
    constants: tuple[int, ...],
) -> tuple[list[int], list[int], list[int], list[int]]:  # fmt: skip
    """The coded-values estimates (plane, rice, spent, scanned bytes for 0..``levels``
    split levels) of the ranked distinct ``words`` (``size`` bytes each) of ``counts``,
    as wdelta.policy.values computes them; ``constants`` are its ESTIMATE_CONSTANTS."""
    assert words.dtype == np.uint64 and counts.dtype == np.int64 and len(words) == len(counts)
    assert 1 <= levels <= min(8, len(words)) and table.dtype == np.int32 and len(table) == 1024
    fixed = np.array(constants, dtype=np.int64)
    out = np.empty((4, levels + 1), dtype=np.int64)
    words, counts = np.ascontiguousarray(words), np.ascontiguousarray(counts)
    rows = [ptr(row) for row in out]
    _lib().wd_value_costs(
        ptr(words), ptr(counts), len(words), size, levels, ptr(table), ptr(fixed), *rows
    )
    plane, rice, spent, scanned = out.tolist()
    return plane, rice, spent, scanned
