"""Live tensors (NumPy arrays, torch tensors) seen as stored words.

wdelta reads and writes a tensor only through a :class:`Slot`: chunk ``[start,
start + count)`` of its elements in row-major order, as little-endian unsigned
words (SPEC §5), so bf16, fp8, NaN payloads and -0.0 pass as bit patterns.
torch tensors are reinterpreted with ``tensor.view(<int dtype of the same
size>)``, never converted; torch is imported only when a torch tensor is
seen, so the file tools never need it.  Non-contiguous tensors are read and
written element-wise through their strides (NumPy ``flat``, torch
``take``/``put_``), so scratch memory stays bounded by the chunk.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np

from ..checkpoint.safetensors_header import build_header
from ..checkpoint.source import SINGLE_FILE_NAME, Checkpoint, Tensor, Words, from_arrays
from ..errors import BadArgumentError, UnsupportedFeatureError
from ..format.digest import new_hasher
from ..format.dtypes import DType, from_numpy, from_type_name, to_numpy, type_name

# torch dtype names are numpy/ml_dtypes names (torch.bfloat16 -> "bfloat16").
# Elements per read when hashing a tensor that has no zero-copy host view.
_HASH_BLOCK = 1 << 22
_TORCH_PREFIX = "torch."


# Which tensors to touch: fnmatch patterns on names, comma-separated (as ``chain pull
# --tensors``), a predicate, or None (all).
Select = Union[str, Callable[[str], bool], None]  # noqa: UP007


def selector(select: Select) -> Callable[[str], bool]:
    """A predicate on tensor names for a :data:`Select`."""
    if select is None:
        return lambda name: True
    if isinstance(select, str):
        patterns = [p.strip() for p in select.split(",")]
        return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)
    if not callable(select):
        raise BadArgumentError(
            f"tensors must be a pattern, a predicate on names or None, not {type(select).__name__}"
        )
    return select


def is_torch(value: object) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def dtype_of(value: Any) -> DType:
    """The safetensors dtype of a NumPy array or torch tensor."""
    if is_torch(value):
        return from_type_name(str(value.dtype).removeprefix(_TORCH_PREFIX), "torch")
    if isinstance(value, np.ndarray):
        return from_numpy(value.dtype)
    raise BadArgumentError(f"expected a numpy array or torch tensor, got {type(value).__name__}")


def _torch_word(size: int) -> Any:
    """A torch integer dtype of ``size`` bytes that NumPy can share memory with."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


class Slot:
    """One live tensor: chunked word reads and writes, in row-major element order.

    ``read`` returns a fresh array (the caller may modify it); ``write`` stores
    ``words`` (unsigned, the dtype's width) at element ``start``.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def read(self, start: int, count: int) -> Words:
        raise NotImplementedError

    def write(self, start: int, words: Words) -> None:
        raise NotImplementedError

    def whole(self) -> memoryview | None:
        """The tensor's bytes without a copy, when it is contiguous in host memory."""
        return None

    def digest(self) -> str:
        """BLAKE3 of the tensor's bytes (SPEC §9.3), read without a copy when possible."""
        hasher = new_hasher(1, self.elements * self.dtype.size)
        view = self.whole()
        if view is not None:
            hasher.update(view)
            return str(hasher.hexdigest())
        for start in range(0, self.elements, _HASH_BLOCK):
            words = self.read(start, min(_HASH_BLOCK, self.elements - start))
            hasher.update(words.data.cast("B"))
        return str(hasher.hexdigest())

    def storage_key(self) -> tuple[Any, ...]:
        """Equal for two slots over the same memory with the same layout (tied weights)."""
        raise NotImplementedError

    def invalidate(self) -> None:
        """Forget any host copy made by ``read`` (the tensor was written meanwhile)."""

    @property
    def writable(self) -> bool:
        return True

    # Whether ``gather``/``scatter`` are cheap here (host memory), so that a
    # sparse chunk need not be read and written whole.
    gathers = False

    def gather(self, index: np.ndarray[Any, Any]) -> Words:
        """Words at element ``index`` (row-major), a fresh array."""
        raise NotImplementedError

    def scatter(self, index: np.ndarray[Any, Any], words: Words) -> None:
        """Store ``words`` at element ``index``."""
        raise NotImplementedError


