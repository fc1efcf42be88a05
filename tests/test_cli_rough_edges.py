"""What a new user meets when a command is given the wrong thing: ``chain append`` with a
``--base`` that is not in the chain or a checkpoint already published, ``inspect`` of
long tensor names, and a missing file, a folder or an unreadable file given to each
command, which all say so in one wording (``PATH: no such file or folder``).
Through the CLI in a subprocess, as a user runs it."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kit import RawTensor, safetensors_bytes
from test_cli import ENV, WDELTA, assert_error, run
from wdelta import cli
from wdelta.io.filekind import os_message


def _checkpoint(path: Path, step: int, names: tuple[str, ...] = ("w",)) -> Path:
    words = np.arange(256, dtype=np.uint16) ^ np.uint16(step)
    path.write_bytes(safetensors_bytes({n: RawTensor("BF16", (16, 16), words.tobytes())
                                        for n in names}))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fleet: a chain at B (version 0); T: B's next step, not published; d.wdelta: B -> T;
    k, k2: signing keys; dir: an empty folder."""
    root = tmp_path_factory.mktemp("rough")
    _checkpoint(root / "B.safetensors", 0)
    _checkpoint(root / "T.safetensors", 1)
    for argv in (("diff", root / "B.safetensors", root / "T.safetensors", "-o", root / "d.wdelta",
                  "-q"), ("chain", "init", root / "fleet", root / "B.safetensors"),
                 ("chain", "keygen", root / "k"), ("chain", "keygen", root / "k2")):  # fmt: skip
        assert run(*argv).returncode == 0
    (root / "dir").mkdir()
    return root


# ---------------------------------------------------------------- chain append


def test_append_from_a_base_not_in_the_chain_names_base(folder: Path) -> None:
    """The base is the checkpoint itself (T, not in the chain): the message names --base
    and the head to use, not the temporary file the delta was encoded to."""
    t = folder / "T.safetensors"
    result = run("chain", "append", folder / "fleet", t, "--base", t)
    assert_error(result, "base-mismatch")
    assert result.stderr == (
        f"error: base-mismatch: {t} is not a version of the chain at {folder / 'fleet'}: "
        "--base BASE must be the checkpoint of one of its versions, normally the head "
        "(version 0, as pulled from the chain)\n"
    )
    assert "wdelta-tmp" not in result.stderr


def test_append_of_a_published_checkpoint_says_which_version(folder: Path) -> None:
    b = folder / "B.safetensors"
    result = run("chain", "append", folder / "fleet", b, "--base", b)
    assert_error(result, "conflict")
    assert result.stderr.startswith(
        f"error: conflict: {b} is already version 0 of the chain at {folder / 'fleet'} (digest "
    )
    assert result.stderr.endswith("): nothing to publish\n")
    assert "Version(" not in result.stderr and "wdelta-tmp" not in result.stderr


# ---------------------------------------------------------------- inspect


def test_inspect_prints_long_tensor_names_whole(tmp_path: Path) -> None:
    names = ("model.layers.0.post_attention_layernorm.weight", "x" * 100, "b")
    base = _checkpoint(tmp_path / "b.safetensors", 0, names)
    target = _checkpoint(tmp_path / "t.safetensors", 1, names)
    assert run("diff", base, target, "-o", tmp_path / "d.wdelta", "-q").returncode == 0
    result = run("inspect", tmp_path / "d.wdelta")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[7:]}
    assert set(rows) == set(names)
    # The column is as wide as the longest name up to 64: these rows line up.
    short = [rows[n] for n in names if len(n) <= 64]
    assert len({re.search(" modified ", r).start() for r in short}) == 1  # type: ignore[union-attr]


# ---------------------------------------------------------------- missing files

MISSING = "no such file or folder"

# (CLI arguments, {f}: the fixture's folder, {x}: the path that is not there; category)
NOT_THERE = [
    ("diff {x} {f}/T.safetensors -o {f}/out", "io-error"),
    ("diff {f}/B.safetensors {x} -o {f}/out", "io-error"),
    ("apply {x} {f}/d.wdelta -o {f}/out", "io-error"),
    ("apply {f}/B.safetensors {x} -o {f}/out", "io-error"),
    ("inspect {x}", "io-error"),
    ("verify {x}", "io-error"),
    ("verify {f}/d.wdelta --base {x}", "io-error"),
    ("chain init {f}/new {x}", "io-error"),
    ("chain append {f}/fleet {x} --base {f}/B.safetensors", "io-error"),
    ("chain append {f}/fleet {f}/T.safetensors --base {x}", "io-error"),
    ("chain append {f}/fleet {f}/T.safetensors --base {f}/B.safetensors --sign {x}", "io-error"),
    ("chain check {x}", "not-found"),
    ("chain check {f}/fleet/manifests/rev-000000000001.json --after {x}", "bad-argument"),
    ("chain check {f}/fleet/manifests/rev-000000000001.json --store {x}", "not-found"),
    ("chain pull {f}/fleet {f}/out --trust {x}", "io-error"),
    ("chain rotate {f}/fleet {x}", "io-error"),
    ("chain refresh {f}/fleet --sign {x}", "io-error"),
    ("chain root --chain-id c --root-key {x} --revision-key {x} --sign {f}/k {f}/out",
     "io-error"),
    ("conformance run --vectors {x}", "io-error"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "category"), NOT_THERE, ids=[c[0][:32] for c in NOT_THERE])
