"""``apply_inplace``: move live weights from base to target (or back), all or nothing.

The weights are a mutable mapping of NumPy arrays and/or torch tensors.  The
procedure keeps a live model always entirely at the input side or entirely
at the output side:

1. the mapping's names, dtypes and shapes must be the delta's input side
   (``base-mismatch``), output tensors must be writable (``bad-argument``);
2. input tensors whose check is not implied by their output's (below) are
   hashed against their digests before any byte changes: unchanged tensors,
   tensors with ``full`` chunks, removed tensors (all of them with
   ``verify_input=True`` or ``verify_output=False``);
3. chunks are decoded and written back in place by a thread pool (scratch: a
   few chunks), each one journalled (a ``sparse`` chunk gathers and scatters
   its changed words only); every output tensor is hashed from memory
   against its digest as it completes (``verify_output=False`` skips this);
4. on any failure the journal is undone: a ``sparse`` or ``dense`` chunk by
   decoding its blob in the other direction over the written words (the
   transforms are bijections, SPEC §6), a ``full`` chunk from the old words
   kept for it (only non-reversible deltas have those); then the inputs not
   hashed in step 2 are, so that a wrong input is reported as
   ``base-mismatch`` (SPEC §10.2) rather than as the corrupted output it made;
5. only then are added tensors inserted into the mapping and removed ones
   deleted (structural changes go through the mapping; added tensors are
   created as NumPy arrays, or as torch tensors on the mapping's device).

Why step 2 may skip the tensors it skips: a chunk that is ``unchanged``,
``sparse`` or ``dense`` maps input words to output words by a bijection fixed
by its (checksummed) blob, so an output that hashes to the output digest
came from the input that hashes to the input digest (SPEC §10.2); one pass
over the memory instead of two.  Tensors sharing memory with the same layout
(tied weights) are updated once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..arguments import check_int, check_mapping
from ..checkpoint.source import Words
from ..codec import chunk as chunk_codec
from ..codec import sparse, transform
from ..errors import (
    BadArgumentError,
    BaseMismatchError,
    ChecksumMismatchError,
    EncodingInvalidError,
    WdeltaError,
)
from ..format.container import open_delta
from ..format.digest import digest_bytes
from ..format.header import Chunk, Header
from . import decoder
from . import tensors as live
from .pipeline import ordered_map, runs_locally
from .tensors import Select, Slot, selector


class Delta(Protocol):
    """What an in-place apply reads of a delta: an open ``DeltaFile``, or a stored
    delta read with ranged requests (``chain.remote_delta``)."""

    header: Header

    def payload(self, chunk: Chunk) -> bytes: ...


@dataclass(frozen=True)
class _Task:
    """Chunk ``index`` of a step: elements ``[start, start + count)``."""

    step: decoder.Step
    slot: Slot
    index: int
    start: int
    count: int


@dataclass
class _Journal:
    """Chunks written so far, to undo newest first; ``full`` chunks keep old words."""

    delta: Delta
    reverse: bool
    done: list[tuple[_Task, Words | None]] = field(default_factory=list)

    def record(self, task: _Task, old: Words | None) -> None:
        """Called by a worker right after its chunk is written (list.append is atomic)."""
        self.done.append((task, old))

    def undo(self) -> None:
        # Chunks are disjoint, so the order of undoing does not matter.
        for task, old in reversed(self.done):
            task.slot.invalidate()
            if old is None:
                chunk = task.step.chunk(task.index)
                current = task.slot.read(task.start, task.count)
                old = chunk_codec.decode(
                    chunk.encoding, chunk.transform, self.delta.payload(chunk), current,
                    task.count, task.step.entry.dtype.word, not self.reverse, chunk.changed,
                    self.delta.header.coded_values,
                )  # fmt: skip
            task.slot.write(task.start, old)
        self.done.clear()


def _slots(weights: MutableMapping[str, Any]) -> dict[str, Slot]:
    return {name: live.slot(name, value) for name, value in weights.items()}


def _check_structure(slots: dict[str, Slot], steps: list[decoder.Step]) -> None:
    """The mapping holds exactly the (selected) input side: names, dtypes, shapes."""
    expected = {s.entry.name: (s.entry.dtype, s.entry.shape) for s in steps if s.src_digest}
    actual = {n: (s.dtype, s.shape) for n, s in slots.items()}
    if expected != actual:
        raise BaseMismatchError(
            f"weights are not the delta's input: {decoder.structure_difference(expected, actual)}"
        )
    for step in steps:
        if _writes(step) and not slots[step.entry.name].writable:
            raise BadArgumentError(f"tensor {step.entry.name!r} is read-only")


def _writes(step: decoder.Step) -> bool:
    """Whether a step changes an existing tensor's words."""
    both = step.src_digest is not None and step.dst_digest is not None
    return both and step.entry.op == "modified"


