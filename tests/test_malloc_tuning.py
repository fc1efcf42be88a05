"""The CLI's allocator tuning: chunk buffers are reused, not faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

# Diff the same in-memory pair twice and count the page faults of the second
# run: its buffers can all come from memory the first run already touched.
_PROBE = """
import resource, sys
import numpy as np
import wdelta
from wdelta.io.malloc_tuning import keep_chunk_buffers
tuned = keep_chunk_buffers() if sys.argv[1] == "1" else False
rng = np.random.default_rng(0)
base = {f"w{i}": rng.integers(0, 1 << 16, 1 << 22, dtype=np.uint16) for i in range(4)}
target = {}
for name, words in base.items():
    t = words.copy()
    t[rng.random(len(t)) < 0.1] ^= 1
    target[name] = t
wdelta.diff(base, target, sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
wdelta.diff(base, target, sys.argv[2], overwrite=True)
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(tuned: bool, out: Path) -> tuple[str, int]:
    # The NumPy path: its per-chunk temporaries are the buffers the tuning keeps.  The
    # native kernels allocate few large ones, so an untuned run there sometimes faults as
    # little as a tuned one (measured 6 to 3,900 faults) and the comparison says nothing.
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, "1" if tuned else "0", str(out)],
        capture_output=True, text=True, check=True, env={**os.environ, "WDELTA_NATIVE": "0"},
    ).stdout.split()  # fmt: skip
    return result[0], int(result[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tuned_allocator_reuses_chunk_buffers(tmp_path: Path) -> None:
    flag, tuned = _faults(True, tmp_path / "a.wdelta")
    _, default = _faults(False, tmp_path / "b.wdelta")
    assert flag == "True"
    # Measured: ~14 000 faults for the 4 chunks without tuning, a few hundred with.
    assert tuned * 4 < default, (tuned, default)
