"""A node remembers the trust it accepted revisions under (SPEC.md §17.11, SG-8 to
SG-10): once it accepted a signed revision, reading without a trust policy is refused
until an operator says otherwise explicitly; its trust cannot move back to an older root;
through the API, the command line and in-memory followers with a state file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signkit import Signed, root_file, signed_chain
from wdelta import chain
from wdelta.chain.trust import acceptance
from wdelta.chain.trust import updater as trust
from wdelta.chain.trust.acceptance import Accepted, TrustRecord
from wdelta.chain.trust.updater import root_state_beside
from wdelta.errors import WdeltaError


def _unsigned(s: Signed) -> Path:
    """The next checkpoint, published unsigned (as anyone who can write the storage can)."""
    new = s.next_checkpoint()
    chain.append(chain.Chain(s.store, s.tmp / "ecache"), new, s.ckpts[-2])
    return new


def test_a_node_that_accepted_signatures_keeps_requiring_them(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    state = acceptance.state_beside(s.node)
    record = acceptance.load(state)
    assert record is not None and record.trust is not None
    assert (record.trust.chain, record.trust.root) == ("test/run", 1)
    evil = _unsigned(s)
    before = s.node.read_bytes()
    with pytest.raises(WdeltaError) as info:  # the operator forgot --trust
        chain.pull(chain.Chain(s.store, tmp_path / "ncache"), s.node)
    assert info.value.category == "signature-invalid"
    assert str(state) in str(info.value) and "allow_unsigned=True" in str(info.value)
    assert s.node.read_bytes() == before and acceptance.load(state) == record
    with pytest.raises(WdeltaError) as info:  # a deliberate rollback is not a downgrade
        chain.pull(chain.Chain(s.store, tmp_path / "ncache"), s.node, accept_rollback=True)
    assert info.value.category == "signature-invalid"
    # Told explicitly, the node reads unsigned and forgets the requirement.
    chain.pull(chain.Chain(s.store, tmp_path / "ncache"), s.node, allow_unsigned=True)
    assert s.node.read_bytes() == evil.read_bytes()
    after = acceptance.load(state)
    assert after is not None and after.trust is None
    chain.pull(chain.Chain(s.store, tmp_path / "ncache"), s.node)  # nothing more to require


def test_in_memory_followers_with_a_state_file_keep_requiring_signatures(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    state = tmp_path / "follower" / "state.json"
    state.parent.mkdir()
    weights, v = chain.load(s.node_chain(), trust=s.root, state=state)
    assert v.number == 1
    _unsigned(s)
    with pytest.raises(WdeltaError) as info:
        chain.load(chain.Chain(s.store, tmp_path / "lcache"), state=state)
    assert info.value.category == "signature-invalid" and str(state) in str(info.value)
    before = {n: w.copy() for n, w in weights.items()}
    polls = chain.follow_weights(chain.Chain(s.store, tmp_path / "fcache"), weights, at=1,
                                 state=state, max_polls=1, interval=0.0)  # fmt: skip
    with pytest.raises(WdeltaError) as info:
        list(polls)
    assert info.value.category == "signature-invalid"
    assert all((weights[n] == before[n]).all() for n in before)
    _, v = chain.load(chain.Chain(s.store, tmp_path / "lcache"), state=state, allow_unsigned=True)
    assert v.number == 2


def test_the_trust_cannot_move_back_to_an_older_root(tmp_path: Path) -> None:
    """The state records the root version a revision was accepted under: a node whose
    kept roots and the chain's newer roots were deleted refuses (SG-9) instead of
    trusting the revoked keys of its old trust file again."""
    s = signed_chain(tmp_path, keys=["alice", "carol"], signers=["alice"])
    root1 = chain.read_root_file(s.root)
    root2 = root_file(tmp_path / "r2.json", "test/run", ["alice"], previous=root1)
    (s.store / "trust" / "root-000000000002.json").write_bytes(root2.to_bytes())
    s.publish()
    assert s.pull().revision == 3
    (s.store / "trust" / "root-000000000002.json").unlink()
    root_state_beside(s.node).unlink()
    with pytest.raises(WdeltaError) as info:
        s.pull()
    assert info.value.category == "signature-invalid"
    assert "records trust root version 2" in str(info.value)
    # Given the newer root as its trust file, the node reads on.
    assert s.pull(s.node_chain(tmp_path / "r2.json")).revision == 3


def test_a_state_of_format_version_1_is_read_without_trust(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"format": "wdelta-chain-accepted", "version": 1, "revision": 4, '
                    '"digest": "' + "a" * 64 + '"}')  # fmt: skip
    assert acceptance.load(path) == Accepted(4, "a" * 64)
    record = Accepted(4, "b" * 64, "here", TrustRecord("c/d", 7, ("c" * 64,)))
    acceptance.save(path, record)
    assert acceptance.load(path) == record
    assert '"version": 2' in path.read_text()


WDELTA = [sys.executable, "-m", "wdelta", "chain"]


def test_cli_pull_without_trust_after_signed_revisions(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    _unsigned(s)
    base = [*WDELTA, "pull", str(s.store), str(s.node), "--cache", str(tmp_path / "c")]
    r = subprocess.run(base, capture_output=True, text=True, timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: signature-invalid: ") and "--allow-unsigned" in lines[0]
    assert "allow_unsigned" not in lines[0] and "trust=" not in lines[0]
    assert s.node.read_bytes() == s.ckpts[1].read_bytes()
    r = subprocess.run([*base, "--allow-unsigned"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "not authenticated" in r.stderr, r.stderr
    assert s.node.read_bytes() == s.ckpts[2].read_bytes()


def test_cli_check_with_a_state_file_and_its_unhappy_paths(tmp_path: Path) -> None:
    s = signed_chain(tmp_path)
    rev = s.store / "manifests" / "rev-000000000002.json"
    state = acceptance.state_beside(s.node)
    base = [*WDELTA, "check", str(rev)]

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *map(str, args)], capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    assert run("--store", s.store, "--trust", s.root, "--state", state).returncode == 0
    r = run("--store", s.store, "--state", state)  # SG-8: the state records signatures
    assert r.returncode == 1 and r.stderr.startswith("error: signature-invalid: "), r.stderr
    for args, words in (
        (("--state", state), "check --state needs --store"),
        (("--store", s.store, "--state", state, "--after", rev), "not both"),
        (("--store", s.store, "--state", tmp_path / "absent.json"), "no such file"),
        (("--store", s.store, "--state", s.root), "not a usable acceptance state"),
    ):
        r = run(*args)
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert lines[0].startswith("error: bad-argument: ") and words in lines[0], lines[0]


@given(data=st.binary(max_size=300))
@settings(max_examples=100, deadline=None)
def test_damaged_kept_roots_are_refused_by_name(data: bytes) -> None:
    path = Path("node/.m.safetensors.wdelta-root.json")
    try:
        trust.parse_kept_roots(data, path)
    except WdeltaError as exc:
        assert exc.category == "bad-argument" and str(exc).startswith(f"{path}: ")
