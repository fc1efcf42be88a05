"""``apply``: rebuild the target (or, in reverse, the base) from a delta.

The input checkpoint's tensor set is checked against the header before any
byte is written.  Chunks are then decoded on a thread pool and written with
positioned writes into temporary files laid out exactly as the recorded
safetensors files; every input tensor is hashed against its digest (a wrong
base is refused) and every output tensor against its digest.  Only when all
digests match are the files fsynced and renamed into place.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..checkpoint.safetensors_header import FileLayout
from ..checkpoint.source import Checkpoint, Scratch, Words
from ..codec import chunk as chunk_codec
from ..codec import sparse
from ..errors import (
    BaseMismatchError,
    ChecksumMismatchError,
    EncodingInvalidError,
    NotReversibleError,
)
from ..format.container import DeltaFile
from ..format.digest import EMPTY_DIGEST
from ..format.dtypes import DTYPES
from ..format.header import Chunk, Header, TensorEntry
from ..io.output_file import ALIGN, DIRECT_MIN_BYTES, OutputFile, pwrite_all
from .pipeline import (
    Aborted,
    ChunkTask,
    Sequencer,
    batch_limit,
    batched_map,
    chunk_tasks,
    ordered_map,
    runs_locally,
)

Progress = Callable[[int], None]
_COPY = Chunk("unchanged", 0)


@dataclass(frozen=True)
class Step:
    """What apply does with one tensor entry, seen from the input side.

    ``src_digest``: expected digest of the input tensor (None: not in input);
    ``dst_digest``: expected digest of the output tensor (None: not in output).
    """

    entry: TensorEntry
    src_digest: str | None
    dst_digest: str | None
    reverse: bool

    def chunk(self, index: int) -> Chunk:
        """The chunk to decode, or a copy marker when output equals input."""
        if self.entry.op == "unchanged":
            return _COPY
        return self.entry.chunks[index]


def plan_steps(header: Header, reverse: bool) -> list[Step]:
    """One step per tensor entry, with input/output roles for the direction."""
    if reverse and not header.reversible:
        raise NotReversibleError(
            "delta is not reversible (it has full chunks or drops removed tensors)"
        )
    steps = []
    for t in header.tensors:
        src, dst = (t.target_digest, t.base_digest) if reverse else (t.base_digest, t.target_digest)
        steps.append(Step(t, src, dst, reverse))
    return steps


def at_output_side(reverse: bool, evidence: str) -> str:
    """The message for an input that is already what the delta would produce."""
    if reverse:
        return (f"input is already at the delta's base ({evidence}): nothing to do "
                "(or apply without --reverse to go forward)")  # fmt: skip
    return (f"input is already at the delta's target ({evidence}): nothing to do "
            "(or use --reverse to go back)")  # fmt: skip


def check_input(header: Header, ckpt: Checkpoint, reverse: bool) -> None:
    """The input must hold exactly the input side's tensors, dtypes and shapes."""
    side, other = ("target", "base") if reverse else ("base", "target")
    expected = {t.name: (t.dtype, t.shape) for t in header.side_tensors(side)}
    actual = {t.name: (t.dtype, t.shape) for t in ckpt.tensors.values()}
    if expected == actual:
        return
    if actual == {t.name: (t.dtype, t.shape) for t in header.side_tensors(other)}:
        raise BaseMismatchError(
            at_output_side(reverse, f"it has the {other}'s tensors, dtypes and shapes")
        )
    raise BaseMismatchError(
        f"input is not the delta's {side}: {structure_difference(expected, actual)}"
    )


def structure_difference(expected: Mapping[str, object], actual: Mapping[str, object]) -> str:
    """Which names are missing, unexpected, or differ (first three of each), for messages."""
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differ = sorted(n for n in set(expected) & set(actual) if expected[n] != actual[n])
    found = (("missing", missing), ("unexpected", extra), ("dtype/shape differs for", differ))
    return ", ".join(f"{what} {names[:3]}" for what, names in found if names)


_Task = ChunkTask[Step]


Sink = Callable[[str, int, Words], None]


def check_digests(step: Step, src_hex: str, dst_hex: str) -> None:
    """Compare a finished step's input and output digests with the header."""
    name = step.entry.name
    if step.src_digest is not None and src_hex != step.src_digest:
        if src_hex == step.dst_digest:
            side = "base" if step.reverse else "target"
            raise BaseMismatchError(
                at_output_side(step.reverse, f"tensor {name!r} has its {side} bytes")
            )
        raise BaseMismatchError(f"tensor {name!r}: input bytes differ from the delta's digest")
    if step.entry.op == "unchanged":
        dst_hex = src_hex
    if step.dst_digest is not None and dst_hex != step.dst_digest:
        raise ChecksumMismatchError(f"tensor {name!r}: decoded bytes do not match its digest")


