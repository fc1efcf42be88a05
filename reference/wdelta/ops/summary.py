"""A reviewer's summary of a delta: per tensor op, encodings, density, sizes."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import BadArgumentError
from ..format.container import DeltaFile
from ..format.names import Encoding, Op, Transform


@dataclass(frozen=True)
class TensorSummary:
    """Sizes in bytes; ``changed`` counts elements whose bit pattern changed."""

    name: str
    op: Op
    dtype: str
    shape: list[int]
    elements: int
    changed: int
    density: float
    raw_bytes: int
    stored_bytes: int
    encodings: dict[Encoding, int]
    transforms: dict[Transform, int]


_PART = ("index", "count", "base", "target")


@dataclass(frozen=True)
class DeltaSummary:
    """Whole-delta figures; ``ratio`` is stored bytes / target checkpoint bytes."""

    version: int
    generator: str
    reversible: bool
    chunk_elements: int
    base_digest: str
    target_digest: str
    file_bytes: int
    target_bytes: int
    stored_bytes: int
    ratio: float
    ops: dict[str, int]
    tensors: list[TensorSummary]
    # The header's required features (SPEC §14): what a reader must implement.
    required_features: list[str] = field(default_factory=list)
    # A part of a multi-part chain link (SPEC §4.13): index, count, the link's digests.
    part: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _tensor(entry: Any) -> TensorSummary:
    stored = sum(c.length for c in entry.chunks)
    changed = sum(c.changed for c in entry.chunks)
    encodings = Counter(c.encoding for c in entry.chunks)
    transforms = Counter(c.transform for c in entry.chunks if c.transform)
    return TensorSummary(
        entry.name, entry.op, entry.dtype.name, list(entry.shape), entry.elements, changed,
        changed / entry.elements if entry.elements else 0.0, entry.nbytes, stored,
        dict(encodings), dict(transforms),
    )  # fmt: skip


def summarize(delta: DeltaFile) -> DeltaSummary:
    """Summary of an open delta, from its header alone."""
    if not isinstance(delta, DeltaFile):
        raise BadArgumentError(
            f"summarize takes an open delta (wdelta.open_delta), not {type(delta).__name__}"
        )
    h = delta.header
    tensors = [_tensor(t) for t in h.tensors]
    target_bytes = sum(t.nbytes for t in h.side_tensors("target"))
    file_bytes = 64 + delta.header_length + delta.data_length
    return DeltaSummary(
        1, str(h.raw.get("generator", "")), h.reversible, h.chunk_elements,
        h.raw["base"]["digest"], h.raw["target"]["digest"], file_bytes, target_bytes,
        sum(t.stored_bytes for t in tensors), file_bytes / target_bytes if target_bytes else 0.0,
        dict(Counter(t.op for t in h.tensors)), tensors,
        [str(f) for f in h.raw.get("required_features") or []],
        None if h.part is None else dict(zip(_PART, h.part, strict=True)),
    )  # fmt: skip
