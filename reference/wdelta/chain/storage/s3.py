"""S3-compatible object storage through boto3 (AWS, MinIO, the Hub's S3 gateway).

Create-only writes are ``PutObject`` with ``If-None-Match: *``: the store
answers 412 when the key exists, atomically.  Reads are ranged ``GetObject``
requests, so a download resumes at the byte where it stopped; a response body
is read only up to the bytes asked for (plus one, to see that a store answered
more, which is refused), never whole.  Uploads go
through boto3's transfer manager: a file of at least ``transfer.threshold``
bytes is a multipart upload of ``transfer.chunk``-byte parts,
``transfer.concurrency`` at a time, each request retried by botocore's
standard retry mode; the object appears under its key only when the upload
completes, and a failed upload is aborted (no object, no parts left).
Create-only writes are needed only for small objects (manifests,
signatures, trust roots) and stay single ``PutObject`` requests.  Every
request is sent bounded in time and bytes (``s3http``), and every answer that
fails or does not parse is ``io-error`` naming the object (SPEC §15).  Credentials
and the endpoint come from the usual AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...) unless a client is passed in; a client passed in is
bounded the same way, for all its users.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import BadArgumentError, LimitExceededError, StorageError, TruncatedError
from ..errors import NotFoundError
from .base import (
    STREAM_BLOCK,
    ObjectInfo,
    Progress,
    Storage,
    check_key,
    check_listed,
    longer_than_asked,
    missing_package,
    too_large,
)
from .s3http import bound
from .stall import Watch, cutter
from .transfer import Transfer

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_UNSATISFIABLE = {"416", "InvalidRange"}
# A listing page is one request, bounded by s3http; a store that pages without end (empty
# pages, each with a new continuation token) is stopped by counting pages and by the clock,
# not only by the objects listed (base.MAX_LISTED, which needs 1,000 pages of 1,000 keys).
MAX_PAGES = 5_000
LIST_SECONDS = 300.0
# S3 answers 409 when two conditional writes of one key overlap; the loser
# may retry and then sees 412.
_CREATE_ATTEMPTS = 5


def _client_error() -> type[Exception]:
    from botocore.exceptions import ClientError  # type: ignore[import-untyped, import-not-found, unused-ignore]

    cls: type[Exception] = ClientError
    return cls


def _transport_errors() -> tuple[type[Exception], ...]:
    """What an answer that failed or is malformed raises: botocore's errors, boto3's (an
    upload the store refused), urllib3's (a body read that timed out), and those of parsing
    what the store sent (a header that is not a number, a date that is not a date, a
    listing entry with no key)."""
    from boto3.exceptions import Boto3Error  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from botocore.exceptions import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        BotoCoreError,
        ClientError,
    )
    from urllib3.exceptions import HTTPError

    failed = (Boto3Error, BotoCoreError, ClientError, HTTPError, OSError)
    return (*failed, ValueError, TypeError, LookupError)


def _request_errors() -> tuple[type[Exception], ...]:
    """What a request raises: an answer's errors, and an answer refused by ``s3http``
    (late, or too long), which names the request but not the store's URL."""
    return (*_transport_errors(), StorageError)


