"""``diff``: encode the delta between two checkpoints into a .wdelta file.

Both checkpoints are streamed chunk by chunk on a thread pool; blobs go to a
temporary file beside the output while the header is assembled, prefix and
header are then put in front of them, and the file is fsynced and renamed.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .._version import __version__
from ..checkpoint.source import (
    Checkpoint,
    Scratch,
    Tensor,
    Words,
    is_index_name,
    is_shard_name,
)
from ..codec import chunk as chunk_codec
from ..codec import coded_values
from ..errors import BadArgumentError, CheckpointInvalidError, LimitExceededError
from ..format import compact, inline_blobs, strictjson
from ..format.container import PREFIX_SIZE, pack_prefix
from ..format.digest import (
    EMPTY_DIGEST,
    TensorIdentity,
    checkpoint_digest,
    digest_bytes,
    new_hasher,
)
from ..format.header import FORMAT_VERSION
from ..format.layout import side_json
from ..format.names import Op
from ..io import prepend
from ..io.atomic import atomic_file
from ..io.output_file import BackgroundSync, pwrite_all, start_writeback
from ..limits import MAX_CHUNK_ELEMENTS, MAX_HEADER_BYTES
from ..policy import chunk as chunk_policy
from .pipeline import Aborted, ChunkTask, Sequencer, batch_limit, batched_map, chunk_tasks

DEFAULT_CHUNK_ELEMENTS = 1 << 22
# From this data size on, up to 4 KiB of header padding (0.1% at most) buys
# not moving the data section (see _prepend).  Below it, moving the data costs
# a few milliseconds, while 4 KiB was 2-4% of the per-tensor header allowance
# of a 75-tensor delta of 1-4 MB (issue 15).
INSERT_MIN_DATA_BYTES = 1 << 22
Progress = Callable[[int], None]


@dataclass
class _Plan:
    """One tensor entry to produce: its op and the tensors it reads."""

    op: Op  # "modified" (may turn out unchanged), "added" or "removed"
    base: Tensor | None
    target: Tensor | None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    digests: dict[str, Any] = field(default_factory=dict)
    base_known: bool = False  # base_digest given by the caller: its words are not hashed
    advance: Words | None = None  # the base's own words, brought to the target chunk by chunk

    @property
    def tensor(self) -> Tensor:
        t = self.target if self.target is not None else self.base
        assert t is not None
        return t


def _plans(base: Checkpoint, target: Checkpoint) -> list[_Plan]:
    """Tensor plans sorted by name, removals before additions of the same name."""
    plans: list[_Plan] = []
    names = sorted(set(base.tensors) | set(target.tensors), key=lambda n: n.encode("utf-8"))
    for name in names:
        b, t = base.tensors.get(name), target.tensors.get(name)
        if b is not None and t is not None and (b.dtype, b.shape) == (t.dtype, t.shape):
            plans.append(_Plan("modified", b, t))
            continue
        if b is not None:
            plans.append(_Plan("removed", b, None))
        if t is not None:
            plans.append(_Plan("added", None, t))
    return plans


_Task = ChunkTask[_Plan]


@dataclass(frozen=True)
class _Done:
    """A finished chunk: its encoding (None: nothing stored) and its blob's checksum.

    The checksum is computed on the worker, so that the thread writing blobs
    in order does no hashing (it was 7% of its time on the fp8 real trace).
    """

    task: _Task
    encoded: chunk_codec.Encoded | None
    checksum: str | None = None


@dataclass(frozen=True)
class DiffOptions:
    """Encoder settings: zstd ``level`` (None: auto), ``threads``, chunk size in elements.

    ``reversible`` keeps every modified chunk as a transform and stores
    removed tensors, so that the delta also applies target -> base.
    ``compact`` writes the compact header (feature ``compact-header``, SPEC
    §4.11); False writes the v1 form, for readers that predate the feature.
    ``coded_values`` lets sparse chunks code their values (feature
    ``coded-values``, SPEC §7.6.6); the feature is listed only if one does.
    ``inline_blobs`` stores blobs of at most ``inline_blobs.WRITE_MAX_BYTES``
    in the header (feature ``inline-blobs``, SPEC §4.12), listed only if used.
    """

    level: int | None = None
    threads: int = 2
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    reversible: bool = True
    compact: bool = True
    coded_values: bool = True
    inline_blobs: bool = True

    def check(self) -> None:
        if not 1 <= self.chunk_elements <= MAX_CHUNK_ELEMENTS:
            raise BadArgumentError(f"chunk_elements must be in 1..{MAX_CHUNK_ELEMENTS}")
        if self.level is not None and not -7 <= self.level <= 22:
            raise BadArgumentError("zstd level must be in -7..22")
        if self.threads < 1:
            raise BadArgumentError("threads must be >= 1")


class _Buffers:
    """Each worker thread's two read buffers (base, target), for one diff.

    A chunk's words are dead once it is encoded (every blob is a copy or a
    new array), so the next chunk of the same thread can reuse the buffers.
    """

    def __init__(self) -> None:
        self._by_thread: dict[int, tuple[Scratch, Scratch]] = {}

    def get(self, which: int) -> Scratch:
        ident = threading.get_ident()
        pair = self._by_thread.get(ident)
        if pair is None:
            pair = self._by_thread[ident] = (Scratch(), Scratch())
        return pair[which]


@dataclass
class _Side:
    """A chunk's words of one side (0 base, 1 target), and whether they are still to
    be fed to that side's digest (they stay unchanged until they are)."""

    which: int
    words: Words | None
    unhashed: bool

    def feed(self, task: _Task, seq: Sequencer, wait: bool) -> None:
        """Feed the words to the digest in their turn; without ``wait``, only if
        their turn has come."""
        if not self.unhashed or not (wait or task.digests.ready(seq, self.which, task.index)):
            return
        assert self.words is not None
        task.digests.feed(seq, self.which, task.index, self.words)
        self.unhashed = False
        if task.last:
            key = ("base_digest", "target_digest")[self.which]
            task.item.digests[key] = task.digests.hexdigest(seq, self.which)


