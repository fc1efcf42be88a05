"""``--max-age`` / ``max_age=`` (SPEC.md §17.7 "Freshness"): a head published longer ago
than the max age is refused as ``frozen``, the node keeping its version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainkit import Trainer
from wdelta import chain
from wdelta.chain.trust import freshness
from wdelta.errors import WdeltaError

STALE = "2020-01-01T00:00:00Z"
WDELTA = [sys.executable, "-m", "wdelta", "chain"]


def make_chain(tmp: Path, versions: int = 2) -> list[Path]:
    """A local chain at ``tmp/store`` of ``versions`` versions; their checkpoints."""
    t = Trainer(rows=16, cols=64)
    ckpts = [t.save(tmp / "c0.safetensors")]
    c = chain.Chain(tmp / "store", tmp / "wcache")
    chain.init(c, ckpts[0])
    for n in range(1, versions):
        t.step(n)
        ckpts.append(t.save(tmp / f"c{n}.safetensors"))
        chain.append(c, ckpts[n], ckpts[n - 1])
    return ckpts


def set_head_updated(store: Path, updated: str | None) -> None:
    """Rewrite the head revision's ``updated`` (None: remove it), as a stalled trainer's
    old revision, or one written without it, would read."""
    head = sorted((store / "manifests").glob("rev-*.json"))[-1]
    doc = json.loads(head.read_text())
    doc.pop("updated", None)
    if updated is not None:
        doc["updated"] = updated
    head.write_text(json.dumps(doc, indent=2) + "\n")


def wd(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WDELTA, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)  # fmt: skip


@given(st.integers(1, 10**6), st.sampled_from(["", "s", "m", "h", "d"]))
def test_durations_parse_to_seconds(n: int, unit: str) -> None:
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert freshness.parse_duration(f"{n}{unit}") == n * scale


@pytest.mark.parametrize("text", ["", "0", "0s", "-5m", "1w", "h", "1.5.2h", "inf", "nan", "5 m"])
def test_bad_durations_are_bad_arguments(text: str) -> None:
    with pytest.raises(WdeltaError) as info:
        freshness.parse_duration(text)
    assert info.value.category == "bad-argument"


def test_api_refuses_a_stale_head_and_keeps_the_node(tmp_path: Path) -> None:
    ckpts = make_chain(tmp_path, 3)
    node = tmp_path / "node" / "m.safetensors"
    node.parent.mkdir()
    store = tmp_path / "store"
    # state=False: the edit below rewrites the head, which RD-1 would refuse first
    assert chain.pull(store, node, to=1, max_age=3600, state=False).version.number == 1
    set_head_updated(store, STALE)
    for call in (
        lambda: chain.pull(store, node, max_age=3600),
        lambda: chain.load(chain.Chain(store, tmp_path / "lcache"), max_age=3600),
    ):
        with pytest.raises(WdeltaError) as info:
            call()
        assert info.value.category == "frozen" and STALE in str(info.value)
    assert node.read_bytes() == ckpts[1].read_bytes()
    set_head_updated(store, None)  # no time at all: the age is unknown, refused too
    with pytest.raises(WdeltaError) as info:
        chain.pull(store, node, max_age=10**9)
    assert info.value.category == "frozen" and "no valid 'updated'" in str(info.value)
    assert chain.pull(store, node).version.number == 2  # without a max age, as before
    with pytest.raises(WdeltaError) as info:
        chain.pull(store, node, max_age=0)
    assert info.value.category == "bad-argument"


def test_follow_weights_reports_frozen_each_poll_and_keeps_the_weights(tmp_path: Path) -> None:
    make_chain(tmp_path, 2)
    store = tmp_path / "store"
    weights, v0 = chain.load(chain.Chain(store, tmp_path / "lc"), to=0)
    before = {k: v.copy() for k, v in weights.items()}
    set_head_updated(store, STALE)
    seen: list[str] = []
    follower = chain.follow_weights(
        chain.Chain(store, tmp_path / "fc"), weights, at=v0.number, interval=0, max_polls=3,
        backoff=(0.0, 0.0), on_error=lambda e, n: seen.append(e.category), max_age=60,
    )  # fmt: skip
    assert list(follower) == [] and seen == ["frozen"] * 3
    assert all((weights[k] == before[k]).all() for k in before)


def test_cli_max_age(tmp_path: Path) -> None:
    ckpts = make_chain(tmp_path, 2)
    r = wd("pull", "store", "fresh.safetensors", "--max-age", "1h", cwd=tmp_path)
    assert r.returncode == 0 and "version 1" in r.stdout, r.stderr
    set_head_updated(tmp_path / "store", STALE)
    r = wd("pull", "store", "new.safetensors", "--max-age", "7d", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("error: frozen: "), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "new.safetensors").exists()
    old = tmp_path / "old.safetensors"
    old.write_bytes(ckpts[0].read_bytes())
    r = wd("pull", "store", old, "--max-age", "30m", "--follow", "--interval", "0",
           "--max-iterations", "3", "--backoff-cap", "0.01", cwd=tmp_path)  # fmt: skip
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and lines[-1].startswith("error: frozen: "), r.stderr
    assert sum(line.startswith("pull failed: frozen: ") for line in lines) == 2, r.stderr
    assert old.read_bytes() == ckpts[0].read_bytes()
    r = wd("refresh", "store", cwd=tmp_path)  # an unsigned trainer's "still alive"
    assert r.returncode == 0 and "(unsigned)" in r.stdout, r.stderr
    r = wd("pull", "store", old, "--max-age", "30m", cwd=tmp_path)
    assert r.returncode == 0 and old.read_bytes() == ckpts[1].read_bytes(), r.stderr
    for bad in ("0", "soon", "-1h"):
        r = wd("pull", "store", old, "--max-age", bad, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith("error: bad-argument: "), r.stderr
