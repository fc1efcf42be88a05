"""``wdelta chain log``: who signed each stored revision, through a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from signkit import key, signed_chain
from wdelta import chain
from wdelta.chain.model.manifest import revision_key
from wdelta.chain.trust.updater import signature_key
from wdelta.format.digest import digest_bytes
from wdelta.limits import MAX_MANIFEST_BYTES

WDELTA = [sys.executable, "-m", "wdelta", "chain"]


def log(*args: str | Path, cwd: Path) -> list[str]:
    r = subprocess.run([*WDELTA, "log", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.splitlines()


def test_log_names_the_signers_of_every_revision(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)  # revisions 1 and 2 signed by alice
    s.publish_expired()  # revision 3: signed, already expired (a pull is frozen)
    alice = key("alice").public.keyid
    plain = chain.Chain(s.store, tmp_path / "pcache")  # a writer without a key
    chain.append(plain, s.next_checkpoint(), s.ckpts[2])
    # Revision 4 gets revision 3's signature object, moved: found, but it binds revision 3.
    storage = chain.open_storage(str(s.store))
    digests = [digest_bytes(storage.read(revision_key(r), MAX_MANIFEST_BYTES)) for r in (3, 4)]
    moved = s.store / signature_key(digests[1], alice)
    moved.parent.mkdir()
    shutil.copy(s.store / signature_key(digests[0], alice), moved)
    chain.append(plain, s.next_checkpoint(), s.ckpts[3])  # revision 5: no signature at all
    lines = log("store", "--trust", s.root, cwd=tmp_path)
    assert lines[-5:-2] == [
        f"revision {r} signed by {alice[:16]} (trust root version 1)" for r in (1, 2, 3)
    ]
    assert lines[-2].startswith("revision 4 INVALID: revision 4: 0 valid signatures"), lines
    assert lines[-1] == "revision 5 unsigned"
    lines = log("store", cwd=tmp_path)
    assert lines[-5:-1] == [
        f"revision {r} has signatures of {alice[:16]} (unverified: no --trust)"
        for r in (1, 2, 3, 4)
    ]
    assert lines[-1] == "revision 5 unsigned"


def test_log_of_an_unsigned_chain_is_unchanged_unless_asked(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)  # for its trust root and checkpoints only
    plain = chain.Chain(tmp_path / "plain", tmp_path / "pcache")
    chain.init(plain, s.ckpts[0])
    chain.append(plain, s.ckpts[1], s.ckpts[0])
    lines = log("plain", cwd=tmp_path)
    assert len(lines) == 2 + 2 and not any(line.startswith("revision 1") for line in lines)
    lines = log("plain", "--trust", s.root, cwd=tmp_path)
    assert lines[-2:] == ["revision 1 unsigned", "revision 2 unsigned"]
