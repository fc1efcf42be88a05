"""Live weights on a chain: a trainer publishes steps from memory, nodes follow into memory.

``Publisher.publish(state_dict)`` diffs the previously published copy against
the new weights and appends the delta in one call; no full checkpoint is
written (except version 0, which a chain stores whole, and snapshots asked
for).  The previous copy is kept in host memory (one copy of the published
weights: RAM of the checkpoint's size, brought forward in place by applying
each step's delta, the changed words only) or, with ``keep``, as a file on
local disk (no RAM, but the full checkpoint written per step).  Its tensor
digests are kept from the step before rather than hashed again, so a step
reads the new weights once and the copy once (see ``Publisher``).

``follow_weights`` keeps an in-memory mapping at the chain's head: each new
version is applied with ``apply_inplace`` (all or nothing, every digest
checked), so a failed download or a corrupted link leaves the weights at the
previous version; the error is reported (or logged on ``wdelta.chain``), the
step retried with backoff, and raised after ``max_failures`` in a row.  With
``recover``, weights that are no version of the chain are brought to the head
by loading it in place; ``max_cache_bytes`` bounds the node's cache.
A partial mapping (a tensor-parallel rank) reads only its tensors' blobs of
each link (ranged requests, ``remote_delta``); a node whose version has no
links to the head (pruned) jumps there through a snapshot pulled into memory.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from ...arguments import (
    PathLike,
    as_path,
    check_int,
    check_mapping,
    check_optional_int,
    check_seconds,
)
from ...checkpoint.safetensors_header import build_header
from ...checkpoint.source import Checkpoint, Words, open_checkpoint
from ...errors import BadArgumentError, BaseMismatchError, StorageError, WdeltaError
from ...format.container import open_delta
from ...format.digest import TensorIdentity, checkpoint_digest
from ...format.dtypes import to_numpy
from ...io.atomic import atomic_file
from ...io.output_file import pwrite_all
from ...limits import MAX_CHUNK_ELEMENTS
from ...ops import api
from ...ops import tensors as live
from ...ops.decoder import init_file
from ...ops.encoder import DiffOptions, diff_checkpoints
from ...ops.inplace import apply_inplace, apply_opened, apply_unchecked
from ...ops.pipeline import ordered_map, runs_locally
from ...ops.tensors import Select, Slot
from ..errors import ChainBrokenError, NotFoundError
from ..model import graph
from ..model.manifest import Link, Manifest, Version
from ..reading import cachegc, parts
from ..reading.fetch import evicting, fetch_link
from ..reading.pull import pull
from ..reading.remote_delta import RemoteDelta
from ..storage.base import Progress
from ..store import Chain, as_chain
from ..trust.acceptance import Tracker
from ..trust.freshness import check_fresh, check_max_age
from ..trust.updater import Trust, as_trust, keep_roots_beside
from ..writing.append import AppendOptions, append_delta, init

_WRITE_ELEMENTS = 1 << 22
log = logging.getLogger("wdelta.chain")


def save_weights(weights: Mapping[str, Any], path: Path, *, overwrite: bool = False) -> None:
    """Write a mapping of arrays/tensors as one safetensors file, atomically, bit for bit.

    An existing ``path`` is refused (BadArgumentError) unless ``overwrite``.
    """
    check_mapping(weights, "weights")
    path = as_path(path, "path")
    slots = [live.slot(name, value) for name, value in weights.items()]
    layout = build_header([(s.name, s.dtype, s.shape) for s in slots], None)
    begins = {t.name: layout.data_start + t.begin for t in layout.tensors}
    with atomic_file(path, overwrite=overwrite) as fd:
        init_file(fd, layout)
        for s in slots:
            for start in range(0, s.elements, _WRITE_ELEMENTS):
                words = s.read(start, min(_WRITE_ELEMENTS, s.elements - start))
                pwrite_all(fd, words.data.cast("B"), begins[s.name] + start * s.dtype.size)


def weights_digest(weights: Mapping[str, Any]) -> str:
    """The checkpoint digest (SPEC §9.4) of a mapping: what a file of it would have."""
    check_mapping(weights, "weights")
    slots = [live.slot(name, value) for name, value in weights.items()]
    return checkpoint_digest(
        TensorIdentity(s.name, s.dtype.name, s.shape, s.digest()) for s in slots
    )


def _copy_block(src: Slot, dst: Words, start: int, count: int) -> None:
    view = src.whole()
    if view is None:
        dst[start : start + count] = src.read(start, count)
        return
    size = src.dtype.size
    np.copyto(dst[start : start + count], np.frombuffer(view, src.dtype.word, count, start * size))


def _holds(old: object, s: Slot) -> TypeGuard[np.ndarray[Any, Any]]:
    """True if ``old`` is a NumPy array of the dtype and shape of the tensor ``s``."""
    return isinstance(old, np.ndarray) and (old.dtype, old.shape) == (to_numpy(s.dtype), s.shape)


def _host_copy(
    weights: Mapping[str, Any], reuse: Mapping[str, Any], threads: int
) -> dict[str, Any]:
    """NumPy copies of ``weights``, written into the arrays of ``reuse`` that have the
    same name, dtype and shape (a step's previous copy): fresh arrays cost a page fault
    per 4 KiB, measured 4.6 s for 1 GB on the busy 2-core VM, against a 0.2 s copy."""
    copies: dict[str, Any] = {}
    blocks = []
    for name, value in weights.items():
        s = live.slot(name, value)
        old = reuse.get(name)
        if not _holds(old, s):
            old = np.empty(s.shape, to_numpy(s.dtype))  # arrays made here are C-contiguous
        copies[name] = old
        flat = old.reshape(-1).view(s.dtype.word)
        blocks += [(s, flat, i, min(_WRITE_ELEMENTS, s.elements - i))
                   for i in range(0, s.elements, _WRITE_ELEMENTS)]  # fmt: skip
    for _ in ordered_map(lambda b: _copy_block(*b), blocks, threads,
                         local=lambda b: runs_locally(b[3])):  # fmt: skip
        pass
    return copies


class Publisher:
    """Publishes in-memory weights to ``chain`` step after step.

    ``keep`` None keeps the previous published copy in host memory; a path
    keeps it as a safetensors file there.  ``previous`` resumes publishing
    on an existing chain: the weights (mapping or checkpoint path) of its
    head.  Without it the first ``publish`` starts the chain.

    What is trusted: the previous copy is the publisher's own, and its tensor
    digests are those of the version it published (hashed once, when the copy
    is first made: version 0 or ``previous``), so a step does not hash it
    again; a copy changed behind the publisher's back (a stray write into its
    memory, another process rewriting ``keep``) would be published as a delta
    that no follower can apply.  ``check_previous=True`` hashes the copy at
    every step and refuses (``base-mismatch``, nothing published) a copy that
    no longer has its digests: one more pass over the checkpoint's bytes.
    """

    def __init__(
        self, chain: Chain, *, keep: Path | None = None, options: AppendOptions | None = None,
        previous: Mapping[str, Any] | Path | None = None, check_previous: bool = False,
    ) -> None:  # fmt: skip
        self.chain, self.keep, self.options = as_chain(chain), keep, options or AppendOptions()
        self.check_previous = bool(check_previous)
        self._previous: Mapping[str, Any] | Path | None = None
        self._digests: dict[str, str] = {}  # the previous copy's tensor digests
        if previous is not None:
            self._remember(previous if isinstance(previous, Mapping) else _load_all(previous))

    def _remember(self, weights: Mapping[str, Any]) -> None:
        """Copy ``weights`` whole as the previous copy, and hash it (once)."""
        if self.keep is None:
            reuse = self._previous if isinstance(self._previous, Mapping) else {}
            # Overwritten in place: until the copy completes there is no previous copy.
            self._previous = None
            copy = _host_copy(weights, reuse, self.options.threads)
            self._digests = tensor_digests(copy, self.options.threads)
            self._previous = copy
            return
        save_weights(weights, self.keep, overwrite=True)
        self._digests = tensor_digests(weights, self.options.threads)  # the bytes just saved
        self._previous = self.keep

    def publish(
        self, weights: Mapping[str, Any], *, step: int | None = None,
        metadata: Mapping[str, str] | None = None, snapshot: bool = False,
        progress: Progress | None = None,
    ) -> Manifest:  # fmt: skip
        """Publish ``weights`` (a state_dict) as the chain's next version; its manifest.

        The version's digest is the checkpoint digest of ``weights``, as a
        file holding them would have.  A step reads ``weights`` once (diffed
        against the previous copy and hashed); the diff brings the previous
        copy to them as it goes (each changed chunk's changed words, once it is
        encoded), or, for a step that adds or removes tensors, the delta is
        applied to it in place after the append; a ``keep`` file is rewritten
        whole.  On failure nothing is published and the previous copy is kept
        (a failed snapshot save or a refused append takes it back: the delta
        applied in reverse); if the copy cannot be brought to a version (an
        interrupted diff or take-back, or an interrupt after the append), it is
        dropped: pass ``previous=`` to a new Publisher to resume.
        """
        with tempfile.TemporaryDirectory(prefix="wdelta-publish-") as tmp:
            whole = Path(tmp) / "model.safetensors"
            if self._previous is None:
                if self.chain.revisions():
                    raise BadArgumentError("the chain exists: pass previous= to resume it")
                save_weights(weights, whole, overwrite=True)
                m = init(self.chain, whole, step=step, metadata=metadata, progress=progress)
                self._remember(weights)
                return m
            out = Path(tmp) / "link.wdelta"
            advance = self._advance_words(weights)
            try:
                self._diff(weights, out, advance)
                if snapshot or self.options.snapshot:
                    save_weights(weights, whole, overwrite=True)
                m = self._append(out, step, metadata, whole if whole.exists() else None, progress)
            except BaseException as exc:
                if advance is not None:
                    self._take_back(out, exc)
                raise
            self._advance(weights, out, advanced=advance is not None)
        return m

    def _append(
        self, out: Path, step: int | None, metadata: Mapping[str, str] | None,
        snapshot: Path | None, progress: Progress | None,
    ) -> Manifest:  # fmt: skip
        try:
            return append_delta(
                self.chain, out, step=step, metadata=metadata, snapshot=snapshot,
                progress=progress,
            )  # fmt: skip
        except BaseMismatchError as exc:  # it would name our temporary delta
            raise BaseMismatchError(
                f"{self.chain.url}: the previous copy (previous=, or the version this "
                "publisher last published) is not a version of the chain: resume with "
                "previous= the weights of one of its versions, normally the head"
            ) from exc

    def _advance_words(self, weights: Mapping[str, Any]) -> dict[str, Any] | None:
        """The previous copy's words, flat, if the diff can bring them forward as it
        goes: a copy in memory whose digests are trusted (not ``check_previous``),
        with the same tensors (names, dtypes, shapes) as ``weights``; else None."""
        previous = self._previous
        if self.check_previous or not isinstance(previous, Mapping):
            return None
        if set(previous) != set(weights):
            return None
        words = {}
        for name, value in weights.items():
            s, old = live.slot(name, value), previous[name]
            if not _holds(old, s):
                return None
            words[name] = old.reshape(-1).view(s.dtype.word)
        return words

    def _take_back(self, delta: Path, exc: BaseException) -> None:
        """After a failed step whose diff was bringing the copy forward: the copy is taken
        back to the previous version (the link ``delta`` applied in reverse) if the diff
        finished (``delta`` is written whole or not at all) and ``exc`` names no published
        revision; otherwise (a diff cut short, a version published anyway), or if the
        take-back fails too, the copy is dropped."""
        previous, self._previous = self._previous, None
        published = getattr(exc, "published_revision", None) is not None
        if previous is None or published or not delta.exists():
            return
        assert isinstance(previous, MutableMapping)
        with open_delta(delta) as d:
            apply_unchecked(previous, d, self.options.threads, reverse=True)
        self._previous = previous

    def _diff(
        self, weights: Mapping[str, Any], out: Path, advance: Mapping[str, Any] | None
    ) -> None:
        """The delta from the previous copy to ``weights``, its digests taken as
        known (or, with ``check_previous``, hashed and compared with them);
        ``advance``: the copy's words, brought to ``weights`` as the diff goes."""
        assert self._previous is not None
        o = self.options
        level = check_optional_int(o.level, "level", -7, 22)
        chunks = check_optional_int(o.chunk_elements, "chunk_elements", 1, MAX_CHUNK_ELEMENTS)
        opts = DiffOptions(level, check_int(o.threads, "threads", 1),
                           chunks or DiffOptions.chunk_elements)  # fmt: skip
        known = None if self.check_previous else self._digests
        with _as_checkpoint(self._previous) as base:
            try:
                diff_checkpoints(base, live.checkpoint_of(weights), out, opts,
                                 base_digests=known, advance=advance)  # fmt: skip
            except OSError as exc:
                raise StorageError(str(exc)) from exc
        if self.check_previous:
            with open_delta(out) as d:
                found = {t.name: t.base_digest for t in d.header.tensors if t.base_digest}
            changed = sorted(n for n, v in found.items() if self._digests.get(n) != v)
            if changed:
                raise BaseMismatchError(
                    f"the previous published copy was modified since it was published "
                    f"(tensor {changed[0]!r}); nothing published"
                )

    def _advance(self, weights: Mapping[str, Any], delta: Path, advanced: bool) -> None:
        """Bring the previous copy to the version just published by ``delta``
        (``advanced``: the diff already did), and take its digests; on failure the
        copy is dropped (its words or digests would not be the version's)."""
        previous, self._previous = self._previous, None  # none until brought forward
        with open_delta(delta) as d:
            digests = {t.name: t.target_digest for t in d.header.tensors if t.target_digest}
            if not isinstance(previous, Mapping):
                assert self.keep is not None
                save_weights(weights, self.keep, overwrite=True)
            elif not advanced:
                assert isinstance(previous, MutableMapping)
                apply_unchecked(previous, d, self.options.threads)
        self._previous, self._digests = previous, digests


