"""A chain in a local (or network-mounted POSIX) folder.

Create-only writes are a temporary file hard-linked to the final name:
``link(2)`` fails if the name exists, atomically, and the object appears
complete or not at all.  Uploads are a temporary file renamed into place.

Whoever can write the folder can put anything at a key: every read opens the
object without blocking and refuses anything but a regular file (a FIFO would
hang the reader, ``/dev/zero`` behind a symlink would never end).  Symlinks
are followed (a folder whose objects link elsewhere is a valid store); what
they lead to is checked.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ...arguments import as_path
from ...errors import StorageError, TruncatedError
from ...io import interrupts
from ...io.atomic import TMP_MARK, fsync_dir, remove_stale, temp_file
from ...io.filekind import os_message
from ..errors import NotFoundError
from . import base
from .base import STREAM_BLOCK, ObjectInfo, Progress, Storage, check_key, too_large
from .smallfile import open_regular, read_bounded


class LocalStorage(Storage):
    """Objects are files under ``root``; keys are relative paths."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = as_path(root, "root")
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo(key, self._path(key).stat().st_size)
        except FileNotFoundError:
            return None

    def _open(self, key: str) -> int:
        """A descriptor of the regular file at ``key`` (a FIFO or device: StorageError)."""
        path = self._path(key)
        try:
            return open_regular(path, lambda why: StorageError(f"{path}: {why}"))
        except FileNotFoundError as exc:
            if not self.root.is_dir():  # the store itself is missing, said as everywhere
                raise NotFoundError(f"{os_message(self.root, exc)} (no object {key})") from exc
            raise NotFoundError(f"{self.url}: no object {key}") from exc

    def read(self, key: str, limit: int) -> bytes:
        fd = self._open(key)
        try:
            return read_bounded(fd, limit, lambda why: too_large(key, limit))
        except OSError as exc:
            raise StorageError(f"cannot read {key}: {exc}") from exc
        finally:
            os.close(fd)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        fd = self._open(key)
        try:
            data = os.pread(fd, length, start)
        finally:
            os.close(fd)
        if len(data) != length:
            raise TruncatedError(f"{key}: {length} bytes at {start} run past its end")
        return data

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        fd = self._open(key)
        try:
            offset = start
            while block := os.pread(fd, STREAM_BLOCK, offset):
                offset += len(block)
                yield block
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _temp(self, key: str) -> Iterator[tuple[Path, Path]]:
        dest = self._path(key)
        tmp = None
        try:
            with interrupts.deferred():  # see atomic.py: tmp is known before a signal raises
                tmp = self._new_temp(dest)
            yield tmp, dest
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)

    @staticmethod
    def _new_temp(dest: Path) -> Path:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = temp_file(dest.parent, dest.name)
            os.close(fd)
        except OSError as exc:
            raise StorageError(f"cannot write under {dest.parent}: {exc}") from exc
        return tmp

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        with self._temp(key) as (tmp, dest):
            try:
                with open(path, "rb") as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, STREAM_BLOCK)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, dest)
                fsync_dir(dest.parent)
            except OSError as exc:
                raise StorageError(f"cannot store {key}: {exc}") from exc
        if progress is not None:
            progress(path.stat().st_size)

    def create(self, key: str, data: bytes) -> bool:
        with self._temp(key) as (tmp, dest):
            try:
                with open(tmp, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.link(tmp, dest)
            except FileExistsError:
                return False
            except OSError as exc:
                raise StorageError(f"cannot create {key}: {exc}") from exc
            fsync_dir(dest.parent)
            return True

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix``.

        Also removes, in the folders it walks, temporaries left by dead local
        processes (atomic.remove_stale): an upload killed outright leaves
        nothing once any command has listed the chain again.
        """
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / folder if folder else self.root
        if not top.is_dir():
            return []
        paths = list(itertools.islice(top.rglob("*"), base.MAX_LISTED + 1))
        base.check_listed(f"{self.url}/", prefix, len(paths))
        for path in [top, *paths]:
            if path.is_dir():
                remove_stale(path)
        found = []
        for path in paths:
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and rel.startswith(prefix) and TMP_MARK not in rel:
                found.append(ObjectInfo(rel, path.stat().st_size))
        return sorted(found, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete {key}: {exc}") from exc
