"""Shared helpers for the wdelta test suite.

Everything here is written from the format description (design notes / SPEC),
not from the library's internals, so that the tests check the library against
an independent reading of the format: dtype tables, special bit patterns,
a raw safetensors writer, the checkpoint digest, and a delta-file editor that
re-serialises a modified header and blobs with valid digests and checksums.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import ml_dtypes
import numpy as np
import zstandard

import wdelta
from wdelta.format.container import pack_prefix

# safetensors name -> (element size in bytes, numpy / ml_dtypes dtype)
DTYPES: dict[str, tuple[int, np.dtype[Any]]] = {
    "BOOL": (1, np.dtype(np.bool_)),
    "U8": (1, np.dtype(np.uint8)),
    "I8": (1, np.dtype(np.int8)),
    "F8_E4M3": (1, np.dtype(ml_dtypes.float8_e4m3fn)),
    "F8_E5M2": (1, np.dtype(ml_dtypes.float8_e5m2)),
    "F8_E8M0": (1, np.dtype(ml_dtypes.float8_e8m0fnu)),
    "F8_E4M3FNUZ": (1, np.dtype(ml_dtypes.float8_e4m3fnuz)),
    "F8_E5M2FNUZ": (1, np.dtype(ml_dtypes.float8_e5m2fnuz)),
    "I16": (2, np.dtype(np.int16)),
    "U16": (2, np.dtype(np.uint16)),
    "F16": (2, np.dtype(np.float16)),
    "BF16": (2, np.dtype(ml_dtypes.bfloat16)),
    "I32": (4, np.dtype(np.int32)),
    "U32": (4, np.dtype(np.uint32)),
    "F32": (4, np.dtype(np.float32)),
    "I64": (8, np.dtype(np.int64)),
    "U64": (8, np.dtype(np.uint64)),
    "F64": (8, np.dtype(np.float64)),
    "C64": (8, np.dtype(np.complex64)),
}
DTYPE_NAMES = tuple(DTYPES)

# Bit patterns that a value-level (float) implementation would mangle: NaN
# payloads (quiet and signalling, both signs), -0.0, subnormals, infinities and
# the fp8 special encodings.
_F32_SPECIALS = [
    0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF,
    0x7F800000, 0xFF800000, 0x80000000, 0x00000000, 0x00000001, 0x807FFFFF, 0x00800000,
]  # fmt: skip
SPECIALS: dict[str, list[int]] = {
    "BOOL": [0, 1],
    "U8": [0, 1, 0x7F, 0x80, 0xFF],
    "I8": [0, 1, 0x7F, 0x80, 0xFF],
    "F8_E4M3": [0x7F, 0xFF, 0x80, 0x00, 0x01, 0x07, 0x7E, 0xFE],
    "F8_E5M2": [0x7C, 0xFC, 0x7D, 0x7E, 0x7F, 0xFD, 0xFF, 0x80, 0x00, 0x01, 0x03],
    "F8_E8M0": [0xFF, 0x00, 0x7F, 0xFE, 0x01],
    "F8_E4M3FNUZ": [0x80, 0x00, 0x01, 0x7F, 0xFF],
    "F8_E5M2FNUZ": [0x80, 0x00, 0x01, 0x7F, 0xFF],
    "I16": [0, 1, 0x7FFF, 0x8000, 0xFFFF],
    "U16": [0, 1, 0x7FFF, 0x8000, 0xFFFF],
    "F16": [0x7E00, 0xFE00, 0x7C01, 0x7DFF, 0x7C00, 0xFC00, 0x8000, 0x0000, 0x0001, 0x83FF],
    "BF16": [0x7FC0, 0xFFC0, 0x7F81, 0x7FBF, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x807F],
    "I32": [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF],
    "U32": [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF],
    "F32": _F32_SPECIALS,
    "I64": [0, 1, 2**63 - 1, 2**63, 2**64 - 1],
    "U64": [0, 1, 2**63 - 1, 2**63, 2**64 - 1],
    "F64": [
        0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FF0000000000001,
        0x7FF7FFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000, 0x8000000000000000,
        0x0000000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF,
    ],
    "C64": [lo | (hi << 32) for lo in _F32_SPECIALS[:5] for hi in _F32_SPECIALS[5:10]],
}  # fmt: skip


def word_dtype(size: int) -> np.dtype[Any]:
    """The little-endian unsigned word of ``size`` bytes."""
    return np.dtype(f"<u{size}")


def words_to_array(words: np.ndarray[Any, Any], name: str, shape: tuple[int, ...]) -> Any:
    """Reinterpret unsigned words as a tensor of dtype ``name`` (bytes kept)."""
    size, dtype = DTYPES[name]
    raw = np.ascontiguousarray(words, dtype=word_dtype(size)).tobytes()
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def random_words(rng: np.random.Generator, size: int, n: int) -> np.ndarray[Any, Any]:
    """n uniformly random words of ``size`` bytes (every bit pattern possible)."""
    return np.frombuffer(rng.bytes(n * size), dtype=word_dtype(size)).copy()


def raw(array: Any) -> bytes:
    """The stored bytes of an array (C order, as safetensors stores them)."""
    return bytes(np.ascontiguousarray(array).tobytes())


def assert_same_tensors(got: Mapping[str, Any], want: Mapping[str, Any]) -> None:
    """Same names, dtypes, shapes and bytes."""
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert raw(got[name]) == raw(array), name


# ---------------------------------------------------------------- files


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_hashes(path: Path) -> dict[str, str]:
    """sha256 of a file (key ""), or of every file (hidden ones too) under a folder."""
    if path.is_file():
        return {"": sha256(path)}
    return {str(p.relative_to(path)): sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders wdelta may have left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if ".wdelta-tmp-" in p.name)


@dataclass(frozen=True)
class RawTensor:
    """A tensor for the raw safetensors writer."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def as_raw(array: Any) -> RawTensor:
    """A numpy / ml_dtypes array as a RawTensor."""
    names = {dtype: name for name, (_, dtype) in DTYPES.items()}
    return RawTensor(names[np.dtype(array.dtype)], tuple(array.shape), raw(array))


