"""Where outputs may go: never onto an input, never over a file unless --force.

``-o`` naming an input (the same path, a symlink or hard link to it, a file
inside an input folder, a folder holding an input) is refused with
``bad-argument`` before anything is written; so are ``-o -``, a device and a
FIFO.  An existing output is refused unless ``--force`` / ``overwrite=True``
(an empty folder counts as absent).  Each case runs the real CLI and checks
that the inputs are byte-identical afterwards and no temporary is left.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import wdelta
from kit import RawTensor, leftovers, random_words, safetensors_bytes, tree_hashes, write_sharded
from test_cli import assert_error, assert_ok, run


def _tensors(seed: int) -> dict[str, RawTensor]:
    out = {}
    for i in range(3):
        words = random_words(np.random.default_rng(i), 2, 512)
        words[seed * 7 : seed * 7 + 5] ^= np.uint16(1)
        out[f"w{i}"] = RawTensor("BF16", (512,), words.tobytes())
    return out


@dataclass
class Work:
    """Inputs in ``root``: single files, sharded folders and a delta of each kind."""

    root: Path

    @property
    def base(self) -> Path:
        return self.root / "base.safetensors"

    @property
    def target(self) -> Path:
        return self.root / "target.safetensors"

    @property
    def delta(self) -> Path:
        return self.root / "d.wdelta"

    @property
    def sbase(self) -> Path:
        return self.root / "sbase"

    @property
    def sdelta(self) -> Path:
        return self.root / "sd.wdelta"

    def hashes(self) -> dict[str, str]:
        return tree_hashes(self.root)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Work:
    w = Work(tmp_path_factory.mktemp("outputs"))
    base, target = _tensors(0), _tensors(1)
    w.base.write_bytes(safetensors_bytes(base))
    w.target.write_bytes(safetensors_bytes(target))
    write_sharded(w.sbase, [{"w0": base["w0"]}, {"w1": base["w1"], "w2": base["w2"]}])
    write_sharded(
        w.root / "starget", [{"w0": target["w0"]}, {"w1": target["w1"]}, {"w2": target["w2"]}]
    )
    wdelta.diff(w.base, w.target, w.delta)
    wdelta.diff(w.sbase, w.root / "starget", w.sdelta)
    return w


def _shard(w: Work) -> Path:
    return next(p for p in sorted(w.sbase.iterdir()) if p.name.endswith(".safetensors"))


def _link(kind: str, target: Path, at: Path) -> Path:
    at.unlink(missing_ok=True)
    (os.symlink if kind == "symlink" else os.link)(target, at)
    return at


# (name, argv builder given the Work and a scratch folder); the reason is "input" unless named
_INPUT_CASES: list[tuple[str, Callable[[Work, Path], list[object]]]] = [
    ("diff-o-base", lambda w, s: ["diff", w.base, w.target, "-o", w.base]),
    ("diff-o-target", lambda w, s: ["diff", w.base, w.target, "-o", w.target, "-f"]),
    (
        "diff-o-dotted-base",
        lambda w, s: ["diff", w.base, w.target, "-o", w.root / "." / w.base.name],
    ),
    ("apply-o-base", lambda w, s: ["apply", w.base, w.delta, "-o", w.base, "--force"]),
    ("apply-o-delta", lambda w, s: ["apply", w.base, w.delta, "-o", w.delta]),
    (
        "apply-o-symlink-to-base",
        lambda w, s: ["apply", w.base, w.delta, "-o", _link("symlink", w.base, s / "l"), "-f"],
    ),
    (
        "apply-o-hardlink-of-delta",
        lambda w, s: ["apply", w.base, w.delta, "-o", _link("hard", w.delta, s / "h"), "-f"],
    ),
    (
        "diff-o-hardlink-of-shard",
        lambda w, s: ["diff", w.sbase, w.target, "-o", _link("hard", _shard(w), s / "h"), "-f"],
    ),
    ("apply-o-shard", lambda w, s: ["apply", w.sbase, w.sdelta, "-o", _shard(w), "-f"]),
    (
        "apply-o-new-file-in-input-folder",
        lambda w, s: ["apply", w.sbase, w.sdelta, "-o", w.sbase / "new"],
    ),
    ("apply-o-sharded-base-folder", lambda w, s: ["apply", w.sbase, w.sdelta, "-o", w.sbase, "-f"]),
    (
        "apply-o-folder-holding-inputs",
        lambda w, s: ["apply", w.sbase, w.sdelta, "-o", w.root, "-f"],
    ),
    ("apply-o-dash", lambda w, s: ["apply", w.base, w.delta, "-o", "-"]),
    ("diff-o-dev-null", lambda w, s: ["diff", w.base, w.target, "-o", "/dev/null", "-f"]),
    ("apply-o-fifo", lambda w, s: ["apply", w.base, w.delta, "-o", _fifo(s / "p"), "-f"]),
    # Standard output is a pipe here: /dev/stdout resolves to a FIFO.
    ("apply-o-dev-stdout", lambda w, s: ["apply", w.base, w.delta, "-o", "/dev/stdout", "-f"]),
    (
        "diff-o-symlink-elsewhere",
        lambda w, s: ["diff", w.base, w.target, "-o", _link("symlink", s / "x", s / "l"), "-f"],
    ),
]


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


_WHY = {"apply-o-dash": "standard output", "diff-o-dev-null": "regular file",
        "apply-o-fifo": "regular file", "apply-o-dev-stdout": "regular file",
        "diff-o-symlink-elsewhere": "symlink"}  # fmt: skip


@pytest.mark.parametrize(
    ("why", "build"),
    [(_WHY.get(n, "input"), b) for n, b in _INPUT_CASES],
    ids=[c[0] for c in _INPUT_CASES],
)
def test_output_onto_an_input_or_a_non_file_is_refused(
    work: Work, tmp_path: Path, why: str, build: Callable[[Work, Path], list[object]]
) -> None:
    before = work.hashes()
    argv = build(work, tmp_path)
    result = run(*argv)
    assert_error(result, "bad-argument")
    assert why in result.stderr  # the reason, not an unknown option or an existing file
    assert work.hashes() == before
    assert leftovers(work.root) == leftovers(work.sbase) == leftovers(tmp_path) == []


def test_existing_output_file_needs_force(work: Work, tmp_path: Path) -> None:
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"precious")
    result = run("apply", work.base, work.delta, "-o", out)
    assert_error(result, "bad-argument")
    assert "exists" in result.stderr and "--force" in result.stderr
    assert out.read_bytes() == b"precious"
    assert_ok(run("apply", work.base, work.delta, "-o", out, "--force", "-q"))
    assert tree_hashes(out) == tree_hashes(work.target)
    delta = tmp_path / "again.wdelta"
    delta.write_bytes(b"older")
    assert_error(run("diff", work.base, work.target, "-o", delta, "-q"), "bad-argument")
    assert delta.read_bytes() == b"older"
    assert_ok(run("diff", work.base, work.target, "-o", delta, "-q", "-f"))
    assert leftovers(tmp_path) == []


def test_existing_output_folder_needs_force(work: Work, tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    assert_ok(run("apply", work.sbase, work.sdelta, "-o", out, "-q"))  # empty: as if absent
    (out / "note.txt").write_text("mine")
    before = tree_hashes(out)
    assert_error(run("apply", work.base, work.delta, "-o", out), "bad-argument")  # a file
    assert_error(run("apply", work.sbase, work.sdelta, "-o", out), "bad-argument")
    assert tree_hashes(out) == before
    assert_ok(run("apply", work.sbase, work.sdelta, "-o", out, "-q", "--force"))
    assert tree_hashes(out) == tree_hashes(work.root / "starget")
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_api_refuses_inputs_and_existing_outputs(work: Work, tmp_path: Path) -> None:
    before = work.hashes()
    with pytest.raises(wdelta.BadArgumentError, match="input"):
        wdelta.diff(work.base, work.target, work.target, overwrite=True)
    with pytest.raises(wdelta.BadArgumentError, match="input"):
        wdelta.apply(str(work.base), work.delta, work.delta, overwrite=True)
    out = tmp_path / "o.safetensors"
    out.write_bytes(b"x")
    with pytest.raises(wdelta.BadArgumentError, match="overwrite=True"):
        wdelta.apply(work.base, work.delta, out)
    assert out.read_bytes() == b"x"
    wdelta.apply(work.base, work.delta, out, overwrite=True)
    assert tree_hashes(out) == tree_hashes(work.target)
    assert work.hashes() == before


def test_output_created_meanwhile_is_not_replaced(
    work: Work, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process creates the output while apply runs: the final rename refuses."""
    out = tmp_path / "o.safetensors"
    real = wdelta.ops.decoder.run_steps

    def racing(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        out.write_bytes(b"theirs")

    monkeypatch.setattr(wdelta.ops.decoder, "run_steps", racing)
    with pytest.raises(wdelta.BadArgumentError, match="exists"):
        wdelta.apply(work.base, work.delta, out)
    assert out.read_bytes() == b"theirs"
    assert leftovers(tmp_path) == []


def test_pull_refuses_a_local_path_inside_the_chain_folder(work: Work, tmp_path: Path) -> None:
    chain = tmp_path / "fleet"
    assert_ok(run("chain", "init", chain, work.base, "-q"))
    before = tree_hashes(chain)
    for local in (chain / "model.safetensors", chain, "-"):
        result = run("chain", "pull", chain, local, "-q")
        assert_error(result, "bad-argument")
        assert ("chain folder" if local != "-" else "standard output") in result.stderr
    assert tree_hashes(chain) == before


def test_symlink_to_a_file_is_not_replaced_even_with_force(work: Work, tmp_path: Path) -> None:
    """As /dev/stdout when standard output is a file: renaming over the link would
    replace the link, not the file, so it is refused (tested on a link of our own)."""
    (tmp_path / "file").write_bytes(b"mine")
    link = _link("symlink", tmp_path / "file", tmp_path / "link")
    result = run("apply", work.base, work.delta, "-o", link, "-f")
    assert_error(result, "bad-argument")
    assert "symlink" in result.stderr
    assert link.is_symlink() and (tmp_path / "file").read_bytes() == b"mine"
    assert sorted(os.listdir(tmp_path)) == ["file", "link"]
