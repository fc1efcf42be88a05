"""Multi-part links (SPEC §17.12): one version's delta as several files of whole tensors.

Each part is an ordinary delta between the sub-checkpoints of its tensors, so
its own header is checked as any delta's; its ``part`` member (SPEC §4.13)
names its place in the link and the whole link's checkpoint digests.  What no
single part can show is checked on the set: every part is the one the
manifest lists at its position, no tensor is in two parts, and the tensors of
all parts hash (§9.4) to the link's versions' digests, which proves that no
tensor is missing.  Only 32 bytes per tensor (the tensor digests in the
headers) are needed for that, so a node reads every part's header but only
the blobs of the tensors it serves.

A file pull writes the version as one safetensors file in the canonical layout
(SPEC §4.11) of its tensors, or as the partial checkpoint of a pattern; an
in-memory follower applies the parts one after the other and, if one fails,
undoes those already applied (links are reversible; see ``apply_inplace``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...checkpoint.safetensors_header import build_header
from ...checkpoint.source import open_checkpoint
from ...errors import BaseMismatchError, StorageError
from ...format.container import PREFIX_SIZE, open_delta, pack_prefix, parse_prefix
from ...format.digest import checkpoint_digest, new_hasher
from ...format.header import Header
from ...io.atomic import atomic_file
from ...io.output_file import pwrite_all
from ...ops.decoder import Step, init_file, plan_steps
from ...ops.inplace import apply_opened
from ..errors import ChainBrokenError
from ..model.manifest import Link, LinkPart, Manifest
from ..storage.base import Progress, Storage
from ..storage.local import LocalStorage
from ..store import Chain, file_digest
from .fetch import fetch_link
from .local import READ_ELEMENTS, TENSORS_KEY, VERSION_KEY
from .partial import Blobs, apply_tensor, matches, read_remote_header
from .remote_delta import PartDelta, RemoteDelta

_COPY_BLOCK = 1 << 22


def mark_part(delta: Path, out: Path, index: int, count: int, base: str, target: str) -> None:
    """Write ``delta`` to ``out`` as part ``index`` of ``count`` of the link ``base`` ->
    ``target`` (SPEC §4.13): its header gains the ``part`` member, every other byte of
    the header and the data section is kept (blob offsets are relative to the data)."""
    member = json.dumps({"index": index, "count": count, "base": base, "target": target},
                        separators=(",", ":"))  # fmt: skip
    with open_delta(delta) as d:
        n, data_length = d.header_length, d.data_length
    try:
        with open(delta, "rb") as src, atomic_file(out, overwrite=True) as fd:
            src.seek(PREFIX_SIZE)
            text = src.read(n).rstrip(b" ")
            header = text[:-1] + b',"part":' + member.encode("ascii") + b"}"
            header += b" " * (-len(header) % 8)
            pwrite_all(fd, pack_prefix(header, data_length) + header, 0)
            at = PREFIX_SIZE + len(header)
            while block := src.read(_COPY_BLOCK):
                pwrite_all(fd, block, at)
                at += len(block)
    except OSError as exc:
        raise StorageError(f"cannot write part {index} of {delta} to {out}: {exc}") from exc


def part_file(path: Path) -> LinkPart:
    """The manifest entry of a part this writer encoded: BLAKE3 of its bytes, its size and
    its header's BLAKE3, all computed from the local file (WS-7: never from storage)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            header = parse_prefix(f.read(PREFIX_SIZE), size)[1].hex()
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc
    return LinkPart(file_digest(path, "blake3"), size, header)


def check_parts(m: Manifest, link: Link, headers: Sequence[Header]) -> None:
    """The parts' headers against the link (RD-2 of a multi-part link) → chain-broken."""
    want = (m.version(link.source).digest, m.version(link.target).digest)
    check_part_set(headers, want, link.reversible, f"link {link.source}->{link.target}")


