"""RD-1 across restarts: a node that accepted revision r refuses storage rolled back
below r, or revision r rewritten, also after a restart (the state file beside
its checkpoint), through the API, ``pull``, ``pull --follow`` (killed and
restarted) and ``follow_weights``; a damaged state file is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from chainkit import folder_history
from wdelta import chain
from wdelta.chain.model.manifest import Manifest, revision_key
from wdelta.chain.trust import acceptance
from wdelta.chain.trust.acceptance import Accepted, Tracker
from wdelta.errors import WdeltaError
from wdelta.format.digest import digest_bytes

WDELTA = Path(sys.executable).parent / "wdelta"
ENV = {**os.environ, "PYTHONPATH": str(Path(wdelta.__file__).resolve().parent.parent)}
HEX = st.text("0123456789abcdef", min_size=64, max_size=64)


def _d(label: str) -> str:
    return digest_bytes(label.encode())


# ------------------------------------------------------------ the rule


def test_check_refuses_lower_rewritten_and_forked_heads() -> None:
    acc = Accepted(5, _d("r5"))
    stored = {5: _d("r5")}.get
    acceptance.check(acc, 5, _d("r5"), (4, _d("r4")), stored)  # the same revision again
    acceptance.check(acc, 6, _d("r6"), (5, _d("r5")), stored)  # its successor
    acceptance.check(acc, 9, _d("r9"), (8, _d("r8")), stored)  # later, r5 still the same
    acceptance.check(acc, 9, _d("r9"), (8, _d("r8")), lambda r: None)  # r5 pruned meanwhile
    acceptance.check(None, 1, _d("r1"), None, stored)  # nothing accepted yet
    refused = {
        "rolled back": (4, _d("r4"), (3, _d("r3")), stored),
        "forked": (5, _d("other"), (4, _d("r4")), stored),
        "forked ": (6, _d("r6"), (5, _d("other")), stored),
        " forked": (9, _d("r9"), (8, _d("r8")), {5: _d("other")}.get),
    }
    for word, (revision, digest, parent, digests) in refused.items():
        with pytest.raises(chain.ManifestInvalidError) as info:
            acceptance.check(acc, revision, digest, parent, digests, "delete it")
        text = str(info.value)
        assert word.strip() in text and "revision 5" in text and text.endswith("; delete it")
        assert f"revision {revision}" in text


@given(revision=st.integers(1, 10**12 - 1), digest=HEX, where=st.text(max_size=40))
@settings(max_examples=50, deadline=None)
def test_state_round_trips(tmp_path_factory: pytest.TempPathFactory, revision: int,
                           digest: str, where: str) -> None:  # fmt: skip
    path = tmp_path_factory.mktemp("state") / "s.json"
    acceptance.save(path, Accepted(revision, digest, where))
    assert acceptance.load(path) == Accepted(revision, digest, where)
    assert not [p for p in path.parent.iterdir() if p != path]  # no temporary left


@given(data=st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_damaged_state_is_refused_by_name(data: bytes) -> None:
    try:
        acceptance.parse(data, Path("node/.m.wdelta-accepted.json"))
    except WdeltaError as exc:
        assert exc.category == "bad-argument"
        assert str(exc).startswith("node/.m.wdelta-accepted.json: not a usable acceptance state")


GOOD = Accepted(3, _d("r3"), "store").to_bytes()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not strict JSON"),
        (b"[1]", "format"),
        (GOOD.replace(b'"revision": 3', b'"revision": 0'), "schema violation"),
        (GOOD.replace(b'"revision": 3', b'"revision": 3.0'), "schema violation"),
        (GOOD.replace(b'"revision": 3', b'"revision": 3, "revision": 9'), "duplicate"),
        (GOOD.replace(b'"revision": 3', b'"revision": NaN'), "not strict JSON"),
        (GOOD.replace(b'"digest": "', b'"digest": "A'), "schema violation"),
        (GOOD.replace(b'"version": 2', b'"version": 3'), "schema violation"),
        (GOOD.replace(b'"revision": 3', b'"revision": 3, "trust": {"chain": "c", "root": 1, '
                      b'"signers": []}'), "schema violation"),
        (GOOD.replace(b'"version": 2', b'"version": 1').replace(
            b'"revision": 3', b'"revision": 3, "trust": {"chain": "c", "root": 1, "signers": ["'
            + b"a" * 64 + b'"]}'), "schema violation"),  # trust in a version-1 state
        (GOOD.replace(b"store", b"st\xffre"), "not strict JSON"),
        (b"[" * 100 + b"]" * 100, "not strict JSON"),
        (b" " * (acceptance.MAX_STATE_BYTES + 1), "bytes"),
    ],
)
def test_hostile_state_files(tmp_path: Path, data: bytes, why: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(data)
    with pytest.raises(wdelta.BadArgumentError) as info:
        acceptance.load(path)
    assert str(info.value).startswith(f"{path}: not a usable acceptance state (")
    assert why in str(info.value)
    assert acceptance.load(path.with_name("absent.json")) is None
    with pytest.raises(wdelta.BadArgumentError, match="a folder"):
        acceptance.load(tmp_path)


class FakeChain:
    """Manifest revisions in memory: ``revisions[r]`` is revision r's bytes' label."""

    url = "fake"
    seen_revision = 0
    trust = None  # unsigned: RD-1 alone
    storage = None

    def __init__(self) -> None:
        self.revisions: dict[int, str] = {}
        self.head_signers: list[str] = []

    def read_head(self) -> tuple[Manifest, str]:
        r = max(self.revisions)
        parent = None if r == 1 else (r - 1, _d(self.revisions.get(r - 1, "pruned")))
        return Manifest(r, parent, (), (), ()), _d(self.revisions[r])

    def revision_bytes(self, revision: int) -> bytes | None:
        label = self.revisions.get(revision)
        return None if label is None else label.encode()


EVENTS = st.lists(
    st.tuples(st.sampled_from(["publish", "roll back", "rewrite", "prune", "restart"]),
              st.integers(1, 3)),
    max_size=25,
)  # fmt: skip


@given(events=EVENTS)
@settings(max_examples=60, deadline=None)
def test_a_restarted_tracker_decides_as_one_that_never_stopped(
    tmp_path_factory: pytest.TempPathFactory, events: list[tuple[str, int]]
) -> None:
    """Publishing, rolling back, rewriting and pruning in any order: a tracker
    reloaded from its file after every read refuses exactly what an in-memory
    one refuses, and its accepted revision never decreases."""
    path = tmp_path_factory.mktemp("state") / "s.json"
    fake, memory, count = FakeChain(), Tracker(None), 0
    fake.revisions[1] = "r1"
    for event, n in events:
        top = max(fake.revisions)
        if event == "publish":
            count += 1
            fake.revisions[top + 1] = f"r{top + 1}.{count}"
        elif event == "roll back" and len(fake.revisions) > n:
            for r in sorted(fake.revisions)[-n:]:
                del fake.revisions[r]
        elif event == "rewrite":
            count += 1
            fake.revisions[top] = f"r{top}.{count}"
        elif event == "prune" and len(fake.revisions) > n:
            for r in sorted(fake.revisions)[:n]:
                del fake.revisions[r]
        outcomes = []
        for tracker in (memory, Tracker(path)):
            before = tracker.accepted
            try:
                m, digest = tracker.head(fake)
            except chain.ManifestInvalidError:
                outcomes.append("refused")
                continue
            tracker.accept(fake, m, digest)
            assert before is None or tracker.accepted is not None
            assert before is None or before.revision <= m.revision
            outcomes.append(digest)
        assert outcomes[0] == outcomes[1], events


# ------------------------------------------------------------ pull and follow


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder chain of versions 0..3 (revisions 1..4), snapshots at 0 and 3."""
    return folder_history(tmp_path, 16, 64)


