"""Structure-aware fuzzing of every reader (issue 12, "make it stay fixed").

Mutations of valid inputs: byte flips and truncations of a delta; edits of
its header's JSON members with the header digest recomputed (so they get past
the checksum); blob edits with fresh checksums; edits of a safetensors header,
a shard index and a chain manifest.  Property (fuzz_targets.py): the right
result or a WdeltaError of a documented category, no output left after a
refusal, inputs unchanged.  The default profile draws 40 examples per target;
``pytest -m slow tests/test_fuzz.py`` runs 2000 per target in a subprocess
under an address-space limit (memory beyond the limits fails it) and a
timeout (a hang fails it).  Coverage-guided: fuzz/atheris_fuzz.py.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from fuzz_targets import (
    Seeds,
    blob_edited,
    check_delta,
    check_index,
    check_manifest,
    check_safetensors,
    with_header,
    work_folder,
)
from wdelta.chain.model.manifest import parse_manifest

LONG = int(os.environ.get("WDELTA_FUZZ_EXAMPLES", "0"))
fuzz = settings(max_examples=LONG) if LONG else settings()

scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, -1, 2**64])
    | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["sparse", "dense", "full", "unchanged", "zstd", "none", "xor", "sub",
                       "F32", "BF16", "modified", "added", "removed", "m.safetensors\n"])
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    return Seeds(tmp_path_factory.mktemp("fuzz"))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def json_edits(draw: st.DrawFn, doc: Any) -> Any:
    """``doc`` with one member replaced, removed or added somewhere."""
    doc = copy.deepcopy(doc)
    path = draw(st.sampled_from(_paths(doc)[1:]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(json_values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=6))] = draw(json_values)
    else:
        parent.insert(path[-1], draw(json_values))
    return doc


@fuzz
@given(st.data())
def test_delta_header_member_edits(seeds: Seeds, data: st.DataObject) -> None:
    header = data.draw(json_edits(seeds.header))
    check_delta(seeds, with_header(seeds.delta_bytes, header), work_folder(seeds.folder))


@fuzz
@given(st.data())
def test_delta_byte_flips_and_truncation(seeds: Seeds, data: st.DataObject) -> None:
    raw = bytearray(seeds.delta_bytes)
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(raw)) | st.just(len(raw)))
    check_delta(seeds, bytes(raw[:cut]), work_folder(seeds.folder))


@fuzz
@given(st.data())
def test_delta_blob_edits_with_fresh_checksums(seeds: Seeds, data: st.DataObject) -> None:
    work = work_folder(seeds.folder)
    check_delta(seeds, blob_edited(seeds, data, work).read_bytes(), work)


@fuzz
@given(st.data())
def test_safetensors_header_edits(seeds: Seeds, data: st.DataObject) -> None:
    n = int.from_bytes(seeds.safetensors[:8], "little")
    doc = json.loads(seeds.safetensors[8 : 8 + n])
    text = json.dumps(data.draw(json_edits(doc))).encode()
    body = seeds.safetensors[8 + n :]
    raw = len(text).to_bytes(8, "little") + text + body
    check_safetensors(
        raw[: data.draw(st.integers(0, len(raw)) | st.just(len(raw)))], work_folder(seeds.folder)
    )


@fuzz
@given(st.data())
def test_shard_index_edits(seeds: Seeds, data: st.DataObject) -> None:
    check_index(seeds, json.dumps(data.draw(json_edits(json.loads(seeds.index)))).encode())


@fuzz
@given(st.data())
def test_chain_manifest_edits(seeds: Seeds, data: st.DataObject) -> None:
    check_manifest(json.dumps(data.draw(json_edits(json.loads(seeds.manifest)))).encode())


@fuzz
@given(st.binary(max_size=200))
def test_arbitrary_bytes(seeds: Seeds, raw: bytes) -> None:
    check_manifest(raw)
    check_safetensors(raw, work_folder(seeds.folder))
    check_delta(seeds, raw, work_folder(seeds.folder))


@pytest.mark.parametrize("features", [[[]], [{}], [1, "x"]])
def test_found_manifest_with_unhashable_required_features(seeds: Seeds, features: Any) -> None:
    """Found by the long run: ``required_features: [[]]`` was a TypeError."""
    doc = json.loads(seeds.manifest)
    doc["required_features"] = features
    with pytest.raises(wdelta.WdeltaError) as info:
        parse_manifest(json.dumps(doc).encode())
    assert info.value.category in {"manifest-invalid", "unsupported-feature"}


def _limit_memory() -> None:
    cap = 3 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.mark.slow
def test_long_fuzz_run_under_memory_and_time_limits() -> None:
    """2000 examples per target in a subprocess capped at 3 GiB and 50 minutes."""
    here = Path(__file__).parent
    env = {**os.environ, "WDELTA_FUZZ_EXAMPLES": "2000"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         str(here / "test_fuzz.py"), "-k", "not long_fuzz"],
        capture_output=True, text=True, env=env, cwd=here.parent, timeout=3000,
        preexec_fn=_limit_memory,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