@dataclass(frozen=True)
class _Decoded:
    """A finished task, its output words (None: nothing to write) and the pool
    buffer its input was read into (None: none), free once the words are written."""

    task: _Task
    words: Words | None
    buffer: _Buffer | None = None


class _Buffer(Scratch):
    """A read buffer of ``nbytes`` whose first byte sits at ``phase`` modulo ALIGN.

    Placed like the output file offset its chunk goes to, an input chunk
    decoded in place (sparse, unchanged) is written with O_DIRECT straight
    from this buffer, without the copy into an aligned staging buffer.
    Chunks too small to be written direct get no placement, and no ALIGN
    bytes of slack (a batch may hold a great many of them).
    """

    def __init__(self, nbytes: int, phase: int) -> None:
        self._slack = ALIGN if nbytes >= DIRECT_MIN_BYTES else 0
        self._raw = np.empty(nbytes + self._slack, np.uint8)
        self.place(phase)

    def place(self, phase: int) -> None:
        """Move the buffer's start to ``phase`` modulo ALIGN (its contents are gone)."""
        nbytes = len(self._raw) - self._slack
        skip = (phase - self._raw.ctypes.data) % ALIGN if self._slack else 0
        self._buf = self._raw[skip : skip + nbytes]


class _ReadPool:
    """Input read buffers, reused once the chunk's output has been written.

    A decoded chunk may be its input buffer (a sparse chunk is decoded in
    place, an unchanged one passed on), so a buffer is free only after the
    writer has written the chunk.  A fresh buffer per chunk made the kernel
    fault in and zero 3,000-5,000 pages per apply of the fp8 real trace.
    Buffers are kept per size (a tensor's chunks and same-shaped tensors
    share sizes), at most ``keep_bytes`` of them.
    """

    def __init__(self, keep_bytes: int) -> None:
        self._free: dict[int, list[_Buffer]] = {}
        self._lock = threading.Lock()
        self._kept = 0
        self._keep_bytes = keep_bytes

    def take(self, nbytes: int, phase: int) -> _Buffer:
        """A buffer of ``nbytes`` starting at ``phase`` modulo ALIGN."""
        with self._lock:
            free = self._free.get(nbytes)
            buffer = free.pop() if free else None
            if buffer is not None:
                self._kept -= nbytes
        if buffer is None:
            return _Buffer(nbytes, phase)
        buffer.place(phase)
        return buffer

    def give(self, buffer: _Buffer, nbytes: int) -> None:
        with self._lock:
            if self._kept + nbytes <= self._keep_bytes:
                self._free.setdefault(nbytes, []).append(buffer)
                self._kept += nbytes


@dataclass
class _Decoder:
    """Decodes and hashes tasks on worker threads.

    The input chunk is hashed before it is decoded in place; digests are fed
    in chunk order through the sequencer.
    """

    delta: DeltaFile
    ckpt: Checkpoint
    seq: Sequencer
    pool: _ReadPool
    # Where a tensor's byte goes in its output file (None: not a file).
    placement: Callable[[str, int], int] | None

    def run(self, task: _Task) -> _Decoded:
        try:
            return self._run(task)
        except BaseException as exc:
            self.seq.fail(exc)
            raise

    def _run(self, task: _Task) -> _Decoded:
        step, entry = task.item, task.item.entry
        src: Words | None = None
        dst: Words | None = None
        buffer = None
        if step.src_digest is not None:
            tensor = self.ckpt.tensors[entry.name]
            if tensor.uses_scratch:
                buffer = self._buffer(task)
            src = tensor.read(task.start, task.count, buffer)
            task.digests.feed(self.seq, 0, task.index, src)
        if step.dst_digest is None and entry.chunks:
            # Not needed for the output, but any corrupted byte must be refused.
            self.delta.payload(entry.chunks[task.index])
        if step.dst_digest is not None:
            dst = self._decode(task, src)
            if entry.op != "unchanged":
                task.digests.feed(self.seq, 1, task.index, dst)
        if task.last:
            digests = task.digests
            check_digests(step, digests.hexdigest(self.seq, 0), digests.hexdigest(self.seq, 1))
        return _Decoded(task, dst, buffer)

    def _buffer(self, task: _Task) -> _Buffer:
        """A pool buffer for the task's input words, placed like their output."""
        step, size = task.item, task.item.entry.dtype.size
        phase = 0
        if self.placement is not None and step.dst_digest is not None:
            phase = self.placement(step.entry.name, task.start * size) % ALIGN
        return self.pool.take(task.count * size, phase)

    def _decode(self, task: _Task, src: Words | None) -> Words:
        chunk = task.item.chunk(task.index)
        if chunk.encoding == "unchanged":
            assert src is not None
            return src
        payload = self.delta.payload(chunk)
        return chunk_codec.decode(
            chunk.encoding, chunk.transform, payload, src, task.count,
            task.item.entry.dtype.word, task.item.reverse, chunk.changed,
            self.delta.header.coded_values,
        )  # fmt: skip