def _read(task: _Task, which: int, buffers: _Buffers, base: Words | None = None) -> _Side:
    """One side's words of a chunk, and whether they are still to be fed to its digest.

    A target that finds its changes itself (on its device) is the ``base`` words
    with those changes written in: only the changes were transferred.
    """
    tensor = task.item.base if which == 0 else task.item.target
    if tensor is None:
        return _Side(which, None, False)
    # In-memory tensors are only read here (blobs are copies), so no copy is made.
    words: Words | None = None
    if tensor._changes is not None and base is not None:
        index, values = tensor._changes(task.start, task.count)
        words = base.copy()
        words[index] = values
    elif (words := tensor.peek(task.start, task.count)) is not None and not task.digests.single:
        if task.index == 0 and not (which == 0 and task.item.base_known):
            _hash_whole(task, which, tensor)
        return _Side(which, words, False)
    if words is None:
        words = tensor.read(task.start, task.count, buffers.get(which))
    return _Side(which, words, not (which == 0 and task.item.base_known))


def _hash_whole(task: _Task, which: int, tensor: Tensor) -> None:
    """The digest of an in-memory tensor of several chunks, hashed whole by the worker
    of its first chunk: its words are all there, so no chunk waits for its turn to feed
    a digest in order (on a 1 GB bf16 share held in memory the sequencer's waits were
    a seventh of the workers' time)."""
    whole = tensor.peek(0, task.elements)
    assert whole is not None
    hasher = new_hasher(task.digests.workers, whole.nbytes)
    hasher.update(whole.data.cast("B"))
    task.item.digests[("base_digest", "target_digest")[which]] = str(hasher.hexdigest())


def _run(task: _Task, opts: DiffOptions, seq: Sequencer, buffers: _Buffers) -> _Done:
    try:
        return _encode(task, opts, seq, buffers)
    except BaseException as exc:
        seq.fail(exc)
        raise