def _size(value: object) -> int:
    """A size the store stated (a header, a listing entry), refused unless a count of bytes."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a size of {value!r}")
    return value


def _code(exc: Exception) -> str:
    response: dict[str, Any] = getattr(exc, "response", {}) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix/``; ``transfer`` sets multipart uploads and
    concurrent downloads of large objects."""

    def __init__(
        self, bucket: str, prefix: str = "", *, client: Any = None,
        endpoint_url: str | None = None, transfer: Transfer | None = None,
    ) -> None:  # fmt: skip
        if not bucket:
            raise BadArgumentError("an S3 URL needs a bucket: s3://BUCKET/PREFIX")
        if transfer is not None and not isinstance(transfer, Transfer):
            raise BadArgumentError(f"transfer must be a Transfer, not {type(transfer).__name__}")
        self.transfer = transfer or Transfer()
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        if client is None:
            try:
                import boto3  # type: ignore[import-untyped, import-not-found, unused-ignore]
                from botocore.config import Config  # type: ignore[import-untyped, import-not-found, unused-ignore]
            except ImportError as exc:
                raise missing_package("s3://", exc, "pip install 'wdelta[s3]'") from exc

            # Socket timeouts bound one wait; stall.Watch bounds a whole answer.
            config = Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=10,
                read_timeout=30,
            )
            client = boto3.client("s3", endpoint_url=endpoint_url, config=config)
        bound(client)
        self.client = client

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _fail(self, key: str, exc: Exception) -> StorageError | NotFoundError:
        if _code(exc) in _NOT_FOUND:
            return NotFoundError(f"{self.url}: no object {key}")
        if isinstance(exc, (ValueError, TypeError, LookupError)):
            return StorageError(f"{self.url}{key}: the store's answer is malformed ({exc!r})")
        return StorageError(f"{self.url}{key}: {exc}")

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return ObjectInfo(key, _size(head["ContentLength"]))
        except _request_errors() as exc:
            err = self._fail(key, exc)
            if isinstance(err, NotFoundError):
                return None
            raise err from exc

    def _get(self, key: str, byte_range: str | None) -> Any:
        kwargs = {"Range": byte_range} if byte_range else {}
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key), **kwargs)["Body"]
        except _request_errors() as exc:
            raise self._fail(key, exc) from exc

    def _read_body(self, key: str, byte_range: str, most: int) -> bytes:
        """At most ``most`` bytes of the answer to a GET of ``byte_range`` (then closed)."""
        body = self._get(key, byte_range)
        parts, have = [], 0
        try:
            with Watch(f"{self.url}{key}", cutter(body)) as watch:
                while have < most and (block := body.read(min(STREAM_BLOCK, most - have))):
                    parts.append(bytes(block))
                    have += len(block)
                    watch.got(len(block))
        except _transport_errors() as exc:
            raise self._fail(key, exc) from exc
        finally:
            body.close()  # the rest of an answer longer than asked is never read
        return b"".join(parts)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if length == 0:
            return b""
        data = self._read_body(key, f"bytes={start}-{start + length - 1}", length + 1)
        if len(data) > length:
            raise longer_than_asked(self.url, key, length)
        if len(data) != length:
            raise TruncatedError(f"{key}: {length} bytes at {start} run past its end")
        return data

    def read(self, key: str, limit: int) -> bytes:
        # One byte past the limit is asked for, and read, to tell "exactly the
        # limit" from "longer": a store ignoring the Range is cut there too.
        try:
            data = self._read_body(key, f"bytes=0-{limit}", limit + 1)
        except StorageError as exc:
            cause = exc.__cause__
            if not isinstance(cause, Exception) or _code(cause) not in _UNSATISFIABLE:
                raise
            data = b""  # an empty object has no byte 0 for the range to start at
        if len(data) > limit:
            raise too_large(key, limit)
        return data

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        body = self._get(key, f"bytes={start}-" if start else None)
        try:
            with Watch(f"{self.url}{key}", cutter(body)) as watch:
                for block in body.iter_chunks(STREAM_BLOCK):
                    watch.got(len(block))
                    yield block
        except _transport_errors() as exc:
            raise self._fail(key, exc) from exc
        finally:
            body.close()

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped, import-not-found, unused-ignore]

        t = self.transfer
        config = TransferConfig(
            multipart_threshold=t.threshold, multipart_chunksize=t.chunk,
            max_concurrency=t.concurrency, use_threads=t.concurrency > 1,
        )  # fmt: skip
        try:
            self.client.upload_file(
                str(path), self.bucket, self._key(key), Callback=progress, Config=config
            )
        except _request_errors() as exc:
            raise self._fail(key, exc) from exc

    def create(self, key: str, data: bytes) -> bool:
        for _ in range(_CREATE_ATTEMPTS):
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
                return True
            except _client_error() as exc:
                if _code(exc) in ("PreconditionFailed", "412"):
                    return False
                if _code(exc) != "ConditionalRequestConflict":
                    raise self._fail(key, exc) from exc
            except _request_errors() as exc:
                raise self._fail(key, exc) from exc
        raise StorageError(f"{self.url}{key}: conditional write kept conflicting")

    def list(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        deadline = time.monotonic() + LIST_SECONDS
        for number, page in enumerate(self._pages(prefix), 1):
            for obj in page.get("Contents", []):
                info = self._entry(prefix, obj)
                # S3 lists in key order: a page that does not move forward is a
                # store paging in a loop, which would never end.
                if found and info.key <= found[-1].key:
                    raise StorageError(f"{self.url}{prefix}: the listing went backwards")
                found.append(info)
            check_listed(self.url, prefix, len(found))
            if number >= MAX_PAGES or time.monotonic() > deadline:
                limit = f"{MAX_PAGES:,} pages" if number >= MAX_PAGES else f"{LIST_SECONDS:g} s"
                raise LimitExceededError(
                    f"{self.url}{prefix}: the listing goes on past {limit} ({number:,} pages, "
                    f"{len(found):,} objects: a store that pages without end); refused"
                )
        return found

    def _pages(self, prefix: str) -> Iterator[dict[str, Any]]:
        """The pages of a listing, a page that failed or is malformed as ``io-error``."""
        pages = iter(
            self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
        )
        while True:
            try:
                page = next(pages, None)
            except _request_errors() as exc:
                raise self._fail(prefix, exc) from exc
            if not isinstance(page, dict):
                return
            yield page

    def _entry(self, prefix: str, obj: Any) -> ObjectInfo:
        """One listed object; a key outside the prefix listed, or a size that is not a
        count of bytes, is a malformed answer."""
        try:
            key, size = obj["Key"], _size(obj["Size"])
        except (LookupError, TypeError, ValueError) as exc:
            raise self._fail(prefix, exc) from exc
        if not isinstance(key, str) or not key.startswith(self.prefix + prefix):
            raise StorageError(f"{self.url}{prefix}: the listing names {key!r}, not under it")
        return ObjectInfo(key[len(self.prefix) :], size)

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except _request_errors() as exc:
            raise self._fail(key, exc) from exc