def safetensors_bytes(
    tensors: Mapping[str, RawTensor],
    metadata: dict[str, str] | None = None,
    *,
    data_order: list[str] | None = None,
    indent: int | None = None,
    pad: bool = True,
) -> bytes:
    """A safetensors file laid out in ``data_order`` with a chosen JSON style.

    ``indent``/``pad`` vary the header text so that byte-identity of outputs
    is tested against headers that are not in the canonical form.
    """
    order = data_order or list(tensors)
    offsets: dict[str, list[int]] = {}
    cursor = 0
    for name in order:
        offsets[name] = [cursor, cursor + len(tensors[name].data)]
        cursor += len(tensors[name].data)
    doc: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
    for name, t in tensors.items():
        doc[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": offsets[name]}
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    header = text.encode("utf-8")
    if pad:
        header += b" " * (-len(header) % 8)
    data = b"".join(tensors[name].data for name in order)
    return struct.pack("<Q", len(header)) + header + data


def write_sharded(
    folder: Path, shards: list[dict[str, RawTensor]], *, prefix: str = "model"
) -> dict[str, str]:
    """Write shards plus ``model.safetensors.index.json``; returns the weight map."""
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        fname = f"{prefix}-{i:05d}-of-{len(shards):05d}.safetensors"
        (folder / fname).write_bytes(safetensors_bytes(shard, {"format": "pt"}))
        for name, t in shard.items():
            weight_map[name] = fname
            total += len(t.data)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / f"{prefix}.safetensors.index.json").write_text(
        json.dumps(index, indent=2) + "\n", encoding="utf-8"
    )
    return weight_map


# ---------------------------------------------------------------- digests (from the spec)


def tensor_digest(data: bytes) -> str:
    return str(blake3.blake3(data).hexdigest())


def checkpoint_digest(entries: list[tuple[str, str, tuple[int, ...], str]]) -> str:
    """Spec: BLAKE3(domain || per tensor sorted by UTF-8 name: name, dtype, shape, digest)."""
    h = blake3.blake3(b"wdelta-checkpoint-v1\n")
    for name, dtype, shape, digest in sorted(entries, key=lambda e: e[0].encode("utf-8")):
        nb = name.encode("utf-8")
        h.update(struct.pack("<I", len(nb)) + nb)
        h.update(struct.pack("<B", len(dtype)) + dtype.encode("ascii"))
        h.update(struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape))
        h.update(bytes.fromhex(digest))
    return str(h.hexdigest())


def arrays_digest(arrays: Mapping[str, Any]) -> str:
    """Checkpoint digest of in-memory arrays."""
    return checkpoint_digest(
        [(n, as_raw(a).dtype, tuple(a.shape), tensor_digest(raw(a))) for n, a in arrays.items()]
    )


# ---------------------------------------------------------------- payloads (from the spec)


def ref_transform(kind: str, b: int, t: int, w: int) -> int:
    mod = 1 << w
    if kind == "xor":
        return t ^ b
    d = (t - b) % mod
    sign = mod - 1 if d >> (w - 1) else 0
    return ((d << 1) ^ sign) % mod


def ref_planes(values: list[int], size: int) -> bytes:
    return b"".join(bytes((v >> (8 * j)) & 0xFF for v in values) for j in range(size))