def _encode(task: _Task, opts: DiffOptions, seq: Sequencer, buffers: _Buffers) -> _Done:
    """Read, hash and encode one chunk.  A side whose turn to be hashed has not come (the
    chunk before it, on another worker, is being hashed) is hashed after the encode
    rather than waited for: on the 2-chunk tensors of a 1 GB model the second chunk's
    worker otherwise idles through the first chunk's hash."""
    sides = [_read(task, 0, buffers)]
    sides[0].feed(task, seq, wait=False)
    sides.append(_read(task, 1, buffers, sides[0].words))
    for side in sides:
        side.feed(task, seq, wait=False)
    done = _encoded(task, opts, sides[0].words, sides[1].words)
    for side in sides:
        side.feed(task, seq, wait=True)
    return done


def _encoded(task: _Task, opts: DiffOptions, base: Words | None, target: Words | None) -> _Done:
    """One chunk encoded from its words (which it leaves unchanged)."""
    plan = task.item
    encoded: chunk_codec.Encoded | None
    if plan.op == "modified":
        assert base is not None and target is not None
        own = None if plan.advance is None else plan.advance[task.start : task.start + task.count]
        encoded = chunk_policy.encode_modified(
            base, target, opts.level, not opts.reversible, opts.coded_values, own
        )
        if own is not None and encoded.fields["encoding"] != "unchanged" and not encoded.advanced:
            np.copyto(own, target)
    elif plan.op == "added":
        assert target is not None
        encoded = chunk_codec.encode_full(target, opts.level)
    else:
        assert base is not None
        encoded = None
        if opts.reversible:
            encoded = chunk_codec.encode_full(base, opts.level)
    if encoded is None or encoded.blob is None:
        return _Done(task, encoded)
    return _Done(task, encoded, digest_bytes(encoded.blob))


class _BlobWriter:
    """Appends blobs to the data section and fills their offset/checksum.

    Every :data:`~.output_file.SYNC_BYTES` the new range is handed to the
    kernel's writeback and a background flush to storage starts, so that the
    disk writes while the encoder works and the final fsync finds little left
    to do.  On success call :meth:`finish`; :meth:`close` on every path.
    """

    def __init__(self, f: BinaryIO, inline: bool) -> None:
        self.f = f
        self.offset = 0
        self.coded_values = False  # some blob codes its values (feature coded-values)
        self.inline = inline  # blobs up to WRITE_MAX_BYTES go in the header
        self.inlined = False  # some blob did (feature inline-blobs)
        self._handed = 0
        self._sync = BackgroundSync(f.fileno())

    def add(self, encoded: chunk_codec.Encoded, checksum: str | None) -> dict[str, Any]:
        """The chunk's header fields; its blob (if any, with ``checksum``) is appended."""
        fields = dict(encoded.fields)
        self.coded_values |= encoded.coded
        small = encoded.blob is not None and len(encoded.blob) <= inline_blobs.WRITE_MAX_BYTES
        if encoded.blob is not None and self.inline and small:
            del fields["length"]  # the inline text's size (§4.12)
            fields["inline"] = inline_blobs.encode(encoded.blob)
            self.inlined = True
        elif encoded.blob is not None:
            assert checksum is not None
            self.f.write(encoded.blob)
            fields["offset"] = self.offset
            fields["checksum"] = checksum
            self.offset += len(encoded.blob)
            if self.offset - self._handed >= self._sync.every:
                self._flush()
        return fields

    def _flush(self) -> None:
        """Write out buffered blobs and start writeback and a flush of what is new."""
        self.f.flush()
        start_writeback(self.f.fileno(), self._handed, self.offset - self._handed)
        self._sync.wrote(self.offset - self._handed)
        self._handed = self.offset

    def finish(self) -> None:
        """Write out every blob; StorageError if a background flush failed."""
        self._flush()
        self._sync.finish()

    def close(self) -> None:
        """Wait for a background flush (before the file is closed)."""
        self._sync.close()


def _empty_digests(plan: _Plan) -> None:
    if plan.base is not None and not plan.base_known:
        plan.digests["base_digest"] = EMPTY_DIGEST
    if plan.target is not None:
        plan.digests["target_digest"] = EMPTY_DIGEST


