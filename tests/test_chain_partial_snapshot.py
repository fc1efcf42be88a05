"""A partial pull from nothing reads only its share of a snapshot: a link header
(to prove the version's tensor list), the safetensors headers and the matching
tensors' byte ranges, each checked against its tensor digest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainkit import Trainer, folder_history
from wdelta import chain
from wdelta.chain.reading import partial
from wdelta.chain.storage.base import Storage
from wdelta.errors import WdeltaError


class Counting(chain.LocalStorage):
    """Counts every byte read (ranged or streamed)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.read_bytes = 0

    def read_range(self, key: str, start: int, length: int) -> bytes:
        self.read_bytes += length
        return super().read_range(key, start, length)

    def stream(self, key: str, start: int = 0) -> Iterator[bytes]:
        for block in super().stream(key, start):
            self.read_bytes += len(block)
            yield block


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Versions 0..2 of three 512 KiB bf16 layers; a snapshot of version 0 only."""
    return folder_history(tmp_path, 256, 1024, last=2, snapshots=())


def expected(ckpt: Path, pattern: str, digest: str, out: Path) -> bytes:
    partial.extract(ckpt, pattern, digest, out)
    return out.read_bytes()


def pull_share(store: Storage, tmp_path: Path, name: str, to: int) -> tuple[Path, int]:
    local = tmp_path / name / "rank.safetensors"
    result = chain.pull(chain.Chain(store, tmp_path / f"{name}-cache"), local, to=to,
                        tensors="layer0.*,step")  # fmt: skip
    return local, result.downloaded


def test_partial_from_nothing_fetches_its_share(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root, ckpts = history
    store = Counting(root)
    local, downloaded = pull_share(store, tmp_path, "a", to=0)
    m = chain.Chain(chain.LocalStorage(root)).head()
    want = expected(ckpts[0], "layer0.*,step", m.versions[0].digest, tmp_path / "want0")
    assert local.read_bytes() == want
    share = 256 * 1024 * 2 + 8  # layer0 in bf16, and the int64 step
    snapshot = m.snapshots[0].size
    assert downloaded <= store.read_bytes <= downloaded + 4096  # plus the manifest
    assert share <= store.read_bytes < share + 64 * 1024 < snapshot / 2
    assert not (tmp_path / "a-cache" / "objects").exists() or not any(
        (tmp_path / "a-cache" / "objects").iterdir()
    )
    store.read_bytes = 0
    local, _ = pull_share(store, tmp_path, "b", to=2)  # snapshot share, then two links
    want = expected(ckpts[2], "layer0.*,step", m.versions[2].digest, tmp_path / "want2")
    assert local.read_bytes() == want
    assert store.read_bytes < snapshot / 2


def flip(root: Path, key: str, offset: int) -> None:
    path = root / key
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupted_share_is_refused_and_other_bytes_are_not_read(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    root, _ = history
    m = chain.Chain(chain.LocalStorage(root)).head()
    key = m.snapshots[0].files[0].key
    with open(root / key, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        layout = json.loads(f.read(n))
    data_start = 8 + n
    flip(root, key, data_start + layout["layer2.weight"]["data_offsets"][0] + 7)
    local, _ = pull_share(chain.LocalStorage(root), tmp_path, "ok", to=0)  # layer2 not read
    assert local.exists()
    flip(root, key, data_start + layout["layer0.weight"]["data_offsets"][0] + 7)
    bad = tmp_path / "bad" / "rank.safetensors"
    with pytest.raises(WdeltaError) as info:
        chain.pull(chain.Chain(chain.LocalStorage(root), tmp_path / "bad-cache"), bad, to=0,
                   tensors="layer0.*")  # fmt: skip
    assert info.value.category == "checksum-mismatch"
    assert not bad.exists()


def test_single_version_chain_falls_back_to_the_whole_snapshot(tmp_path: Path) -> None:
    ck = Trainer(rows=16, cols=64).save(tmp_path / "ck0.safetensors")
    c = chain.Chain(chain.LocalStorage(tmp_path / "store"), tmp_path / "w")
    m = chain.init(c, ck, step=0)
    local, downloaded = pull_share(chain.LocalStorage(tmp_path / "store"), tmp_path, "n", to=0)
    assert downloaded == m.snapshots[0].size  # no link proves the tensor list: whole file
    assert local.read_bytes() == expected(
        ck, "layer0.*,step", m.versions[0].digest, tmp_path / "w0"
    )