def pack_bits(bits: list[int]) -> bytes:
    out = bytearray((len(bits) + 7) // 8)
    for n, bit in enumerate(bits):
        out[n >> 3] |= bit << (n & 7)
    return bytes(out)


def ref_rice(pos: list[int], k: int) -> tuple[bytes, bytes]:
    gaps = [p - q - 1 for p, q in zip(pos, [-1, *pos[:-1]], strict=True)]
    unary: list[int] = []
    rem: list[int] = []
    for g in gaps:
        unary += [0] * (g >> k) + [1]
        rem += [(g >> j) & 1 for j in range(k)]
    return pack_bits(unary), pack_bits(rem)


def ref_bitmap(pos: list[int], m: int) -> bytes:
    bits = [0] * m
    for p in pos:
        bits[p] = 1
    return pack_bits(bits)


def ref_sparse(pos: list[int], values: list[int], size: int, m: int, coding: int, k: int) -> bytes:
    """Sparse payload: head, bitmap (coding 0) or Rice (coding 1) positions, value planes."""
    head = bytes([coding, k]) + bytes(6) + struct.pack("<Q", len(pos))
    if coding == 0:
        body = ref_bitmap(pos, m)
    else:
        unary, rem = ref_rice(pos, k)
        body = struct.pack("<Q", len(unary)) + unary + rem
    return head + body + ref_planes(values, size)


def parse_sparse(payload: bytes, m: int, size: int) -> tuple[list[int], list[int], int]:
    """(positions, values, rice k) of a well-formed sparse payload."""
    coding, k = payload[0], payload[1]
    (c,) = struct.unpack_from("<Q", payload, 8)
    bits = [(byte >> j) & 1 for byte in payload for j in range(8)]
    if coding == 0:
        pos = [j for j in range(m) if bits[16 * 8 + j]]
        cursor = 16 + (m + 7) // 8
    else:
        (u,) = struct.unpack_from("<Q", payload, 16)
        ones = [n for n in range(u * 8) if bits[24 * 8 + n]]
        rem_start = (24 + u) * 8
        pos, prev = [], -1
        for i, one in enumerate(ones):
            q = one - (ones[i - 1] + 1 if i else 0)
            r = sum(bits[rem_start + i * k + j] << j for j in range(k))
            prev = prev + 1 + ((q << k) | r)
            pos.append(prev)
        cursor = 24 + u + (c * k + 7) // 8
    values = [sum(payload[cursor + j * c + i] << (8 * j) for j in range(size)) for i in range(c)]
    return pos, values, k


# ---------------------------------------------------------------- delta files


PREFIX = struct.Struct("<8sIIQ32sQ")


@dataclass
class Delta:
    """A delta file split into its header JSON and its blobs (in header order).

    ``write`` re-serialises it with contiguous offsets, fresh blob checksums
    and a fresh header digest, so a test can change one thing deep inside a
    file and check that the reader finds exactly that problem.
    """

    header: dict[str, Any]
    blobs: list[bytes]
    frozen: bool = False  # set by ``layout``: write offsets/checksums as they are

    @classmethod
    def read(cls, path: Path) -> Delta:
        data = path.read_bytes()
        _, _, _, n, _, _ = PREFIX.unpack_from(data)
        header = json.loads(data[64 : 64 + n])
        assert "compact-header" not in header["required_features"], "write it with compact=False"
        section = data[64 + n :]
        blobs = [section[c["offset"] : c["offset"] + c["length"]] for _, c in cls._walk(header)]
        return cls(header, blobs)

    @staticmethod
    def _walk(header: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for t in header["tensors"]:
            for c in t.get("chunks", []):
                if c["encoding"] != "unchanged":
                    yield t, c

    def chunks(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(tensor, chunk) for every blob, in blob order."""
        return list(self._walk(self.header))

    def find(self, encoding: str) -> int:
        """Index of the first blob of a chunk with ``encoding``."""
        for i, (_, c) in enumerate(self.chunks()):
            if c["encoding"] == encoding:
                return i
        raise LookupError(encoding)

    def payload(self, i: int) -> bytes:
        _, c = self.chunks()[i]
        blob = self.blobs[i]
        return blob if c["codec"] == "none" else zstandard.ZstdDecompressor().decompress(blob)

    def set_payload(self, i: int, payload: bytes, codec: str = "none") -> None:
        """Replace blob i's raw payload (raw_length updated, stored as ``codec``)."""
        _, c = self.chunks()[i]
        c["codec"] = codec
        c["raw_length"] = len(payload)
        self.blobs[i] = payload if codec == "none" else zstd_frame(payload)

    def blob_index(self, name: str, chunk: int = 0) -> int:
        """Blob index of chunk ``chunk`` of the (first) tensor called ``name``."""
        entry = self.tensor(name)
        target = entry["chunks"][chunk]
        return next(i for i, (_, c) in enumerate(self.chunks()) if c is target)

    def tensor(self, name: str, op: str | None = None) -> dict[str, Any]:
        return next(
            t for t in self.header["tensors"] if t["name"] == name and op in (None, t["op"])
        )

    def refresh_side_digests(self) -> None:
        """Recompute base/target checkpoint digests from the tensor digests."""
        for side, absent in (("base", "added"), ("target", "removed")):
            entries = [
                (t["name"], t["dtype"], tuple(t["shape"]), t[f"{side}_digest"])
                for t in self.header["tensors"]
                if t["op"] != absent
            ]
            self.header[side]["digest"] = checkpoint_digest(entries)

    def header_bytes(self) -> bytes:
        text = json.dumps(self.header, ensure_ascii=False, separators=(",", ":")).encode()
        return text + b" " * (-len(text) % 8)

    def layout(self) -> None:
        """Contiguous offsets, lengths and checksums for the blobs; then frozen,
        so that an edit made after this call reaches the file unchanged."""
        offset = 0
        for (_, c), blob in zip(self.chunks(), self.blobs, strict=True):
            c["offset"], c["length"] = offset, len(blob)
            c["checksum"] = blake3.blake3(blob).hexdigest()
            offset += len(blob)
        self.frozen = True

    def write(self, path: Path) -> Path:
        if not self.frozen:
            self.layout()
        header = self.header_bytes()
        data = b"".join(self.blobs)
        path.write_bytes(pack_prefix(header, len(data)) + header + data)
        return path


def zstd_frame(payload: bytes, *, content_size: bool = True) -> bytes:
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=content_size)
    return bytes(cctx.compress(payload))


def rle_zstd_frame(
    size: int, byte: int = 0, *, window_log: int | None = None, dict_id: int | None = None
) -> bytes:
    """A hand-made zstd frame (RFC 8878) of ``size`` copies of ``byte`` (one RLE block,
    size <= 128 KiB) with a 4-byte content size, an optional explicit window
    (not single-segment) and an optional dictionary ID."""
    assert 0 < size <= 1 << 17
    descriptor = 0x80 | (0x20 if window_log is None else 0) | (0 if dict_id is None else 1)
    header = bytes([descriptor])
    if window_log is not None:
        header += bytes([(window_log - 10) << 3])
    if dict_id is not None:
        header += bytes([dict_id])
    block = (size << 3) | (1 << 1) | 1  # RLE block, last block
    return (
        b"\x28\xb5\x2f\xfd"
        + header
        + struct.pack("<I", size)
        + block.to_bytes(3, "little")
        + bytes([byte])
    )


def encodings_used(path: Path) -> set[str]:
    """Encodings of every chunk; sparse split by position coding (byte 0)."""
    used: set[str] = set()
    with wdelta.open_delta(path) as d:
        for t in d.header.tensors:
            for c in t.chunks:
                if c.encoding == "sparse":
                    used.add(("sparse-bitmap", "sparse-rice")[d.payload(c)[0]])
                else:
                    used.add(c.encoding)
    return used


def transforms_used(path: Path) -> set[str]:
    with wdelta.open_delta(path) as d:
        return {c.transform for t in d.header.tensors for c in t.chunks if c.transform}


def ops(path: Path) -> set[tuple[str, str]]:
    with wdelta.open_delta(path) as d:
        return {(t.name, t.op) for t in d.header.tensors}


@contextlib.contextmanager
def unchanged_inputs(*paths: Path) -> Iterator[None]:
    """Assert that the files or folders at ``paths`` are byte-identical afterwards."""
    before = [tree_hashes(p) for p in paths]
    yield
    assert [tree_hashes(p) for p in paths] == before


def expect_refusal(
    base: Any, delta: Path, out: Path, category: str, *, reverse: bool = False
) -> wdelta.WdeltaError:
    """Apply must raise a WdeltaError of ``category`` and leave nothing behind."""
    inputs = [delta] + ([base] if isinstance(base, os.PathLike) else [])
    folder_before = sorted(os.listdir(out.parent))
    with unchanged_inputs(*inputs):
        try:
            wdelta.apply(base, delta, out, reverse=reverse, threads=2)
        except wdelta.WdeltaError as exc:
            error = exc
        else:
            raise AssertionError(f"apply succeeded; expected {category}")
    assert error.category == category, f"{error.category}: {error}"
    assert not out.exists()
    assert sorted(os.listdir(out.parent)) == folder_before
    return error


def record_staged(monkeypatch: Any) -> list[int]:
    """Patch OutputFile so that each copy into its O_DIRECT staging buffer appends
    the copied length to the returned list (empty: every write went out as it was)."""
    from wdelta.io.output_file import OutputFile

    staged: list[int] = []
    real_staged = OutputFile._staged

    def counting(self: OutputFile, source: Any) -> memoryview:
        staged.append(len(source))
        return real_staged(self, source)

    monkeypatch.setattr(OutputFile, "_staged", counting)
    return staged