@contextlib.contextmanager
def _as_checkpoint(source: Mapping[str, Any] | Path) -> Iterator[Checkpoint]:
    if isinstance(source, Mapping):
        yield live.checkpoint_of(source)
        return
    with open_checkpoint(source) as ckpt:
        yield ckpt


def tensor_digests(weights: Mapping[str, Any], threads: int) -> dict[str, str]:
    """Each tensor's digest (SPEC §9.3), hashed on ``threads`` threads."""
    slots = [live.slot(name, value) for name, value in weights.items()]
    found = ordered_map(lambda s: s.digest(), slots, threads, 1,
                        local=lambda s: runs_locally(s.elements))  # fmt: skip
    return {s.name: d for s, d in zip(slots, found, strict=True)}


def _load_all(path: Path, select: Select = None, device: Any = None) -> dict[str, Any]:
    keep = live.selector(select)
    with open_checkpoint(path) as ckpt:
        return {
            t.name: live.present(t.read(0, t.elements), t.dtype, t.shape, device)
            for t in ckpt.tensors.values() if keep(t.name)
        }  # fmt: skip


def load(
    chain: Chain, *, to: str | int = "head", tensors: str | None = None, device: Any = None,
    trust: Trust | PathLike | None = None,
    state: PathLike | None = None, accept_rollback: bool = False, max_age: float | None = None,
    allow_unsigned: bool = False,
) -> tuple[dict[str, Any], Version]:  # fmt: skip
    """Weights of version ``to`` in memory, and that version (a node's start).

    ``tensors`` selects by pattern (a partial pull: only those byte ranges);
    ``device`` None gives NumPy arrays, else torch tensors on that device.
    Without a cache on ``chain`` the downloads go to a temporary one, removed
    afterwards (``chain.cache`` stays None).  ``state``: the acceptance state
    file (RD-1, as ``pull``'s; with ``trust``, the newest trust root walked to is
    kept beside it too); None keeps none.  ``max_age``: seconds, as
    ``pull``'s (a head published longer ago is refused, ``frozen``).
    ``allow_unsigned``: as ``pull``'s (a state recording signed revisions
    otherwise refuses a load without ``trust``).
    """
    chain = as_chain(chain)
    if trust is not None:
        chain.trust = as_trust(trust)
    keep_roots(chain, state)
    cache = chain.cache
    with tempfile.TemporaryDirectory(prefix="wdelta-load-") as tmp:
        local = Path(tmp) / "model.safetensors"
        try:
            tracker = Tracker(state, accept_rollback, allow_unsigned)
            result = pull(chain, local, to=to, tensors=tensors, state=tracker, max_age=max_age)
        finally:
            chain.cache = cache  # pull points a missing cache into ``tmp``
        return _load_all(local, tensors, device), result.version


