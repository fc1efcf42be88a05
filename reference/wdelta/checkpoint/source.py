"""Checkpoints as sets of tensors that can be read chunk by chunk.

A checkpoint is a single ``.safetensors`` file, a folder holding a sharded
checkpoint (``*.safetensors.index.json`` plus shards), or an in-memory mapping
of names to NumPy arrays.  Reads are positioned (``os.preadv``) into fresh
buffers, so memory grows with the chunk being read, never with the file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arguments import as_path, check_str_mapping
from ..errors import BadArgumentError, CheckpointInvalidError, StorageError, TruncatedError
from ..format import strictjson
from ..format.dtypes import DType, from_numpy
from ..io import filekind
from ..limits import MAX_INPUT_HEADER_BYTES
from .safetensors_header import FileLayout, build_header, parse_header

# File names a delta can record (SPEC §4.9): no paths, no leading dot, at
# most 255 characters.  Always used with ``fullmatch``: Python's ``$`` would
# also match before a final line feed, which the format's patterns exclude.
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors")
INDEX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors\.index\.json")
MAX_NAME_LENGTH = 255
SINGLE_FILE_NAME = "model.safetensors"
Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]


def is_shard_name(name: str) -> bool:
    """True if a delta can record ``name`` as a safetensors file name (§4.9)."""
    return len(name) <= MAX_NAME_LENGTH and SHARD_NAME.fullmatch(name) is not None


def is_index_name(name: str) -> bool:
    """True if a delta can record ``name`` as an index file name (§4.9)."""
    return len(name) <= MAX_NAME_LENGTH and INDEX_NAME.fullmatch(name) is not None


@dataclass
class Tensor:
    """One tensor of a checkpoint; ``read`` returns ``count`` words from ``start``."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    _fd: int | None = None
    _offset: int = 0
    _array: np.ndarray[Any, Any] | None = None
    # Live tensors (wdelta.ops.tensors) read through their slot, chunk by chunk.
    _reader: Callable[[int, int], Words] | None = None
    # The file a ``_fd`` tensor lives in, to name it when a read fails.
    _path: Path | None = None
    # A diff's target on a device: (positions relative to ``start``, words) where it
    # differs from the base, found on the device (wdelta.ops.tensors.compare_on_device).
    _changes: Callable[[int, int], tuple[np.ndarray[Any, Any], Words]] | None = None

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.size

    def peek(self, start: int, count: int) -> Words | None:
        """Words ``[start, start + count)`` of an in-memory tensor without a copy: a
        read-only view of its memory (valid while the tensor's owner leaves it
        alone); None for a tensor in a file or read through a slot."""
        if self._array is None:
            return None
        view: Words = self._array[start : start + count].view()
        view.flags.writeable = False
        return view

    @property
    def uses_scratch(self) -> bool:
        """Whether :meth:`read` reads into a given scratch buffer (not live tensors)."""
        return self._reader is None

    def read(self, start: int, count: int, scratch: Scratch | None = None) -> Words:
        """Words ``[start, start + count)`` as a new little-endian unsigned array.

        With ``scratch`` (a reusable buffer, see :class:`Scratch`) a file is
        read into it instead, and the words stay valid only until its next use.
        """
        if self._reader is not None:
            return self._reader(start, count)
        if self._array is not None:
            return np.array(self._array[start : start + count])
        nbytes = count * self.dtype.size
        buf = np.empty(nbytes, np.uint8) if scratch is None else scratch.take(nbytes)
        assert self._fd is not None
        where = f"{self._path}: tensor {self.name!r}"
        try:
            pread_into(self._fd, buf.data, self._offset + start * self.dtype.size, where)
        except TruncatedError as exc:
            # The header was checked against the file's size when it was opened,
            # so a short read means someone shortened the file since.
            raise CheckpointInvalidError(
                f"{exc}: the file changed while it was being read; "
                "rerun once whatever writes it has finished"
            ) from exc
        out: Words = buf.view(self.dtype.word)
        return out


