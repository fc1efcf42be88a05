"""``squash``: one delta for a run of consecutive links, without the checkpoints between.

The end checkpoint is presented to the ordinary encoder as a virtual
checkpoint: reading words of a tensor at link k reads the covering chunks at
link k-1 (down to the real start checkpoint) and decodes link k's chunks on
them in memory.  The encoder then diffs start against this virtual end chunk
by chunk, so memory stays a few chunks per link and nothing is written but
the squashed delta.  Its header's target digest, computed by the encoder from
the composed bytes, must equal the manifest's digest of the end version.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...arguments import PathLike, as_path
from ...checkpoint.source import Checkpoint, Scratch, Tensor, Words, open_checkpoint
from ...codec import chunk as chunk_codec
from ...errors import BadArgumentError, BaseMismatchError
from ...format.container import DeltaFile, open_delta
from ...io.atomic import temp_dir
from ...ops.decoder import check_input, structure_difference
from ...ops.encoder import DiffOptions, diff_checkpoints
from ..errors import ChainBrokenError, ConflictError
from ..model import graph
from ..model.manifest import Link, Manifest, delta_key
from ..reading.fetch import fetch_link
from ..reading.pull import pull
from ..storage.base import Progress
from ..store import Chain, as_chain, file_digest

# Decoded chunks kept per composed tensor.  When the links' chunk sizes
# differ, one read at link k covers parts of several chunks at link k-1 and
# neighbouring reads share them; without this cache each level would decode
# them again and the work would grow exponentially with the number of links.
_KEEP_CHUNKS = 4


@dataclass
class ComposedTensor(Tensor):
    """A tensor of the checkpoint after ``delta``, computed from ``prev`` (None if added)."""

    delta: DeltaFile | None = None
    entry: Any = None
    prev: Tensor | None = None
    _cache: OrderedDict[int, Words] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, start: int, count: int, scratch: Scratch | None = None) -> Words:
        """Words ``[start, start + count)``, always a new array (``scratch`` is not used)."""
        if self.entry.op == "unchanged":
            assert self.prev is not None
            return self.prev.read(start, count)
        out = np.empty(count, dtype=self.dtype.word)
        assert self.delta is not None
        size = self.delta.header.chunk_elements
        for i in range(start // size, -(-(start + count) // size)):
            c_start, m = self.delta.header.chunk_span(self.entry, i)
            words = self._chunk(i, c_start, m)
            lo, hi = max(start, c_start), min(start + count, c_start + m)
            out[lo - start : hi - start] = words[lo - c_start : hi - c_start]
        return out

    def _chunk(self, i: int, c_start: int, m: int) -> Words:
        """Chunk ``i`` after this link (never handed out: callers copy from it)."""
        with self._lock:
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
        assert self.delta is not None
        chunk = self.entry.chunks[i]
        src = None
        if chunk.encoding != "full" and self.prev is not None:
            src = self.prev.read(c_start, m)
        if chunk.encoding == "unchanged":
            assert src is not None
            words = src
        else:
            words = chunk_codec.decode(
                chunk.encoding, chunk.transform, self.delta.payload(chunk), src, m,
                self.dtype.word, False, chunk.changed, self.delta.header.coded_values,
            )  # fmt: skip
        with self._lock:
            self._cache[i] = words
            while len(self._cache) > _KEEP_CHUNKS:
                self._cache.popitem(last=False)
        return words


def compose(base: Checkpoint, deltas: list[DeltaFile]) -> Checkpoint:
    """The virtual checkpoint ``base`` + ``deltas[0]`` + ... + ``deltas[-1]``."""
    if not isinstance(base, Checkpoint) or not all(isinstance(d, DeltaFile) for d in deltas):
        raise BadArgumentError("compose takes a Checkpoint and a list of open deltas")
    level: dict[str, Tensor] = dict(base.tensors)
    for delta in deltas:
        check_input(delta.header, Checkpoint(level, {}), False)
        nxt: dict[str, Tensor] = {}
        for e in delta.header.side_tensors("target"):
            prev = level.get(e.name) if e.op != "added" else None
            nxt[e.name] = ComposedTensor(e.name, e.dtype, e.shape, delta=delta, entry=e, prev=prev)
        level = nxt
    target = deltas[-1].header.target
    return Checkpoint(level, dict(target.files), target.index)


def _forward_links(m: Manifest, source: int, target: int) -> list[Link]:
    plan = graph.cheapest_path(
        m, [source], target, lambda d: False,
        allow=lambda h: h.link is not None and not h.reverse and h.version <= target,
    )  # fmt: skip
    if plan is None or plan[0] != source:
        raise ChainBrokenError(f"no forward links lead from version {source} to {target}")
    return [h.link for h in plan[1] if h.link is not None]


def squash(
    chain: Chain | PathLike, source: str | int, target: str | int, *, base: PathLike | None = None,
    level: int | None = None, threads: int = 2, progress: Progress | None = None,
) -> Manifest:  # fmt: skip
    """Publish one link ``source -> target`` composed from the links between them.

    ``base`` is a local checkpoint at ``source``; without it ``source`` is
    pulled (the cheapest way) into a temporary folder first.
    """
    chain, base = as_chain(chain), None if base is None else as_path(base, "base")
    m = chain.head()
    src, dst = m.version(source), m.version(target)
    if src.number >= dst.number:
        raise BadArgumentError("squash goes from an older to a newer version")
    if any(k.source == src.number and k.target == dst.number for k in m.links):
        raise ConflictError(f"a link {src.number}->{dst.number} already exists")
    links = _forward_links(m, src.number, dst.number)
    if any(k.parts for k in links):
        raise BadArgumentError("squashing multi-part links is not supported; pull the target "
                               "version and append it as one delta instead")  # fmt: skip
    with temp_dir(chain.scratch(), "squash") as tmp:
        out = Path(tmp) / "squashed.wdelta"
        with contextlib.ExitStack() as stack:
            deltas = [
                stack.enter_context(open_delta(fetch_link(chain, m, k, progress))) for k in links
            ]
            given = base
            if base is None:
                base = _materialize(chain, src.number, deltas[0], Path(tmp), progress)
            start = stack.enter_context(open_checkpoint(base))
            if given is not None:
                _check_given_base(chain, src.number, given, start, deltas[0])
            sizes = {d.header.chunk_elements for d in deltas}
            opts = DiffOptions(level, threads, min(sizes), True)
            diff_checkpoints(start, compose(start, deltas), out, opts)
        link = _check_and_upload(chain, m, src.number, dst.number, out, progress, given)

    def update(cur: Manifest) -> Manifest:
        if cur.by_digest(src.digest) is None or cur.by_digest(dst.digest) is None:
            raise ConflictError("the versions being squashed were pruned meanwhile")
        k = Link(cur.by_digest(src.digest).number, cur.by_digest(dst.digest).number,  # type: ignore[union-attr]
                 link.digest, link.size, link.reversible)  # fmt: skip
        links_ = sorted((*cur.links, k), key=lambda x: (x.target, x.source))
        return cur.successor(links=tuple(links_))

    return chain.publish(update)


def _materialize(
    chain: Chain, number: int, first: DeltaFile, tmp: Path, progress: Progress | None
) -> Path:
    """Pull version ``number`` into ``tmp`` under the file name its layout records,
    so that the squashed delta's base layout is the version's own."""
    layout = first.header.base
    local = tmp / (layout.files[0][0] if layout.index is None else "base")
    pull(chain, local, to=number, progress=progress)
    return local


def _wrong_base(chain: Chain, source: int, base: Path, why: str) -> BaseMismatchError:
    return BaseMismatchError(
        f"{base} is not version {source} of the chain at {chain.url} ({why}): base=BASE "
        "must be the checkpoint of the version squashed from (or leave it out to have that "
        "version pulled)"
    )


def _check_given_base(
    chain: Chain, source: int, base: Path, start: Checkpoint, first: DeltaFile
) -> None:
    """Refuse a caller's ``base`` whose tensors are not those of version ``source``,
    naming it (``compose`` would only say that its input is not a delta's base)."""
    expected = {t.name: (t.dtype, t.shape) for t in first.header.side_tensors("base")}
    actual = {t.name: (t.dtype, t.shape) for t in start.tensors.values()}
    if expected != actual:
        raise _wrong_base(chain, source, base, structure_difference(expected, actual))


def _check_and_upload(
    chain: Chain, m: Manifest, source: int, target: int, out: Path, progress: Progress | None,
    given: Path | None,
) -> Link:  # fmt: skip
    """Upload the squashed delta ``out`` if it leads from version ``source`` to ``target``;
    a caller's base ``given`` with other bytes is the caller's mistake, not a broken chain."""
    with open_delta(out) as d:
        got = (d.header.raw["base"]["digest"], d.header.raw["target"]["digest"])
        reversible = d.header.reversible
    want = (m.version(source).digest, m.version(target).digest)
    if given is not None and got[0] != want[0]:
        raise _wrong_base(chain, source, given, f"its digest is {got[0][:16]}")
    if got != want:
        raise ChainBrokenError(f"squashed delta goes {got[0][:16]}->{got[1][:16]}, expected "
                               f"{want[0][:16]}->{want[1][:16]}")  # fmt: skip
    digest = file_digest(out, "blake3")
    chain.upload(delta_key(digest), out, digest, "blake3", progress)
    return Link(source, target, digest, out.stat().st_size, reversible)
