"""Every HTTP exchange of an S3 client bounded in time and in bytes.

botocore reads an answer's headers, a listing page and an error body whole, each wait
bounded only by a socket timeout, which a store that trickles a byte every few seconds
never meets; a 500 answer or a listing page can be hundreds of MiB. :func:`bound` takes
over the sending of a boto3 S3 client's requests (its ``before-send`` event, the hook
botocore offers to answer a request in its place) and sends each through the client's own
HTTP session (its proxies, TLS settings and pools), so that:

- the whole exchange, from connecting to the last byte of a body read here, runs under a
  :class:`~.stall.Watch` (the budget of every network answer: ``GRACE`` seconds plus a
  second per ``MIN_RATE`` bytes moved); past it the connection is shut down, which wakes a
  read blocked in the socket, and the request fails with ``io-error``;
- a body that botocore would read whole (every answer but a successful ``GetObject``) is
  read here, at most :data:`MAX_BODY` bytes of a success and :data:`MAX_ERROR_BODY` of an
  error, then refused; a ``GetObject`` body is left to the caller, which reads only the
  bytes it asked for under a watch of its own (``S3Storage._read_body``, ``stream``).

The connection a request uses is found through the pool's connection class: the client's
pools make :class:`_Tracked` connections, which name themselves to the watch of the
request their thread is sending.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
from typing import Any

from ...errors import StorageError, UnsupportedFeatureError
from .stall import Watch, cutter

MAX_BODY = 8 << 20  # a listing page of 1,000 keys of 1 KiB, URL-encoded, is under 4 MiB
MAX_ERROR_BODY = 64 << 10  # an S3 error is a few hundred bytes of XML
_BLOCK = 64 << 10

# The audit of every call S3Storage makes on its client (a test keeps this list and the
# calls in s3.py the same): how the answers' time and size are bounded. Every call in s3.py
# turns what a failed or malformed answer raises into io-error naming the object
# (s3._transport_errors). transfer.py makes no call of its own: it reads through
# Storage.read_range, which is get_object's.
AUDITED_CALLS: dict[str, str] = {
    "head_object": "headers under the budget; ContentLength must be a count of bytes; "
    "botocore's parse errors (a bad date, a non-integer header) -> io-error (stat)",
    "get_object": "headers and an error body (at most MAX_ERROR_BODY) under the budget; the "
    "object's body is read by the caller under a Watch, at most the bytes asked for plus one",
    "put_object": "answer (at most MAX_BODY) under the budget, which the request body extends",
    "upload_file": "boto3's transfer manager sends every request (PutObject, the multipart "
    "ones) through this client, each under its own budget and MAX_BODY",
    "get_paginator": "list_objects_v2: each page (at most MAX_BODY) under the budget; "
    "s3.MAX_PAGES pages and s3.LIST_SECONDS in all; each entry's key and size checked",
    "delete_object": "answer (at most MAX_BODY) under the budget",
}

_current = threading.local()  # .slot: the _Slot of the request this thread is sending


class _Slot:
    """How to cut one request: its new connection's socket (a duplicate, which reaches the
    TCP connection even while TLS holds it during the handshake), else the pooled
    connection it reuses, and its answer once the headers are in (a connection that will
    close hands its socket to the answer)."""

    def __init__(self) -> None:
        self.connection: Any = None
        self.socket: socket.socket | None = None
        self.answer: Any = None

    def cut(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # already closed, or shut down
            if self.socket is not None:
                self.socket.shutdown(socket.SHUT_RDWR)
            elif self.answer is not None:
                cutter(self.answer)()
            elif (sock := getattr(self.connection, "sock", None)) is not None:
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()  # the duplicate only: the connection keeps its own


class _Tracked:
    """A connection that names itself, and the socket it opens, to the request its thread
    is sending (mixed into botocore's connection classes, before them). An HTTPS pool
    connects before it sends, an HTTP connection while it sends: both are covered."""

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        slot = getattr(_current, "slot", None)
        if slot is not None and slot.socket is None:
            slot.socket = sock.dup()
        return sock

    def request(self, *args: Any, **kwargs: Any) -> Any:
        slot = getattr(_current, "slot", None)
        if slot is not None:
            slot.connection = self
        return super().request(*args, **kwargs)  # type: ignore[misc]


@functools.cache
def _tracked_pools() -> dict[str, type]:
    from botocore.awsrequest import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        AWSHTTPConnection,
        AWSHTTPConnectionPool,
        AWSHTTPSConnection,
        AWSHTTPSConnectionPool,
    )

    http = type("TrackedHTTPConnection", (_Tracked, AWSHTTPConnection), {})
    https = type("TrackedHTTPSConnection", (_Tracked, AWSHTTPSConnection), {})
    return {
        "http": type("TrackedHTTPPool", (AWSHTTPConnectionPool,), {"ConnectionCls": http}),
        "https": type("TrackedHTTPSPool", (AWSHTTPSConnectionPool,), {"ConnectionCls": https}),
    }


class _Replay:
    """A body already read, given back to botocore in the shape of a urllib3 response."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        yield self.data


def _read_at_most(raw: Any, limit: int, watch: Watch, what: str) -> bytes:
    """The body of ``raw`` (a urllib3 response), refused once longer than ``limit``."""
    from urllib3.exceptions import HTTPError

    parts, have = [], 0
    try:
        while have <= limit and (block := raw.read(_BLOCK)):
            parts.append(block)
            have += len(block)
            watch.got(len(block))
    except (HTTPError, OSError) as exc:
        raw.close()
        raise StorageError(f"{what}: the answer's body broke off ({exc})") from exc
    if have > limit:
        raw.close()  # the rest is never read
        raise StorageError(f"{what}: the answer is longer than the {limit} bytes allowed; refused")
    return b"".join(parts)


class _BoundedSender:
    """The ``before-send`` handler: sends a request through ``session``, bounded."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        slot = _Slot()
        try:
            return self._send(request, slot)
        finally:
            slot.close()

    def _send(self, request: Any, slot: _Slot) -> Any:
        from botocore.awsrequest import AWSResponse  # type: ignore[import-untyped, import-not-found, unused-ignore]

        what = f"{request.method} {request.url}"
        with Watch(what, slot.cut) as watch:
            # The request body is ours; its bytes earn time like received ones (an upload
            # part on a slow uplink is not a stalled answer).
            watch.got(int(request.headers.get("Content-Length", 0) or 0))
            streamed, request.stream_output = request.stream_output, True
            _current.slot = slot
            try:
                response = self.session.send(request)
            finally:
                _current.slot, request.stream_output = None, streamed
            slot.answer = response.raw
            if streamed and response.status_code < 300:
                return response  # a GetObject body: read by the caller, under its own watch
            limit = MAX_ERROR_BODY if response.status_code >= 300 else MAX_BODY
            body = _read_at_most(response.raw, limit, watch, what)
            return AWSResponse(request.url, response.status_code, response.headers, _Replay(body))


def bound(client: Any) -> None:
    """Send every request of the boto3 S3 ``client`` bounded in time and bytes (above).

    A client without botocore's event system and endpoint (a test double that answers
    in-process) sends nothing over a network and is left as it is. A botocore client whose
    requests another ``before-send`` handler answers in-process (moto's ``mock_aws``) is
    not such a double: this handler still sends them, so give it a client of a server.
    """
    events = getattr(getattr(client, "meta", None), "events", None)
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    if events is None or session is None:
        return
    # botocore keeps the pool classes of its session in one dict that its pool managers
    # share (the only hook to the connection a request uses); a session without it is
    # not botocore's URLLib3Session, whose reads could not be bounded.
    pools = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(pools, dict):
        raise UnsupportedFeatureError(
            f"s3:// storage needs botocore's own HTTP session, not {type(session).__name__}"
        )
    pools.update(_tracked_pools())
    session.close()  # pools made before (untracked connections) are dropped
    events.register("before-send.s3", _BoundedSender(session), unique_id="wdelta-bounded")