class Scratch:
    """A read buffer reused from chunk to chunk by one thread.

    Reading every chunk into a fresh array makes the kernel map and zero its
    pages again each time (large blocks come from mmap): measured on diff of
    the real fp8 trace (133 tensors, 27.5 MB a side), 8,800 page faults and
    11 ms of system time per diff.  The buffer grows to the largest chunk.
    """

    def __init__(self) -> None:
        self._buf = np.empty(0, np.uint8)

    def take(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The first ``nbytes`` of the buffer (its earlier contents are gone)."""
        if len(self._buf) < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf[:nbytes]


def pread_into(fd: int, buf: memoryview, offset: int, what: str = "file") -> None:
    """Fill ``buf`` from ``fd`` at ``offset``; a short file is TruncatedError.

    ``what`` names the file (and part) in both errors' messages.
    """
    done = 0
    while done < len(buf):
        try:
            got = os.preadv(fd, [buf[done:]], offset + done)
        except OSError as exc:
            raise StorageError(f"{what}: read failed: {exc}") from exc
        if got == 0:
            short = len(buf) - done
            raise TruncatedError(f"{what}: file ends at byte {offset + done}, {short} bytes short")
        done += got


@dataclass
class Checkpoint:
    """Tensors by name plus the file layout needed to rewrite the files exactly.

    ``files`` maps shard file names to their parsed headers; ``index`` is the
    ``(file name, text)`` of the sharded index, or None for a single file.
    """

    tensors: dict[str, Tensor]
    files: dict[str, FileLayout]
    index: tuple[str, str] | None = None
    _fds: list[int] = field(default_factory=list)

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def sorted_tensors(self) -> Iterator[Tensor]:
        for name in sorted(self.tensors, key=lambda n: n.encode("utf-8")):
            yield self.tensors[name]


def _open_fd(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise StorageError(filekind.os_message(path, exc)) from exc


def read_file_layout(fd: int, path: Path) -> FileLayout:
    """Parse and validate the safetensors header of an open file, and its length."""
    mistake = filekind.checkpoint_refusal(path, filekind.sniff_fd(fd, path))
    if mistake is not None:
        raise mistake
    size = os.fstat(fd).st_size
    if size < 8:
        raise CheckpointInvalidError(f"{path}: {size} bytes, too short for a safetensors file")
    prefix = bytearray(8)
    pread_into(fd, memoryview(prefix), 0)
    n = int.from_bytes(prefix, "little")
    if n > MAX_INPUT_HEADER_BYTES:
        raise CheckpointInvalidError(
            f"{path}: header of {n} bytes exceeds {MAX_INPUT_HEADER_BYTES}"
        )
    if 8 + n > size:
        raise CheckpointInvalidError(f"{path}: header length {n} runs past the end of the file")
    header = bytearray(n)
    pread_into(fd, memoryview(header), 8)
    try:
        layout = parse_header(bytes(header))
    except CheckpointInvalidError as exc:
        raise CheckpointInvalidError(f"{path}: {exc}") from exc
    if layout.data_start + layout.data_length != size:
        described = layout.data_start + layout.data_length
        raise CheckpointInvalidError(f"{path}: file is {size} bytes, header describes {described}")
    return layout


def _add_file(ckpt: Checkpoint, path: Path, name: str) -> FileLayout:
    fd = _open_fd(path)
    ckpt._fds.append(fd)
    layout = read_file_layout(fd, path)
    ckpt.files[name] = layout
    for t in layout.tensors:
        if t.name in ckpt.tensors:
            raise CheckpointInvalidError(f"tensor {t.name!r} appears in more than one shard")
        start = layout.data_start + t.begin
        ckpt.tensors[t.name] = Tensor(t.name, t.dtype, t.shape, fd, start, _path=path)
    return layout


def _find_index(folder: Path) -> Path | None:
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise CheckpointInvalidError(f"{folder}: more than one *.safetensors.index.json")
    if indexes and not is_index_name(indexes[0].name):
        raise CheckpointInvalidError(f"{indexes[0]}: index file name is not portable")
    return indexes[0] if indexes else None


def _open_sharded(folder: Path, index_path: Path, ckpt: Checkpoint) -> None:
    try:
        data = index_path.read_bytes()
    except OSError as exc:
        raise StorageError(f"{index_path}: {exc}") from exc
    index = strictjson.loads(data, CheckpointInvalidError, str(index_path))
    text = data.decode("utf-8")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(v, str) and is_shard_name(v) for v in weight_map.values()
    ):
        raise CheckpointInvalidError(f"{index_path}: weight_map must map names to shard files")
    ckpt.index = (index_path.name, text)
    for shard in sorted(set(weight_map.values())):
        # A shard the index names but the folder lacks makes the checkpoint
        # malformed (SPEC §10.3), not an I/O failure.
        if not (folder / shard).is_file():
            raise CheckpointInvalidError(f"{index_path}: shard {shard} is not in the folder")
        _add_file(ckpt, folder / shard, shard)
    for name, tensor_file in weight_map.items():
        if name not in ckpt.tensors:
            raise CheckpointInvalidError(f"index maps {name!r} to {tensor_file}, which lacks it")
    listed = {t.name: f for f, lay in ckpt.files.items() for t in lay.tensors}
    if listed != weight_map:
        raise CheckpointInvalidError(f"{index_path}: weight_map disagrees with the shards")


def recorded_name(path: Path) -> str:
    """The name a single-file checkpoint is recorded under in a delta."""
    return path.name if is_shard_name(path.name) else SINGLE_FILE_NAME


def _open_folder(folder: Path, ckpt: Checkpoint) -> None:
    index_path = _find_index(folder)
    if index_path is not None:
        _open_sharded(folder, index_path, ckpt)
        return
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        found = f"{len(files)} .safetensors files" if files else "no .safetensors file"
        raise CheckpointInvalidError(
            f"{folder} is a folder with {found} and no *.safetensors.index.json: a checkpoint "
            "folder holds one .safetensors file, or shards and their index"
        )
    _add_file(ckpt, files[0], recorded_name(files[0]))


def _open_path(p: Path, ckpt: Checkpoint) -> None:
    if p.is_dir():
        _open_folder(p, ckpt)
    elif p.is_file():
        _add_file(ckpt, p, recorded_name(p))
    elif p.exists():
        raise CheckpointInvalidError(f"{p} is not a regular file or a folder")
    else:
        raise StorageError(f"{p}: no such file or folder")


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open a ``.safetensors`` file or a folder holding a (sharded) checkpoint."""
    p = as_path(path, "checkpoint")
    ckpt = Checkpoint({}, {})
    try:
        with filekind.naming(p, CheckpointInvalidError):
            _open_path(p, ckpt)
    except BaseException:
        ckpt.close()
        raise
    return ckpt


def as_array(name: str, value: object) -> np.ndarray[Any, Any]:
    """The NumPy array of one value of a mapping given as a checkpoint.

    This is the one place where other array types are converted; anything
    that is not an array is a BadArgumentError naming the tensor.
    """
    if isinstance(value, np.ndarray):
        return value
    raise BadArgumentError(f"tensor {name!r}: expected a NumPy array, not {type(value).__name__}")


def _check_mapping(arrays: object, metadata: object) -> None:
    if not isinstance(arrays, Mapping):
        raise BadArgumentError(f"expected a mapping of tensor names to arrays, not "
                               f"{type(arrays).__name__}")  # fmt: skip
    bad = next((k for k in arrays if not isinstance(k, str)), None)
    if bad is not None:
        raise BadArgumentError(f"tensor names must be strings, not {type(bad).__name__}: {bad!r}")
    check_str_mapping(metadata, "metadata")


def from_arrays(
    arrays: Mapping[str, np.ndarray[Any, Any]], metadata: dict[str, str] | None = None
) -> Checkpoint:
    """An in-memory checkpoint; bf16/fp8 arrays may use ml_dtypes dtypes."""
    _check_mapping(arrays, metadata)
    tensors: dict[str, Tensor] = {}
    for name, value in arrays.items():
        array = as_array(name, value)
        dtype = from_numpy(array.dtype)
        # safetensors stores little-endian words; convert, never reinterpret.
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        flat = np.ascontiguousarray(little).reshape(-1).view(dtype.word)
        tensors[name] = Tensor(name, dtype, tuple(array.shape), _array=flat)
    layout = build_header([(t.name, t.dtype, t.shape) for t in tensors.values()], metadata)
    return Checkpoint(tensors, {SINGLE_FILE_NAME: layout})