def _encode_all(
    plans: list[_Plan], opts: DiffOptions, blobs: _BlobWriter, progress: Progress | None
) -> None:
    for plan in plans:
        if plan.tensor.elements == 0:
            _empty_digests(plan)
    seq, buffers = Sequencer(), _Buffers()
    tasks = chunk_tasks(plans, lambda p: p.tensor.elements, opts.chunk_elements, opts.threads)
    try:
        limit = batch_limit(opts.chunk_elements)
        for done in batched_map(lambda t: _run(t, opts, seq, buffers), tasks, opts.threads, limit):
            if done.encoded is not None:
                done.task.item.chunks.append(blobs.add(done.encoded, done.checksum))
            if progress is not None:
                sides = (done.task.item.base, done.task.item.target)
                progress(done.task.count * sum(t.dtype.size for t in sides if t is not None))
    except Aborted:
        assert seq.error is not None
        raise seq.error from None


def _entry(plan: _Plan) -> dict[str, Any]:
    t = plan.tensor
    op = plan.op
    if op == "modified" and all(c["encoding"] == "unchanged" for c in plan.chunks):
        op = "unchanged"
    entry: dict[str, Any] = {
        "name": t.name,
        "op": op,
        "dtype": t.dtype.name,
        "shape": list(t.shape),
    }
    entry.update(plan.digests)
    if op != "unchanged" and (op != "removed" or plan.chunks or t.elements == 0):
        entry["chunks"] = plan.chunks
    return entry


def _side(ckpt: Checkpoint, entries: list[dict[str, Any]], side: str) -> dict[str, Any]:
    absent = "added" if side == "base" else "removed"
    ids = [
        TensorIdentity(e["name"], e["dtype"], tuple(e["shape"]), e[f"{side}_digest"])
        for e in entries if e["op"] != absent
    ]  # fmt: skip
    return {"digest": checkpoint_digest(ids), **side_json(ckpt.files, ckpt.index)}


def _header_bytes(
    base: Checkpoint, target: Checkpoint, plans: list[_Plan], opts: DiffOptions,
    features: list[str],
) -> bytes:  # fmt: skip
    """The padded header text; ``features``: those the blobs use (v1 form names)."""
    entries = [_entry(p) for p in plans]
    reversible = all(
        c["encoding"] != "full" for e in entries if e["op"] == "modified" for c in e["chunks"]
    ) and all("chunks" in e for e in entries if e["op"] == "removed")
    doc = {
        "version": FORMAT_VERSION,
        "required_features": features,
        "generator": f"wdelta-py/{__version__}",
        "zstd_level": "auto" if opts.level is None else opts.level,
        "chunk_elements": opts.chunk_elements,
        "reversible": reversible,
        "base": _side(base, entries, "base"),
        "target": _side(target, entries, "target"),
        "tensors": entries,
    }
    text = None
    if opts.compact:
        # Unchanged chunks cost more parse memory per byte in the compact form
        # (24 bytes each) than the reader's budget allows when they are most
        # of a large header (§13): such a header is written in the v1 form.
        small = json.dumps(compact.compact_header(doc), ensure_ascii=False, separators=(",", ":"))
        if strictjson.within_budget(small.encode("utf-8")):
            text = small.encode("utf-8")
    if text is None:
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def diff_checkpoints(
    base: Checkpoint, target: Checkpoint, out: Path, opts: DiffOptions,
    progress: Progress | None = None, *, overwrite: bool = False,
    base_digests: Mapping[str, str] | None = None, advance: Mapping[str, Words] | None = None,
) -> Path:  # fmt: skip
    """Write the delta base -> target to ``out`` atomically; returns ``out``.

    An existing ``out`` is refused unless ``overwrite``.  ``base_digests``
    (tensor name -> BLAKE3 hex) are taken as the base tensors' digests instead
    of hashing them: the caller vouches for them (a publisher's own copy of
    the weights it published); tensors not named there are hashed.

    ``advance`` (tensor name -> the base tensor's own words, flat, writable) is
    brought to the target as the diff goes: each changed chunk is written with
    the target's words once it is encoded, so that a publisher's copy needs no
    second pass.  Only for tensors whose base digest is in ``base_digests`` (the
    words are not hashed after a chunk is rewritten); on failure the arrays are
    partly brought forward.

    Blobs are written first, from the start of the temporary file; prefix and
    header are put in front of them once the header is known (:func:`_prepend`).
    """
    opts.check()
    _check_describable(base, "base")
    _check_describable(target, "target")
    plans = _plans(base, target)
    for plan in plans:
        if plan.base is not None and base_digests and plan.base.name in base_digests:
            plan.digests["base_digest"], plan.base_known = base_digests[plan.base.name], True
        if advance and plan.op == "modified" and plan.base_known:
            plan.advance = _advanced_words(plan, advance)
    with atomic_file(out, overwrite=overwrite) as fd:
        with os.fdopen(os.dup(fd), "wb") as data:
            blobs = _BlobWriter(data, opts.inline_blobs)
            try:
                _encode_all(plans, opts, blobs, progress)
                blobs.finish()
            finally:
                blobs.close()
        used = [(coded_values.FEATURE, blobs.coded_values), (inline_blobs.FEATURE, blobs.inlined)]
        features = [name for name, on in used if on]
        header = _header_bytes(base, target, plans, opts, features)
        _check_header_size(header, plans, opts)
        _prepend(fd, header, blobs.offset)
    return out


