"""The chunk pipeline: batched handoff of chunk tasks to the worker threads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from kit import as_raw, safetensors_bytes
from wdelta import pipeline
from wdelta.checkpoint.source import Scratch
from wdelta.pipeline import BATCH_ELEMENTS, ChunkTask, batch_limit, batched_map, chunk_tasks

tensor_sizes = st.lists(st.integers(0, 50), max_size=30)


def _tasks(sizes: list[int], chunk: int) -> list[ChunkTask[int]]:
    return list(chunk_tasks(range(len(sizes)), lambda k: sizes[k], chunk, 2))


@given(sizes=tensor_sizes, chunk=st.integers(1, 20), limit=st.integers(1, 60))
def test_batches_are_greedy_runs_of_at_most_limit_elements(
    sizes: list[int], chunk: int, limit: int
) -> None:
    tasks = _tasks(sizes, chunk)
    batches = list(pipeline._batches(tasks, limit))
    assert [t for b in batches for t in b] == tasks
    for i, batch in enumerate(batches):
        total = sum(t.count for t in batch)
        assert batch and (len(batch) == 1 or total <= limit)
        if i + 1 < len(batches):
            assert total + batches[i + 1][0].count > limit  # nothing more would fit


@given(sizes=tensor_sizes, chunk=st.integers(1, 20), limit=st.integers(1, 60),
       threads=st.integers(1, 3))  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_batched_map_runs_each_batch_on_one_thread_and_yields_in_order(
    sizes: list[int], chunk: int, limit: int, threads: int
) -> None:
    tasks = _tasks(sizes, chunk)
    thread_of: dict[tuple[int, int], int] = {}

    def run(task: ChunkTask[int]) -> tuple[int, int]:
        thread_of[(task.item, task.index)] = threading.get_ident()
        return task.item, task.index

    assert list(batched_map(run, tasks, threads, limit)) == [(t.item, t.index) for t in tasks]
    for batch in pipeline._batches(tasks, limit):
        assert len({thread_of[(t.item, t.index)] for t in batch}) == 1


def test_batches_group_small_tasks_and_keep_large_ones_alone() -> None:
    batches = pipeline._batches(_tasks([3, 3, 3, 10, 2, 2], 100), 6)
    assert [[t.item for t in b] for b in batches] == [[0, 1], [2], [3], [4, 5]]


def test_a_failing_task_stops_the_map_with_its_exception() -> None:
    def run(task: ChunkTask[int]) -> int:
        if task.item == 7:
            raise ValueError("task 7")
        return task.item

    got: list[int] = []
    with pytest.raises(ValueError, match="task 7"):
        for value in batched_map(run, _tasks([1] * 20, 4), 2, 3):
            got.append(value)
    assert got == list(range(len(got))) and len(got) <= 7


def test_batch_limit_never_exceeds_a_chunk() -> None:
    assert batch_limit(1000) == 1000
    assert batch_limit(1 << 30) == BATCH_ELEMENTS


@given(counts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=8))
@settings(max_examples=30, deadline=None)
def test_reads_into_a_scratch_buffer_match_fresh_reads(
    counts: list[tuple[int, int]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The encoder's reused read buffer gives the same words as a fresh read, read after read."""
    rng = np.random.default_rng(len(counts))
    arrays = {"a": rng.integers(0, 2**16, 40, dtype=np.uint16).view(np.float16),
              "b": rng.integers(0, 2**32, 40, dtype=np.uint32).view(np.float32)}  # fmt: skip
    path = tmp_path_factory.mktemp("scratch") / "model.safetensors"
    path.write_bytes(safetensors_bytes({k: as_raw(v) for k, v in arrays.items()}))
    scratch = Scratch()
    with wdelta.open_checkpoint(path) as ckpt:
        for i, (start, count) in enumerate(counts):
            tensor = ckpt.tensors["ab"[i % 2]]
            count = min(count, 40 - start)
            fresh = tensor.read(start, count)
            reused = tensor.read(start, count, scratch)
            assert reused.dtype == fresh.dtype and reused.tobytes() == fresh.tobytes()


@given(counts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=8))
@settings(max_examples=30, deadline=None)
def test_in_memory_reads_go_into_the_scratch_buffer(counts: list[tuple[int, int]]) -> None:
    """Arrays and CPU torch tensors (diff of a state_dict) are copied into the reused
    buffer, as file reads are, not into a fresh array per chunk (a page fault per
    4 KiB); the words equal a fresh read's."""
    from wdelta.checkpoint.source import from_arrays
    from wdelta.tensors import checkpoint_of

    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(len(counts))
    arrays = {"a": rng.integers(0, 2**16, 40, dtype=np.uint16).view(np.float16),
              "b": rng.integers(0, 2**32, 40, dtype=np.uint32).view(np.float32)}  # fmt: skip
    sources = [from_arrays(arrays), checkpoint_of({k: torch.from_numpy(v)
                                                   for k, v in arrays.items()})]  # fmt: skip
    scratch = Scratch()
    for i, (start, count) in enumerate(counts):
        name, ckpt = "ab"[i % 2], sources[i % 2]
        count = min(count, 40 - start)
        reused = ckpt.tensors[name].read(start, count, scratch)
        assert reused.tobytes() == arrays[name][start : start + count].tobytes()
        assert count == 0 or np.shares_memory(reused, scratch.take(1))


def test_diff_reads_in_memory_tensors_without_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoder reads arrays and CPU torch tensors through read-only views of their
    memory (``Tensor.peek``), never copying a chunk, and the delta is still right."""
    from wdelta.checkpoint import source

    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    base = {"a": rng.integers(0, 2**16, 5000, dtype=np.uint16).view(np.float16),
            "b": rng.integers(0, 2**32, 300, dtype=np.uint32).view(np.float32)}  # fmt: skip
    target = {k: v.copy() for k, v in base.items()}
    target["a"][::7] = 1.5

    def no_copy(*args: object, **kwargs: object) -> None:
        raise AssertionError("an in-memory chunk was copied")

    monkeypatch.setattr(source.Tensor, "read", no_copy)
    for side in (base, {k: torch.from_numpy(v) for k, v in base.items()}):
        out = wdelta.diff(side, target, tmp_path / "d.wdelta", chunk_elements=1024, overwrite=True)
        monkeypatch.undo()
        back = wdelta.apply(base, out)
        assert isinstance(back, dict)
        assert all(back[k].tobytes() == target[k].tobytes() for k in target)
        monkeypatch.setattr(source.Tensor, "read", no_copy)
    view = source.from_arrays(base).tensors["a"].peek(10, 20)
    assert view is not None and not view.flags.writeable and np.shares_memory(view, base["a"])
