"""Verified local copies of a chain's files: deltas checked against the manifest,
snapshots assembled into checkpoints whose digest is the version's."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from ...errors import StorageError, WdeltaError
from ...format.container import open_delta
from ...format.header import Header
from ...io import rename
from ...io.atomic import temp_name
from ..errors import ChainBrokenError
from ..model.manifest import Link, LinkPart, Manifest, Snapshot
from ..storage.base import Progress
from ..store import Chain
from .local import digest_of_path


def check_link_header(m: Manifest, link: Link, header: Header) -> None:
    """The delta's header must name the link's versions and reversibility."""
    want_from, want_to = m.version(link.source).digest, m.version(link.target).digest
    base, target = header.raw["base"]["digest"], header.raw["target"]["digest"]
    reversible = header.reversible
    if (base, target) != (want_from, want_to):
        raise ChainBrokenError(
            f"delta {link.digest[:16]} goes {base[:16]}->{target[:16]}, the manifest says "
            f"{want_from[:16]}->{want_to[:16]} (link {link.source}->{link.target})"
        )
    if reversible != link.reversible:
        raise ChainBrokenError(f"link {link.source}->{link.target}: reversible flag disagrees")


T = TypeVar("T")


def evicting(chain: Chain, files: Iterable[LinkPart], run: Callable[[], T]) -> T:
    """``run()``; if it fails and a cached file of ``files`` (delta files, BLAKE3) no
    longer has its digest (damaged, or planted under it), those files are removed
    and ``run()`` is called once more, fetching them again (SPEC §17.7).  ``run``
    must change nothing when it fails (an in-place apply is all or nothing)."""
    try:
        return run()
    except WdeltaError:
        if not chain.evict_corrupt((f.digest, "blake3") for f in files):
            raise
    return run()


def fetch_link(chain: Chain, m: Manifest, link: Link, progress: Progress | None = None) -> Path:
    """The verified delta file of ``link`` (BLAKE3 and header checked)."""
    path = chain.fetch(link.key, link.size, link.digest, "blake3", progress)
    with open_delta(path) as d:
        check_link_header(m, link, d.header)
    return path


def materialize_snapshot(
    chain: Chain, m: Manifest, snap: Snapshot, dest: Path, progress: Progress | None = None
) -> Path:
    """Copy a snapshot's verified files to ``dest`` (a file, or a folder if sharded).

    The copy's checkpoint digest must be the version's digest: the manifest's
    sha256 proves the bytes are the ones uploaded, this proves they are the
    version the manifest says.  The copy is assembled under a temporary name
    and renamed to ``dest`` once checked, so ``dest`` is complete or absent.
    """
    paths = {f.name: chain.fetch(f.key, f.size, f.sha256, "sha256", progress) for f in snap.files}
    tmp = dest.parent / temp_name(dest.name)
    try:
        _copy(paths, tmp, dest)
        want = m.version(snap.version).digest
        got = digest_of_path(tmp)
        if got != want:
            raise ChainBrokenError(
                f"snapshot of version {snap.version} has digest {got[:16]}, not {want[:16]}"
            )
        rename.replace(tmp, dest, dest.parent / temp_name(dest.name))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise
    return dest


def _copy(paths: dict[str, Path], tmp: Path, dest: Path) -> None:
    """Copy one file to ``tmp``, or several into a new folder ``tmp``."""
    try:
        if len(paths) == 1:
            shutil.copyfile(next(iter(paths.values())), tmp)
        else:
            tmp.mkdir(parents=True)
            for name, src in paths.items():
                shutil.copyfile(src, tmp / name)
    except OSError as exc:
        raise StorageError(f"cannot assemble the snapshot at {dest}: {exc}") from exc
