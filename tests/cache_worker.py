"""One of several processes sharing one cache folder (run as a script, not collected).

    python cache_worker.py STORE CACHE WORK INDEX

Waits for WORK/go, then, in an order set by INDEX, pulls the head into its own
file, loads the head into memory, and prefetches and moves weights from
version 0 to the head, all through the cache folder CACHE; every result is
checked against the head's digest.  Odd INDEXes download with concurrent
ranged reads (a small ``Transfer.threshold``).  Prints ``ok``, or the error
(exit status 1).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from wdelta import chain
from wdelta.chain.storage.transfer import Transfer


def main(store: Path, cache: Path, work: Path, index: int) -> None:
    storage = chain.open_storage(str(store))
    if index % 2:
        storage.transfer = Transfer(threshold=1 << 16, chunk=1 << 15, concurrency=3)
    c = chain.Chain(storage, cache)
    head = c.head().head

    def pull() -> None:
        local = work / f"node{index}" / "model.safetensors"
        local.parent.mkdir(parents=True, exist_ok=True)
        assert chain.pull(c, local).version.digest == head.digest

    def load() -> None:
        weights, version = chain.load(c)
        assert version == head and chain.weights_digest(weights) == head.digest

    def move() -> None:
        weights, _ = chain.load(c, to=0)
        chain.prefetch(c, at=0)
        assert chain.move_weights(c, weights, at=0).version == head
        assert chain.weights_digest(weights) == head.digest

    steps: list[Callable[[], None]] = [pull, load, move]
    while not (work / "go").exists():
        time.sleep(0.002)
    for k in range(len(steps)):
        steps[(index + k) % len(steps)]()


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    except BaseException as exc:
        print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
        sys.exit(1)
    print("ok")