def _implied(step: decoder.Step, verify_output: bool) -> bool:
    """Whether checking the step's output digest also proves its input (module docstring)."""
    bijective = all(step.chunk(i).encoding != "full" for i in range(len(step.entry.chunks)))
    return verify_output and _writes(step) and bijective


def _verify_inputs(steps: list[decoder.Step], slots: dict[str, Slot], threads: int) -> None:
    """Every input tensor of ``steps`` against its digest."""
    checked = [s for s in steps if s.src_digest is not None]
    digests = ordered_map(lambda s: slots[s.entry.name].digest(), checked, threads, 1,
                          local=lambda s: runs_locally(s.entry.elements))  # fmt: skip
    for step, digest in zip(checked, digests, strict=True):
        if digest != step.src_digest and digest == step.dst_digest:
            evidence = (
                f"tensor {step.entry.name!r} has its {'base' if step.reverse else 'target'} bytes"
            )
            raise BaseMismatchError(decoder.at_output_side(step.reverse, evidence))
        if digest != step.src_digest:
            raise BaseMismatchError(
                f"tensor {step.entry.name!r}: weights differ from the delta's input digest"
            )


def _tasks(
    steps: list[decoder.Step], slots: dict[str, Slot], chunk_elements: int
) -> Iterator[_Task]:
    for step in steps:
        n = step.entry.elements
        for i, start in enumerate(range(0, n, chunk_elements)):
            yield _Task(step, slots[step.entry.name], i, start, min(chunk_elements, n - start))


@dataclass(frozen=True)
class _Decoded:
    """A chunk's new words: at ``index`` (element indices of the tensor) when sparse,
    else the whole chunk; ``before`` the words they replace (to put back if the
    write itself fails); ``old`` the words the journal keeps (``full`` chunks only,
    the others are undone by their inverse transform)."""

    task: _Task
    words: Words | None
    index: np.ndarray[Any, Any] | None = None
    before: Words | None = None
    old: Words | None = None


def _decode(delta: Delta, task: _Task, reverse: bool) -> _Decoded:
    """A sparse chunk touches only its changed words (gathered, transformed, scattered
    back by the caller); other encodings rebuild the whole chunk."""
    chunk = task.step.chunk(task.index)
    word = task.step.entry.dtype.word
    if chunk.encoding == "unchanged":
        return _Decoded(task, None)
    payload = delta.payload(chunk)
    if chunk.encoding == "sparse" and task.slot.gathers:
        assert chunk.transform is not None
        pos, values = sparse.decode(
            payload, task.count, word, delta.header.coded_values, chunk.changed
        )
        if len(pos) != chunk.changed:
            raise EncodingInvalidError(f"sparse payload holds {len(pos)} positions, header "
                                       f"{chunk.changed}")  # fmt: skip
        index = pos.astype(np.intp) + task.start
        invert = transform.to_base if reverse else transform.to_target
        before = task.slot.gather(index)  # left intact: the result goes into ``values``
        return _Decoded(task, invert(chunk.transform, before, values), index, before)
    source = task.slot.read(task.start, task.count)
    if chunk.encoding == "full":
        return _Decoded(task, np.frombuffer(payload, word, task.count), None, source, source)
    # A sparse chunk is decoded in ``source`` itself; dense leaves it intact.
    before = source.copy() if chunk.encoding == "sparse" else source
    out = chunk_codec.decode(
        chunk.encoding, chunk.transform, payload, source, task.count, word, reverse,
        chunk.changed, delta.header.coded_values,
    )  # fmt: skip
    return _Decoded(task, out, None, before)


