"""Migrating a chain's trust root from format version 1 to 2 (SPEC §17.11).

A version-1 root has one key list and one threshold for roots and revisions alike; nodes
and writers refuse it (``unsupported-version``).  ``wdelta chain root NEW --previous V1``
writes its successor, a version-2 root signed by the new root role and by a threshold of
the version-1 keys, and ``wdelta chain rotate`` stores it after the chain's version-1 roots.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wdelta.chain.storage.local import LocalStorage
from wdelta.chain.trust.signing import canonical, load_signing_key
from wdelta.chain.trust.updater import Trust, read_root_file, root_key
from wdelta.errors import UnsupportedVersionError

FAR = "2099-01-01T00:00:00Z"


def _wdelta(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wdelta", *map(str, args)],
                          capture_output=True, text=True)  # fmt: skip


def _v1_root(key: Path, version: int, sign_with: Path | None = None) -> bytes:
    """A format-version-1 root of ``key`` (threshold 1), signed by ``sign_with``."""
    public = load_signing_key(key).public
    signed = {"format": "wdelta-trust-root", "version": version, "chain": "demo/run",
              "expires": FAR, "keys": {public.keyid: {"type": "ed25519",
                                                      "public": public.raw.hex()}},
              "threshold": 1}  # fmt: skip
    signer = load_signing_key(sign_with or key)
    sigs = [{"keyid": signer.public.keyid, "sig": signer.sign(canonical(signed))}]
    return json.dumps({"signed": signed, "signatures": sigs}).encode()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, role in (("old", None), ("root", "root"), ("rev", "revisions"),
                       ("other", None)):  # fmt: skip
        path = tmp_path / f"{name}.key"
        role_args = [] if role is None else ["--role", role]
        assert _wdelta("chain", "keygen", *role_args, path).returncode == 0
        out[name] = path
    return out


def test_a_version_1_root_is_migrated_and_stored_after_its_chain_roots(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    store = tmp_path / "chain"
    v1 = _v1_root(keys["old"], 3)
    (store / "trust").mkdir(parents=True)
    (store / root_key(3)).write_bytes(v1)
    (tmp_path / "v1.json").write_bytes(v1)
    with pytest.raises(UnsupportedVersionError):
        read_root_file(tmp_path / "v1.json")  # never a node's trust file
    new = tmp_path / "v2.json"
    base = ["chain", "root", new, "--previous", tmp_path / "v1.json", "--root-key",
            f"{keys['root']}.pub", "--revision-key", f"{keys['rev']}.pub"]  # fmt: skip
    refused = _wdelta(*base, "--sign", keys["root"])
    assert refused.returncode != 0 and not new.exists()
    assert refused.stderr.strip().splitlines()[-1].startswith("error: signature-invalid:")
    made = _wdelta(*base, "--sign", keys["root"], "--sign", keys["old"])
    assert made.returncode == 0, made.stderr
    root = read_root_file(new)
    assert (root.version, root.chain) == (4, "demo/run")
    assert root.revisions.keyids == (load_signing_key(keys["rev"]).public.keyid,)
    stored = _wdelta("chain", "rotate", store, new)
    assert stored.returncode == 0, stored.stderr
    assert (store / root_key(4)).read_bytes() == new.read_bytes()
    assert Trust.from_file(new).update(LocalStorage(store)).version == 4


def test_a_forged_version_1_root_migrates_nothing(tmp_path: Path, keys: dict[str, Path]) -> None:
    """The version-1 root must be signed by its own keys, and the new root by them."""
    forged = tmp_path / "forged.json"
    forged.write_bytes(_v1_root(keys["old"], 1, sign_with=keys["other"]))
    genuine = tmp_path / "v1.json"
    genuine.write_bytes(_v1_root(keys["old"], 1))
    for previous, signer in ((forged, keys["old"]), (genuine, keys["other"])):
        new = tmp_path / "v2.json"
        result = _wdelta("chain", "root", new, "--previous", previous, "--root-key",
                         f"{keys['root']}.pub", "--revision-key", f"{keys['rev']}.pub",
                         "--sign", keys["root"], "--sign", signer)  # fmt: skip
        assert result.returncode != 0 and not new.exists()
        assert result.stderr.strip().splitlines()[-1].startswith("error: signature-invalid:")
