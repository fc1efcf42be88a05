"""``follow`` and ``pull --follow`` under failures: the backoff policy, retries
that keep the node serving its version, routing around a corrupted link, and
one stderr line per failed poll from the CLI."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wdelta
from chainkit import folder_history
from wdelta import chain
from wdelta.chain.storage.base import ObjectInfo
from wdelta.errors import StorageError, WdeltaError

WDELTA = Path(sys.executable).parent / "wdelta"
ENV = {**os.environ, "PYTHONPATH": str(Path(wdelta.__file__).resolve().parent.parent)}


@given(
    base=st.floats(0, 10),
    extra=st.floats(0, 1000),
    factor=st.floats(1, 10),
    jitter=st.floats(0, 1),
    failures=st.integers(1, 10_000),
    seed=st.integers(0, 2**32),
)
def test_backoff_is_capped_jittered_and_grows(
    base: float, extra: float, factor: float, jitter: float, failures: int, seed: int
) -> None:
    b = chain.Backoff(base=base, cap=base + extra, factor=factor, jitter=jitter)
    nominal = b.nominal(failures)
    assert b.nominal(failures - 1 or 1) <= nominal <= b.cap
    delay = b.delay(failures, random.Random(seed))
    assert nominal * (1 - jitter) - 1e-9 <= delay <= nominal
    if base > 0 and failures < 20:
        assert nominal == pytest.approx(min(b.cap, base * factor ** (failures - 1)))


def test_backoff_refuses_nonsense() -> None:
    for kwargs in ({"base": 2.0, "cap": 1.0}, {"factor": 0.5}, {"jitter": 1.5}):
        with pytest.raises(WdeltaError) as info:
            chain.Backoff(**kwargs)  # type: ignore[arg-type]
        assert info.value.category == "bad-argument"


class Outage(chain.LocalStorage):
    """Listing fails for the first ``down`` calls (the store is unreachable)."""

    def __init__(self, root: Path, down: int) -> None:
        super().__init__(root)
        self.down = down

    def list(self, prefix: str) -> list[ObjectInfo]:
        if self.down > 0:
            self.down -= 1
            raise StorageError("injected: connection refused")
        return super().list(prefix)


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder chain of versions 0..3 with snapshots at 0 and 3."""
    return folder_history(tmp_path, 32, 128)


def corrupt_link(store: Path, source: int) -> None:
    m = chain.Chain(chain.LocalStorage(store)).head()
    link = next(k for k in m.links if k.source == source)
    path = store / link.key
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_follow_retries_an_outage_with_growing_delays(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    chain.pull(store, local, to=1)
    errors: list[tuple[str, float]] = []
    slept: list[float] = []
    backoff = chain.Backoff(base=1.0, cap=3.0, jitter=0.0)

    def on_error(exc: WdeltaError, delay: float) -> None:
        errors.append((exc.category, delay))
        assert local.read_bytes() == ckpts[1].read_bytes()  # still serving version 1

    result = chain.follow(
        chain.Chain(Outage(store, down=3)), local, interval=10.0, max_iterations=5,
        on_error=on_error, backoff=backoff, sleep=slept.append,
    )  # fmt: skip
    assert errors == [("io-error", 1.0), ("io-error", 2.0), ("io-error", 3.0)]  # capped
    assert slept == [1.0, 2.0, 3.0, 10.0]  # no sleep after the last poll
    assert result is not None and result.version.number == 3
    assert local.read_bytes() == ckpts[3].read_bytes()


def test_follow_routes_around_a_corrupted_link(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    local.parent.mkdir()
    shutil.copyfile(ckpts[2], local)  # a node at version 2 with an empty cache
    corrupt_link(store, 2)  # the cheapest path 2 -> 3 is this link
    errors: list[str] = []
    result = chain.follow(
        store, local, interval=0.0, max_iterations=2,
        on_error=lambda exc, delay: errors.append(exc.category), sleep=lambda s: None,
    )  # fmt: skip
    assert errors == ["checksum-mismatch"]
    assert result is not None and result.version.number == 3
    assert [h.snapshot is not None for h in result.hops] == [True]
    assert local.read_bytes() == ckpts[3].read_bytes()


def follow_cli(store: Path, local: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WDELTA), "chain", "pull", str(store), str(local), "--follow", "--interval", "0",
         "--backoff-cap", "0.01", *extra],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip


def test_cli_follow_reports_each_failure_and_keeps_serving(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    local.parent.mkdir()
    shutil.copyfile(ckpts[2], local)  # a node at version 2 with an empty cache
    corrupt_link(store, 2)
    (store / chain.Chain(chain.LocalStorage(store)).head().snapshots[-1].files[0].key).unlink()
    result = follow_cli(store, local, "--max-iterations", "3")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 3, result.stderr
    assert lines[0].startswith("pull failed: checksum-mismatch: ")
    assert lines[1].startswith("pull failed: not-found: ")  # the snapshot route, tried next
    assert all("; retrying in 0.0 s" in line for line in lines[:2])
    assert lines[2].startswith("error: not-found: ")
    assert local.read_bytes() == ckpts[2].read_bytes()
    bad = follow_cli(store, local, "--backoff-cap", "-1", "--max-iterations", "1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: bad-argument: ")
