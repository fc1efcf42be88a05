"""In-memory checkpoints whose safetensors files are known byte for byte.

A :class:`Checkpoint` holds tensors (name, dtype, shape, raw little-endian
bytes) and the exact text of every file's safetensors header, so that the
expected output of an apply can be computed here, independently of the
reference decoder.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from wdelta.checkpoint.safetensors_header import build_header, parse_header
from wdelta.format.dtypes import DTYPES

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class TensorData:
    """One tensor: ``data`` is its C-order little-endian bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def size(self) -> int:
        """Bytes per element."""
        return DTYPES[self.dtype].size

    @property
    def elements(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    def words(self) -> np.ndarray[Any, Any]:
        """The elements as a read-only array of unsigned words."""
        return np.frombuffer(self.data, dtype=f"<u{self.size}")


def tensor(
    name: str, dtype: str, shape: tuple[int, ...], words: np.ndarray[Any, Any]
) -> TensorData:
    """A tensor from an array of words of the dtype's size."""
    size = DTYPES[dtype].size
    data = np.ascontiguousarray(words, dtype=f"<u{size}").tobytes()
    t = TensorData(name, dtype, tuple(shape), data)
    assert len(data) == t.elements * size, (name, len(data), t.elements)
    return t


@dataclass(frozen=True)
class Checkpoint:
    """Tensors plus the exact files they are stored in.

    ``files`` are ``(file name, safetensors header text)`` pairs; ``index`` is
    ``(file name, text)`` of the sharded index or None for a single file.
    """

    tensors: tuple[TensorData, ...]
    files: tuple[tuple[str, str], ...]
    index: tuple[str, str] | None = None

    @property
    def by_name(self) -> dict[str, TensorData]:
        return {t.name: t for t in self.tensors}

    @property
    def layout(self) -> str:
        """``"file"`` for a single safetensors file, ``"folder"`` when sharded."""
        return "file" if self.index is None else "folder"

    def file_bytes(self) -> dict[str, bytes]:
        """Every file of the checkpoint (shards and index) by name."""
        by_name = self.by_name
        out: dict[str, bytes] = {}
        for path, text in self.files:
            header = text.encode("utf-8")
            layout = parse_header(header)
            data = bytearray(layout.data_length)
            for t in layout.tensors:
                data[t.begin : t.end] = by_name[t.name].data
            out[path] = struct.pack("<Q", len(header)) + header + bytes(data)
        if self.index is not None:
            out[self.index[0]] = self.index[1].encode("utf-8")
        return out

    def with_data(self, name: str, data: bytes) -> Checkpoint:
        """The same checkpoint with the bytes of tensor ``name`` replaced."""
        tensors = tuple(replace(t, data=data) if t.name == name else t for t in self.tensors)
        return replace(self, tensors=tensors)


def _canonical(tensors: list[TensorData], metadata: dict[str, str] | None) -> str:
    layout = build_header([(t.name, DTYPES[t.dtype], t.shape) for t in tensors], metadata)
    return layout.header_text


def single(
    tensors: list[TensorData], metadata: dict[str, str] | None = None, name: str = SINGLE_NAME
) -> Checkpoint:
    """A single-file checkpoint laid out the way the safetensors writer does."""
    return Checkpoint(tuple(tensors), ((name, _canonical(tensors, metadata)),))


def with_header(tensors: list[TensorData], header_text: str, name: str = SINGLE_NAME) -> Checkpoint:
    """A single file with a hand-written (e.g. non-canonical) header."""
    parse_header(header_text.encode("utf-8"))
    return Checkpoint(tuple(tensors), ((name, header_text),))


def sharded(tensors: list[TensorData], shard_of: dict[str, str]) -> Checkpoint:
    """A sharded checkpoint: ``shard_of`` maps each tensor name to its file."""
    files = []
    for shard in sorted(set(shard_of.values())):
        members = [t for t in tensors if shard_of[t.name] == shard]
        files.append((shard, _canonical(members, {"format": "pt"})))
    total = sum(len(t.data) for t in tensors)
    weight_map = {name: shard_of[name] for name in sorted(shard_of)}
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    return Checkpoint(tuple(tensors), tuple(files), (INDEX_NAME, text))
