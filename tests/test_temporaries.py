"""Temporary files: named for their output and owner, removed on SIGTERM/SIGHUP,
and removed by the next run when their process died without cleaning up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import wdelta
from kit import RawTensor, leftovers, random_words, safetensors_bytes, tree_hashes
from test_cli import ENV, WDELTA
from wdelta.io import atomic


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporary_names_say_what_and_whose(tmp_path: Path) -> None:
    name = atomic.temp_name("model.safetensors")
    assert name.startswith(".model.safetensors.wdelta-tmp-")
    assert f"-{atomic.host_tag()}-{os.getpid()}-" in name
    long = atomic.temp_name("é" * 127 + "x")  # 255 bytes of UTF-8
    assert len(os.fsencode(long)) <= 255
    (tmp_path / long).touch()  # a valid file name


def test_host_tags_of_changed_names_carry_a_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = {}
    for name in ("node-1", "node_1", "n" * 40 + "a", "n" * 40 + "b"):
        monkeypatch.setattr(atomic.socket, "gethostname", lambda name=name: name)
        atomic.host_tag.cache_clear()
        tags[name] = atomic.host_tag()
    atomic.host_tag.cache_clear()
    assert tags["node_1"] == "node_1"
    assert len(set(tags.values())) == 4
    assert all(re.fullmatch(r"\w{1,41}", tag) for tag in tags.values())


def test_stale_temporaries_of_dead_local_processes_are_removed(tmp_path: Path) -> None:
    host, dead = atomic.host_tag(), _dead_pid()
    stale_file = f".a.wdelta-tmp-{host}-{dead}-{'0' * 16}"
    stale_dir = f".b.wdelta-tmp-{host}-{dead}-{'1' * 16}"
    keep = [
        f".c.wdelta-tmp-{host}-{os.getpid()}-{'2' * 16}",  # a live process (this one)
        f".d.wdelta-tmp-other_host-{dead}-{'3' * 16}",  # another host on a shared folder
        f".e.wdelta-tmp-{host}-{dead}-xyz",  # not our pattern
        f".f.wdelta-tmp-{host}-0-{'4' * 16}",  # not a process ID
        "a.safetensors",
    ]
    (tmp_path / stale_file).write_bytes(b"x")
    (tmp_path / stale_dir).mkdir()
    (tmp_path / stale_dir / "shard").write_bytes(b"x")
    for name in keep:
        (tmp_path / name).write_bytes(b"x")
    assert sorted(atomic.remove_stale(tmp_path)) == [stale_file, stale_dir]
    assert sorted(os.listdir(tmp_path)) == sorted(keep)


def _tensors(seed: int, n: int) -> dict[str, RawTensor]:
    out = {}
    for i in range(8):
        words = random_words(np.random.default_rng(i), 2, n)
        words[seed::97] ^= np.uint16(seed)
        out[f"w{i}"] = RawTensor("BF16", (n,), words.tobytes())
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("temporaries")
    (root / "b.safetensors").write_bytes(safetensors_bytes(_tensors(0, 1 << 19)))
    (root / "t.safetensors").write_bytes(safetensors_bytes(_tensors(1, 1 << 19)))
    return root / "b.safetensors", wdelta.diff(root / "b.safetensors", root / "t.safetensors",
                                               root / "d.wdelta")  # fmt: skip


def test_next_run_removes_what_a_killed_run_left(pair: tuple[Path, Path], tmp_path: Path) -> None:
    base, delta = pair
    stale = tmp_path / f".out.wdelta-tmp-{atomic.host_tag()}-{_dead_pid()}-{'a' * 16}"
    stale.write_bytes(b"half a checkpoint")
    wdelta.apply(base, delta, tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_signal_mid_write_removes_the_temporary(
    pair: tuple[Path, Path], tmp_path: Path, sig: signal.Signals
) -> None:
    """The signal is sent once the temporary exists (retried if the run was too quick)."""
    base, delta = pair
    before = tree_hashes(delta.parent)
    for attempt in range(5):
        out = tmp_path / str(attempt) / "r.safetensors"
        out.parent.mkdir()
        # The child starts with the signal at its default action even when this run
        # ignores it (a suite started under nohup ignores SIGHUP, and wdelta, like
        # any program, leaves an inherited "ignore" alone).
        proc = subprocess.Popen(
            [str(WDELTA), "apply", str(base), str(delta), "-o", str(out), "-q"],
            stderr=subprocess.PIPE, text=True, env=ENV,
            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
        )  # fmt: skip
        while proc.poll() is None and not leftovers(out.parent):
            time.sleep(0.001)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            break
    assert proc.returncode == 128 + sig, err
    assert err.splitlines() == [f"error: interrupted ({sig.name})"]
    assert os.listdir(out.parent) == []
    assert tree_hashes(delta.parent) == before


def test_a_signal_during_creation_is_raised_after_it() -> None:
    """The window between creating a temporary and recording it for cleanup is closed."""
    from wdelta.io import interrupts

    done, before = [], signal.getsignal(signal.SIGTERM)
    with interrupts.as_exceptions(), pytest.raises(interrupts.Interrupted) as caught:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler has run by now, in this thread
            done.append("recorded")
        done.append("not reached")
    assert done == ["recorded"] and caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