def roll_back(store: Path, keep: int) -> None:
    """Delete every manifest revision above ``keep`` (storage restored from a backup)."""
    for path in (store / "manifests").iterdir():
        if int(path.name[4:-5]) > keep:
            path.unlink()


def rewrite(store: Path, revision: int) -> None:
    """Replace revision ``revision`` with other bytes of the same content (a fork)."""
    path = store / revision_key(revision)
    doc = json.loads(path.read_bytes())
    doc["generator"] = "someone else"
    path.write_text(json.dumps(doc, indent=2) + "\n")


def test_pull_refuses_a_rollback_after_a_restart(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    running = chain.Chain(chain.LocalStorage(store))  # a process that stays up
    assert chain.pull(running, local, to=2).revision == 4
    state = acceptance.state_beside(local)
    head_digest = digest_bytes((store / revision_key(4)).read_bytes())
    assert acceptance.load(state) == Accepted(4, head_digest, str(store))
    saved = state.read_bytes()
    roll_back(store, 3)
    with pytest.raises(chain.ManifestInvalidError) as info:
        chain.pull(store, local)  # a new process: a new Chain, the state from disk
    assert "head revision 3 is lower than revision 4" in str(info.value)
    assert f"pull once with accept_rollback=True or delete {state}" in str(info.value)
    assert local.read_bytes() == ckpts[2].read_bytes() and state.read_bytes() == saved
    assert chain.pull(store, local, state=False).revision == 3  # no state: no protection
    moved = tmp_path / "moved-store"
    shutil.copytree(store, moved)
    with pytest.raises(chain.ManifestInvalidError) as info:
        chain.pull(moved, local)  # pointed at another copy: the state says where it came from
    assert f"that revision was accepted from {store}, not {moved}; " in str(info.value)
    with pytest.raises(chain.ManifestInvalidError, match="lower than revision 4 read before"):
        chain.pull(running, local, state=False)
    result = chain.pull(running, local, accept_rollback=True)
    assert result.revision == 3 and acceptance.load(state).revision == 3  # type: ignore[union-attr]
    assert chain.pull(store, local).revision == 3  # and checked against revision 3 from now on


def test_pull_refuses_a_rewritten_revision(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local, state = tmp_path / "node.safetensors", tmp_path / "elsewhere" / "accepted.json"
    state.parent.mkdir()
    chain.pull(store, local, state=state)
    assert not acceptance.state_beside(local).exists()
    for wrong in (local, store / "accepted.json", store):
        with pytest.raises(wdelta.BadArgumentError, match="overlaps"):
            chain.pull(store, local, state=wrong)
    assert local.read_bytes() == ckpts[3].read_bytes()
    rewrite(store, 4)
    with pytest.raises(chain.ManifestInvalidError, match="chain forked: revision 4 is now"):
        chain.pull(store, local, state=state)
    assert local.read_bytes() == ckpts[3].read_bytes()


def cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WDELTA), "chain", *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout)  # fmt: skip