def keep_roots(chain: Chain, state: PathLike | None) -> None:
    """With a trust policy and a ``state`` file, the newest trust root walked to is
    kept beside that file (``.STATE.wdelta-root.json``) and resumed from, as ``pull``
    keeps it beside its checkpoint; without a state file it lives in memory only."""
    beside = None if state is None else as_path(state, "state")
    keep_roots_beside(chain.trust, chain.storage, beside)


def needs_state(chain: Chain, state: PathLike | None) -> None:
    """A follower with a trust policy keeps what it trusted across restarts (TUF: trusted
    metadata persists), as ``pull`` does beside its checkpoint: it needs a state file."""
    if chain.trust is not None and state is None:
        raise BadArgumentError(
            "a follower with a trust policy needs a state file (state), where it keeps the "
            "revision it accepted and the trust roots it reached: without it a restart forgets "
            "a root rotation that revoked a key, should the store delete it"
        )


def start_version(
    m: Manifest, weights: Mapping[str, Any], at: str | int | None, partial: bool
) -> int:
    """The number of the weights' version; a number pruned from the manifest is kept
    (the node then jumps to the head, see :func:`_jump`)."""
    if isinstance(at, int) and not isinstance(at, bool) and 0 <= at <= m.head.number:
        return at
    if at is not None:
        return m.version(at).number
    if partial:
        raise BadArgumentError("a partial mapping cannot be hashed to its version: pass at=")
    digest = weights_digest(weights)
    found = m.by_digest(digest)
    if found is None:
        raise NotFoundError(f"the weights (digest {digest[:16]}) are not a version of the chain")
    return found.number


