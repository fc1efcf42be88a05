"""Hugging Face Hub storage: a bucket or a model/dataset repo, via ``huggingface_hub``.

URLs: ``hf://buckets/NS/NAME/PREFIX``, ``hf://NS/NAME/PREFIX`` (model repo),
``hf://datasets/NS/NAME/PREFIX``.  Reads go through ``HfFileSystem`` as
ranged requests (a missing file raises, it is never skipped).  It returns
at most the bytes asked for (a longer answer is refused all the same), but
receives a whole answer before it does: the transfer of a store that answers
more than asked is not cut short (SPEC RD-5).  The token
comes from the usual environment (``HF_TOKEN`` or the saved login).

Uploads go through ``huggingface_hub``'s own large-file path: ``upload_file``
to a repo sends a large file by the Hub's chunked protocol (LFS multipart or
Xet) before the commit that makes it visible, and a bucket's batch upload
uses Xet; wdelta adds no chunking of its own.  Downloads of large files use
the chain's concurrent ranged reads (``transfer.download_ranges``).

Create-only writes: in a repo, a commit whose ``parent_commit`` is the head
at which the key was seen absent; the Hub refuses it (412) if anything was
committed since, and the check is repeated.  Buckets offer no conditional
write through this API, so a bucket create is check, write, read back: safe
for one writer; concurrent writers should use the bucket's S3 gateway through
the ``s3://`` backend, which honours ``If-None-Match``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import BadArgumentError, StorageError, TruncatedError
from ..errors import NotFoundError
from . import base
from .base import ObjectInfo, Progress, Storage, check_key, longer_than_asked, missing_package

RANGE_BLOCK = 8 << 20
_COMMIT_ATTEMPTS = 8


@dataclass(frozen=True)
class HfLocation:
    """Where a chain lives on the Hub: ``kind`` is bucket, model or dataset."""

    kind: str
    repo_id: str
    prefix: str

    @property
    def fs_root(self) -> str:
        """The ``HfFileSystem`` path of the chain's root (no trailing slash)."""
        head = {"bucket": "buckets/", "model": "", "dataset": "datasets/"}[self.kind]
        return f"{head}{self.repo_id}" + (f"/{self.prefix}" if self.prefix else "")


def parse_hf_url(url: str) -> HfLocation:
    """Split an ``hf://`` URL into kind, repo or bucket id, and key prefix."""
    rest = url.removeprefix("hf://").strip("/")
    parts = rest.split("/")
    kind = {"buckets": "bucket", "datasets": "dataset", "models": "model"}.get(parts[0])
    if kind is not None:
        parts = parts[1:]
    if len(parts) < 2 or not all(parts[:2]):
        raise BadArgumentError(f"{url}: expected hf://[buckets/|datasets/]NAMESPACE/NAME[/PREFIX]")
    return HfLocation(kind or "model", "/".join(parts[:2]), "/".join(parts[2:]))


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


