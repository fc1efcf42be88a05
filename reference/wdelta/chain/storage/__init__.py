"""Storage backends of a chain, chosen by URL (SPEC §17.4).

``open_storage("path/or/file://...")`` is a local folder, ``s3://BUCKET/PREFIX``
S3-compatible storage (boto3; endpoint from ``AWS_ENDPOINT_URL``) and
``hf://...`` the Hugging Face Hub.
"""

from __future__ import annotations

import os
from typing import Union

from ...errors import BadArgumentError
from .base import ObjectInfo, Progress, Storage, download
from .local import LocalStorage


def open_storage(url: Union[str, os.PathLike[str]]) -> Storage:  # noqa: UP007
    """The backend for ``url`` (a folder may be given as an ``os.PathLike``)."""
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise BadArgumentError(
            f"a chain location must be a folder, s3:// or hf:// URL, not {url!r:.80}"
        )
    if url.startswith("s3://"):
        from .s3 import S3Storage

        bucket, _, prefix = url[5:].partition("/")
        return S3Storage(bucket, prefix)
    if url.startswith("hf://"):
        from .hf import HfStorage

        return HfStorage(url)
    scheme, colon, rest = url.partition(":")
    if colon and scheme in ("s3", "hf") and not os.path.lexists(url):
        # "s3:/bucket" is a typo, not a local folder named "s3:" to create.
        raise BadArgumentError(
            f"{url}: a chain location is a folder, s3://BUCKET/PREFIX or hf://...: did you "
            f"mean {scheme}://{rest.lstrip('/')}?"
        )
    return LocalStorage(url.removeprefix("file://"))


__all__ = ["LocalStorage", "ObjectInfo", "Progress", "Storage", "download", "open_storage"]