class NumpySlot(Slot):
    """A NumPy array (native little-endian) viewed as words."""

    def __init__(self, name: str, array: np.ndarray[Any, Any], dtype: DType | None = None) -> None:
        self.name, self.shape = name, tuple(array.shape)
        self.dtype = from_numpy(array.dtype) if dtype is None else dtype
        order = array.dtype.byteorder
        if order == ">" or (order in "=|" and sys.byteorder == "big"):
            raise BadArgumentError(f"tensor {name!r}: big-endian arrays cannot be used in place")
        self._words = array.view(self.dtype.word)
        self._flat = self._words.reshape(-1) if array.flags.c_contiguous else None

    def read(self, start: int, count: int) -> Words:
        if self._flat is not None:
            return np.array(self._flat[start : start + count])
        out: Words = self._words.flat[start : start + count]
        return out

    @property
    def writable(self) -> bool:
        return bool(self._words.flags.writeable)

    def write(self, start: int, words: Words) -> None:
        if self._flat is not None:
            self._flat[start : start + len(words)] = words
        else:
            self._words.flat[start : start + len(words)] = words

    def whole(self) -> memoryview | None:
        return None if self._flat is None else self._flat.data.cast("B")

    gathers = True

    def gather(self, index: np.ndarray[Any, Any]) -> Words:
        if self._flat is not None:
            taken: Words = self._flat.take(index)
            return taken
        out: Words = self._words.flat[index]
        return out

    def scatter(self, index: np.ndarray[Any, Any], words: Words) -> None:
        if self._flat is not None:
            self._flat[index] = words
        else:
            self._words.flat[index] = words

    def storage_key(self) -> tuple[Any, ...]:
        pointer = self._words.__array_interface__["data"][0]
        return ("numpy", pointer, self._words.shape, self._words.strides, self.dtype)


