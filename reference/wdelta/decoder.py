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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .checkpoint.safetensors_header import FileLayout
from .checkpoint.source import Checkpoint, Words
from .container import DeltaFile
from .digest import EMPTY_DIGEST
from .encodings import chunk as chunk_codec
from .encodings import sparse
from .errors import (
    BaseMismatchError,
    ChecksumMismatchError,
    EncodingInvalidError,
    NotReversibleError,
)
from .header import Chunk, Header, TensorEntry
from .output_file import OutputFile, pwrite_all
from .pipeline import (
    Aborted,
    ChunkTask,
    Sequencer,
    batch_limit,
    batched_map,
    chunk_tasks,
    ordered_map,
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
    return f"missing {missing[:3]}, unexpected {extra[:3]}, dtype/shape differs for {differ[:3]}"


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
    """A finished task and its output words (None: nothing to write)."""

    task: _Task
    words: Words | None


@dataclass
class _Decoder:
    """Decodes and hashes tasks on worker threads.

    The input chunk is hashed before it is decoded in place; digests are fed
    in chunk order through the sequencer.
    """

    delta: DeltaFile
    ckpt: Checkpoint
    seq: Sequencer

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
        if step.src_digest is not None:
            src = self.ckpt.tensors[entry.name].read(task.start, task.count)
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
        return _Decoded(task, dst)

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
    decoder = _Decoder(delta, ckpt, Sequencer())
    chunk = delta.header.chunk_elements
    tasks = chunk_tasks(steps, lambda s: s.entry.elements, chunk, threads)
    try:
        ahead = _WRITE_AHEAD if sink is not None else 2
        for done in batched_map(decoder.run, tasks, threads, batch_limit(chunk), ahead):
            task = done.task
            if sink is not None and done.words is not None:
                sink(task.item.entry.name, task.start * task.item.entry.dtype.size, done.words)
            if progress is not None:
                progress(task.count * task.item.entry.dtype.size)
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


def file_sink(files: dict[str, OutputFile], offsets: dict[str, tuple[str, int]]) -> Sink:
    """A sink writing each tensor's words at its offset in its output file."""

    def write(name: str, byte_offset: int, words: Words) -> None:
        path, start = offsets[name]
        files[path].write(words.data, start + byte_offset)

    return write


def _check_chunk(delta: DeltaFile, entry: TensorEntry, chunk: Chunk, m: int) -> int:
    payload = delta.payload(chunk)
    if chunk.encoding == "sparse":
        pos, _ = sparse.decode(payload, m, entry.dtype.word, delta.header.coded_values)
        if len(pos) != chunk.changed:
            raise EncodingInvalidError(f"tensor {entry.name!r}: sparse count != changed")
    return chunk.length


def check_blobs(delta: DeltaFile, threads: int, progress: Progress | None) -> None:
    """Read, checksum, decompress and parse every blob (no base needed)."""
    header = delta.header
    work = [
        (t, c, header.chunk_span(t, i)[1])
        for t in header.tensors for i, c in enumerate(t.chunks) if c.encoding != "unchanged"
    ]  # fmt: skip
    for length in ordered_map(lambda w: _check_chunk(delta, *w), work, threads):
        if progress is not None:
            progress(length)
