"""Storage backends for tests that need no network: an in-memory stand-in for the
Hugging Face Hub (``HfApi`` and ``HfFileSystem`` in one object), shared by the Hub
backend's tests and the storage contract tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wdelta.chain.storage.hf import HfStorage, parse_hf_url


@dataclass
class _Response:
    status_code: int


class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.response = _Response(status)


class FakeHub:
    """Files of one repo or bucket as ``fs path -> bytes``; both the api and the fs."""

    def __init__(self, root: str) -> None:
        self.root, self.files, self.sha, self.moves = root, {}, 0, 0  # type: ignore[var-annotated]
        self.commits: list[str | None] = []
        self.lock = threading.Lock()

    # -- HfFileSystem
    def info(self, path: str, refresh: bool = False) -> dict[str, Any]:
        if path not in self.files:
            raise FileNotFoundError(path)
        return {"type": "file", "size": len(self.files[path])}

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return bytes(self.files[path][start:end])

    def find(self, root: str, detail: bool, refresh: bool) -> dict[str, Any]:
        return {p: self.info(p) for p in self.files if p.startswith(root + "/")}

    # -- HfApi (paths relative to the repo; the chain prefix is part of them)
    def _path(self, in_repo: str) -> str:
        parts = self.root.split("/")
        repo_root = "/".join(parts[:3] if parts[0] in ("buckets", "datasets") else parts[:2])
        return f"{repo_root}/{in_repo}"

    def repo_info(self, repo_id: str, repo_type: str) -> Any:
        return type("Info", (), {"sha": f"sha{self.sha}"})()

    def file_exists(self, repo_id: str, path: str, repo_type: str, revision: str) -> bool:
        return self._path(path) in self.files

    def create_commit(self, repo_id: str, operations: list[Any], **kw: Any) -> None:
        with self.lock:  # the Hub applies one commit at a time
            self._commit(operations, **kw)

    def _commit(self, operations: list[Any], **kw: Any) -> None:
        self.commits.append(kw.get("parent_commit"))
        if self.moves:  # another writer committed since parent_commit was read
            self.moves -= 1
            self.sha += 1
            raise _HttpError(412)
        if kw.get("parent_commit") != f"sha{self.sha}":
            raise _HttpError(412)
        for op in operations:
            self.files[self._path(op.path_in_repo)] = op.path_or_fileobj
        self.sha += 1

    def upload_file(self, path_or_fileobj: str, path_in_repo: str, **kw: Any) -> None:
        self.files[self._path(path_in_repo)] = Path(path_or_fileobj).read_bytes()
        self.sha += 1

    def delete_file(self, path_in_repo: str, repo_id: str, repo_type: str) -> None:
        if self._path(path_in_repo) not in self.files:
            raise _HttpError(404)
        del self.files[self._path(path_in_repo)]

    def batch_bucket_files(
        self, bucket_id: str, add: list[Any] | None = None, delete: list[str] | None = None
    ) -> None:
        for src, dest in add or []:
            data = src if isinstance(src, bytes) else Path(src).read_bytes()
            self.files[self._path(dest)] = data
        for dest in delete or []:
            self.files.pop(self._path(dest), None)


def hf(url: str) -> tuple[HfStorage, FakeHub]:
    hub = FakeHub(parse_hf_url(url).fs_root)
    return HfStorage(url, api=hub, fs=hub), hub