class TorchSlot(Slot):
    """A torch tensor on any device, viewed as integer words of its width, through
    torch operations only (:func:`slot` uses it for tensors off the CPU).

    A tensor off the CPU is copied to host once per pass (one transfer per
    tensor, not per chunk), held while its chunks are read; writes are
    ``copy_`` of host chunks with ``non_blocking``.
    """

    def __init__(self, name: str, tensor: Any) -> None:
        self.name, self.dtype, self.shape = name, dtype_of(tensor), tuple(tensor.shape)
        self._words = tensor.detach().view(_torch_word(self.dtype.size))
        self._flat = self._words.view(-1) if self._words.is_contiguous() else None
        # DEVICE_PATH_ON_CPU: a CPU tensor is handled as if on a device, copies included.
        self._host_cpu = self._words.device.type == "cpu" and not DEVICE_PATH_ON_CPU
        self._cached: Any = None
        self._served = 0  # elements read from ``_cached`` since it was filled
        self._lock = threading.Lock()

    def _host(self) -> np.ndarray[Any, Any]:
        """All words on the host (a view for CPU tensors, one transfer otherwise)."""
        with self._lock:
            if self._cached is None:
                flat = self._flat if self._flat is not None else self._words.reshape(-1)
                self._cached = flat.cpu().numpy().view(self.dtype.word)
            host: np.ndarray[Any, Any] = self._cached
            return host

    def read(self, start: int, count: int) -> Words:
        if self._host_cpu and self._flat is None:
            import torch

            idx = torch.arange(start, start + count, device=self._words.device)
            taken: Words = self._words.take(idx).numpy().view(self.dtype.word)
            return taken
        host = self._host()
        out = np.array(host[start : start + count])
        if not self._host_cpu:
            # Dropped once every element was served: workers read chunks out of order,
            # so "the last chunk was read" does not mean the others were.
            with self._lock:
                self._served += count
                if self._served >= self.elements:
                    self._cached, self._served = None, 0
        return out

    def write(self, start: int, words: Words) -> None:
        import torch

        src = torch.from_numpy(np.ascontiguousarray(words).view(_numpy_signed(self.dtype.size)))
        if self._flat is not None:
            self._flat[start : start + len(words)].copy_(src, non_blocking=True)
        else:
            idx = torch.arange(start, start + len(words), device=self._words.device)
            self._words.put_(idx, src.to(self._words.device, non_blocking=True))

    def whole(self) -> memoryview | None:
        if not (self._host_cpu and self._flat is not None):
            return None
        words: np.ndarray[Any, Any] = self._flat.numpy()
        return words.data.cast("B")

    def storage_key(self) -> tuple[Any, ...]:
        w = self._words
        return ("torch", str(w.device), w.data_ptr(), tuple(w.shape), w.stride(), self.dtype)

    def invalidate(self) -> None:
        with self._lock:
            self._cached, self._served = None, 0

    # Sparse chunks of apply are gathered and scattered on the device, so that only
    # the changed words cross to the host and back.
    gathers = True

    def _index(self, index: np.ndarray[Any, Any]) -> Any:
        import torch

        return to_device(torch.from_numpy(np.ascontiguousarray(index, np.int64)), self._words)

    def gather(self, index: np.ndarray[Any, Any]) -> Words:
        idx = self._index(index)
        taken = self._flat.index_select(0, idx) if self._flat is not None else self._words.take(idx)
        out: Words = taken.cpu().numpy().view(self.dtype.word)
        return out

    def scatter(self, index: np.ndarray[Any, Any], words: Words) -> None:
        import torch

        idx = self._index(index)
        src = torch.from_numpy(np.ascontiguousarray(words).view(_numpy_signed(self.dtype.size)))
        src = to_device(src, self._words)
        if self._flat is not None:
            self._flat.index_copy_(0, idx, src)
        else:
            self._words.put_(idx, src)

    def _chunk(self, start: int, count: int) -> Any:
        """Words ``[start, start + count)`` on the device (a view when contiguous)."""
        if self._flat is not None:
            return self._flat[start : start + count]
        import torch

        return self._words.take(torch.arange(start, start + count, device=self._words.device))

    def changes(
        self, base: TorchSlot, start: int, count: int
    ) -> tuple[np.ndarray[Any, Any], Words]:
        """Where chunk ``[start, start + count)`` differs from ``base``'s: positions
        (relative to ``start``) and this tensor's words there.  Stored words are
        compared as integers on the device (NaN payloads and -0.0 are words like
        any other), and only the positions and words found are copied to the host;
        device scratch is bounded by the chunk."""
        import torch

        mine = self._chunk(start, count)
        index = torch.nonzero(mine != base._chunk(start, count)).flatten()
        values: Words = mine.index_select(0, index).cpu().numpy().view(self.dtype.word)
        # Positions within a chunk fit 32 bits (MAX_CHUNK_ELEMENTS): half the bytes.
        return index.to(torch.int32).cpu().numpy(), values


# Tests and bench/device.py set this to run the device path on CPU tensors (no
# accelerator there); on CPU it is slower than reading host memory directly.
DEVICE_PATH_ON_CPU = False


def _on_device(value: Any) -> bool:
    return is_torch(value) and (DEVICE_PATH_ON_CPU or value.device.type != "cpu")


def compare_on_device(base: object, target: object, target_ckpt: Checkpoint) -> None:
    """Let each tensor of ``target_ckpt`` that lives on the same device as its base
    (two torch mappings) find its changed words there (``Tensor._changes``), so that
    the encoder transfers only those and rebuilds the chunk from the base's words."""
    if not (isinstance(base, Mapping) and isinstance(target, Mapping)):
        return
    for name, tensor in target_ckpt.tensors.items():
        b: Any = base.get(name)
        t: Any = target.get(name)
        if not (_on_device(b) and _on_device(t)) or b.device != t.device:
            continue
        if (dtype_of(b), tuple(b.shape)) != (tensor.dtype, tensor.shape):
            continue
        tensor._changes = functools.partial(TorchSlot(name, t).changes, TorchSlot(name, b))