# Direct writes block this thread until the disk has the chunk; decoded
# chunks queue up meanwhile so the workers keep decoding (measured on the
# 1 GB bench at 30%: 3.5 s with 2 chunks per worker queued, 2.6 s with 6).
# Memory: up to 6 decoded chunks per worker, 48 MiB per worker for bf16.
_WRITE_AHEAD = 6


def run_steps(
    delta: DeltaFile, ckpt: Checkpoint, steps: list[Step], sink: Sink | None,
    threads: int, progress: Progress | None,
) -> None:  # fmt: skip
    """Decode and verify every step; raises the first failed check.

    Workers decode and hash; this thread writes the output through ``sink``
    (None: verify only) in chunk order, so that the kernel sees one writer
    instead of threads contending for the file.
    """
    for step in steps:
        if step.entry.elements == 0:
            check_digests(step, EMPTY_DIGEST, EMPTY_DIGEST)
    chunk = delta.header.chunk_elements
    ahead = _WRITE_AHEAD if sink is not None else 2
    # Two batches per worker are enough to recycle (the writer frees buffers
    # as fast as the workers take them) and far below what is in flight.
    keep = 2 * threads * batch_limit(chunk) * max(d.size for d in DTYPES.values())
    placement = sink.file_offset if isinstance(sink, FileSink) else None
    decoder = _Decoder(delta, ckpt, Sequencer(), _ReadPool(keep), placement)
    tasks = chunk_tasks(steps, lambda s: s.entry.elements, chunk, threads)
    try:
        for done in batched_map(decoder.run, tasks, threads, batch_limit(chunk), ahead):
            task = done.task
            nbytes = task.count * task.item.entry.dtype.size
            if sink is not None and done.words is not None:
                sink(task.item.entry.name, task.start * task.item.entry.dtype.size, done.words)
            if done.buffer is not None:
                decoder.pool.give(done.buffer, nbytes)
            if progress is not None:
                progress(nbytes)
    except Aborted:
        assert decoder.seq.error is not None
        raise decoder.seq.error from None


def output_tensor_offsets(
    files: tuple[tuple[str, FileLayout], ...],
) -> dict[str, tuple[str, int]]:
    """Tensor name -> (file name, absolute byte offset) for a side's layout."""
    offsets: dict[str, tuple[str, int]] = {}
    for path, layout in files:
        for t in layout.tensors:
            offsets[t.name] = (path, layout.data_start + t.begin)
    return offsets


def init_file(fd: int, layout: FileLayout) -> None:
    """Size an output file and write its safetensors length prefix and header."""
    header = layout.header_text.encode("utf-8")
    os.ftruncate(fd, layout.data_start + layout.data_length)
    pwrite_all(fd, len(header).to_bytes(8, "little") + header, 0)


class FileSink:
    """A :data:`Sink` writing each tensor's words at its offset in its output file."""

    def __init__(self, files: dict[str, OutputFile], offsets: dict[str, tuple[str, int]]) -> None:
        self.files = files
        self.offsets = offsets

    def __call__(self, name: str, byte_offset: int, words: Words) -> None:
        path, start = self.offsets[name]
        self.files[path].write(words.data, start + byte_offset)

    def file_offset(self, name: str, byte_offset: int) -> int:
        """Where byte ``byte_offset`` of tensor ``name`` goes in its output file."""
        return self.offsets[name][1] + byte_offset


def file_sink(files: dict[str, OutputFile], offsets: dict[str, tuple[str, int]]) -> FileSink:
    """A sink writing each tensor's words at its offset in its output file."""
    return FileSink(files, offsets)


def _check_chunk(delta: DeltaFile, entry: TensorEntry, chunk: Chunk, m: int) -> int:
    payload = delta.payload(chunk)
    if chunk.encoding == "sparse":
        pos, _ = sparse.decode(
            payload, m, entry.dtype.word, delta.header.coded_values, chunk.changed
        )
        if len(pos) != chunk.changed:
            raise EncodingInvalidError(f"tensor {entry.name!r}: sparse count != changed")
    # Progress counts data-section bytes (its total is D); inline blobs came with the header.
    return chunk.length if chunk.in_data else 0


def check_blobs(delta: DeltaFile, threads: int, progress: Progress | None) -> None:
    """Read, checksum, decompress and parse every blob (no base needed)."""
    header = delta.header
    work = [
        (t, c, header.chunk_span(t, i)[1])
        for t in header.tensors for i, c in enumerate(t.chunks) if c.encoding != "unchanged"
    ]  # fmt: skip
    checked = ordered_map(lambda w: _check_chunk(delta, *w), work, threads,
                          local=lambda w: runs_locally(w[2]))  # fmt: skip
    for length in checked:
        if progress is not None:
            progress(length)
