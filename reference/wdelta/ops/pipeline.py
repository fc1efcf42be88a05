"""An ordered, bounded parallel map over chunks.

NumPy, zstd and BLAKE3 release the GIL, so a small thread pool keeps both
cores busy.  At most ``window`` results are in flight, which bounds memory to
a few chunks however large the tensors are; results come back in input order
so that digests can be updated sequentially.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import blake3
import numpy as np

from ..format.digest import EMPTY_DIGEST, new_hasher

T = TypeVar("T")
R = TypeVar("R")
Words = np.ndarray[Any, np.dtype[np.unsignedinteger[Any]]]
# Tasks are handed to workers in batches of about this many elements (see
# batched_map): enough for a batch's work to outweigh its handoff, few enough
# that two workers stay evenly loaded on a 25 M-element checkpoint.
BATCH_ELEMENTS = 1 << 20
# Work on fewer elements than this runs in the calling thread, not on the pool
# (see runs_locally): it is Python more than NumPy, and two threads running
# Python take turns holding the GIL, each handing it over at every call that
# releases it (a read, a hash, a compression).  Measured on 20,000 tensors of
# 2,048 elements, one thread against two: diff 1.8 s against 2.4 s (5,000
# tensors), verify 2.7 s against 3.6-3.9 s, apply_inplace 3.9 s against 4.9 s.
LOCAL_ELEMENTS = 1 << 16


def runs_locally(elements: int) -> bool:
    """Whether work on ``elements`` elements (a chunk, a small tensor) is better
    done by the calling thread than handed to the pool (see LOCAL_ELEMENTS)."""
    return elements < LOCAL_ELEMENTS


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], threads: int, ahead: int = 2,
    local: Callable[[T], bool] | None = None,
) -> Generator[R, None, None]:  # fmt: skip
    """Yield ``fn(item)`` for each item, in order, computing ahead on a pool.

    At most ``ahead * threads`` items are submitted but not yet yielded.
    Items for which ``local`` is true are not submitted: each is computed in
    the calling thread when its turn to be yielded comes.
    """
    if threads <= 1:
        yield from map(fn, items)
        return
    window = ahead * threads
    pending: deque[Future[R] | _Local[T]] = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wdelta") as pool:
        try:
            for item in items:
                local_item = local is not None and local(item)
                pending.append(_Local(item) if local_item else pool.submit(fn, item))
                if len(pending) >= window:
                    yield _result(pending.popleft(), fn)
            while pending:
                yield _result(pending.popleft(), fn)
        finally:
            for future in pending:
                if isinstance(future, Future):
                    future.cancel()


@dataclass(frozen=True)
class _Local(Generic[T]):
    """An item of :func:`ordered_map` computed by the calling thread in its turn."""

    item: T


def _result(pending: Future[R] | _Local[T], fn: Callable[[T], R]) -> R:
    return fn(pending.item) if isinstance(pending, _Local) else pending.result()


class Aborted(Exception):
    """Raised in a worker waiting for its turn after another worker failed."""


class Sequencer:
    """Runs sections of concurrent workers in task order, per stream.

    Digests must be fed chunk by chunk in order, yet hashing is as costly as
    decoding; letting each worker hash its own chunk when its turn comes keeps
    both cores busy.  Tasks start in submission order (FIFO pool), so the
    lowest pending index always runs and waiting never deadlocks.  After any
    failure every waiter raises :class:`Aborted`; ``error`` is the first real
    exception, which the caller re-raises.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next: dict[int, int] = {}
        self.error: BaseException | None = None

    @contextlib.contextmanager
    def turn(self, stream: int, index: int) -> Iterator[None]:
        """Hold the turn ``index`` of ``stream`` (0, 1, 2, ... in order)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self.error is not None or self._next.get(stream, 0) == index
            )
            if self.error is not None:
                raise Aborted
        yield
        with self._cond:
            self._next[stream] = index + 1
            self._cond.notify_all()

    def ready(self, stream: int, index: int) -> bool:
        """Whether turn ``index`` of ``stream`` has come (a turn taken after this says
        True does not wait); raises :class:`Aborted` after a failure."""
        with self._cond:
            if self.error is not None:
                raise Aborted
            return self._next.get(stream, 0) == index

    def close(self, stream: int) -> None:
        """Forget a finished stream."""
        with self._cond:
            self._next.pop(stream, None)

    def fail(self, exc: BaseException) -> None:
        """Record the first failure and wake every waiter."""
        with self._cond:
            if self.error is None and not isinstance(exc, Aborted):
                self.error = exc
            self._cond.notify_all()


class TensorDigests:
    """The two BLAKE3 digests of one tensor (0: input side, 1: other side).

    Workers feed chunks through :meth:`feed`, which waits for the chunk's turn
    so that each digest sees the tensor's bytes in order.  A tensor of one
    chunk (``single``) has no order to keep: its chunk is hashed at once,
    without the sequencer's lock and wake-ups (two per chunk, for each of
    the 133 mostly small tensors of the fp8 real trace).
    """

    def __init__(self, stream: int, workers: int, elements: int, single: bool = False) -> None:
        self.stream = stream
        self.single = single
        self.workers = workers
        self.elements = elements
        # Made at the first chunk, whose words give the tensor's size in bytes.
        self.hashers: list[blake3.blake3 | None] = [None, None]

    def _hasher(self, which: int, words: Words) -> blake3.blake3:
        hasher = self.hashers[which]
        if hasher is None:
            hasher = new_hasher(self.workers, self.elements * words.dtype.itemsize)
            self.hashers[which] = hasher
        return hasher

    def ready(self, seq: Sequencer, which: int, index: int) -> bool:
        """Whether :meth:`feed` of chunk ``index`` would hash at once, without waiting."""
        return self.single or seq.ready(self.stream + which, index)

    def feed(self, seq: Sequencer, which: int, index: int, words: Words) -> None:
        if self.single:
            self._hasher(which, words).update(words.data.cast("B"))
            return
        with seq.turn(self.stream + which, index):
            self._hasher(which, words).update(words.data.cast("B"))

    def hexdigest(self, seq: Sequencer, which: int) -> str:
        """The finished digest ``which``; its stream is forgotten."""
        seq.close(self.stream + which)
        hasher = self.hashers[which]
        return EMPTY_DIGEST if hasher is None else str(hasher.hexdigest())


@dataclass(frozen=True)
class ChunkTask(Generic[T]):
    """Chunk ``index`` of ``item``: elements ``[start, start + count)`` of ``elements``."""

    item: T
    index: int
    start: int
    count: int
    elements: int
    digests: TensorDigests

    @property
    def last(self) -> bool:
        return self.start + self.count == self.elements


def batched_map(
    fn: Callable[[ChunkTask[T]], R], tasks: Iterable[ChunkTask[T]], threads: int, limit: int,
    ahead: int = 2,
) -> Generator[R, None, None]:  # fmt: skip
    """:func:`ordered_map` of ``fn`` over tasks, handed to the workers in batches.

    A batch is a run of consecutive tasks of at most ``limit`` elements in
    all (or one larger task), so that a checkpoint of many small tensors costs
    a few dozen thread handoffs instead of one per tensor.  A batch of small
    tasks only (each :func:`runs_locally`) runs in the calling thread.
    Results are yielded per task, in order; at most ``ahead * threads``
    batches are in flight, so memory stays bounded as long as ``limit`` is at
    most a chunk.
    """
    batches = _batches(tasks, limit)
    work = ordered_map(
        lambda batch: [fn(t) for t in batch], batches, threads, ahead,
        local=lambda batch: all(runs_locally(t.count) for t in batch),
    )  # fmt: skip
    for results in work:
        yield from results


def batch_limit(chunk_elements: int) -> int:
    """The batch size for :func:`batched_map`: never more elements than a chunk."""
    return min(chunk_elements, BATCH_ELEMENTS)


def _batches(tasks: Iterable[ChunkTask[T]], limit: int) -> Iterator[list[ChunkTask[T]]]:
    batch: list[ChunkTask[T]] = []
    total = 0
    for task in tasks:
        if batch and total + task.count > limit:
            yield batch
            batch, total = [], 0
        batch.append(task)
        total += task.count
    if batch:
        yield batch


def chunk_tasks(
    items: Iterable[T], elements: Callable[[T], int], chunk_elements: int, workers: int
) -> Iterator[ChunkTask[T]]:
    """One task per chunk of every item, in order; empty items yield nothing."""
    for k, item in enumerate(items):
        n = elements(item)
        digests = TensorDigests(2 * k, workers, n, single=n <= chunk_elements)
        for i, start in enumerate(range(0, n, chunk_elements)):
            yield ChunkTask(item, i, start, min(chunk_elements, n - start), n, digests)