def test_cli_pull_rollback_refusal_and_override(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    assert cli("pull", store, local, "--to", "2", "-q").returncode == 0
    roll_back(store, 3)
    refused = cli("pull", store, local)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: manifest-invalid: storage rolled back: ")
    assert refused.stderr.count("\n") == 1
    assert "pull once with --accept-rollback or delete" in refused.stderr
    assert "accept_rollback" not in refused.stderr  # the CLI names its flag, not the keyword
    assert local.read_bytes() == ckpts[2].read_bytes()
    ok = cli("pull", store, local, "--accept-rollback")
    assert ok.returncode == 0 and "(revision 3," in ok.stdout
    state = acceptance.state_beside(local)
    state.write_text('{"format": "wdelta-chain-accepted", "version": 1, "revision": -1}')
    bad = cli("pull", store, local)
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"error: bad-argument: {state}: not a usable acceptance state")
    assert bad.stderr.count("\n") == 1 and local.read_bytes() == ckpts[2].read_bytes()


def test_follow_killed_and_restarted_refuses_the_rollback(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    state = tmp_path / "node" / "accepted.json"
    local.parent.mkdir()
    shutil.copyfile(ckpts[1], local)
    args = [str(WDELTA), "chain", "pull", str(store), str(local), "--follow", "--interval",
            "0.05", "--state", str(state), "-q"]  # fmt: skip
    proc = subprocess.Popen(args, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while acceptance.load(state) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert acceptance.load(state).revision == 4  # type: ignore[union-attr]
    assert local.read_bytes() == ckpts[3].read_bytes()
    roll_back(store, 2)
    again = cli("pull", store, local, "--follow", "--interval", "0", "--backoff-cap", "0.01",
                "--max-iterations", "2", "--state", state)  # fmt: skip
    lines = again.stderr.splitlines()
    assert again.returncode == 1 and len(lines) == 2, again.stderr
    assert lines[0].startswith("pull failed: manifest-invalid: storage rolled back: ")
    assert "--accept-rollback" in lines[0] and "accept_rollback" not in lines[0]
    assert lines[1].startswith("error: manifest-invalid: storage rolled back: head revision 2 "
                               "is lower than revision 4")  # fmt: skip
    assert local.read_bytes() == ckpts[3].read_bytes()


# ------------------------------------------------------------ in memory


def test_follow_weights_with_a_state_path(
    history: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    store, ckpts = history
    state = tmp_path / "accepted.json"

    def node() -> chain.Chain:
        return chain.Chain(chain.LocalStorage(store), tmp_path / "node-cache")

    weights, v = chain.load(node(), to=1, state=state)
    assert v.number == 1 and acceptance.load(state).revision == 4  # type: ignore[union-attr]
    got = [x.number for x in chain.follow_weights(node(), weights, state=state, interval=0,
                                                  max_polls=1)]  # fmt: skip
    assert got == [2, 3]
    reached = {n: np.array(a, copy=True) for n, a in weights.items()}
    roll_back(store, 3)
    with pytest.raises(chain.ManifestInvalidError, match="lower than revision 4"):
        next(chain.follow_weights(node(), weights, state=state, max_polls=1))  # a restart
    with pytest.raises(chain.ManifestInvalidError, match="lower than revision 4"):
        chain.load(node(), state=state)
    assert all(np.array_equal(weights[n], a) for n, a in reached.items())
    # A node that keeps running sees the rollback as a failed poll, weights untouched.
    shutil.rmtree(store)
    c = chain.Chain(chain.LocalStorage(store), tmp_path / "writer-2")
    chain.init(c, ckpts[0], step=0)
    chain.append(c, ckpts[1], ckpts[0], step=1)
    weights, _ = chain.load(node(), to=0)
    errors: list[str] = []
    follower = chain.follow_weights(node(), weights, interval=0, max_polls=2, backoff=(0, 0),
                                    on_error=lambda e, n: errors.append(str(e)))  # fmt: skip
    assert next(follower).number == 1
    roll_back(store, 1)
    assert list(follower) == [] and len(errors) == 1
    assert "lower than revision 2" in errors[0]


# ------------------------------------------------------------ chain check --after


def test_cli_check_after_a_seen_revision(history: tuple[Path, list[Path]], tmp_path: Path) -> None:
    store, _ = history
    seen = tmp_path / "seen" / "rev-000000000002.json"
    seen.parent.mkdir()
    shutil.copyfile(store / revision_key(2), seen)
    head = store / revision_key(4)
    assert cli("check", "-q", head, "--after", seen).returncode == 0
    lower = cli("check", store / revision_key(1), "--after", seen)
    assert lower.returncode == 1 and lower.stderr.startswith(
        "error: manifest-invalid: storage rolled back: head revision 1 is lower than revision 2"
    )
    rewrite(store, 2)  # revision 2 rewritten in storage: seen only with the store at hand
    assert cli("check", "-q", head, "--after", seen).returncode == 0
    forked = cli("check", head, "--after", seen, "--store", store)
    assert forked.returncode == 1
    assert forked.stderr.startswith("error: manifest-invalid: chain forked: revision 2 is now")
    for bad in (tmp_path / "absent.json", tmp_path / "ck0.safetensors"):
        refused = cli("check", head, "--after", bad)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert refused.stderr.startswith(f"error: bad-argument: --after {bad}: not a manifest")


def test_a_stale_s3_mirror_is_refused(history: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """A node that pulled revision 4 from the folder, pointed at a loopback S3 mirror that
    holds revisions 1-3 only (a stale mirror): refused, naming where 4 came from; once the
    mirror catches up (revision 4 byte for byte) it is accepted."""
    pytest.importorskip("moto")
    from chainkit import S3Server
    from wdelta.chain.storage.s3 import S3Storage

    store, ckpts = history
    local = tmp_path / "node" / "m.safetensors"
    chain.pull(store, local)
    server = S3Server()
    try:
        mirror = S3Storage(server.new_bucket(), "mirror", client=server.client())
        for path in sorted(store.rglob("*")):
            if path.is_file() and path.name != "rev-000000000004.json":
                mirror.put_file(str(path.relative_to(store)), path)
        node = chain.Chain(mirror, tmp_path / "cache")
        with pytest.raises(chain.ManifestInvalidError) as info:
            chain.pull(node, local)
        assert "head revision 3 is lower than revision 4" in str(info.value)
        assert f"accepted from {store}, not {mirror.url}" in str(info.value)
        assert local.read_bytes() == ckpts[3].read_bytes()
        mirror.put_file(revision_key(4), store / revision_key(4))
        assert chain.pull(node, local).revision == 4
    finally:
        server.stop()
