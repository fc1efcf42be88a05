"""Every failure of the public API is a WdeltaError (issue 12, finding 7).

Wrong kinds of argument (a list, None, a number, bytes where a checkpoint or a
path goes; a non-array in a mapping; a str where an int goes) are
``bad-argument`` naming the argument, never a TypeError or AttributeError;
paths are accepted as ``str`` or ``os.PathLike`` everywhere, the chain API
included; a missing optional package is one CLI line naming what to install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdelta
from chainkit import Trainer
from test_cli import ENV, WDELTA, assert_error
from wdelta import chain
from wdelta.chain.reading.local import digest_of_path
from wdelta.errors import WdeltaError

ARRAYS = {"w": np.arange(64, dtype=np.float32)}


def expect_bad_argument(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(WdeltaError) as info:
        fn(*args, **kwargs)
    assert info.value.category == "bad-argument", info.value
    return str(info.value)


class StrPath(os.PathLike[str]):
    """A path type that is neither str nor pathlib.Path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    base, target = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    t = Trainer(rows=8, cols=64)
    t.save(base)
    t.step(1)
    t.save(target)
    delta = wdelta.diff(str(base), StrPath(target), StrPath(tmp_path / "d.wdelta"))
    return base, target, delta


# A value that is neither a path, a mapping nor a Checkpoint.
NOT_A_CHECKPOINT = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=False), st.binary(max_size=8),
    st.lists(st.integers(), max_size=3), st.tuples(st.text(max_size=3)), st.booleans(),
)  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=NOT_A_CHECKPOINT)
def test_a_checkpoint_of_the_wrong_kind_is_bad_argument(value: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.wdelta"
    assert "base must be" in expect_bad_argument(wdelta.diff, value, ARRAYS, out)
    assert "target must be" in expect_bad_argument(wdelta.diff, ARRAYS, value, out)
    assert "must be a path" in expect_bad_argument(wdelta.diff, ARRAYS, ARRAYS, value)
    assert "must be a path" in expect_bad_argument(wdelta.apply, ARRAYS, value)
    assert "must be a path" in expect_bad_argument(wdelta.verify, value)
    assert "must be a path" in expect_bad_argument(wdelta.open_delta, value)
    assert "must be a path" in expect_bad_argument(wdelta.open_checkpoint, value)
    assert not out.exists()


@settings(max_examples=60, deadline=None)
@given(value=NOT_A_CHECKPOINT.filter(lambda v: not isinstance(v, np.ndarray)))
def test_a_mapping_value_that_is_not_an_array_is_bad_argument(value: Any) -> None:
    message = expect_bad_argument(wdelta.from_arrays, {"layer.w": value})
    assert "tensor 'layer.w'" in message


def test_mapping_keys_and_metadata_are_checked() -> None:
    expect_bad_argument(wdelta.from_arrays, [np.zeros(3)])
    expect_bad_argument(wdelta.from_arrays, {1: np.zeros(3)})
    expect_bad_argument(wdelta.from_arrays, ARRAYS, {"k": 1})


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"level": "3"}, "level must be an integer"),
        ({"level": 23}, "level must be in -7..22"),
        ({"threads": 1.5}, "threads must be an integer"),
        ({"threads": True}, "threads must be an integer"),
        ({"chunk_elements": "many"}, "chunk_elements must be an integer"),
        ({"progress": 3}, "progress must be callable"),
    ],
)
def test_diff_options_of_the_wrong_type(tmp_path: Path, kwargs: Any, words: str) -> None:
    out = tmp_path / "out.wdelta"
    assert words in expect_bad_argument(wdelta.diff, ARRAYS, ARRAYS, out, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_apply_and_verify_options(files: tuple[Path, Path, Path]) -> None:
    base, _, delta = files
    expect_bad_argument(wdelta.apply, base, delta, threads="2")
    expect_bad_argument(wdelta.apply, base, delta, base.parent / "o", progress="yes")
    expect_bad_argument(wdelta.verify, delta, threads=0)
    expect_bad_argument(wdelta.verify, delta, base=[base])
    assert not (base.parent / "o").exists()


def test_summarize_takes_an_open_delta(files: tuple[Path, Path, Path]) -> None:
    expect_bad_argument(wdelta.summarize, str(files[2]))


@pytest.mark.parametrize("text", ["", "a\0b"])
def test_empty_and_nul_paths(text: str, tmp_path: Path) -> None:
    expect_bad_argument(wdelta.open_delta, text)
    expect_bad_argument(wdelta.diff, text, ARRAYS, tmp_path / "o.wdelta")
    expect_bad_argument(chain.Chain, text)


def test_every_path_type_is_accepted(files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, target, delta = files
    for kind in (str, Path, StrPath):
        out = wdelta.apply(kind(base), kind(delta), kind(tmp_path / f"{kind.__name__}.st"))
        assert Path(out).read_bytes() == target.read_bytes()
        wdelta.verify(kind(delta), base=kind(base))
        with wdelta.open_delta(kind(delta)) as d, wdelta.open_checkpoint(kind(base)) as c:
            assert d.header.tensors and c.tensors


def test_chain_api_takes_str_and_pathlike(files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, target, _ = files
    store, node = str(tmp_path / "store"), tmp_path / "node.safetensors"
    chain.init(store, str(base), step=0)
    chain.append(chain.Chain(StrPath(Path(store))), StrPath(target), str(base), step=1)
    node.write_bytes(base.read_bytes())
    result = chain.pull(store, str(node))
    assert result.version.number == 1 and node.read_bytes() == target.read_bytes()
    assert chain.follow(StrPath(Path(store)), StrPath(node), interval=0, max_iterations=1)
    c = chain.Chain(store, cache=str(tmp_path / "cache"))
    assert chain.verify(c).head.number == 1
    assert chain.read_manifest(str(next((tmp_path / "store" / "manifests").iterdir())))
    assert chain.open_storage(StrPath(Path(store))).stat("manifests/x") is None


def test_chain_api_wrong_kinds(files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, target, _ = files
    store = tmp_path / "store"
    chain.init(store, base)
    expect_bad_argument(chain.init, tmp_path / "s2", [base])
    expect_bad_argument(chain.init, tmp_path / "s2", base, step="0")
    expect_bad_argument(chain.init, tmp_path / "s2", base, metadata={"k": 1})
    expect_bad_argument(chain.append, store, target, None)
    expect_bad_argument(chain.append, 42, target, base)
    expect_bad_argument(chain.Chain, store, cache=7)
    expect_bad_argument(chain.open_storage, None)
    expect_bad_argument(chain.LocalStorage, None)
    expect_bad_argument(chain.read_manifest, None)
    expect_bad_argument(chain.parse_manifest, 5)
    expect_bad_argument(chain.log_rows, "store")
    expect_bad_argument(chain.pull, store, tmp_path / "n.safetensors", tensors=3)
    expect_bad_argument(chain.follow, store, tmp_path / "n.safetensors", interval=-1)
    expect_bad_argument(chain.prune, store, "every 10")
    expect_bad_argument(chain.prune, store, chain.Policy("10", 1))  # type: ignore[arg-type]
    expect_bad_argument(chain.squash, store, 0, 1, base=b"a.safetensors")
    assert not (tmp_path / "s2").exists() and not (tmp_path / "n.safetensors").exists()


@pytest.fixture
def blocked(tmp_path: Path) -> dict[str, str]:
    """An environment in which boto3 and huggingface_hub fail to import."""
    shim = tmp_path / "shim"
    shim.mkdir()
    for name in ("boto3", "huggingface_hub"):
        (shim / f"{name}.py").write_text(
            f"raise ImportError({'No module named ' + repr(name)!r}, name={name!r})\n",
            encoding="utf-8",
        )
    return {**ENV, "PYTHONPATH": f"{shim}{os.pathsep}{ENV['PYTHONPATH']}"}


@pytest.mark.parametrize(
    ("argv", "install"),
    [
        (["chain", "log", "s3://bucket/run"], "pip install 'wdelta[s3]'"),
        (["chain", "pull", "s3://bucket/run", "{tmp}/m.safetensors"], "pip install 'wdelta[s3]'"),
        (["chain", "log", "hf://ns/repo"], "pip install 'huggingface_hub"),
    ],
)
def test_missing_optional_package_is_one_line(
    blocked: dict[str, str], tmp_path: Path, argv: list[str], install: str
) -> None:
    args = [a.format(tmp=tmp_path) for a in argv]
    result = subprocess.run(
        [str(WDELTA), *args], capture_output=True, text=True, env=blocked, timeout=120
    )
    assert_error(result, "unsupported-feature")
    assert install in result.stderr and "Traceback" not in result.stderr


def test_cli_follow_with_a_negative_interval(
    files: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    base, _, _ = files
    chain.init(tmp_path / "store", base)
    node = tmp_path / "node.safetensors"
    node.write_bytes(base.read_bytes())
    result = subprocess.run(
        [str(WDELTA), "chain", "pull", str(tmp_path / "store"), str(node), "--follow",
         "--interval", "-1", "--max-iterations", "2", "-q"],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert_error(result, "bad-argument")


def test_missing_optional_package_through_the_api(blocked: dict[str, str]) -> None:
    code = (
        "import wdelta, wdelta.chain\n"
        "try:\n    wdelta.chain.open_storage('s3://bucket/run')\n"
        "except wdelta.WdeltaError as e:\n    print(f'{e.category}: {e}')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=blocked, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("unsupported-feature: s3:// storage needs")


def test_conformance_load_takes_str_and_refuses_none() -> None:
    from wdelta import conformance

    root = conformance.default_vectors()
    assert conformance.load(str(root), check_files=False).cases
    expect_bad_argument(conformance.load, None)


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4),
    st.binary(max_size=4), st.lists(st.integers(), max_size=2),
)  # fmt: skip


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    level=st.one_of(st.integers(-10, 25), JUNK),
    threads=st.one_of(st.integers(-2, 4), JUNK.filter(lambda v: not isinstance(v, int))),
    chunk_elements=st.one_of(st.integers(-2, 2**27), JUNK),
    progress=st.one_of(st.just(lambda n: None), JUNK),
)
def test_diff_options_are_used_or_refused(
    tmp_path: Path, level: Any, threads: Any, chunk_elements: Any, progress: Any
) -> None:
    """Any value of any option: a delta, or a WdeltaError and no output."""
    out = tmp_path / "fuzz.wdelta"
    out.unlink(missing_ok=True)
    try:
        wdelta.diff(ARRAYS, ARRAYS, out, level=level, threads=threads,
                    chunk_elements=chunk_elements, progress=progress)  # fmt: skip
    except WdeltaError:
        assert not out.exists()
    else:
        assert wdelta.apply(ARRAYS, out)["w"].tobytes() == ARRAYS["w"].tobytes()


def test_a_chain_without_cache_says_how_to_give_one(files: tuple[Path, Path, Path]) -> None:
    base, _, _ = files
    store = base.parent / "store"
    chain.init(store, base)
    with pytest.raises(WdeltaError) as info:
        chain.verify(str(store))
    assert info.value.category == "io-error"
    assert "cache=FOLDER" in str(info.value)


def test_live_weights_api_wrong_kinds(files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The in-memory API (apply_inplace, changes, changed_tensors, verify_weights, chain
    save_weights / weights_digest / load / follow_weights / append_delta) refuses wrong kinds."""
    base, target, delta = files
    weights = dict(wdelta.apply(base, delta, reverse=False))  # the target, in memory
    expect_bad_argument(wdelta.apply_inplace, [1], delta)
    expect_bad_argument(wdelta.apply_inplace, "a.safetensors", delta)
    expect_bad_argument(wdelta.apply_inplace, dict(weights), delta, threads="2")
    expect_bad_argument(wdelta.apply_inplace, dict(weights), delta, tensors=5)
    expect_bad_argument(lambda: list(wdelta.changes(delta, tensors=5)))
    expect_bad_argument(lambda: list(wdelta.changed_tensors([1], delta)))
    expect_bad_argument(lambda: list(wdelta.changed_tensors(weights, delta, threads=0)))
    expect_bad_argument(wdelta.verify_weights, None, delta)
    expect_bad_argument(chain.save_weights, [1], tmp_path / "w.safetensors")
    expect_bad_argument(chain.save_weights, weights, None)
    expect_bad_argument(chain.weights_digest, [1])
    expect_bad_argument(chain.load, 5)
    expect_bad_argument(lambda: list(chain.follow_weights(tmp_path / "s", [1], interval=0)))
    expect_bad_argument(chain.append_delta, tmp_path / "s", None)
    chain.save_weights(weights, str(tmp_path / "w.safetensors"))  # a str path is a path
    assert digest_of_path(tmp_path / "w.safetensors") == digest_of_path(target)


def test_apply_inplace_to_its_own_target_says_so(files: tuple[Path, Path, Path]) -> None:
    base, _, delta = files
    weights = dict(wdelta.apply(base, delta))
    with pytest.raises(WdeltaError) as info:
        wdelta.apply_inplace(weights, delta)
    assert info.value.category == "base-mismatch"
    assert "already at the delta's target" in str(info.value)