class HfStorage(Storage):
    """Objects under a bucket or repo path; ``api``/``fs`` may be injected (tests)."""

    def __init__(self, url: str, *, api: Any = None, fs: Any = None) -> None:
        self.loc = parse_hf_url(url)
        self.url = f"hf://{self.loc.fs_root}/"
        if api is None or fs is None:
            try:
                from huggingface_hub import HfApi, HfFileSystem
            except ImportError as exc:
                raise missing_package("hf://", exc, "pip install 'huggingface_hub>=0.30'") from exc

            api = api or HfApi()
            fs = fs or HfFileSystem()
        self.api, self.fs = api, fs

    def _in_repo(self, key: str) -> str:
        check_key(key)
        return f"{self.loc.prefix}/{key}" if self.loc.prefix else key

    def _fs_path(self, key: str) -> str:
        return f"{self.loc.fs_root}/{check_key(key)}"

    def _fail(self, key: str, exc: Exception) -> StorageError | NotFoundError:
        if isinstance(exc, FileNotFoundError) or _status(exc) == 404:
            return NotFoundError(f"{self.url}: no object {key}")
        return StorageError(f"{self.url}{key}: {exc}")

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            info = self.fs.info(self._fs_path(key), refresh=True)
        except Exception as exc:
            err = self._fail(key, exc)
            if isinstance(err, NotFoundError):
                return None
            raise err from exc
        if info.get("type") != "file":
            return None
        return ObjectInfo(key, int(info["size"]))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length == 0:
            return b""
        try:
            data = bytes(self.fs.cat_file(self._fs_path(key), start=start, end=start + length))
        except Exception as exc:
            raise self._fail(key, exc) from exc
        if len(data) > length:
            raise longer_than_asked(self.url, key, length)
        if len(data) != length:
            raise TruncatedError(f"{key}: {length} bytes at {start} run past its end")
        return data

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        info = self.stat(key)
        if info is None:
            raise NotFoundError(f"{self.url}: no object {key}")
        offset = start
        while offset < info.size:
            length = min(RANGE_BLOCK, info.size - offset)
            yield self.read_range(key, offset, length)
            offset += length

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        try:
            if self.loc.kind == "bucket":
                self.api.batch_bucket_files(self.loc.repo_id, add=[(str(path), self._in_repo(key))])
            else:
                self.api.upload_file(
                    path_or_fileobj=str(path), path_in_repo=self._in_repo(key),
                    repo_id=self.loc.repo_id, repo_type=self.loc.kind,
                )  # fmt: skip
        except Exception as exc:
            raise self._fail(key, exc) from exc
        if progress is not None:
            progress(path.stat().st_size)

    def create(self, key: str, data: bytes) -> bool:
        if self.loc.kind == "bucket":
            return self._create_in_bucket(key, data)
        for _ in range(_COMMIT_ATTEMPTS):
            created = self._commit_if_absent(key, data)
            if created is not None:
                return created
        raise StorageError(f"{self.url}{key}: the repo kept moving; conditional commit failed")

    def _commit_if_absent(self, key: str, data: bytes) -> bool | None:
        """True: created; False: exists; None: the head moved, try again."""
        from huggingface_hub import CommitOperationAdd

        try:
            head = self.api.repo_info(self.loc.repo_id, repo_type=self.loc.kind).sha
            if self.api.file_exists(
                self.loc.repo_id, self._in_repo(key), repo_type=self.loc.kind, revision=head
            ):
                return False
            self.api.create_commit(
                self.loc.repo_id, [CommitOperationAdd(self._in_repo(key), data)],
                commit_message=f"wdelta: create {key}", repo_type=self.loc.kind,
                parent_commit=head,
            )  # fmt: skip
        except Exception as exc:
            if _status(exc) in (409, 412):
                return None
            raise self._fail(key, exc) from exc
        return True

    def _create_in_bucket(self, key: str, data: bytes) -> bool:
        # Check, write, read back: not atomic (see the module doc), but a
        # writer that loses a race it can see still reports it.
        if self.stat(key) is not None:
            return False
        try:
            self.api.batch_bucket_files(self.loc.repo_id, add=[(data, self._in_repo(key))])
        except Exception as exc:
            raise self._fail(key, exc) from exc
        stored = self.stat(key)
        return (
            stored is not None
            and stored.size == len(data)
            and self.read(key, len(data) + 1) == data
        )

    def list(self, prefix: str) -> list[ObjectInfo]:
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        root = self.loc.fs_root + (f"/{folder}" if folder else "")
        try:
            found = self.fs.find(root, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._fail(prefix, exc) from exc
        base.check_listed(self.url, prefix, len(found))
        out = []
        for path, info in found.items():
            key = path[len(self.loc.fs_root) + 1 :]
            if info.get("type") == "file" and key.startswith(prefix):
                out.append(ObjectInfo(key, int(info["size"])))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            if self.loc.kind == "bucket":
                self.api.batch_bucket_files(self.loc.repo_id, delete=[self._in_repo(key)])
            else:
                self.api.delete_file(self._in_repo(key), self.loc.repo_id, repo_type=self.loc.kind)
        except Exception as exc:
            if isinstance(self._fail(key, exc), NotFoundError):
                return
            raise self._fail(key, exc) from exc
