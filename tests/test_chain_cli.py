"""``wdelta chain ...`` end to end on a local-folder chain: output, exit codes and
``error: CATEGORY: message`` lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chainkit import Trainer
from wdelta import cli


def run(capsys: Any, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, str]:
    code = cli.run(["chain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_round_trip(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Trainer(rows=32, cols=64)
    ck = [t.save(tmp_path / "c0.safetensors")]
    store = str(tmp_path / "store")
    code, out, _ = run(capsys, monkeypatch, "init", store, str(ck[0]), "--step", "0",
                       "--meta", "run=a")  # fmt: skip
    assert code == 0 and "version 0" in out
    for n in (1, 2, 3):
        t.step(n)
        ck.append(t.save(tmp_path / f"c{n}.safetensors"))
        code, out, err = run(capsys, monkeypatch, "append", store, str(ck[n]), "--base",
                             str(ck[n - 1]), "--step", str(n))  # fmt: skip
        assert code == 0, err
        assert f"version {n}" in out
    code, out, _ = run(capsys, monkeypatch, "log", store)
    assert code == 0 and len(out.splitlines()) == 2 + 4
    code, out, _ = run(capsys, monkeypatch, "log", store, "--json")
    doc = json.loads(out)
    assert doc["revision"] == 4 and doc["versions"][0]["metadata"] == {"run": "a"}
    local = tmp_path / "node" / "m.safetensors"
    code, out, _ = run(capsys, monkeypatch, "pull", store, str(local), "--to", "step:2")
    assert code == 0 and "version 2" in out
    assert local.read_bytes() == ck[2].read_bytes()
    code, out, _ = run(capsys, monkeypatch, "pull", store, str(local), "--follow",
                       "--interval", "0", "--max-iterations", "2")  # fmt: skip
    assert code == 0 and local.read_bytes() == ck[3].read_bytes()
    part = tmp_path / "node" / "p.safetensors"
    code, _, err = run(capsys, monkeypatch, "pull", store, str(part), "--tensors", "layer0.*")
    assert code == 0, err
    code, out, _ = run(capsys, monkeypatch, "squash", store, "--from", "1", "--base", str(ck[1]))
    assert code == 0 and "link 1->3" in out
    code, out, _ = run(capsys, monkeypatch, "verify", store, "--deep")
    assert code == 0 and out.startswith("ok: revision 5")
    code, out, _ = run(capsys, monkeypatch, "prune", store, "--snapshot-every", "5",
                       "--keep-links", "1")  # fmt: skip
    assert code == 0 and out.startswith("revision 6: kept 4 versions")


def test_cli_errors(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = str(tmp_path / "store")
    code, _, err = run(capsys, monkeypatch, "log", store)
    assert code == 1 and err.startswith("error: not-found: ")
    code, _, err = run(capsys, monkeypatch, "prune", store, "--snapshot-every", "0",
                       "--keep-links", "1")  # fmt: skip
    assert code == 2 and err.startswith("error: bad-argument: ")
    code, _, err = run(capsys, monkeypatch, "init", store, str(tmp_path / "c.safetensors"),
                       "--meta", "novalue")  # fmt: skip
    assert code == 2 and err.startswith("error: bad-argument: ")
    code, _, err = run(capsys, monkeypatch, "frobnicate")
    assert code == 2 and err.startswith("error: bad-argument: ")
    ck = Trainer(rows=8, cols=8).save(tmp_path / "c.safetensors")
    assert run(capsys, monkeypatch, "init", store, str(ck))[0] == 0
    code, _, err = run(capsys, monkeypatch, "init", store, str(ck))
    assert code == 1 and err.startswith("error: conflict: ")
    code, _, err = run(capsys, monkeypatch, "pull", store, str(tmp_path / "n"), "--to", "7")
    assert code == 1 and err.startswith("error: not-found: ")