def _advanced_words(plan: _Plan, advance: Mapping[str, Words]) -> Words | None:
    """The words ``advance`` names for the plan's base, checked against its layout."""
    assert plan.base is not None
    words = advance.get(plan.base.name)
    if words is None:
        return None
    if words.shape != (plan.base.elements,) or words.dtype != plan.base.dtype.word:
        raise BadArgumentError(f"tensor {plan.base.name!r}: the words to advance are not its own")
    if not words.flags.writeable:
        raise BadArgumentError(f"tensor {plan.base.name!r}: the words to advance are read-only")
    return words


def _check_describable(ckpt: Checkpoint, side: str) -> None:
    """Refuse, before anything is written, a layout the header rules reject (§4.9)."""
    for name in ckpt.files:
        if not is_shard_name(name):
            raise CheckpointInvalidError(
                f"{side}: file name {name!r} cannot be recorded in a delta"
            )
    if ckpt.index is not None and not is_index_name(ckpt.index[0]):
        raise CheckpointInvalidError(f"{side}: index name {ckpt.index[0]!r} cannot be recorded")


def _check_header_size(header: bytes, plans: list[_Plan], opts: DiffOptions) -> None:
    """LimitExceededError for a header over the format's limit, with the remedy that
    applies: the compact form when it was not asked for (it takes about half the
    bytes per tensor: 350 against 740 on an fp8 MoE layout, where 138,000 tensors
    put the v1 form just over the limit), larger chunks for tensors of many chunks."""
    if len(header) <= MAX_HEADER_BYTES:
        return
    chunks = sum(len(p.chunks) for p in plans)
    remedy = []
    if not opts.compact:
        remedy.append("write the compact header form (compact=True), "
                      "about half the bytes per tensor")  # fmt: skip
    if chunks > 2 * len(plans):
        remedy.append("use larger chunks (chunk_elements=N)")
    remedy.append("or split the checkpoint and diff its parts separately")
    raise LimitExceededError(
        f"the header would be {len(header):,} bytes for {len(plans):,} tensors "
        f"({len(header) // max(1, len(plans))} per tensor), over the format's limit of "
        f"{MAX_HEADER_BYTES:,} bytes: {'; '.join(remedy)}"
    )


def _prepend(fd: int, header: bytes, data_length: int) -> None:
    """Put the prefix and ``header`` in front of the ``data_length`` bytes at offset 0.

    With a large enough data section the header is padded so that the data
    starts on a 4096-byte boundary (SPEC §4.1) and the room is inserted
    without moving data; otherwise, or where inserting is not possible, the
    data is shifted and the header carries 0 to 7 spaces of padding.
    """
    aligned = header + b" " * (-(PREFIX_SIZE + len(header)) % prepend.BLOCK)
    insert = data_length >= INSERT_MIN_DATA_BYTES and len(aligned) <= MAX_HEADER_BYTES
    if insert and prepend.insert_front(fd, PREFIX_SIZE + len(aligned)):
        pwrite_all(fd, pack_prefix(aligned, data_length) + aligned, 0)
        return
    prepend.shift_forward(fd, data_length, PREFIX_SIZE + len(header))
    pwrite_all(fd, pack_prefix(header, data_length) + header, 0)