def test_a_missing_file_reads_the_same_in_every_command(
    folder: Path, argv: str, category: str
) -> None:
    missing = folder / "not-there.safetensors"
    result = run(*argv.format(f=folder, x=missing).split())
    assert_error(result, category)
    where = f"{missing}/manifest.json" if argv.startswith("conformance") else f"{missing}"
    assert f"{where}: {MISSING}" in result.stderr, result.stderr
    assert "Errno" not in result.stderr and "directory" not in result.stderr
    assert not (folder / "out").exists() and not (folder / "new").exists()


# (CLI arguments, {f}: the fixture's folder, {d}: a folder where a file goes; category; words)
FOLDERS = [
    ("inspect {d}", "io-error", "{d} is a folder; a delta is one .wdelta file"),
    ("verify {d}", "io-error", "{d} is a folder; a delta is one .wdelta file"),
    ("apply {f}/B.safetensors {d} -o {f}/out", "io-error",
     "{d} is a folder; a delta is one .wdelta file"),
    ("chain check {d}", "bad-argument", "{d}: a folder, not a file"),
    ("chain pull {f}/fleet {f}/out --trust {d}", "bad-argument", "{d} is a folder, not a file"),
    ("chain refresh {f}/fleet --sign {d}", "bad-argument", "{d} is a folder, not a file"),
    ("chain rotate {f}/fleet {d}", "bad-argument", "{d} is a folder, not a file"),
    ("chain keygen {d}", "bad-argument", "{d} is a folder; expected a file path"),
    ("conformance run --vectors {d}", "io-error", "{d}/manifest.json: " + MISSING),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "category", "words"), FOLDERS, ids=[c[0][:32] for c in FOLDERS])
def test_a_folder_where_a_file_goes_is_named(
    folder: Path, argv: str, category: str, words: str
) -> None:
    result = run(*argv.format(f=folder, d=folder / "dir").split())
    assert_error(result, category)
    assert words.format(d=folder / "dir") in result.stderr, result.stderr
    assert not (folder / "out").exists()


@pytest.mark.parametrize("argv", ["chain keygen {f}/none/k", "chain root --chain-id c "
                                  "--root-key {f}/k.pub --revision-key {f}/k2.pub --sign {f}/k "
                                  "{f}/none/root.json"])  # fmt: skip
def test_an_output_in_a_missing_folder_says_so(folder: Path, argv: str) -> None:
    result = run(*argv.format(f=folder).split())
    assert_error(result, "io-error")
    assert f"its folder {folder / 'none'} does not exist: nothing was written" in result.stderr
    assert "wdelta-tmp" not in result.stderr and "Errno" not in result.stderr


UNREADABLE = [
    "inspect {x}", "verify {x}", "apply {f}/B.safetensors {x} -o {f}/out",
    "apply {x} {f}/d.wdelta -o {f}/out", "diff {x} {f}/T.safetensors -o {f}/out",
    "chain append {f}/fleet {f}/T.safetensors --base {x}", "chain check {x}",
    "chain pull {f}/fleet {f}/out --trust {x}", "chain refresh {f}/fleet --sign {x}",
]  # fmt: skip


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
@pytest.mark.parametrize("argv", UNREADABLE)
def test_an_unreadable_file_reads_the_same_in_every_command(folder: Path, argv: str) -> None:
    locked = folder / "locked"
    locked.write_bytes(b"")
    locked.chmod(0)
    try:
        result = run(*argv.format(f=folder, x=locked).split())
    finally:
        locked.unlink()
    assert result.returncode != 0
    assert f"{locked}: permission denied" in result.stderr, result.stderr


