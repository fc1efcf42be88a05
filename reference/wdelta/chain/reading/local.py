"""Local checkpoints of a node: digests, the partial-node marker, atomic replacement.

A pulled checkpoint replaces the node's copy in one rename, so a reader sees
the old or the new version, never a mix: a single file is renamed over; a
sharded checkpoint lives in a folder that the node path links to (a symlink),
and the symlink is swapped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...checkpoint.source import Checkpoint, open_checkpoint
from ...errors import BadArgumentError, StorageError
from ...format.digest import TensorIdentity, checkpoint_digest, new_hasher
from ...io.atomic import fsync_dir, temp_name

READ_ELEMENTS = 1 << 22
VERSION_KEY = "wdelta.chain.version"
TENSORS_KEY = "wdelta.chain.tensors"


def digest_of(ckpt: Checkpoint) -> str:
    """The checkpoint digest of an open checkpoint (every byte hashed)."""
    ids = []
    for t in ckpt.tensors.values():
        h = new_hasher(1, t.nbytes)
        for start in range(0, t.elements, READ_ELEMENTS):
            h.update(t.read(start, min(READ_ELEMENTS, t.elements - start)).data.cast("B"))
        ids.append(TensorIdentity(t.name, t.dtype.name, t.shape, h.hexdigest()))
    return checkpoint_digest(ids)


def digest_of_path(path: Path) -> str:
    with open_checkpoint(path) as ckpt:
        return digest_of(ckpt)


def partial_marker(path: Path) -> tuple[str, str] | None:
    """(version digest, tensor pattern) recorded in a partial checkpoint, else None."""
    with open_checkpoint(path) as ckpt:
        meta = next(iter(ckpt.files.values())).metadata or {}
    if VERSION_KEY in meta and TENSORS_KEY in meta:
        return meta[VERSION_KEY], meta[TENSORS_KEY]
    return None


def checkpoint_files(path: Path) -> list[Path]:
    """The files making up a checkpoint: one file, or index plus shards."""
    with open_checkpoint(path) as ckpt:
        if ckpt.index is None:
            ((name, _),) = ckpt.files.items()
            return [path if path.is_file() else path / name]
        return [path / ckpt.index[0]] + [path / name for name in ckpt.files]


def replace_checkpoint(new: Path, local: Path) -> None:
    """Make ``new`` (on the same file system) the node's checkpoint at ``local``.

    A file is renamed over ``local``.  A folder is moved beside ``local`` and
    ``local``, which must be a symlink or absent, is re-pointed in one rename;
    the folder it pointed to before is then removed if wdelta created it.
    """
    if new.is_file():
        if local.is_dir() and not local.is_symlink():
            raise BadArgumentError(f"{local} is a folder; the chain holds single-file checkpoints")
        os.replace(new, local)
        fsync_dir(local.parent)
        return
    if local.exists() and not local.is_symlink():
        raise BadArgumentError(
            f"{local} must be a symlink (or absent) to be replaced atomically by a "
            "sharded checkpoint"
        )
    old = local.resolve() if local.is_symlink() else None
    home = local.parent / f".{local.name}.wdelta-versions"
    home.mkdir(exist_ok=True)
    dest = home / new.name
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(new, dest)
    link = local.parent / temp_name(local.name)
    os.symlink(os.path.relpath(dest, local.parent), link)
    try:
        os.replace(link, local)
    except OSError as exc:
        raise StorageError(f"cannot replace {local}: {exc}") from exc
    fsync_dir(local.parent)
    if old is not None and old.parent == home.resolve() and old != dest.resolve():
        shutil.rmtree(old, ignore_errors=True)