def to_device(host: Any, like: Any) -> Any:
    """Host tensor ``host`` copied to the device of ``like``."""
    return host.to(like.device, non_blocking=True)


def _numpy_signed(size: int) -> np.dtype[Any]:
    return np.dtype("u1") if size == 1 else np.dtype(f"<i{size}")


def slot(name: str, value: Any) -> Slot:
    """The :class:`Slot` of a NumPy array or torch tensor.

    A CPU torch tensor is accessed through a NumPy view of its memory: torch's
    own ``copy_`` on small slices, running its intra-op threads beside
    wdelta's workers, measured 40 ms per 0.5 MB chunk on two busy cores, where
    a NumPy copy takes well under 1 ms.
    """
    if is_torch(value):
        if not _on_device(value):
            dtype = dtype_of(value)
            words = value.detach().view(_torch_word(dtype.size)).numpy()
            return NumpySlot(name, words.view(dtype.word), dtype)
        return TorchSlot(name, value)
    if isinstance(value, np.ndarray):
        return NumpySlot(name, value)
    raise BadArgumentError(
        f"tensor {name!r}: expected a numpy array or torch tensor, got {type(value).__name__}"
    )


def any_torch(mapping: Mapping[str, Any]) -> bool:
    """Whether a mapping holds at least one torch tensor."""
    return any(is_torch(v) for v in mapping.values())


def checkpoint_of(mapping: Mapping[str, Any]) -> Checkpoint:
    """An in-memory checkpoint over a mapping of NumPy arrays and/or torch tensors.

    Tensors are read chunk by chunk through their slots (no copy of the whole
    mapping); pure NumPy mappings keep going through :func:`from_arrays`.
    """
    if not any_torch(mapping):
        for name, value in mapping.items():
            if not isinstance(value, np.ndarray):
                raise BadArgumentError(
                    f"tensor {name!r}: expected a numpy array or torch tensor, "
                    f"got {type(value).__name__}"
                )
        return from_arrays(mapping)
    tensors: dict[str, Tensor] = {}
    for name, value in mapping.items():
        s = slot(name, value)
        view = s.whole()
        if view is not None:  # host memory: read into the reader's reused buffers
            flat = np.frombuffer(view, s.dtype.word)
            tensors[name] = Tensor(name, s.dtype, s.shape, _array=flat)
        else:
            tensors[name] = Tensor(name, s.dtype, s.shape, _reader=s.read)
    layout = build_header([(t.name, t.dtype, t.shape) for t in tensors.values()], None)
    return Checkpoint(tensors, {SINGLE_FILE_NAME: layout})


def torch_device(mapping: object) -> Any:
    """For a mapping holding torch tensors, their one device (CPU when mixed);
    None for anything else (results are then NumPy arrays)."""
    if not (isinstance(mapping, Mapping) and any_torch(mapping)):
        return None
    devices = {v.device for v in mapping.values() if is_torch(v)}
    if len(devices) == 1:
        return devices.pop()
    import torch

    return torch.device("cpu")


def present(words: Words, dtype: DType, shape: tuple[int, ...], device: Any) -> Any:
    """Decoded words as a tensor of ``dtype``: a NumPy array (ml_dtypes for
    bf16/fp8) when ``device`` is None, else a torch tensor on ``device``.
    Both are bit views of ``words``, never conversions."""
    if device is None:
        return words.view(to_numpy(dtype)).reshape(shape)
    import torch

    target = getattr(torch, type_name(dtype), None)
    if target is None:
        raise UnsupportedFeatureError(f"this torch has no dtype for {dtype.name}")
    host = torch.from_numpy(np.ascontiguousarray(words).view(_numpy_signed(dtype.size)))
    return host.view(target).reshape(shape).to(device)


__all__ = ["Slot", "checkpoint_of", "dtype_of", "is_torch", "present", "slot", "torch_device"]