@pytest.mark.parametrize("argv", UNREADABLE)
def test_an_unreadable_file_in_process(
    folder: Path, argv: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the test above where root would read the file: ``open`` refuses it."""
    locked = folder / "B.safetensors" if argv.startswith("diff") else folder / "locked"
    real_open = os.open

    def refusing(path: object, *args: int) -> int:
        if os.fspath(path) == os.fspath(locked):  # type: ignore[arg-type]
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(locked))  # type: ignore[arg-type]
        return real_open(path, *args)  # type: ignore[arg-type]

    locked.touch()
    monkeypatch.setattr(os, "open", refusing)
    code = cli.run(argv.format(f=folder, x=locked).split())
    monkeypatch.undo()
    if locked.name == "locked":
        locked.unlink()
    assert code == 1
    assert f"{locked}: permission denied" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("exc", "reason"),
    [(FileNotFoundError(errno.ENOENT, "No such file or directory"), MISSING),
     (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
     (IsADirectoryError(errno.EISDIR, "Is a directory"), "a folder, not a file"),
     (NotADirectoryError(errno.ENOTDIR, "Not a directory"),
      "a part of the path is a file, not a folder"),
     (OSError(errno.EIO, "Input/output error"), "input/output error")],
)  # fmt: skip
def test_os_message(exc: OSError, reason: str) -> None:
    assert os_message(Path("a/b"), exc) == f"a/b: {reason}"


# ---------------------------------------------------------------- other wrong ways

LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 4096\n"
HTML = b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head></html>\n"


@pytest.fixture(scope="module")
def impostors(folder: Path) -> dict[str, tuple[Path, str]]:
    """Files that are not JSON documents: (path, what the message calls it)."""
    (folder / "lfs.json").write_bytes(LFS)
    (folder / "page.json").write_bytes(HTML)
    return {
        "delta": (folder / "d.wdelta", "is a wdelta delta, not a {want}"),
        "checkpoint": (folder / "B.safetensors", "is a safetensors checkpoint, not a {want}"),
        "lfs": (folder / "lfs.json", "is a Git LFS pointer, not the file: run `git lfs pull`"),
        "page": (folder / "page.json", "is an HTML page (a failed download?), not a {want}: "
                 "download it again"),
    }  # fmt: skip


# (CLI arguments, {f}: the fixture's folder, {x}: the impostor; category; what it wants)
DOCUMENTS = [
    ("chain check {x}", "manifest-invalid", "manifest revision"),
    ("chain pull {f}/fleet {f}/out --trust {x}", "bad-argument", "trust root"),
    ("chain rotate {f}/fleet {x}", "bad-argument", "trust root"),
    ("chain refresh {f}/fleet --sign {x}", "bad-argument", "signing key file"),
]


@pytest.mark.parametrize("kind", ["delta", "checkpoint", "lfs", "page"])
@pytest.mark.parametrize(("argv", "category", "want"), DOCUMENTS, ids=[c[2] for c in DOCUMENTS])
def test_a_file_of_another_kind_where_a_json_document_goes(
    folder: Path, impostors: dict[str, tuple[Path, str]], kind: str, argv: str, category: str,
    want: str,
) -> None:  # fmt: skip
    path, reason = impostors[kind]
    result = run(*argv.format(f=folder, x=path).split())
    assert_error(result, category)
    assert result.stderr == f"error: {category}: {path} {reason.format(want=want)}\n"


def test_chain_init_in_a_file_says_a_chain_is_a_folder(folder: Path) -> None:
    result = run("chain", "init", folder / "d.wdelta", folder / "B.safetensors")
    assert_error(result, "bad-argument")
    assert f"{folder / 'd.wdelta'} is a file; a chain is stored in a folder" in result.stderr
    assert "snapshots/" not in result.stderr


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chain "fleet" at versions 0..2 (c0..c2), and other.safetensors of another model."""
    root = tmp_path_factory.mktemp("grown")
    for n in range(3):
        _checkpoint(root / f"c{n}.safetensors", n)
    _checkpoint(root / "other.safetensors", 0, ("a", "b"))
    assert run("chain", "init", root / "fleet", root / "c0.safetensors").returncode == 0
    for n in (1, 2):
        base = root / f"c{n - 1}.safetensors"
        argv = ("chain", "append", root / "fleet", root / f"c{n}.safetensors", "--base", base)
        assert run(*argv).returncode == 0
    return root


@pytest.mark.parametrize(
    ("base", "why"), [("c1", "its digest is "), ("other", "missing ['w'], unexpected ['a', 'b']")]
)
def test_squash_from_a_wrong_base_names_base(grown: Path, base: str, why: str) -> None:
    """Not "chain-broken: squashed delta goes ...": the chain is fine, --base is not."""
    path = grown / f"{base}.safetensors"
    result = run("chain", "squash", grown / "fleet", "--from", "0", "--base", path)
    assert_error(result, "base-mismatch")
    assert result.stderr.startswith(
        f"error: base-mismatch: {path} is not version 0 of the chain at {grown / 'fleet'} ({why}"
    ), result.stderr
    assert "--base BASE must be the checkpoint of the version squashed from" in result.stderr


def test_a_structure_difference_lists_only_what_differs(grown: Path) -> None:
    assert run("diff", grown / "c0.safetensors", grown / "c1.safetensors", "-o",
               grown / "d.wdelta", "-q").returncode == 0  # fmt: skip
    result = run("verify", grown / "d.wdelta", "--base", grown / "other.safetensors")
    assert_error(result, "base-mismatch")
    assert result.stderr.endswith(": missing ['w'], unexpected ['a', 'b']\n"), result.stderr


def test_pull_onto_a_checkpoint_of_another_chain_says_what_to_do(grown: Path) -> None:
    other = grown / "other.safetensors"
    before = other.read_bytes()
    result = run("chain", "pull", grown / "fleet", other)
    assert_error(result, "not-found")
    assert "is not a version of this chain: pull to another path, or remove it" in result.stderr
    assert other.read_bytes() == before


def test_pull_to_an_unknown_version_lists_the_versions(grown: Path) -> None:
    result = run("chain", "pull", grown / "fleet", grown / "node.safetensors", "--to", "9")
    assert_error(result, "not-found")
    assert "unknown version '9': the chain has versions 0 to 2 (a number, 'head'" in result.stderr


@pytest.mark.parametrize("distributed", [False, True])
def test_a_publisher_resumed_from_no_version_says_so(
    grown: Path, tmp_path: Path, request: pytest.FixtureRequest, distributed: bool
) -> None:
    """A ``previous=`` that is none of the chain's versions: not a temporary file's name
    (``Publisher``), not "the chain changed" (``DistributedPublisher``)."""
    from wdelta import chain
    from wdelta.chain.live.distributed import DistributedPublisher
    from wdelta.errors import WdeltaError

    store = chain.Chain(grown / "fleet", cache=tmp_path / "cache")
    previous, _ = chain.load(store)
    changed = {n: a.copy() for n, a in previous.items()}
    changed["w"].view(np.uint16)[0] ^= 1
    nxt = {n: a.copy() for n, a in changed.items()}
    nxt["w"].view(np.uint16)[1] ^= 1
    if distributed:
        request.getfixturevalue("group")
        pub: chain.Publisher | DistributedPublisher = DistributedPublisher(store, previous=changed)
    else:
        pub = chain.Publisher(store, previous=changed)
    with pytest.raises(WdeltaError) as info:
        pub.publish(nxt, step=9)
    category, words = (
        ("conflict", "a publisher's previous= is not one of its versions")
        if distributed
        else ("base-mismatch", "resume with previous= the weights of one of its versions")
    )
    assert info.value.category == category
    assert words in str(info.value) and "wdelta-publish" not in str(info.value)
    assert len(store.head().versions) == 3


@pytest.mark.parametrize("cached", [False, True])
def test_changed_names_of_a_multi_part_link(tmp_path: Path, cached: bool) -> None:
    """What ``DistributedPublisher`` writes: the names come from every part's header
    (not an AssertionError on the link's key)."""
    from test_chain_parts import published
    from wdelta import chain
    from wdelta.ops import engines

    c, history = published(tmp_path, steps=2)
    m = c.head()
    assert all(len(k.parts) == 2 for k in m.links)
    if cached:
        chain.pull(c, tmp_path / "node.safetensors")  # the parts are now in the cache
    changed = sorted(n for n in history[2] if (history[1][n] != history[2][n]).any())
    assert sorted(engines.changed_names(c, m, 1, 2) or []) == changed
    assert sorted(engines.changed_names(c, m, 2, 1) or []) == changed


@pytest.mark.parametrize("typo", ["s3:/bucket/run", "hf:user/repo"])
def test_a_mistyped_url_is_not_a_local_folder(tmp_path: Path, typo: str) -> None:
    """``s3:/bucket`` (one slash) would have created a local folder named ``s3:``."""
    result = subprocess.run([str(WDELTA), "chain", "init", typo, _checkpoint(
        tmp_path / "b.safetensors", 0)], cwd=tmp_path, capture_output=True, text=True, env=ENV,
        timeout=300)  # fmt: skip
    assert_error(result, "bad-argument")
    scheme, _, rest = typo.partition(":")
    assert f"did you mean {scheme}://{rest.lstrip('/')}?" in result.stderr
    assert not (tmp_path / f"{scheme}:").exists()


def test_a_partial_pull_that_matches_no_tensor_warns(grown: Path, tmp_path: Path) -> None:
    local = tmp_path / "node.safetensors"
    result = run("chain", "pull", grown / "fleet", local, "--tensors", "layers.*")
    assert result.returncode == 0, result.stderr
    assert f"warning: --tensors 'layers.*' matches no tensor of the version: {local}" in (
        result.stderr
    )
    result = run("chain", "pull", grown / "fleet", tmp_path / "w.safetensors", "--tensors", "w")
    assert result.returncode == 0 and "matches no tensor" not in result.stderr
