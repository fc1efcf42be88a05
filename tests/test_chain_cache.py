"""The pull cache's size: ``chain gc`` (entries the head no longer names, then
least recently used), ``pull --cache-max-bytes``, and pins that keep what a
running pull needs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import wdelta
from chainkit import folder_history
from wdelta import chain
from wdelta.chain.reading import cachegc

WDELTA = Path(sys.executable).parent / "wdelta"
ENV = {k: v for k, v in os.environ.items() if k != "WDELTA_CACHE"}
ENV["PYTHONPATH"] = str(Path(wdelta.__file__).resolve().parent.parent)


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder chain of versions 0..3 (snapshot at 0)."""
    return folder_history(tmp_path, 32, 256, snapshots=())


def cache_bytes(cache: Path) -> int:
    return sum(e.size for e in cachegc.entries(cache))


def test_gc_drops_unnamed_then_least_recently_used(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, _ = history
    cache = tmp_path / "cache"
    c = chain.Chain(chain.LocalStorage(store), cache)
    chain.pull(c, tmp_path / "n" / "m.safetensors", to=3)
    stray = cache / "objects" / ("0" * 64)
    stray.write_bytes(b"x" * 100)  # named by no manifest
    m = c.head()
    links = {k.digest: k.size for k in m.links}
    for age, digest in enumerate(sorted(links)):  # oldest use: the first sorted digest
        os.utime(cache / "objects" / digest, (1000.0 + age, 1000.0 + age))
    limit = cache_bytes(cache) - 100 - min(links.values())
    oldest = sorted(links)[0]
    r = chain.gc_chain(c, limit)
    assert stray in r.removed
    assert cache / "objects" / oldest in r.removed  # least recently used goes first
    assert r.kept == cache_bytes(cache) <= limit
    assert chain.gc_chain(c).removed == []  # nothing unnamed left
    everything = chain.gc_chain(c, 0)
    assert cache_bytes(cache) == 0 and everything.kept == 0


def test_cache_hit_refreshes_last_use(history: tuple[Path, list[Path]], tmp_path: Path) -> None:
    store, _ = history
    c = chain.Chain(chain.LocalStorage(store), tmp_path / "cache")
    link = c.head().links[0]
    path = c.fetch(link.key, link.size, link.digest, "blake3")
    os.utime(path, (1000.0, 1000.0))
    assert c.fetch(link.key, link.size, link.digest, "blake3") == path
    assert path.stat().st_mtime > 1000.0


def test_pins_of_running_pulls_survive_and_dead_ones_are_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "objects").mkdir(parents=True)
    for name in ("a" * 64, "b" * 64):
        (cache / "objects" / name).write_bytes(b"data")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (cache / "pins").mkdir()
    (cache / "pins" / f"{dead.stdout.strip()}-x.json").write_text(f'["{"b" * 64}"]')
    with cachegc.pin(cache, {"a" * 64}):
        r = cachegc.gc(cache, None, 0)
    assert [p.name for p in r.removed] == ["b" * 64] and r.kept == 4
    assert list((cache / "pins").iterdir()) == []


class GcDuringPull(chain.LocalStorage):
    """Runs a gc down to 0 bytes while the pull streams its last link."""

    def __init__(self, root: Path, cache: Path, last_link: str) -> None:
        super().__init__(root)
        self.cache, self.last_link = cache, last_link
        self.removed: list[Path] = []

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        if key == self.last_link:
            self.removed += cachegc.gc(self.cache, None, 0).removed
        yield from super().stream(key, start)


def test_gc_never_removes_what_a_running_pull_needs(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    cache = tmp_path / "cache"
    m = chain.Chain(chain.LocalStorage(store)).head()
    (cache / "objects").mkdir(parents=True)
    (cache / "objects" / ("f" * 64)).write_bytes(b"old")  # not in this pull's plan
    st = GcDuringPull(store, cache, m.links[-1].key)
    local = tmp_path / "n" / "m.safetensors"
    r = chain.pull(chain.Chain(st, cache), local)
    assert len(r.hops) == 4  # snapshot 0, then links 0->1, 1->2, 2->3
    assert [p.name for p in st.removed] == ["f" * 64]
    assert local.read_bytes() == ckpts[3].read_bytes()


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WDELTA), "chain", *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=300)  # fmt: skip


def test_cli_cache_limit_and_gc(history: tuple[Path, list[Path]], tmp_path: Path) -> None:
    store, ckpts = history
    cache = tmp_path / "cache"
    local = tmp_path / "n" / "m.safetensors"
    limit = 20_000
    r = run("pull", store, local, "--cache", cache, "--cache-max-bytes", limit)
    assert r.returncode == 0, r.stderr
    assert local.read_bytes() == ckpts[3].read_bytes()
    assert 0 < cache_bytes(cache) <= limit
    r = run("gc", store, "--cache", cache, "--max-bytes", 0)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removed ") and r.stdout.endswith("; cache holds 0 bytes\n")
    assert cache_bytes(cache) == 0
    r = run("gc", store)
    assert r.returncode == 2 and r.stderr.startswith("error: bad-argument: ")
    r = run("gc", store, "--cache", cache, "--max-bytes", -1)
    assert r.returncode == 2 and r.stderr.startswith("error: bad-argument: ")