def check_part_set(
    headers: Sequence[Header], want: tuple[str, str], reversible: bool, name: str
) -> None:
    """``headers`` are parts 0, 1, ... of the link ``want`` (base, target digests) and
    together hold each of its tensors once → chain-broken."""
    for i, h in enumerate(headers):
        if h.part is None or h.part != (i, len(headers), *want):
            raise ChainBrokenError(
                f"{name}: part {i} says it is {_describe(h.part)}, the manifest lists it as "
                f"part {i} of {len(headers)} of {want[0][:16]}->{want[1][:16]}"
            )
    if all(h.reversible for h in headers) != reversible:
        raise ChainBrokenError(f"{name}: reversible flag disagrees with its parts")
    for side, digest in zip(("base", "target"), want, strict=True):
        ids = [t.identity(side) for h in headers for t in h.side_tensors(side)]
        names = [i.name for i in ids]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ChainBrokenError(f"{name}: tensor {twice[0]!r} is in two parts ({side})")
        if checkpoint_digest(ids) != digest:
            raise ChainBrokenError(
                f"{name}: the parts' {side} tensors do not hash to the {side} version "
                f"{digest[:16]} (a tensor is missing)"
            )


def _describe(part: tuple[int, int, str, str] | None) -> str:
    if part is None:
        return "no part"
    return f"part {part[0]} of {part[1]} of {part[2][:16]}->{part[3][:16]}"


@dataclass
class _Source:
    """One part: its header and a reader of its blobs."""

    header: Header
    storage: Storage
    key: str
    data_start: int
    path: Path | None = None  # the verified local copy, when downloaded whole


def _fetched(chain: Chain, m: Manifest, link: Link, progress: Progress | None) -> list[_Source]:
    """Every part downloaded into the cache (BLAKE3 and size checked), headers checked."""
    sources = []
    for p in link.parts:
        path = chain.fetch(p.key, p.size, p.digest, "blake3", progress)
        local = LocalStorage(path.parent)
        header, start = read_remote_header(local, _Local(path.name, p.size), None, p.header)
        sources.append(_Source(header, local, path.name, start, path))
    check_parts(m, link, [s.header for s in sources])
    return sources


@dataclass(frozen=True)
class _Local:
    """A cached part as ``read_remote_header`` reads a link: its key and size."""

    key: str
    size: int


def _remote(storage: Storage, m: Manifest, link: Link, progress: Progress | None) -> list[_Source]:
    """Every part's prefix and header by ranged reads (header digests checked)."""
    sources = []
    for p in link.parts:
        header, start = read_remote_header(storage, p, progress, p.header)
        sources.append(_Source(header, storage, p.key, start))
    check_parts(m, link, [s.header for s in sources])
    return sources


def link_files(
    chain: Chain, m: Manifest, link: Link, progress: Progress | None = None
) -> list[Path]:
    """The verified delta files of ``link`` (every part, the set checked; or its one file)."""
    if not link.parts:
        return [fetch_link(chain, m, link, progress)]
    return [s.path for s in _fetched(chain, m, link, progress) if s.path is not None]


def fetch_sources(
    chain: Chain, m: Manifest, link: Link, pattern: str | None, progress: Progress | None
) -> list[_Source]:
    """The parts of ``link`` to apply: downloaded whole for a full node, read by ranges
    (headers, then only the selected blobs) for a partial node."""
    if pattern is None:
        return _fetched(chain, m, link, progress)
    return _remote(chain.storage, m, link, progress)


