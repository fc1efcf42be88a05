"""SIGTERM and SIGHUP handled as Ctrl-C is: an exception that unwinds the command.

Unwinding runs every cleanup on the way (temporary files and folders are
removed, see atomic.py), then the CLI prints ``error: interrupted (SIGTERM)``
and exits with 128 + the signal number, as a shell reports a process killed by
that signal.  Only the CLI installs the handlers; the library leaves a host
program's signal handling alone.  SIGKILL cannot be caught: the temporaries
it leaves are removed by the next run into the same folder.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# deferred() nesting depth, and the signal it holds back (main thread only).
_deferring = 0
_pending: int | None = None


class Interrupted(KeyboardInterrupt):
    """A signal asked the command to stop; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _handler(signum: int, frame: FrameType | None) -> None:
    global _pending
    # Later signals are ignored so that they cannot cut the cleanup short.
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if _deferring:
        _pending = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold back a signal's :class:`Interrupted` until the end of this block.

    For a few statements that create a resource and record it for cleanup:
    the exception must not fall between the two.  It is raised when the
    block ends normally (an exception from the block wins).  A no-op outside
    the main thread, where no handler runs.
    """
    global _deferring, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring and _pending is not None:
        signum, _pending = _pending, None
        raise Interrupted(signum)


@contextlib.contextmanager
def as_exceptions() -> Iterator[None]:
    """Within this block, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted`.

    A no-op outside the main thread (only it may set handlers); a signal
    ignored when the block starts (``nohup``) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s, old in previous.items():
        if old is not signal.SIG_IGN:
            signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, old in previous.items():
            if old is not None:
                signal.signal(s, old)
