"""``wdelta chain`` maintenance and wording through a real subprocess:
``prune --dry-run`` removes nothing and names exactly what ``prune`` then
removes; counts of one are singular ("1 hop")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import wdelta
from chainkit import folder_history
from kit import tree_hashes

WDELTA = Path(sys.executable).parent / "wdelta"
ENV = {**os.environ, "PYTHONPATH": str(Path(wdelta.__file__).resolve().parent.parent)}


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WDELTA), "chain", *map(str, args)], capture_output=True, text=True, env=ENV,
        timeout=300,
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder chain of versions 0..4 (snapshots at 0 and 4) and the checkpoints."""
    return folder_history(tmp_path, 32, 128, last=4, snapshots=(4,))


def test_prune_dry_run_removes_nothing(store: tuple[Path, list[Path]]) -> None:
    root, _ = store
    before = tree_hashes(root)
    policy = ("--snapshot-every", "10", "--keep-links", "1", "--keep-revisions", "2")
    dry = run("prune", root, *policy, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert tree_hashes(root) == before
    lines = dry.stdout.splitlines()
    kept = "3 versions, 1 link, 2 snapshots"
    assert lines[0] == f"dry run: revision 6 would keep {kept}; would delete 7 files"
    would = {line.strip() for line in lines[1:]}
    assert len(would) == 7 and sum(k.startswith("deltas/") for k in would) == 3
    real = run("prune", root, *policy)
    assert real.returncode == 0, real.stderr
    assert real.stdout == f"revision 6: kept {kept}; deleted 7 files\n"
    gone = set(before) - set(tree_hashes(root))
    assert gone == would


def test_one_hop_is_singular(store: tuple[Path, list[Path]], tmp_path: Path) -> None:
    root, ckpts = store
    local = tmp_path / "node" / "m.safetensors"
    assert run("pull", root, local, "--to", "3").returncode == 0
    result = run("pull", root, local)
    assert result.returncode == 0, result.stderr
    assert "(revision 5, 1 hop, " in result.stdout
    assert local.read_bytes() == ckpts[4].read_bytes()
