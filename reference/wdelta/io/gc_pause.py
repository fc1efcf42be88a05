"""Pausing Python's cyclic garbage collector while a large structure is built.

Parsing a header creates objects by the million (a 50,000-tensor header:
about 600,000), all of them kept.  Each allocation counts towards a
collection, and each full collection walks every object alive, so a parse
of N tensors triggered collections whose total work grew faster than N: the
cost per tensor of opening a delta doubled from 5,000 to 20,000 tensors, and
collections were 1.9 s of a 6.1 s open at 50,000.  Nothing built here forms
a reference cycle that needs collecting.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Run the block with automatic collection off, then restore it.

    Collection stays as the caller had it if it was already off (another
    thread's pause, or the application's choice).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