def _store(task: _Task, index: np.ndarray[Any, Any] | None, words: Words) -> None:
    if index is not None:
        task.slot.scatter(index, words)
    else:
        task.slot.write(task.start, words)


def _check_output(slot: Slot, step: decoder.Step) -> None:
    """The tensor as now stored must hash to the step's output digest."""
    slot.invalidate()
    if slot.digest() != step.dst_digest:
        raise ChecksumMismatchError(f"tensor {step.entry.name!r}: decoded bytes do not match")


def _write_chunk(delta: Delta, task: _Task, journal: _Journal) -> _Task:
    """Decode one chunk and write it in place (on a worker thread), journalled.

    A write that fails (a device error, say) may have stored part of the chunk,
    which the inverse transform cannot undo: the words it replaces are put back.
    """
    done = _decode(delta, task, journal.reverse)
    if done.words is None:
        return task
    assert done.before is not None
    try:
        _store(task, done.index, done.words)
    except BaseException:
        _store(task, done.index, done.before)
        raise
    # Only once written: undoing a chunk that was not written would corrupt it.
    journal.record(task, done.old)
    return task


def _update(
    delta: Delta, steps: list[decoder.Step], slots: dict[str, Slot], journal: _Journal,
    threads: int, verify: bool,
) -> None:  # fmt: skip
    """Write every modified tensor in place, chunks decoded and written by the
    workers (chunks are disjoint); with ``verify`` each tensor is hashed from
    memory once its last chunk is written."""
    writes = [s for s in steps if _writes(s)]
    tasks = _tasks(writes, slots, delta.header.chunk_elements)
    # Closed on error, which waits for the running workers: none still writes
    # while the journal is undone.
    written = ordered_map(lambda t: _write_chunk(delta, t, journal), tasks, threads,
                          local=lambda t: runs_locally(t.count))  # fmt: skip
    with contextlib.closing(written):
        for task in written:
            if verify and task.start + task.count == task.step.entry.elements:
                _check_output(task.slot, task.step)
    for step in writes:
        if verify and step.entry.elements == 0:
            _check_output(slots[step.entry.name], step)


def _build_added(
    delta: Delta, steps: list[decoder.Step], device: Any, verify: bool
) -> dict[str, Any]:
    """New tensors (output side only), decoded and checked before the commit."""
    added: dict[str, Any] = {}
    for step in steps:
        entry = step.entry
        if step.src_digest is not None or step.dst_digest is None:
            continue
        words = np.empty(entry.elements, dtype=entry.dtype.word)
        for i, chunk in enumerate(entry.chunks):
            start, count = delta.header.chunk_span(entry, i)
            words[start : start + count] = np.frombuffer(
                delta.payload(chunk), entry.dtype.word, count
            )
        if verify and digest_bytes(words.data.cast("B")) != step.dst_digest:
            raise ChecksumMismatchError(f"tensor {entry.name!r}: decoded bytes do not match")
        added[entry.name] = live.present(words, entry.dtype, entry.shape, device)
    return added


def _dedupe_tied(steps: list[decoder.Step], slots: dict[str, Slot]) -> list[decoder.Step]:
    """Drop the write steps of tensors that alias an earlier one with the same change."""
    seen: dict[tuple[Any, ...], decoder.Step] = {}
    kept = []
    for step in steps:
        if _writes(step):
            key = slots[step.entry.name].storage_key()
            first = seen.setdefault(key, step)
            if first is not step:
                if (first.src_digest, first.dst_digest) != (step.src_digest, step.dst_digest):
                    raise BadArgumentError(
                        f"tensors {first.entry.name!r} and {step.entry.name!r} share memory "
                        "but the delta changes them differently"
                    )
                continue
        kept.append(step)
    return kept


