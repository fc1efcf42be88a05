"""Answers that stall: a network store that trickles its bytes is cut off.

A socket timeout (botocore's ``read_timeout``) bounds one wait for bytes, not an answer: a
store that sends a byte every few seconds, or a 1 GiB answer at 1 KiB/s, would hold a node
for days while it looks alive. Every answer read from a network store therefore has a
budget: ``GRACE`` seconds, plus one second per ``MIN_RATE`` bytes received so far. Past it, a
watchdog shuts the connection down (which wakes a read blocked in the socket) and the read
fails with ``io-error`` naming the object, so a follower reports it and polls again instead of
hanging (SPEC §15, "Slow answers"). For S3, ``s3http`` puts each whole request under such a
budget (connecting, the headers, a listing page, an error body); an object's bytes are
watched by the reader, which reads only the bytes it asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from ...errors import StorageError

GRACE = 60.0  # seconds: a slow first byte (a cold object, a busy gateway) is not a stall
MIN_RATE = 64 << 10  # bytes per second, averaged over the whole answer after GRACE
_POLL = 0.25  # seconds between the watchdog's looks at the clock


class Watch:
    """Cuts one answer that falls behind its budget.

    ``cut`` is called once, from the watchdog thread, when the answer is late: it must
    make a read blocked on the connection return or raise. The reader reports progress
    with :meth:`got`; leaving the ``with`` block raises :class:`StorageError` if the
    answer was cut, whatever the read itself raised or returned.
    """

    def __init__(self, what: str, cut: Callable[[], None]) -> None:
        self.what, self._cut = what, cut
        self.grace, self.rate = GRACE, MIN_RATE  # read at start: tests lower them
        self.received = 0
        self.cut = False
        self._done = threading.Event()
        self._start = 0.0

    def got(self, n: int) -> None:
        """``n`` more bytes of the answer arrived."""
        self.received += n

    def late(self, now: float) -> bool:
        """Whether the answer is behind its budget at monotonic time ``now``."""
        return now - self._start > self.grace + self.received / self.rate

    def _watch(self) -> None:
        while not self._done.wait(_POLL):
            if self.late(time.monotonic()):
                self.cut = True
                self._cut()
                return

    def __enter__(self) -> Watch:
        self._start = time.monotonic()
        threading.Thread(target=self._watch, name="wdelta-stall-watch", daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        if self.cut:
            seconds = time.monotonic() - self._start
            raise StorageError(
                f"{self.what}: the store's answer stalled ({self.received} bytes in "
                f"{seconds:.0f} s, under {self.rate} bytes/s after a {self.grace:.0f} s grace); "
                "cut off, try again later or use another mirror"
            ) from exc


def cutter(body: object) -> Callable[[], None]:
    """How to cut a botocore ``StreamingBody``: shut its urllib3 connection down, which
    wakes a blocked read (closing it from another thread would not), else close it."""
    raw = getattr(body, "_raw_stream", body)
    shutdown = getattr(raw, "shutdown", None)
    close = getattr(body, "close", None)
    action = shutdown if callable(shutdown) else close
    return action if callable(action) else (lambda: None)