def apply_to_file(
    sources: list[_Source], reverse: bool, src: Path, pattern: str | None, digest: str,
    out: Path, progress: Progress | None = None,
) -> None:  # fmt: skip
    """Apply every part to the checkpoint ``src``; write ``out`` atomically: the canonical
    single file of the output tensors, or for ``pattern`` the partial checkpoint of
    version ``digest``."""
    keep: Callable[[str], bool] = (
        (lambda name: True) if pattern is None else (lambda name: matches(name, pattern))
    )
    work = [(s, step) for s in sources for step in plan_steps(s.header, reverse)
            if keep(step.entry.name)]  # fmt: skip
    wanted = {st.entry.name: (st.entry.dtype, st.entry.shape) for _, st in work if st.src_digest}
    outputs = sorted(((s, st) for s, st in work if st.dst_digest is not None),
                     key=lambda w: w[1].entry.name.encode("utf-8"))  # fmt: skip
    meta = None if pattern is None else {VERSION_KEY: digest, TENSORS_KEY: pattern}
    layout = build_header([(st.entry.name, st.entry.dtype, st.entry.shape) for _, st in outputs],
                          meta)  # fmt: skip
    offsets = {t.name: layout.data_start + t.begin for t in layout.tensors}
    blobs = {id(s): _blobs(s, [st for t, st in outputs if t is s], progress) for s in sources}
    with open_checkpoint(src) as ckpt:
        have = {t.name: (t.dtype, t.shape) for t in ckpt.tensors.values()}
        if have != wanted:
            raise BaseMismatchError(f"{src} does not hold the input tensors of the link's parts")
        for _, st in work:
            if st.dst_digest is None:
                _check_input(ckpt.tensors[st.entry.name], st)
        with atomic_file(out, overwrite=True) as fd:
            init_file(fd, layout)
            for s, st in outputs:
                apply_tensor(s.header, st, ckpt, blobs[id(s)], fd, offsets[st.entry.name])


def _blobs(s: _Source, steps: list[Step], progress: Progress | None) -> Blobs:
    chunks = [c for st in steps for c in st.entry.chunks if c.in_data]
    chunks.sort(key=lambda c: c.offset)
    # A part downloaded whole was counted then; only ranged reads of storage count here.
    return Blobs(s.storage, s.key, s.data_start, chunks, progress if s.path is None else None)


def _check_input(tensor: Any, step: Step) -> None:
    """A tensor the output drops must still be the input it names (SPEC §10.2 step 6)."""
    h = new_hasher(1, tensor.nbytes)
    for start in range(0, tensor.elements, READ_ELEMENTS):
        h.update(tensor.read(start, min(READ_ELEMENTS, tensor.elements - start)).data.cast("B"))
    if h.hexdigest() != step.src_digest:
        raise BaseMismatchError(f"tensor {step.entry.name!r} is not the link's input")


def apply_in_memory(
    chain: Chain, m: Manifest, link: Link, weights: MutableMapping[str, Any], reverse: bool,
    keep: Callable[[str], bool], partial: bool, threads: int,
) -> list[Any]:  # fmt: skip
    """Apply a reversible multi-part link to ``weights`` in place, all or nothing: each
    part to the tensors it holds; a failed part undoes the parts applied before it.
    Returns the parts applied, open (blobs read by ranges kept), so that the link can be
    undone from them (``apply_part`` backwards) until the caller closes them."""
    if partial and not all(chain.is_cached(p.digest) for p in link.parts):
        deltas: list[Any] = [PartDelta(chain.storage, p, keep) for p in link.parts]
    else:
        deltas = [open_delta(chain.fetch(p.key, p.size, p.digest, "blake3")) for p in link.parts]
    try:
        check_parts(m, link, [d.header for d in deltas])
        done: list[Any] = []
        try:
            for d in deltas:
                apply_part(weights, d, reverse, keep, threads)
                done.append(d)
        except BaseException:
            for d in reversed(done):
                apply_part(weights, d, not reverse, keep, threads)
            raise
    except BaseException:
        for d in deltas:
            d.close()
        raise
    return deltas


def apply_part(
    weights: MutableMapping[str, Any], d: Any, reverse: bool, keep: Callable[[str], bool],
    threads: int,
) -> None:  # fmt: skip
    """One part, on the sub-mapping of its input tensors; its structural changes copied back."""
    if isinstance(d, RemoteDelta):
        d.hold_removed(reverse)
    names = {t.name for t in d.header.side_tensors("target" if reverse else "base")}
    sub = {n: weights[n] for n in names if keep(n) and n in weights}
    before = set(sub)
    apply_opened(sub, d, reverse, verify_output=True, verify_input=False, threads=threads,
                 tensors=keep)  # fmt: skip
    for n in before - set(sub):
        del weights[n]
    weights.update({n: v for n, v in sub.items() if n not in before})