def _advance(
    chain: Chain, tracker: Tracker, weights: MutableMapping[str, Any], current: int | None,
    tensors: Select, threads: int, max_age: float | None = None,
) -> Generator[Version, None, Manifest]:  # fmt: skip
    """Apply the links from ``current`` (None: the weights are no version) to the head,
    yielding each version reached; the head revision is accepted once the weights
    reached its head (and, with ``max_age`` seconds, only if it was published within
    them), and returned."""
    keep_roots(chain, tracker.path)
    m, digest = tracker.head(chain)
    check_fresh(m, max_age)
    plan = None
    if current is not None and any(v.number == current for v in m.versions):
        plan = graph.cheapest_path(
            m, [current], m.head.number, chain.is_cached,
            allow=lambda h: h.link is not None and (h.link.reversible or not h.link.parts),
        )  # fmt: skip
    if plan is None:
        yield _jump(chain, m, weights, current, tensors, threads)
    else:
        for hop in plan[1]:
            link = hop.link
            assert link is not None
            applied = evicting(chain, link.files, functools.partial(
                apply_link, chain, m, link, weights, hop.reverse, tensors, threads))  # fmt: skip
            applied.close()
            yield m.version(hop.version)
    tracker.accept(chain, m, digest)
    return m


def _jump(
    chain: Chain, m: Manifest, weights: MutableMapping[str, Any], current: int | None,
    tensors: Select, threads: int,
) -> Version:  # fmt: skip
    """The head, when no links lead there from ``current`` (pruned, say; None: the
    weights are no version, a recovery): pulled into
    host memory (a snapshot and its links; a partial pull for a pattern), then diffed
    against the weights and applied in place, all or nothing as a link is."""
    if tensors is not None and not isinstance(tensors, str):
        where = "the weights' version" if current is None else f"version {current}"
        raise ChainBrokenError(
            f"no links lead from {where} to the head, and a snapshot's "
            "tensors can be selected by a pattern only, not a predicate"
        )
    head, version = load(chain, to=m.head.number, tensors=tensors)
    with tempfile.TemporaryDirectory(prefix="wdelta-jump-", dir=chain.cache) as tmp:
        delta = Path(tmp) / "jump.wdelta"
        api.diff(weights, head, delta, threads=threads)
        del head  # the delta holds what changes
        apply_inplace(weights, delta, threads=threads)
    return version