def apply_inplace(
    weights: MutableMapping[str, Any], delta: str | os.PathLike[str], reverse: bool = False,
    *, verify_output: bool = True, verify_input: bool = False, threads: int = 2,
    tensors: Select = None,
) -> None:  # fmt: skip
    """Update ``weights`` (NumPy arrays / torch tensors by name) in place by ``delta``.

    Forward the weights go from the delta's base to its target; with
    ``reverse`` from target to base.  All or nothing: on any error (a wrong
    base, a corrupted blob, an output digest mismatch, an interrupt) the
    weights are left bit-identical to what they were, and the error raised.
    Scratch memory is a few chunks per thread (``full`` chunks of a
    non-reversible delta keep their old words until the end).

    Verification: by default every output tensor is hashed against its
    digest, which for ``sparse``/``dense``/``unchanged`` chunks also proves
    the input (a bijection); the other inputs are hashed before the first
    write.  A wrong input is then written, found by the output check, undone
    and reported as ``base-mismatch``.  ``verify_input=True`` hashes every
    input before the first write as well (a wrong base is refused without
    touching a byte; one more pass over the weights).
    ``verify_output=False`` hashes the inputs only; only for deltas already
    verified against these weights.
    ``tensors`` (an fnmatch pattern or a predicate on names) restricts the
    update to those tensors; ``weights`` then holds exactly the selected
    input tensors (a tensor-parallel rank's shard of the model).
    """
    check_mapping(weights, "weights", mutable=True)
    check_int(threads, "threads", 1)
    with open_delta(delta) as d:
        apply_opened(weights, d, reverse, verify_output=verify_output,
                     verify_input=verify_input, threads=threads, tensors=tensors)  # fmt: skip


def apply_opened(
    weights: MutableMapping[str, Any], d: Delta, reverse: bool, *, verify_output: bool,
    verify_input: bool, threads: int, tensors: Select,
) -> None:  # fmt: skip
    """:func:`apply_inplace` of an opened delta (arguments already checked)."""
    keep = selector(tensors)
    steps = [s for s in decoder.plan_steps(d.header, reverse) if keep(s.entry.name)]
    slots = _slots(weights)
    _check_structure(slots, steps)
    steps = _dedupe_tied(steps, slots)
    implied = [not verify_input and _implied(s, verify_output) for s in steps]
    later = [s for s, skip in zip(steps, implied, strict=True) if skip]
    _verify_inputs([s for s, skip in zip(steps, implied, strict=True) if not skip], slots,
                   threads)  # fmt: skip
    journal = _Journal(d, reverse)
    try:
        _update(d, steps, slots, journal, threads, verify_output)
        added = _build_added(d, steps, live.torch_device(weights), verify_output)
    except BaseException as exc:
        journal.undo()
        if isinstance(exc, WdeltaError):
            _verify_inputs(later, slots, threads)  # a wrong input is the cause to name
        raise
    _commit(weights, steps, added)


def _commit(
    weights: MutableMapping[str, Any], steps: list[decoder.Step], added: dict[str, Any]
) -> None:
    """The structural changes, once every write succeeded: removed tensors deleted,
    added ones inserted."""
    for step in steps:
        if step.dst_digest is None:
            del weights[step.entry.name]
    weights.update(added)


def apply_unchecked(
    weights: MutableMapping[str, Any], d: Delta, threads: int, reverse: bool = False
) -> None:
    """:func:`apply_opened` without computing any digest, for a delta that was just
    encoded from these very weights (a publisher's own copy): the words are trusted
    to be its base (``reverse``: its target), and the decoder to reproduce the other
    side it hashed.

    Names, dtypes and shapes are checked; on failure the written chunks are undone.
    """
    steps = decoder.plan_steps(d.header, reverse)
    slots = _slots(weights)
    _check_structure(slots, steps)
    journal = _Journal(d, reverse)
    try:
        _update(d, steps, slots, journal, threads, False)
        added = _build_added(d, steps, live.torch_device(weights), False)
    except BaseException:
        journal.undo()
        raise
    _commit(weights, steps, added)
