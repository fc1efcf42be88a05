"""Publishing one step from many ranks of a torch.distributed process group.

Every rank holds some whole tensors of the model (its *share*, disjoint from
the others'; the trainer's assignment, or :func:`assign_by_bytes`).  At each
step every rank encodes the delta of its share against its own previous copy
and uploads it as one part of a multi-part link (SPEC §17.12); the ranks
exchange only names, dtypes, shapes and 32-byte tensor digests, from which
every rank computes the whole version's checkpoint digest (§9.4); rank 0
creates the manifest revision (signed as the chain is configured) from those
digests and the parts' digests the ranks computed, never from what storage
returns (WS-7): it reads the parts' headers back only to check that they are
the ones the ranks wrote and form that link.  Version 0 is a sharded
snapshot, one shard per rank, plus an index rank 0 writes.

Each rank's diff brings its previous copy to the new share as it goes (as
``Publisher`` does), unless the step adds or removes tensors: then the delta is
applied to the copy after the commit.

Failure: the ranks agree through the group after encoding and after
uploading; if any rank failed (an exception) every rank raises and rank 0
creates no revision.  A rank that dies makes the others' collectives fail
(gloo and NCCL report a closed peer or time out), so no revision is created
either.  Parts already uploaded are unreferenced objects: never read (RD-4),
deleted by the next prune.  When no revision was created every rank takes its
copy back (its own link applied in reverse), so the next step publishes as if
the failed one had not been tried.  A rank whose copy cannot be brought to a
version (its own diff cut short, a take-back or a copy update that fails, an
error after the revision was created) drops it: its next step fails on every
rank, saying to create the publishers again with ``previous=``.

The collectives run on ``group`` (default: the default group), through
``all_gather_object`` and ``broadcast_object_list``: gloo on CPU, NCCL with
each rank's current CUDA device, the same code.  ``submit`` runs publishing
in a background thread with a bounded queue; use a group of its own
(``torch.distributed.new_group()``) so that its collectives never interleave
with the training loop's.
"""

from __future__ import annotations

import json
import queue
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from ...arguments import check_int, check_mapping
from ...errors import BadArgumentError, WdeltaError
from ...format.container import open_delta
from ...format.digest import TensorIdentity, checkpoint_digest
from ...ops import tensors as live
from ..errors import published_anyway
from ..model.manifest import (
    Link,
    LinkPart,
    Manifest,
    Snapshot,
    SnapshotFile,
    Version,
    new_manifest,
    parse_manifest,
    utc_now,
)
from ..reading.parts import mark_part, part_file
from ..store import Chain, as_chain, file_digest
from ..writing.append import AppendOptions, append_parts, append_update
from .collective import Group, Outcome
from .weights import Publisher, save_weights, tensor_digests

Ids = list[tuple[str, str, tuple[int, ...], str]]


def assign_by_bytes(sizes: Mapping[str, int], ranks: int) -> list[list[str]]:
    """Whole tensors to ``ranks`` ranks, balanced by bytes: largest first, each to the
    rank with the fewest bytes so far (ties to the lower rank).  Deterministic, so
    every rank computes the same assignment from the same ``sizes`` without talking."""
    check_int(ranks, "ranks", 1)
    loads = [0] * ranks
    out: list[list[str]] = [[] for _ in range(ranks)]
    for name in sorted(sizes, key=lambda n: (-sizes[n], n.encode("utf-8"))):
        r = min(range(ranks), key=lambda i: (loads[i], i))
        out[r].append(name)
        loads[r] += sizes[name]
    return out


def share_of(weights: Mapping[str, Any], rank: int, ranks: int) -> dict[str, Any]:
    """Rank ``rank``'s share of a mapping every rank holds the names of (by bytes)."""
    check_mapping(weights, "weights")
    sizes = {n: live.slot(n, v).elements * live.slot(n, v).dtype.size for n, v in weights.items()}
    return {n: weights[n] for n in assign_by_bytes(sizes, ranks)[rank]}


