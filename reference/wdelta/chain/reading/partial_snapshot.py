"""A partial checkpoint cut from a stored snapshot with ranged reads only.

A snapshot file's SHA-256 covers the whole file, so it cannot check a few
tensors read out of it.  What can is the version's checkpoint digest (SPEC
§9.4): it is computed from every tensor's name, dtype, shape and digest, and
the header of any delta that starts or ends at the version lists exactly
those (for a multi-part link, the headers of its parts together, SPEC
§17.12).  So: read such a header (ranged reads; header digest checked), accept
its tensor list only if it hashes to the manifest's version digest, then read
each snapshot file's safetensors header and the matching tensors' byte ranges,
and check every tensor's BLAKE3 against the accepted digest before the
partial checkpoint is renamed into place.  Bytes fetched: the delta header,
the safetensors headers and the matching tensors.  When no link touches the
version (or none proves its tensor list) the caller falls back to
downloading the whole snapshot.
"""

from __future__ import annotations

from pathlib import Path

from ...checkpoint.safetensors_header import TensorLayout as Layout
from ...checkpoint.safetensors_header import build_header, parse_header
from ...errors import ChecksumMismatchError, DeltaFormatError
from ...format.digest import TensorIdentity, checkpoint_digest, new_hasher
from ...format.header import Header
from ...io.atomic import atomic_file
from ...io.output_file import pwrite_all
from ...limits import MAX_INPUT_HEADER_BYTES
from ...ops.decoder import init_file
from ..errors import ChainBrokenError
from ..model.manifest import Link, Manifest, Snapshot
from ..storage.base import Progress, Storage
from .fetch import check_link_header
from .local import TENSORS_KEY, VERSION_KEY
from .partial import RANGE_WINDOW, matches, read_remote_header
from .parts import check_parts


def proven_tensors(
    storage: Storage, m: Manifest, version: int, progress: Progress | None = None
) -> dict[str, TensorIdentity] | None:
    """Version ``version``'s tensors from a link header whose list hashes to its digest.

    Links touching the version are tried smallest first (a damaged one is
    skipped); None if none proves it.
    """
    links = sorted((k for k in m.links if version in (k.source, k.target)), key=lambda k: k.size)
    for link in links:
        try:
            headers = _link_headers(storage, m, link, progress)
        except (DeltaFormatError, ChainBrokenError):
            continue  # a damaged delta proves nothing; the pull that applies it reports it
        side = "target" if link.target == version else "base"
        ids = {i.name: i for h in headers for i in (t.identity(side) for t in h.side_tensors(side))}
        if checkpoint_digest(ids.values()) == m.version(version).digest:
            return ids
    return None


def _link_headers(
    storage: Storage, m: Manifest, link: Link, progress: Progress | None
) -> list[Header]:
    """The checked header of a link, or of each of its parts (MP-4: together they list
    the version's tensors)."""
    if not link.parts:
        header, _ = read_remote_header(storage, link, progress)
        check_link_header(m, link, header)
        return [header]
    headers = [read_remote_header(storage, p, progress, p.header)[0] for p in link.parts]
    check_parts(m, link, headers)
    return headers


def _remote_layout(
    storage: Storage, key: str, size: int, progress: Progress | None
) -> tuple[int, tuple[Layout, ...]]:
    """(data start, tensors) of a stored safetensors file, from two ranged reads."""
    n = int.from_bytes(storage.read_range(key, 0, 8), "little")
    if n > MAX_INPUT_HEADER_BYTES or 8 + n > size:
        raise ChainBrokenError(f"{key}: safetensors header of {n} bytes does not fit the file")
    layout = parse_header(storage.read_range(key, 8, n))
    if progress is not None:
        progress(8 + n)
    if layout.data_start + layout.data_length != size:
        raise ChainBrokenError(f"{key}: header describes {layout.data_start + layout.data_length}")
    return layout.data_start, layout.tensors


def _locate(
    storage: Storage,
    snap: Snapshot,
    pattern: str,
    ids: dict[str, TensorIdentity],
    progress: Progress | None,
) -> dict[str, tuple[str, int, Layout]]:
    """Matching tensor name -> (key, absolute offset, layout), checked against ``ids``."""
    found: dict[str, tuple[str, int, Layout]] = {}
    for f in snap.files:
        if not f.name.endswith(".safetensors"):
            continue  # the index of a sharded snapshot: the shards' headers say it all
        start, tensors = _remote_layout(storage, f.key, f.size, progress)
        for t in tensors:
            if matches(t.name, pattern):
                found[t.name] = (f.key, start + t.begin, t)
    wanted = {n: (i.dtype, i.shape) for n, i in ids.items() if matches(n, pattern)}
    have = {n: (t.dtype.name, t.shape) for n, (_, _, t) in found.items()}
    if have != wanted:
        raise ChainBrokenError(
            f"snapshot of version {snap.version} does not hold the tensors its version lists"
        )
    return found


def extract_remote(
    storage: Storage, m: Manifest, snap: Snapshot, pattern: str, out: Path,
    progress: Progress | None = None,
) -> bool:  # fmt: skip
    """Write the partial checkpoint of ``snap`` for ``pattern`` to ``out`` (atomically).

    False (nothing written) if no link proves the version's tensor list.
    """
    ids = proven_tensors(storage, m, snap.version, progress)
    if ids is None:
        return False
    found = _locate(storage, snap, pattern, ids, progress)
    names = sorted(found, key=lambda n: n.encode("utf-8"))
    digest = m.version(snap.version).digest
    layout = build_header(
        [(n, found[n][2].dtype, found[n][2].shape) for n in names],
        {VERSION_KEY: digest, TENSORS_KEY: pattern},
    )
    offsets = {t.name: layout.data_start + t.begin for t in layout.tensors}
    with atomic_file(out, overwrite=True) as fd:
        init_file(fd, layout)
        for name in names:
            key, at, t = found[name]
            h = new_hasher(1, t.end - t.begin)
            for pos in range(0, t.end - t.begin, RANGE_WINDOW):
                block = storage.read_range(key, at + pos, min(RANGE_WINDOW, t.end - t.begin - pos))
                h.update(block)
                pwrite_all(fd, memoryview(block), offsets[name] + pos)
                if progress is not None:
                    progress(len(block))
            if h.hexdigest() != ids[name].digest:
                raise ChecksumMismatchError(f"{key}: tensor {name!r} digest mismatch")
    return True