@dataclass
class Applied:
    """A link applied in place, with the deltas it applied still open (the blobs ranged
    reads took are kept, ``RemoteDelta``): undone from bytes the node holds, never by
    reading the store again.  ``close`` once the version it reached is accepted."""

    deltas: list[Any]
    reverse: bool
    keep: Callable[[str], bool]
    threads: int

    def undo(self, weights: MutableMapping[str, Any]) -> None:
        for d in reversed(self.deltas):
            parts.apply_part(weights, d, not self.reverse, self.keep, self.threads)

    def close(self) -> None:
        for d in self.deltas:
            d.close()


def apply_link(
    chain: Chain, m: Manifest, link: Link, weights: MutableMapping[str, Any], reverse: bool,
    tensors: Select, threads: int,
) -> Applied:  # fmt: skip
    """Apply one link in place: from the cache or a whole download, or, for a partial
    mapping and a link not cached, from ranged reads of its header and selected blobs."""
    keep = live.selector(tensors)
    if link.parts:
        deltas = parts.apply_in_memory(chain, m, link, weights, reverse, keep,
                                       tensors is not None, threads)  # fmt: skip
        return Applied(deltas, reverse, keep, threads)
    if tensors is None or chain.is_cached(link.digest):
        d: Any = open_delta(fetch_link(chain, m, link))
    else:
        d = RemoteDelta(chain.storage, m, link, keep)
    try:
        if isinstance(d, RemoteDelta):
            d.hold_removed(reverse)
        apply_opened(weights, d, reverse, verify_output=True, verify_input=False,
                     threads=threads, tensors=tensors)  # fmt: skip
    except BaseException:
        d.close()
        raise
    return Applied([d], reverse, keep, threads)


