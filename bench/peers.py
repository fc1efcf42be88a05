"""What other tools make of a base/target pair: sizes and timed encode/decode of each peer.

Peers (every one lossless, every round trip checked where it decodes):
  - zstd -3 / -19 of the target file, and of the XOR of the two files (what
    ZipNN's "delta" does: XOR two equal-length files, then compress);
  - the TRL "Delta Weight Sync" layout: one safetensors file with, per changed
    tensor, ``{name}.idx`` (gaps ``idx[k] - idx[k-1] - 1``, U16 when every gap
    fits, else U32) and ``{name}.val`` (raw values; fp8 values widened to
    bf16 as TRL does, F32 scales kept F32), raw and with zstd -3;
  - ZipNN (byte grouping + Huffman/zstd) of the target and of the XOR.
Times are seconds of the work in memory (files already read), except for
``zstd_xor_files``, the file-to-file speed reference.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import zstandard
from safetensors.numpy import save as st_save

Array = np.ndarray[Any, Any]
WORDS = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32, "F8_E4M3": np.uint8,
         "F8_E5M2": np.uint8, "U8": np.uint8, "I8": np.uint8}  # fmt: skip


@dataclass(frozen=True)
class Loaded:
    """Both files in memory: raw bytes, per-tensor (dtype, words), and their XOR."""

    base: bytes
    target: bytes
    tensors: dict[str, tuple[str, Array, Array]]
    xor: bytes


def _tensors(data: bytes) -> dict[str, tuple[str, Array]]:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        out[name] = (t["dtype"], np.frombuffer(data, WORDS[t["dtype"]], (hi - lo) // np.dtype(
            WORDS[t["dtype"]]).itemsize, 8 + n + lo))  # fmt: skip
    return out


def load(base: Path, target: Path) -> Loaded:
    """Read both files (same safetensors layout required for the XOR)."""
    b, t = base.read_bytes(), target.read_bytes()
    if len(b) != len(t):
        raise ValueError("XOR peers need files of equal length")
    tb, tt = _tensors(b), _tensors(t)
    tensors = {k: (tt[k][0], tb[k][1], tt[k][1]) for k in tt}
    xor = np.bitwise_xor(np.frombuffer(b, np.uint8), np.frombuffer(t, np.uint8)).tobytes()
    return Loaded(b, t, tensors, xor)


@dataclass(frozen=True)
class Result:
    """Bytes of one method's output; encode/decode seconds (None: not measured)."""

    bytes: int
    encode: float | None = None
    decode: float | None = None


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def zstd(data: bytes, level: int, decode: bool = True) -> Result:
    """One single-threaded zstd frame; decode checked for equality."""
    packed, enc = _timed(lambda: zstandard.ZstdCompressor(level=level).compress(data))
    if not decode:
        return Result(len(packed), enc)
    back, dec = _timed(lambda: zstandard.ZstdDecompressor().decompress(packed))
    if back != data:
        raise AssertionError("zstd round trip differs")
    return Result(len(packed), enc, dec)


def _write_synced(path: Path, data: Any) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def zstd_xor_files(
    base: Path, target: Path, work: Path, level: int = 3,
    timer: Callable[[Callable[[], Any]], tuple[Any, float]] = _timed,
) -> Result:  # fmt: skip
    """The speed reference: "XOR the files, zstd the result" as a file-to-file tool.

    Encode reads both files, XORs them, compresses (one thread) and writes
    and fsyncs the delta; decode reads the base and the delta, decompresses,
    XORs and writes and fsyncs the rebuilt file, which is then checked.
    That is the job wdelta diff and apply do (without their digests).
    ``timer`` runs and times each of the two (bench/fp8speed.py also counts CPU).
    """
    delta, rebuilt = work / "xor.zst", work / "xor.out"

    def encode() -> None:
        b = np.fromfile(base, np.uint8)
        x = np.bitwise_xor(b, np.fromfile(target, np.uint8))
        _write_synced(delta, zstandard.ZstdCompressor(level=level).compress(x))

    def decode() -> None:
        b = np.fromfile(base, np.uint8)
        x = zstandard.ZstdDecompressor().decompress(delta.read_bytes())
        _write_synced(rebuilt, np.bitwise_xor(b, np.frombuffer(x, np.uint8)))

    _, enc = timer(encode)
    _, dec = timer(decode)
    if rebuilt.read_bytes() != target.read_bytes():
        raise AssertionError("zstd XOR file round trip differs")
    size = delta.stat().st_size
    delta.unlink()
    rebuilt.unlink()
    return Result(size, enc, dec)


def _trl_values(dtype: str, words: Array) -> Array:
    if dtype in ("F8_E4M3", "F8_E5M2"):
        kind = ml_dtypes.float8_e4m3fn if dtype == "F8_E4M3" else ml_dtypes.float8_e5m2
        return words.view(kind).astype(ml_dtypes.bfloat16).view(np.uint16)
    return words


def trl_layout(loaded: Loaded) -> bytes:
    """The TRL delta file: gap-coded indices and raw values of every changed tensor."""
    out: dict[str, Array] = {}
    for name, (dtype, b, t) in loaded.tensors.items():
        idx = np.flatnonzero(b != t)
        if len(idx) == 0:
            continue
        gaps = np.diff(idx, prepend=-1) - 1
        out[f"{name}.idx"] = gaps.astype(np.uint16 if gaps.max() < 1 << 16 else np.uint32)
        out[f"{name}.val"] = _trl_values(dtype, t[idx])
    return st_save(out)


def trl(loaded: Loaded) -> tuple[Result, Result]:
    """(raw, zstd -3) sizes of the TRL layout; encode includes building the file."""
    layout, enc = _timed(lambda: trl_layout(loaded))
    packed = zstd(layout, 3)
    return Result(len(layout), enc), Result(packed.bytes, enc + (packed.encode or 0))


def zipnn(data: bytes, dtype: str) -> Result:
    """ZipNN of ``data`` read as ``dtype`` words; round trip checked.

    zipnn's ``compress`` overwrites the buffer it is given (even ``bytes``),
    so it gets a private copy.
    """
    from zipnn import ZipNN

    codec = ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
    scratch = bytearray(data)
    packed, enc = _timed(lambda: codec.compress(scratch))
    back, dec = _timed(lambda: codec.decompress(packed))
    if bytes(back) != data:
        raise AssertionError("ZipNN round trip differs")
    return Result(len(packed), enc, dec)


def zipnn_dtype(loaded: Loaded) -> str:
    """bfloat16 for bf16 checkpoints, and for fp8 ones too: zipnn's byte input takes
    float and uint32 word types only, and fp8 files are mostly 1-byte words."""
    dtypes = {d for d, _, _ in loaded.tensors.values()}
    return "bfloat16" if dtypes <= {"BF16", "F8_E4M3", "F32"} else "float32"
