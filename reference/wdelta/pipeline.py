"""An ordered, bounded parallel map over chunks.

NumPy, zstd and BLAKE3 release the GIL, so a small thread pool keeps both
cores busy.  At most ``window`` results are in flight, which bounds memory to
a few chunks however large the tensors are; results come back in input order
so that digests can be updated sequentially.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], threads: int) -> Iterator[R]:
    """Yield ``fn(item)`` for each item, in order, computing ahead on a pool."""
    if threads <= 1:
        yield from map(fn, items)
        return
    window = 2 * threads
    pending: deque[Future[R]] = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wdelta") as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
