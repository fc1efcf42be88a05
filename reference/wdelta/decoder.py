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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .checkpoint.safetensors_header import FileLayout
from .checkpoint.source import Checkpoint, Words
from .container import DeltaFile
from .digest import new_hasher
from .encodings import chunk as chunk_codec
from .encodings import sparse
from .errors import (
    BaseMismatchError,
    ChecksumMismatchError,
    EncodingInvalidError,
    NotReversibleError,
)
from .header import Chunk, Header, TensorEntry
from .pipeline import ordered_map

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


def check_input(header: Header, ckpt: Checkpoint, reverse: bool) -> None:
    """The input must hold exactly the input side's tensors, dtypes and shapes."""
    side = "target" if reverse else "base"
    expected = {t.name: (t.dtype, t.shape) for t in header.side_tensors(side)}
    actual = {t.name: (t.dtype, t.shape) for t in ckpt.tensors.values()}
    if expected == actual:
        return
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differ = sorted(n for n in set(expected) & set(actual) if expected[n] != actual[n])
    raise BaseMismatchError(
        f"input is not the delta's {side}: missing {missing[:3]}, unexpected {extra[:3]}, "
        f"dtype/shape differs for {differ[:3]}"
    )


@dataclass(frozen=True)
class _Task:
    step: Step
    index: int
    start: int
    count: int


def _tasks(steps: list[Step], chunk_elements: int) -> Iterator[_Task]:
    for step in steps:
        n = step.entry.elements
        for i, start in enumerate(range(0, n, chunk_elements)):
            yield _Task(step, i, start, min(chunk_elements, n - start))


Sink = Callable[[str, int, Words], None]


@dataclass
class _Decoder:
    """Decodes tasks; writes output words through ``sink`` (None: verify only)."""

    delta: DeltaFile
    ckpt: Checkpoint
    sink: Sink | None

    def run(self, task: _Task) -> tuple[Words | None, Words | None]:
        step, entry = task.step, task.step.entry
        src: Words | None = None
        if step.src_digest is not None:
            src = self.ckpt.tensors[entry.name].read(task.start, task.count)
        if step.dst_digest is None:
            return src, None
        chunk = step.chunk(task.index)
        if chunk.encoding == "unchanged":
            dst = src
        else:
            payload = self.delta.payload(chunk)
            dst = chunk_codec.decode(
                chunk.encoding, chunk.transform, payload, src, task.count,
                entry.dtype.word, step.reverse, chunk.changed,
            )  # fmt: skip
        assert dst is not None
        if self.sink is not None:
            self.sink(entry.name, task.start * entry.dtype.size, dst)
        return src, dst


class _Verifier:
    """Hashes input and output words tensor by tensor, in order."""

    def __init__(self) -> None:
        self.step: Step | None = None
        self.src = new_hasher()
        self.dst = new_hasher()

    def feed(self, task: _Task, src: Words | None, dst: Words | None) -> None:
        if task.step is not self.step:
            self.step = task.step
            self.src, self.dst = new_hasher(), new_hasher()
        if src is not None:
            self.src.update(src.data.cast("B"))
        if dst is not None and task.step.entry.op != "unchanged":
            self.dst.update(dst.data.cast("B"))
        if task.start + task.count == task.step.entry.elements:
            self.finish(task.step)

    def finish(self, step: Step) -> None:
        """Compare the digests of a finished step (also used for empty tensors)."""
        if step is not self.step:
            self.step = step
            self.src, self.dst = new_hasher(), new_hasher()
        src_hex = self.src.hexdigest()
        name = step.entry.name
        if step.src_digest is not None and src_hex != step.src_digest:
            raise BaseMismatchError(f"tensor {name!r}: input bytes differ from the delta's digest")
        copied = step.entry.op == "unchanged"
        dst_hex = src_hex if copied else self.dst.hexdigest()
        if step.dst_digest is not None and dst_hex != step.dst_digest:
            raise ChecksumMismatchError(f"tensor {name!r}: decoded bytes do not match its digest")


def run_steps(
    delta: DeltaFile, ckpt: Checkpoint, steps: list[Step], sink: Sink | None,
    threads: int, progress: Progress | None,
) -> None:  # fmt: skip
    """Decode and verify every step; raises on the first failed check."""
    verifier = _Verifier()
    for step in steps:
        if step.entry.elements == 0:
            verifier.finish(step)
    decoder = _Decoder(delta, ckpt, sink)
    tasks = _tasks(steps, delta.header.chunk_elements)
    for task, (src, dst) in ordered_map(lambda t: (t, decoder.run(t)), tasks, threads):
        verifier.feed(task, src, dst)
        if progress is not None:
            progress(task.count * task.step.entry.dtype.size)


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
    _pwrite_all(fd, len(header).to_bytes(8, "little") + header, 0)


def file_sink(fds: dict[str, int], offsets: dict[str, tuple[str, int]]) -> Sink:
    """A sink writing each tensor's words at its offset in its output file."""

    def write(name: str, byte_offset: int, words: Words) -> None:
        path, start = offsets[name]
        _pwrite_all(fds[path], words.data.cast("B"), start + byte_offset)

    return write


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _check_chunk(delta: DeltaFile, entry: TensorEntry, chunk: Chunk, m: int) -> int:
    payload = delta.payload(chunk)
    if chunk.encoding == "sparse":
        pos, _ = sparse.decode(payload, m, entry.dtype.word)
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
