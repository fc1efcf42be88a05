"""Element types: safetensors dtype names mapped to their stored word width.

wdelta never interprets values as numbers: every element is an unsigned
little-endian word of its dtype's size, so NaN payloads, -0.0, subnormals and
fp8 special values survive untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedFeatureError


@dataclass(frozen=True)
class DType:
    """A safetensors dtype: ``name`` as spelled in headers, ``size`` in bytes."""

    name: str
    size: int

    @property
    def word(self) -> np.dtype[np.unsignedinteger]:
        """The little-endian unsigned integer dtype used to view stored words."""
        return np.dtype(f"<u{self.size}")


_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip

DTYPES: dict[str, DType] = {name: DType(name, size) for name, size in _SIZES.items()}

# Sub-byte packed types have no whole-byte word; v1 refuses them explicitly.
UNSUPPORTED = frozenset({"F4", "F6_E2M3", "F6_E3M2", "C128"})

# numpy / ml_dtypes dtype names for in-memory checkpoints (matched by name so
# that ml_dtypes is never imported by the library).
_NUMPY_NAMES: dict[str, str] = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "int16": "I16", "uint16": "U16", "float16": "F16", "bfloat16": "BF16",
    "int32": "I32", "uint32": "U32", "float32": "F32",
    "int64": "I64", "uint64": "U64", "float64": "F64", "complex64": "C64",
}  # fmt: skip
_BY_SAFETENSORS = {v: k for k, v in _NUMPY_NAMES.items()}


def lookup(name: str) -> DType:
    """Return the :class:`DType` for a safetensors dtype name.

    Raises UnsupportedFeatureError for names v1 does not define.
    """
    dtype = DTYPES.get(name)
    if dtype is None:
        raise UnsupportedFeatureError(f"dtype {name!r} is not supported by wdelta v1")
    return dtype


def from_numpy(dtype: np.dtype[Any]) -> DType:
    """Map a numpy (or ml_dtypes) dtype to its safetensors :class:`DType`."""
    return from_type_name(dtype.name, "numpy")


def from_type_name(name: str, library: str) -> DType:
    """Map a numpy/ml_dtypes/torch dtype name (they agree) to its :class:`DType`."""
    found = _NUMPY_NAMES.get(name)
    if found is None:
        raise UnsupportedFeatureError(f"{library} dtype {name!r} has no safetensors equivalent")
    return DTYPES[found]


def type_name(dtype: DType) -> str:
    """The numpy/ml_dtypes/torch name of a safetensors dtype (``BF16`` -> ``bfloat16``)."""
    return _BY_SAFETENSORS[dtype.name]


def to_numpy(dtype: DType) -> np.dtype[Any]:
    """The numpy dtype to present decoded tensors with.

    bf16 and fp8 use ml_dtypes when it is installed; otherwise the unsigned
    word view is returned, which carries the same bytes.
    """
    name = _BY_SAFETENSORS[dtype.name]
    try:
        return np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes

            found: np.dtype[Any] = np.dtype(getattr(ml_dtypes, name))
            return found
        except (ImportError, AttributeError):
            return dtype.word
