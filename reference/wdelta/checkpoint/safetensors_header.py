"""Strict parsing and canonical writing of safetensors headers.

The rules are those of the safetensors Rust validator: an 8-byte little-endian
header length, a JSON object of tensors with ``dtype``, ``shape`` and
``data_offsets`` that tile the data buffer exactly, and an optional
``__metadata__`` mapping of strings to strings.  The ``safetensors`` package
cannot stream chunks of bf16/fp8 tensors into NumPy, so wdelta parses headers
itself and reads data with positioned reads.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from typing import Any

from ..errors import CheckpointInvalidError, LimitExceededError, UnsupportedFeatureError
from ..format import strictjson
from ..format.dtypes import DTYPES, UNSUPPORTED, DType
from ..io import gc_pause
from ..limits import MAX_ELEMENTS

# Headers up to this size are parsed once per process and kept (a few of
# them): one diff or apply meets the same header text up to six times (the
# input files, the layouts recorded in the delta, the compact form's check
# for a canonical layout), about 1 ms each for a 133-tensor model, 10-15% of
# the time of a diff or apply of a 28 MB checkpoint.
CACHED_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class TensorLayout:
    """One tensor of a safetensors file: offsets are bytes into the data buffer."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def elements(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class FileLayout:
    """A parsed safetensors header: ``data_start`` is the absolute data offset."""

    header_text: str
    tensors: tuple[TensorLayout, ...]
    metadata: dict[str, str] | None

    # Cached: callers ask once per tensor, and encoding a header of N tensors
    # each time made opening a checkpoint quadratic in N (20,000 tensors: 3 s).
    @functools.cached_property
    def data_start(self) -> int:
        return 8 + len(self.header_text.encode("utf-8"))

    @functools.cached_property
    def data_length(self) -> int:
        return max((t.end for t in self.tensors), default=0)


def _parse_shape(name: str, raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
    ):
        raise CheckpointInvalidError(f"tensor {name!r}: shape must be a list of integers >= 0")
    n = 1
    for dim in raw:
        n *= dim
    if n > MAX_ELEMENTS or any(dim > MAX_ELEMENTS for dim in raw):
        raise LimitExceededError(f"tensor {name!r}: {n} elements exceeds the limit {MAX_ELEMENTS}")
    return tuple(raw)


def _parse_tensor(name: str, info: Any) -> TensorLayout:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointInvalidError(
            f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets"
        )
    dtype_name = info["dtype"]
    if not isinstance(dtype_name, str):
        raise CheckpointInvalidError(f"tensor {name!r}: dtype must be a string")
    if dtype_name in UNSUPPORTED:
        raise UnsupportedFeatureError(f"tensor {name!r}: dtype {dtype_name} is not supported")
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise CheckpointInvalidError(f"tensor {name!r}: unknown dtype {dtype_name!r}")
    shape = _parse_shape(name, info["shape"])
    offsets = info["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        raise CheckpointInvalidError(f"tensor {name!r}: data_offsets must be [begin, end]")
    layout = TensorLayout(name, dtype, shape, offsets[0], offsets[1])
    if layout.end - layout.begin != layout.elements * dtype.size:
        raise CheckpointInvalidError(
            f"tensor {name!r}: {layout.end - layout.begin} bytes for "
            f"{layout.elements} x {dtype.size}-byte elements"
        )
    return layout


def parse_header(header_bytes: bytes) -> FileLayout:
    """Validate a safetensors header (without its length prefix).

    Offsets must tile ``[0, data_length)`` exactly, in any order.  The result
    may be shared with earlier callers, except its metadata (a fresh dict).
    """
    if len(header_bytes) > CACHED_MAX_BYTES:
        return _parse_header(header_bytes)
    layout = _parse_cached(bytes(header_bytes))
    if layout.metadata is None:
        return layout
    return replace(layout, metadata=dict(layout.metadata))


@functools.lru_cache(maxsize=16)
def _parse_cached(header_bytes: bytes) -> FileLayout:
    return _parse_header(header_bytes)


def _parse_header(header_bytes: bytes) -> FileLayout:
    with gc_pause.paused():
        return _parse_layout(header_bytes)


def _parse_layout(header_bytes: bytes) -> FileLayout:
    raw = strictjson.loads(header_bytes, CheckpointInvalidError, "safetensors header")
    text = header_bytes.decode("utf-8")
    if not isinstance(raw, dict):
        raise CheckpointInvalidError("safetensors header must be a JSON object")
    metadata = raw.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise CheckpointInvalidError("__metadata__ must map strings to strings")
    tensors = tuple(_parse_tensor(name, info) for name, info in raw.items())
    cursor = 0
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.begin != cursor:
            raise CheckpointInvalidError(
                f"tensor {t.name!r}: data_offsets leave a hole or overlap at byte {cursor}"
            )
        cursor = t.end
    return FileLayout(text, tensors, metadata)


def _alignment(dtype: DType) -> int:
    return dtype.size


def build_header(
    tensors: list[tuple[str, DType, tuple[int, ...]]], metadata: dict[str, str] | None
) -> FileLayout:
    """Lay out tensors the way the safetensors serializer does.

    Tensors are ordered by decreasing dtype size, then by name, packed without
    gaps; the JSON is compact and padded with spaces to a multiple of 8 bytes.
    The layout is built along with its text, which is not parsed back: the
    checks a parse would make are made on the inputs (names, shapes, metadata).
    """
    for name, _, shape in tensors:
        if not name.isascii() and not _is_utf8(name):
            raise CheckpointInvalidError(f"tensor name {name!r} is not valid Unicode text")
        if name == "__metadata__":
            raise CheckpointInvalidError("a tensor cannot be named __metadata__")
        _parse_shape(name, list(shape))
    if metadata is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise CheckpointInvalidError("__metadata__ must map strings to strings")
    ordered = sorted(tensors, key=lambda t: (-_alignment(t[1]), t[0]))
    doc: dict[str, Any] = {}
    if metadata is not None:
        doc["__metadata__"] = metadata
    layouts = []
    cursor = 0
    for name, dtype, shape in ordered:
        end = cursor + math.prod(shape) * dtype.size
        doc[name] = {"dtype": dtype.name, "shape": list(shape), "data_offsets": [cursor, end]}
        layouts.append(TensorLayout(name, dtype, tuple(shape), cursor, end))
        cursor = end
    if len(doc) != len(tensors) + (metadata is not None):
        raise CheckpointInvalidError("a tensor name appears twice")
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    text += " " * (-len(text.encode("utf-8")) % 8)
    # Plain str keys and values, as a parse of the text gives (str subclasses too).
    kept = None if metadata is None else {str(k): str(v) for k, v in metadata.items()}
    return FileLayout(text, tuple(layouts), kept)


def _is_utf8(text: str) -> bool:
    # A str can hold lone surrogates, which have no UTF-8 encoding.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