class DistributedPublisher:
    """One rank's publisher: ``publish(share)`` on every rank of ``group`` publishes the
    union of the shares as the chain's next version (see the module's documentation).

    ``share`` holds whole tensors, disjoint from the other ranks' (a rank may hold
    none).  ``previous`` resumes on an existing chain: this rank's share of its head.
    Memory per rank: the previous copy of its share (host RAM, as ``Publisher``), a
    few chunks of scratch per thread, and the encoded part on local disk; ``submit``
    adds one staged copy per queued step (on the weights' device).
    """

    def __init__(
        self, chain: Chain, *, group: Any = None, options: AppendOptions | None = None,
        previous: Mapping[str, Any] | None = None, check_previous: bool = False,
    ) -> None:  # fmt: skip
        self.group = Group(group, "publishing", "nothing published")
        self.rank = self.group.rank
        self.chain = as_chain(chain)
        self._local = Publisher(self.chain, options=options, check_previous=check_previous)
        self._started = previous is not None
        if previous is not None:
            self._local._remember(previous)
        self._queue: queue.Queue[tuple[Any, ...] | None] | None = None
        self._worker: threading.Thread | None = None

    # ------------------------------------------------------------ publishing

    def publish(
        self, share: Mapping[str, Any], *, step: int | None = None,
        metadata: Mapping[str, str] | None = None, snapshot: bool = False,
    ) -> Manifest:  # fmt: skip
        """Publish the union of every rank's ``share`` as the next version (collective:
        every rank of the group calls it, with the same ``step``, ``metadata`` and
        ``snapshot``); the new manifest on every rank.  ``snapshot`` also stores the
        version whole, as a sharded snapshot (one shard per rank; version 0 always is),
        so that nodes can start there once older links are pruned."""
        check_mapping(share, "share")
        with tempfile.TemporaryDirectory(prefix="wdelta-rank-") as tmp:
            if not self._started:
                m = self._init(share, Path(tmp), step, metadata)
                self._local._remember(share)
                self._started = True
                return m
            return self._step(share, Path(tmp), step, metadata, snapshot)

    def _init(
        self, share: Mapping[str, Any], tmp: Path, step: int | None,
        metadata: Mapping[str, str] | None,
    ) -> Manifest:  # fmt: skip
        """Version 0: a sharded snapshot, one shard per rank that holds tensors."""
        holders = [r for r, n in enumerate(self.group.agree(Outcome(value=len(share)))) if n]
        if not holders:
            raise BadArgumentError("no rank holds a tensor: nothing to publish")
        mine = Outcome()
        try:
            if self.rank == 0 and self.chain.revisions():
                raise BadArgumentError("the chain exists: pass previous= to resume it")
            if share:
                shard = self._upload_shard(share, tmp / self._shard_name(holders))
                mine.value = (shard, _ids(share, self._threads))
        except WdeltaError as exc:
            mine = Outcome.failed(exc)
        shards = self.group.agree(mine)
        result = None
        if self.rank == 0:
            result = _guarded(lambda: self._create_first(shards, tmp, step, metadata))
        return self._finish(result, lambda m: None)

    @property
    def _threads(self) -> int:
        return check_int(self._local.options.threads, "threads", 1)

    def _shard_name(self, holders: list[int]) -> str:
        i, n = holders.index(self.rank), len(holders)
        return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"

    def _upload_shard(self, share: Mapping[str, Any], path: Path) -> SnapshotFile:
        save_weights(share, path)
        entry = SnapshotFile(path.name, file_digest(path, "sha256"), path.stat().st_size)
        self.chain.upload(entry.key, path, entry.sha256, "sha256")
        return entry

    def _create_first(
        self, shards: list[Any], tmp: Path, step: int | None, metadata: Mapping[str, str] | None
    ) -> bytes:
        held = [s for s in shards if s is not None]
        ids = [i for _, group in held for i in group]
        names = [i[0] for i in ids]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise BadArgumentError(f"tensor {twice[0]!r} is in the shares of two ranks")
        version = Version(0, _digest(ids), step, utc_now(), dict(metadata or {}))
        snapshot = self._snapshot(0, held, tmp)
        return self.chain.create_first(new_manifest(version, snapshot)).to_bytes()

    def _snapshot(self, number: int, held: list[tuple[SnapshotFile, Ids]], tmp: Path) -> Snapshot:
        """The snapshot of the shards the ranks stored, with the index rank 0 stores."""
        files = [f for f, _ in held]
        if len(files) > 1:
            weight_map = {i[0]: f.name for f, group in held for i in group}
            index = tmp / "model.safetensors.index.json"
            index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
            entry = SnapshotFile(index.name, file_digest(index, "sha256"), index.stat().st_size)
            self.chain.upload(entry.key, index, entry.sha256, "sha256")
            files.append(entry)
        return Snapshot(number, tuple(sorted(files, key=lambda f: f.name)))

    def _step(
        self, share: Mapping[str, Any], tmp: Path, step: int | None,
        metadata: Mapping[str, str] | None, snapshot: bool,
    ) -> Manifest:  # fmt: skip
        """One step's link; the diff brings this rank's previous copy forward as it goes
        (``Publisher``'s in-diff copy update) where the tensors stay the same, and any
        failure before the revision is created takes the copy back (``Publisher._take_back``)."""
        raw = tmp / "share.wdelta"
        advance = self._local._advance_words(share) if share else None
        try:
            encoded = self._encode(share, raw, advance)
            result = self._upload_and_commit(share, raw, tmp, encoded, step, metadata, snapshot)
            advanced = advance is not None
            return self._finish(
                result, lambda m: self._local._advance(share, raw, advanced) if share else None
            )
        except BaseException as exc:
            if advance is not None:
                self._local._take_back(raw, exc)
            raise

    def _encode(
        self, share: Mapping[str, Any], raw: Path, advance: Mapping[str, Any] | None
    ) -> list[Any]:
        """This rank's delta into ``raw``; every rank's (base, target) identities."""
        mine = Outcome()
        try:
            if share:
                if self._local._previous is None:
                    raise BadArgumentError(
                        f"rank {self.rank} has no previous copy of its share (a step failed "
                        "while bringing it forward): create the publishers again, each with "
                        "previous= its rank's share of the chain's head"
                    )
                self._local._diff(share, raw, advance)
                mine.value = _delta_ids(raw)
        except WdeltaError as exc:
            mine = Outcome.failed(exc)
        return self.group.agree(mine)

    def _upload_and_commit(
        self, share: Mapping[str, Any], raw: Path, tmp: Path, encoded: list[Any],
        step: int | None, metadata: Mapping[str, str] | None, snapshot: bool,
    ) -> Outcome | None:  # fmt: skip
        """Upload this rank's part (and shard); rank 0's outcome of creating the revision
        (None on the other ranks)."""
        holders = [r for r, v in enumerate(encoded) if v is not None]
        if not holders:
            raise BadArgumentError("no rank holds a tensor: nothing to publish")
        base = _digest([i for v in encoded if v is not None for i in v[0]])
        target = _digest([i for v in encoded if v is not None for i in v[1]])
        mine = Outcome()
        try:
            if share:
                part = self._upload_part(raw, tmp / "part.wdelta", holders, base, target)
                shard = None
                if snapshot:
                    entry = self._upload_shard(share, tmp / self._shard_name(holders))
                    shard = (entry, encoded[self.rank][1])
                mine.value = (part, shard)
        except WdeltaError as exc:
            mine = Outcome.failed(exc)
        uploaded = [v for v in self.group.agree(mine) if v is not None]
        if self.rank != 0:
            return None
        snap = self._snapshot(0, [s for _, s in uploaded], tmp) if snapshot else None
        parts = [p for p, _ in uploaded]
        return _guarded(lambda: self._commit(parts, base, target, step, metadata, snap))

    def _finish(self, result: Outcome | None, then: Callable[[Manifest], None]) -> Manifest:
        """Rank 0's new manifest on every rank, then ``then(manifest)``.  A failure after
        rank 0 created the revision (the group failing during the broadcast, ``then``
        failing on a rank) is raised saying that the version is published, with the
        error's ``published_revision`` set, so a trainer can tell."""
        created = None if result is None or result.error is not None else result.value
        m = None
        try:
            m = parse_manifest(self.group.from_rank0(result))
            then(m)
        except WdeltaError as exc:
            landed = m if m is not None else (None if created is None else parse_manifest(created))
            if landed is None:
                raise
            raise published_anyway(exc, landed.revision, landed.head.number) from exc
        return m

    def _upload_part(
        self, raw: Path, out: Path, holders: list[int], base: str, target: str
    ) -> tuple[LinkPart, bool]:
        """Store this rank's part (its delta marked as part i of n; a link of one part is
        the delta itself, MP-1); its entry (digests computed here) and reversible flag."""
        if len(holders) == 1:
            out = raw
        else:
            mark_part(raw, out, holders.index(self.rank), len(holders), base, target)
        part = part_file(out)
        self.chain.upload(part.key, out, part.digest, "blake3")
        with open_delta(out) as d:
            return part, d.header.reversible

    def _commit(
        self, uploaded: list[tuple[LinkPart, bool]], base: str, target: str, step: int | None,
        metadata: Mapping[str, str] | None, snap: Snapshot | None,
    ) -> bytes:  # fmt: skip
        """Rank 0 creates the revision from what the ranks computed and exchanged: the
        version digests ``base``/``target`` and each part's digests (WS-7)."""
        if len(uploaded) > 1:
            files = [p for p, _ in uploaded]
            m = append_parts(self.chain, files, versions=(base, target), step=step,
                             metadata=metadata, snapshot=snap)  # fmt: skip
            return m.to_bytes()
        ((part, reversible),) = uploaded
        digest, size = part.digest, part.size

        def link_of(source: int, target: int) -> Link:
            return Link(source, target, digest, size, reversible)

        update = append_update(base, target, step, metadata, link_of, snap)
        return self.chain.publish(update).to_bytes()

    # ------------------------------------------------------------ background

    def submit(
        self,
        share: Mapping[str, Any],
        *,
        step: int | None = None,
        metadata: Mapping[str, str] | None = None,
        snapshot: bool = False,
        max_pending: int = 1,
    ) -> Future[Manifest]:
        """``publish`` in a background thread; returns at once (or, with
        ``max_pending`` steps already queued, when one is done), with a Future of
        the manifest.  The share is staged as a copy on its own device (a GPU
        tensor is cloned on the GPU: no host RAM), so training may go on
        updating the weights.  Steps publish in order; a failed step fails its
        Future and the following ones are still tried."""
        check_mapping(share, "share")
        if self._queue is None:
            self._queue = queue.Queue(maxsize=check_int(max_pending, "max_pending", 1))
            self._worker = threading.Thread(target=self._run, name="wdelta-publish", daemon=True)
            self._worker.start()
        future: Future[Manifest] = Future()
        staged = {n: _stage(v) for n, v in share.items()}
        self._queue.put((staged, step, metadata, snapshot, future))
        return future

    def _run(self) -> None:
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            staged, step, metadata, snapshot, future = item
            try:
                m = self.publish(staged, step=step, metadata=metadata, snapshot=snapshot)
                future.set_result(m)
            except BaseException as exc:
                future.set_exception(exc)
            del staged, item

    def close(self) -> None:
        """Wait for the queued steps, then stop the background thread."""
        if self._queue is not None and self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._queue = self._worker = None


def _stage(value: Any) -> Any:
    """A copy of a tensor on its own device, or of an array."""
    return value.detach().clone() if live.is_torch(value) else np.array(value, copy=True)


def _guarded(make: Callable[[], bytes]) -> Outcome:
    try:
        return Outcome(value=make())
    except WdeltaError as exc:
        return Outcome.failed(exc)


def _ids(share: Mapping[str, Any], threads: int) -> Ids:
    digests = tensor_digests(share, threads)
    slots = [live.slot(n, v) for n, v in share.items()]
    return [(s.name, s.dtype.name, s.shape, digests[s.name]) for s in slots]


def _delta_ids(delta: Path) -> tuple[Ids, Ids]:
    """The base-side and target-side tensor identities of an encoded delta."""
    with open_delta(delta) as d:
        sides = tuple(
            [(i.name, i.dtype, i.shape, i.digest) for i in
             (t.identity(side) for t in d.header.side_tensors(side))]
            for side in ("base", "target")
        )  # fmt: skip
    return sides[0], sides[1]


def _digest(ids: Ids) -> str:
    return checkpoint_digest(TensorIdentity(*i) for i in ids)