def follow_weights(
    chain: Chain, weights: MutableMapping[str, Any], *, at: str | int | None = None,
    tensors: Select = None, interval: float = 10.0, max_polls: int | None = None,
    backoff: tuple[float, float] = (1.0, 60.0),
    on_error: Callable[[WdeltaError, int], None] | None = None, threads: int = 2,
    trust: Trust | PathLike | None = None,
    state: PathLike | None = None, accept_rollback: bool = False, max_age: float | None = None,
    allow_unsigned: bool = False, max_failures: int | None = 5, recover: bool = False,
    max_cache_bytes: int | None = None,
) -> Iterator[Version]:  # fmt: skip
    """Keep ``weights`` at the chain's head; yields every version once applied.

    ``at`` is the weights' version (number, digest or ``step:N``; a number
    pruned from the chain is accepted); None hashes them to find it (a
    partial mapping, with ``tensors``, needs it).  Links are applied in
    place; with ``tensors``, a link not in the cache is read with ranged
    requests (its header and the selected tensors' blobs only).  When no
    links lead to the head (pruned), the head is pulled into host memory
    (its snapshot and links; partial for a ``tensors`` pattern), diffed
    against the weights and that delta applied in place: one version
    yielded, the head.  The head is polled every ``interval`` seconds,
    ``max_polls`` times (None: forever).  The chain needs a cache folder.
    ``trust``: a trust policy, as for ``pull`` (refused revisions are failed steps).

    Failures.  A failed step (download, corrupted link, digest, a refused
    head) leaves the weights at the last yielded version, is passed to
    ``on_error(error, failures in a row)`` (without ``on_error``, logged as
    a warning on the ``wdelta.chain`` logger) and retried after
    ``backoff[0] * 2**(failures-1)`` seconds, at most ``backoff[1]``.  After
    ``max_failures`` failures in a row the last error is raised (None: retry
    forever).  A ``bad-argument`` error (a read-only tensor, say) is raised
    at once: no retry can fix it.

    Recovery.  Weights that are no version of the chain (hashed at the
    start, or refused by a link with ``base-mismatch``: written behind the
    follower's back) are an error, unless ``recover``: the failure is
    reported and the next poll loads the head in place, as when no links
    lead there (the head pulled and verified, diffed against the weights,
    applied all or nothing, every tensor digest checked).

    ``max_cache_bytes``: after each successful poll the cache is collected
    (``cachegc.gc``): files the head no longer names, then the least
    recently used, until it holds at most that many bytes (files a running
    pull pinned are kept).

    What each link hashes (``apply_inplace``'s default, SPEC §10.2): every
    tensor it modifies, once, on its output (which proves the input: the
    chunks map words one to one), and, before the first write, the inputs
    that no output proves: unchanged tensors, tensors with ``full`` chunks,
    removed tensors.  Those were verified at the previous version too, but
    nothing proves that the weights were not written since (the caller holds
    them between versions), so they are hashed again.

    ``state``: a file keeping the accepted head revision across restarts
    (RD-1, as ``pull``'s; with ``trust``, the newest trust root walked to is
    kept beside it too); None keeps the revision in memory only, and is
    refused with ``trust`` (a restart would forget a revoking root rotation).
    A head lower than the accepted one, or a rewritten one, fails the poll (manifest-invalid,
    reported and retried like any failure); ``accept_rollback`` accepts the
    first head whatever it is; ``allow_unsigned`` lets a follower without
    ``trust`` read on although ``state`` records signed revisions (else every
    poll fails, ``signature-invalid``).  ``max_age`` (seconds): a head published
    longer ago fails the poll (``frozen``, reported and retried like any
    failure) while the weights keep their version.
    """
    chain = as_chain(chain)
    if trust is not None:
        chain.trust = as_trust(trust)
    check_mapping(weights, "weights", mutable=True)
    interval = check_seconds(interval, "interval") or 0.0
    check_optional_int(max_polls, "max_polls", 1)
    check_optional_int(max_failures, "max_failures", 1)
    check_optional_int(max_cache_bytes, "max_cache_bytes", 0)
    max_age = check_max_age(max_age)
    if chain.cache is None:
        raise BadArgumentError("following a chain needs a cache folder (Chain(..., cache=))")
    needs_state(chain, state)
    tracker = Tracker(state, accept_rollback, allow_unsigned)
    keep_roots(chain, state)
    f = _Follower(chain, weights, tracker, tensors, threads, max_age, bool(recover))
    f.current = f.start(at)
    polls = 0
    while max_polls is None or polls < max_polls:
        polls += 1
        try:
            yield from f.poll(max_cache_bytes)
        except BadArgumentError:
            raise
        except WdeltaError as exc:
            f.failed(exc, on_error, max_failures)
            time.sleep(min(backoff[0] * 2 ** (f.failures - 1), backoff[1]))
            continue
        if max_polls is None or polls < max_polls:
            time.sleep(interval)


