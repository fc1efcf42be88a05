"""A worker's host copy of a chain version, moved to the version an engine is asked for.

Every engine adapter (vLLM's backend, SGLang's weight loader) does the same
thing: keep the checkpoint, in checkpoint names, at the version the engine's
weights are at; on an update to version N, move that copy with
``chain.move_weights`` (every tensor digest checked, all or nothing) and hand
the engine only the tensors that changed.  The engine is written only after
the whole move has been verified, so a refused version leaves it untouched.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..arguments import check_int, check_seconds
from ..chain.live.move import Moved, move_weights, prefetch
from ..chain.live.weights import load
from ..chain.store import Chain
from ..errors import BadArgumentError, WdeltaError

log = logging.getLogger("wdelta.integrations")


@dataclass
class InitInfo:
    """What an engine is told once: ``chain`` (URI or folder), ``cache`` (a folder shared
    by the node's workers), ``trust`` (trust-root file, or None for an unsigned chain)
    and ``version`` (the chain version the engine's weights are at now)."""

    chain: str
    cache: str
    trust: str | None = None
    version: int = 0
    prefetch: float | None = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.chain, str) or not self.chain:
            raise BadArgumentError("init info: 'chain' must be a non-empty URI or folder")
        if not isinstance(self.cache, str) or not self.cache:
            raise BadArgumentError("init info: 'cache' must be a non-empty folder")
        if self.trust is not None and not isinstance(self.trust, str):
            raise BadArgumentError("init info: 'trust' must be a file path or null")
        self.version = check_int(self.version, "init info 'version'", 0)
        self.prefetch = check_seconds(self.prefetch, "init info 'prefetch'")


@dataclass
class UpdateInfo:
    """One update: bring the engine's weights to chain version ``version``."""

    version: int

    def __post_init__(self) -> None:
        self.version = check_int(self.version, "update info 'version'", 0)


class NodeWeights:
    """The checkpoint at ``info.version``, in host memory, in checkpoint names.

    ``prepare(n)`` downloads what moving to ``n`` needs into the shared cache
    (one download per object for all the node's processes: the cache's lock
    makes the others wait and find it stored), and with ``info.prefetch`` a
    background thread does so towards the chain's head as versions appear,
    so that ``move(n)`` normally reads nothing but the cache.  ``move(n)``
    applies it and returns the changed ``(name, tensor)`` pairs
    for the model's ``load_weights``.  A version whose tensors the engine
    cannot hold (a new name, another shape or dtype) is refused and the host
    copy moved back, so host copy and engine stay at the same version.
    """

    def __init__(self, info: InitInfo) -> None:
        self.chain = Chain(info.chain, cache=Path(info.cache), trust=info.trust)
        # downloads ahead run beside a move, in another thread: a Chain object of their own
        self._ahead = Chain(info.chain, cache=Path(info.cache), trust=info.trust)
        self.location = (info.chain, info.cache)
        self.weights, at = load(self.chain, to=info.version, device="cpu")
        self.version = at.number
        self._layout = {n: (tuple(t.shape), t.dtype) for n, t in self.weights.items()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if info.prefetch is not None:
            self._thread = threading.Thread(
                target=self._prefetch_loop, args=(info.prefetch,), daemon=True,
                name="wdelta-prefetch",
            )  # fmt: skip
            self._thread.start()

    def _prefetch_loop(self, interval: float) -> None:
        """Download towards the head until ``close``; a failure is logged and retried
        (the update that needs the files reports it, or downloads them itself)."""
        while not self._stop.wait(interval):
            try:
                self.prepare(-1)
            except WdeltaError as exc:
                log.warning("wdelta prefetch: %s", exc)

    def close(self) -> None:
        """Stop the background prefetch (if any) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def prepare(self, to: int) -> int:
        """Download ahead what ``move(to)`` needs (-1: the head); the bytes downloaded."""
        return prefetch(self._ahead, at=self.version, to="head" if to == -1 else to)

    def move(self, to: int) -> list[tuple[str, Any]]:
        """Move the host copy to version ``to``; the changed tensors, by checkpoint name
        (sorted, so every rank hands them to its model in the same order)."""
        before = self.version
        moved = move_weights(self.chain, self.weights, at=before, to=to)
        self.version = moved.version.number
        try:
            self._check_fits(moved)
        except BadArgumentError:
            back = move_weights(self.chain, self.weights, at=self.version, to=before)
            self.version = back.version.number
            raise
        return [(n, self.weights[n]) for n in sorted(moved.changed)]

    def _check_fits(self, moved: Moved) -> None:
        """Refuse a version that adds a tensor or changes one's shape or dtype."""
        for name in sorted(moved.changed):
            t = self.weights[name]
            if self._layout.get(name) != (tuple(t.shape), t.dtype):
                raise BadArgumentError(
                    f"version {moved.version.number}: tensor {name!r} is new or changed its "
                    "shape or dtype, which a running engine cannot take"
                )
        missing = sorted(set(self._layout) - set(self.weights))
        if missing:
            raise BadArgumentError(
                f"version {moved.version.number} removes tensor {missing[0]!r}, which a "
                "running engine cannot drop"
            )
