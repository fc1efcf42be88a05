"""``wdelta chain check-storage``: a sound store passes (local folder, loopback S3),
stores that break ST-1, ST-2 or ST-3 are caught, and the key prefix is always
cleaned up (after a failure and after Ctrl-C)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import wdelta
from chainkit import S3Server
from wdelta.chain.storage.base import ObjectInfo, Progress
from wdelta.chain.storage.checkstore import check_storage
from wdelta.chain.storage.local import LocalStorage

WDELTA = Path(sys.executable).parent / "wdelta"
TESTS = Path(__file__).resolve().parent
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(wdelta.__file__).resolve().parent.parent), str(TESTS)]),
}


class RacyCreate(LocalStorage):
    """Create-only write as check-then-write: two writers can both see the key absent."""

    def create(self, key: str, data: bytes) -> bool:
        if self.stat(key) is not None:
            return False
        time.sleep(0.05)  # widen the window between the check and the write
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "data").write_bytes(data)
            self.put_file(key, Path(tmp) / "data")
        return True


class StaleList(LocalStorage):
    """A listing that lags one call behind (an eventually consistent index)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.previous: list[ObjectInfo] = []

    def list(self, prefix: str) -> list[ObjectInfo]:
        now = super().list(prefix)
        stale, self.previous = self.previous, now
        return [o for o in stale if o.key.startswith(prefix)]


class ShortRange(LocalStorage):
    """A ranged read that silently returns fewer bytes near the end of an object."""

    def read_range(self, key: str, start: int, length: int) -> bytes:
        size = self.stat(key)
        end = min(start + length, size.size if size else 0)
        with open(self.root / key, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))


class Interrupted(LocalStorage):
    """Ctrl-C arrives during the ranged-read check."""

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        super().put_file(key, path, progress)
        if "st3" in key:
            raise KeyboardInterrupt


def objects(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def verdicts(store: type[LocalStorage], root: Path) -> dict[str, bool]:
    report = check_storage(lambda: store(root), writers=6, rounds=2)
    assert report.leftover is None
    assert objects(root) == [] and not any(root.iterdir())
    return {r.rule: r.passed for r in report.results}


def test_local_folder_passes(tmp_path: Path) -> None:
    (tmp_path / "keep").write_bytes(b"not ours")
    report = check_storage(lambda: LocalStorage(tmp_path), writers=4, rounds=2)
    assert report.passed, report
    assert [r.rule for r in report.results] == ["ST-1", "ST-2", "ST-3"]
    assert objects(tmp_path) == [tmp_path / "keep"]  # only the prefix is removed


@pytest.mark.parametrize(
    ("store", "broken"),
    [(RacyCreate, "ST-1"), (StaleList, "ST-2"), (ShortRange, "ST-3")],
)
def test_broken_store_is_caught(tmp_path: Path, store: type[LocalStorage], broken: str) -> None:
    got = verdicts(store, tmp_path)
    assert got == {rule: rule != broken for rule in ("ST-1", "ST-2", "ST-3")}


def test_cleanup_after_interrupt(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        check_storage(lambda: Interrupted(tmp_path), writers=2, rounds=1)
    assert objects(tmp_path) == [] and not any(tmp_path.iterdir())


def cli(*args: str, env: dict[str, str] = ENV) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WDELTA), "chain", "check-storage", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_cli_local_and_json(tmp_path: Path) -> None:
    result = cli(str(tmp_path / "store"), "--writers", "3", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["ST-1 PASS", "ST-2 PASS", "ST-3 PASS"]
    result = cli(str(tmp_path / "store"), "--json", "--writers", "3", "--rounds", "1")
    doc = json.loads(result.stdout)
    assert doc["passed"] is True and doc["leftover"] is None
    assert [r["rule"] for r in doc["rules"]] == ["ST-1", "ST-2", "ST-3"]
    assert objects(tmp_path / "store") == []
    result = cli(str(tmp_path / "store"), "--writers", "1")
    assert result.returncode == 2 and result.stderr.startswith("error: bad-argument: ")


def test_cli_fails_on_racy_store(tmp_path: Path) -> None:
    code = (
        "import sys, test_chain_checkstore as t, wdelta.cli.chain as c; "
        "c.open_storage = t.RacyCreate; "
        "from wdelta.cli import run; sys.exit(run(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "chain", "check-storage", str(tmp_path), "--writers", "4"],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("ST-1 FAIL: round 1: ") and "of 4 creates won" in first
    assert objects(tmp_path) == []



def test_cli_loopback_s3(s3: S3Server) -> None:
    bucket = s3.new_bucket()
    env = {
        **ENV, "AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    }  # fmt: skip
    result = cli(f"s3://{bucket}/fleet", "--writers", "4", "--rounds", "2", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line[:9] for line in result.stdout.splitlines()] == [
        "ST-1 PASS",
        "ST-2 PASS",
        "ST-3 PASS",
    ]
    assert s3.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_hub_repo_backend_passes_and_is_cleaned() -> None:
    pytest.importorskip("huggingface_hub")
    from storekit import FakeHub
    from wdelta.chain.storage.hf import HfStorage, parse_hf_url

    url = "hf://me/model/chain"
    hub = FakeHub(parse_hf_url(url).fs_root)
    report = check_storage(lambda: HfStorage(url, api=hub, fs=hub), writers=4, rounds=2)
    assert report.passed, report
    assert hub.files == {}