@dataclass
class _Follower:
    """A follower's state between polls: the weights' version (None: no version of
    the chain, to be recovered) and the failures in a row."""

    chain: Chain
    weights: MutableMapping[str, Any]
    tracker: Tracker
    tensors: Select
    threads: int
    max_age: float | None
    recover: bool
    current: int | None = None
    failures: int = 0

    def start(self, at: str | int | None) -> int | None:
        """The weights' version; None if they are none and ``recover`` was asked."""
        m = self.tracker.head(self.chain)[0]
        try:
            return start_version(m, self.weights, at, self.tensors is not None)
        except NotFoundError as exc:
            if not self.recover or at is not None:
                raise
            log.warning("%s; recovering: loading the head in place", exc)
            return None

    def poll(self, max_cache_bytes: int | None) -> Iterator[Version]:
        """Bring the weights to the head, yielding each version reached; then bound the
        cache to ``max_cache_bytes`` against the head accepted."""
        c = self.chain
        advance = _advance(c, self.tracker, self.weights, self.current, self.tensors,
                           self.threads, self.max_age)  # fmt: skip
        while True:
            try:
                version = next(advance)
            except StopIteration as done:
                head: Manifest = done.value
                break
            self.current, self.failures = version.number, 0
            yield version
        self.failures = 0
        if max_cache_bytes is not None and c.cache is not None:
            cachegc.gc(c.cache, head, max_cache_bytes)

    def failed(
        self, exc: WdeltaError, on_error: Callable[[WdeltaError, int], None] | None,
        max_failures: int | None,
    ) -> None:  # fmt: skip
        """Report a failed poll; raise it after ``max_failures`` in a row."""
        self.failures += 1
        if isinstance(exc, BaseMismatchError) and self.recover:
            self.current = None  # the weights are no version: the next poll reloads the head
        if on_error is not None:
            on_error(exc, self.failures)
        else:
            log.warning("following %s failed (%d in a row): %s: %s",
                        self.chain.url, self.failures, exc.category, exc)  # fmt: skip
        if max_failures is not None and self.failures >= max_failures:
            raise exc
