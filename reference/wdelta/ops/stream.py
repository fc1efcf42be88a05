"""Engine-facing views of a delta: its changes chunk by chunk, or whole changed tensors.

``changes`` lets an inference engine apply a delta its own way (a scatter on
the GPU, say): for every changed chunk it yields the positions that change
and either the output words or the transform values (``xor``, or a wrapping
``add`` of unsigned words), so the engine never needs the base on the host.
Blob checksums and payloads are verified as they are read; tensor digests
need the weights, which the engine holds: check them afterwards with
``verify_weights``.

``changed_tensors`` yields ``(name, tensor)`` for every tensor the delta
changes or adds, fully decoded and digest-checked, one tensor at a time:
the shape engines' ``load_weights(weights)`` methods consume.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arguments import check_int, check_mapping
from ..checkpoint.source import Words
from ..codec import planes, sparse, transform
from ..errors import (
    BadArgumentError,
    BaseMismatchError,
    ChecksumMismatchError,
    EncodingInvalidError,
)
from ..format.container import DeltaFile, open_delta
from ..format.dtypes import DType
from ..format.header import Chunk, TensorEntry
from ..format.names import Transform
from . import decoder
from . import tensors as live
from .tensors import Select


@dataclass(frozen=True)
class ChunkChange:
    """The change of one chunk of one tensor.

    ``positions``: int64 row-major element indices within the whole tensor
    (not the chunk) of the words that change, ascending; None means every
    element of ``[start, start + count)``.  ``values``: unsigned words of the
    tensor's width, one per position.  ``op`` says how to use them:
    ``"set"`` (values are the output words), ``"xor"`` (output = input ^
    value) or ``"add"`` (output = input + value, modulo 2**bits of the word).
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    start: int
    count: int
    positions: np.ndarray[Any, np.dtype[np.int64]] | None
    values: Words
    op: str


def _as_op(kind: Transform, values: Words, reverse: bool) -> tuple[str, Words]:
    """Stored transform values as an engine-side ``xor`` or wrapping ``add``."""
    if kind == "xor":
        return "xor", values
    diff = transform.unzigzag(values)
    return "add", np.negative(diff) if reverse else diff


def _chunk_change(
    delta: DeltaFile, entry: TensorEntry, index: int, chunk: Chunk, reverse: bool
) -> ChunkChange | None:
    start, count = delta.header.chunk_span(entry, index)
    if chunk.encoding == "unchanged":
        return None
    payload = delta.payload(chunk)
    word = entry.dtype.word

    def change(pos: Any, values: Words, op: str) -> ChunkChange:
        return ChunkChange(entry.name, entry.dtype, entry.shape, start, count, pos, values, op)

    if chunk.encoding == "full":
        return change(None, np.frombuffer(payload, word, count).copy(), "set")
    assert chunk.transform is not None
    if chunk.encoding == "dense":
        values = planes.join(payload, count, word)
        return change(None, *_swap(_as_op(chunk.transform, values, reverse)))
    pos, values = sparse.decode(payload, count, word, delta.header.coded_values, chunk.changed)
    if len(pos) != chunk.changed:
        raise EncodingInvalidError(f"tensor {entry.name!r}: sparse count != header's changed")
    return change(pos.astype(np.int64) + start, *_swap(_as_op(chunk.transform, values, reverse)))


def _swap(pair: tuple[str, Words]) -> tuple[Words, str]:
    return pair[1], pair[0]


def changes(
    delta: str | os.PathLike[str], *, reverse: bool = False, tensors: Select = None,
) -> Iterator[ChunkChange]:  # fmt: skip
    """Every changed chunk of the tensors the delta modifies or adds, in file order.

    ``tensors`` selects names (an fnmatch pattern or a predicate).  Tensors
    the delta removes (in reverse: adds in the forward direction) are not
    listed; read ``open_delta(delta).header.tensors`` for the structure.
    In reverse (undo the delta on the target) a non-reversible delta is
    refused with ``not-reversible``.
    """
    keep = live.selector(tensors)
    with open_delta(delta) as d:
        for step in decoder.plan_steps(d.header, reverse):
            entry = step.entry
            if step.dst_digest is None or entry.op == "unchanged" or not keep(entry.name):
                continue
            for index, chunk in enumerate(entry.chunks):
                found = _chunk_change(d, entry, index, chunk, reverse)
                if found is not None:
                    yield found


def changed_tensors(
    base: Mapping[str, Any], delta: str | os.PathLike[str], *, reverse: bool = False,
    tensors: Select = None, threads: int = 2,
) -> Iterator[tuple[str, Any]]:  # fmt: skip
    """``(name, new tensor)`` for every tensor the delta modifies or adds.

    ``base`` is the current weights (NumPy arrays or torch tensors by name;
    it is only read).  Each tensor is decoded whole, its input and output
    digests checked, then yielded as a new array (torch on the base's device
    for a torch mapping): memory is one tensor plus a few chunks.
    """
    check_mapping(base, "base")
    check_int(threads, "threads", 1)
    keep = live.selector(tensors)
    device = live.torch_device(base)
    with open_delta(delta) as d, live.checkpoint_of(base) as ckpt:
        decoder.check_input(d.header, ckpt, reverse)
        for step in decoder.plan_steps(d.header, reverse):
            entry = step.entry
            if step.dst_digest is None or entry.op == "unchanged" or not keep(entry.name):
                continue
            out = np.empty(entry.elements, dtype=entry.dtype.word)

            def sink(name: str, byte_offset: int, words: Words, out: Any = out) -> None:
                start = byte_offset // out.itemsize
                out[start : start + len(words)] = words

            decoder.run_steps(d, ckpt, [step], sink, threads, None)
            yield entry.name, live.present(out, entry.dtype, entry.shape, device)


def verify_weights(
    weights: Mapping[str, Any], delta: str | os.PathLike[str], *, side: str = "target",
    tensors: Select = None,
) -> None:  # fmt: skip
    """Check live weights against a delta's ``side`` ("target" or "base") digests.

    Every selected tensor of that side must be in ``weights`` with its dtype,
    shape and exact bytes; raises ``checksum-mismatch`` naming the first that
    differs (``base-mismatch`` for a missing tensor or a wrong dtype/shape).
    """
    if side not in ("base", "target"):
        raise BadArgumentError(f"side must be 'base' or 'target', not {side!r}")
    check_mapping(weights, "weights")
    keep = live.selector(tensors)
    with open_delta(delta) as d:
        for entry in d.header.side_tensors(side):
            if keep(entry.name):
                _verify_one(weights, entry, side)


def _verify_one(weights: Mapping[str, Any], entry: TensorEntry, side: str) -> None:
    value = weights.get(entry.name)
    if value is None:
        raise BaseMismatchError(f"tensor {entry.name!r} is missing")
    slot = live.slot(entry.name, value)
    if (slot.dtype, slot.shape) != (entry.dtype, entry.shape):
        raise BaseMismatchError(f"tensor {entry.name!r}: dtype/shape differ from the {side}")
    expected = entry.base_digest if side == "base" else entry.target_digest
    if slot.digest() != expected:
        raise ChecksumMismatchError(f"tensor {entry.name!r} differs from the delta's {side}")
