"""The chunk pipeline: batched handoff of chunk tasks to the worker threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdelta
from kit import as_raw, record_staged, safetensors_bytes
from wdelta.checkpoint.source import Scratch, Tensor
from wdelta.io.output_file import ALIGN, DIRECT_MIN_BYTES, OutputFile
from wdelta.ops import decoder, pipeline
from wdelta.ops.pipeline import BATCH_ELEMENTS, ChunkTask, batch_limit, batched_map, chunk_tasks

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
       threads=st.integers(1, 3), local=st.integers(0, 25))  # fmt: skip
@settings(max_examples=100, deadline=None)
def test_batched_map_runs_each_batch_on_one_thread_and_yields_in_order(
    sizes: list[int], chunk: int, limit: int, threads: int, local: int
) -> None:
    """Batches of tasks all under LOCAL_ELEMENTS (here ``local``) run on the calling
    thread, the others on the pool's threads (with more than one thread)."""
    tasks = _tasks(sizes, chunk)
    thread_of: dict[tuple[int, int], int] = {}

    def run(task: ChunkTask[int]) -> tuple[int, int]:
        thread_of[(task.item, task.index)] = threading.get_ident()
        return task.item, task.index

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "LOCAL_ELEMENTS", local)
        got = list(batched_map(run, tasks, threads, limit))
    assert got == [(t.item, t.index) for t in tasks]
    for batch in pipeline._batches(tasks, limit):
        threads_used = {thread_of[(t.item, t.index)] for t in batch}
        assert len(threads_used) == 1
        on_caller = threads_used == {threading.get_ident()}
        assert on_caller == (threads == 1 or all(t.count < local for t in batch))


@given(local=st.lists(st.booleans(), max_size=40), threads=st.integers(1, 3),
       ahead=st.integers(1, 3))  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_ordered_map_computes_local_items_on_the_calling_thread_in_order(
    local: list[bool], threads: int, ahead: int
) -> None:
    caller = threading.get_ident()

    def run(i: int) -> tuple[int, bool]:
        return i, threading.get_ident() == caller

    got = list(pipeline.ordered_map(run, range(len(local)), threads, ahead,
                                    local=lambda i: local[i]))  # fmt: skip
    assert [i for i, _ in got] == list(range(len(local)))
    assert [on_caller for _, on_caller in got] == [threads == 1 or x for x in local]


def test_batches_group_small_tasks_and_keep_large_ones_alone() -> None:
    batches = pipeline._batches(_tasks([3, 3, 3, 10, 2, 2], 100), 6)
    assert [[t.item for t in b] for b in batches] == [[0, 1], [2], [3], [4, 5]]


@pytest.mark.parametrize(
    ("sizes", "limit", "local", "failing", "before"),
    [
        ([1] * 20, 3, 0, 7, 6),  # every batch on the pool; task 7 is in batch [6, 7, 8]
        ([10, 1, 10, 1, 10, 1, 10], 10, 5, 5, 5),  # small batches on the caller, between pooled
    ],
)
def test_a_failing_task_stops_the_map_with_its_exception(
    sizes: list[int], limit: int, local: int, failing: int, before: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Results stop before the failing task's batch; its exception is raised."""
    monkeypatch.setattr(pipeline, "LOCAL_ELEMENTS", local)

    def run(task: ChunkTask[int]) -> int:
        if task.item == failing:
            raise ValueError(f"task {failing}")
        return task.item

    got: list[int] = []
    with pytest.raises(ValueError, match=f"task {failing}"):
        for value in batched_map(run, _tasks(sizes, 100), 2, limit):
            got.append(value)
    assert got == list(range(before))


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


@given(sizes=tensor_sizes, chunk=st.integers(1, 20))
def test_only_tensors_of_one_chunk_skip_the_sequencer(sizes: list[int], chunk: int) -> None:
    """A one-chunk tensor hashes without waiting for a turn (it has no order to keep);
    every tensor's digests are BLAKE3 of its words, fed in chunk order."""
    seq = pipeline.Sequencer()
    turns: list[tuple[int, int]] = []
    real_turn = seq.turn

    def counted_turn(stream: int, index: int):  # type: ignore[no-untyped-def]
        turns.append((stream, index))
        return real_turn(stream, index)

    seq.turn = counted_turn  # type: ignore[method-assign]
    data = {k: np.arange(n, dtype=np.uint16) * (k + 1) for k, n in enumerate(sizes)}
    multi = set()
    for task in _tasks(sizes, chunk):
        assert task.digests.single == (task.elements <= chunk)
        words = data[task.item][task.start : task.start + task.count]
        task.digests.feed(seq, 0, task.index, words)
        if not task.digests.single:
            multi.add(task.digests.stream)
        if task.last:
            expected = wdelta.format.digest.digest_bytes(data[task.item].tobytes())
            assert task.digests.hexdigest(seq, 0) == expected
    assert {stream for stream, _ in turns} == multi


def test_sequencer_ready_says_whose_turn_it_is() -> None:
    seq = pipeline.Sequencer()
    assert seq.ready(4, 0) and not seq.ready(4, 1) and not seq.ready(5, 2)
    with seq.turn(4, 0):
        pass
    assert seq.ready(4, 1) and not seq.ready(4, 0)
    seq.fail(RuntimeError("a worker failed"))
    with pytest.raises(pipeline.Aborted):
        seq.ready(4, 1)


def test_diff_hashes_a_chunk_whose_turn_has_not_come_after_encoding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk 1's worker finds chunk 0 still being hashed (slowed here): it encodes chunk 1
    first and hashes it afterwards, in turn; the digests are still the tensors' BLAKE3."""
    from wdelta.policy import chunk as chunk_policy

    chunk = pipeline.LOCAL_ELEMENTS  # chunks this large go to the pool, not the caller
    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**32, 3 * chunk, dtype=np.uint32).view(np.float32)
    target = base.copy()
    target[::50] = 2.5
    events: list[tuple[str, int, int]] = []
    feed, encode = pipeline.TensorDigests.feed, chunk_policy.encode_modified
    encoded_one = threading.Event()

    def slow_feed(self: Any, seq: Any, which: int, index: int, words: Any) -> None:
        if index == 0 and which == 0:
            encoded_one.wait(5)  # until another chunk has been encoded, or 5 s
        feed(self, seq, which, index, words)
        events.append(("hash", index, which))

    def recorded_encode(*args: Any) -> Any:
        done = encode(*args)
        events.append(("encode", -1, -1))
        encoded_one.set()
        return done

    monkeypatch.setattr(pipeline.TensorDigests, "feed", slow_feed)
    monkeypatch.setattr(chunk_policy, "encode_modified", recorded_encode)
    files = {}
    for name, words in (("base", base), ("target", target)):
        files[name] = tmp_path / f"{name}.safetensors"
        files[name].write_bytes(safetensors_bytes({"w": as_raw(words)}))
    out = wdelta.diff(files["base"], files["target"], tmp_path / "d.wdelta", threads=2,
                      chunk_elements=chunk)  # fmt: skip
    # Some chunk was encoded before chunk 0's base words were hashed: the worker of chunk
    # 1 did not wait for its turn before encoding.
    assert events.index(("hash", 0, 0)) > events.index(("encode", -1, -1)), events
    monkeypatch.undo()
    rebuilt = wdelta.apply(files["base"], out, tmp_path / "out.safetensors")
    assert Path(rebuilt).read_bytes() == files["target"].read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_apply_reuses_input_buffers_and_writes_every_chunk_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """apply reads input chunks into a few recycled buffers, not one fresh array per
    chunk; a buffer goes back only once its chunk is written, so the file (compared
    byte for byte: digests are checked before the write) is the target's."""
    rng = np.random.default_rng(threads)
    base = {f"t{i:03d}": rng.integers(0, 2**16, 300, dtype=np.uint16).view(np.float16)
            for i in range(120)}  # fmt: skip
    target = {}
    for name, words in base.items():
        changed = words.view(np.uint16).copy()
        changed[rng.random(300) < 0.05] ^= 1  # sparse chunks: decoded in place
        target[name] = changed.view(np.float16)
    paths = {}
    for side, arrays in (("base", base), ("target", target)):
        paths[side] = tmp_path / f"{side}.safetensors"
        paths[side].write_bytes(safetensors_bytes({k: as_raw(v) for k, v in arrays.items()}))
    delta = wdelta.diff(paths["base"], paths["target"], tmp_path / "d.wdelta", chunk_elements=100)
    buffers: list[object] = []
    real_read = Tensor.read

    def recording_read(self: Tensor, start: int, count: int, scratch: Scratch | None = None) -> Any:
        buffers.append(scratch)
        return real_read(self, start, count, scratch)

    monkeypatch.setattr(Tensor, "read", recording_read)
    out = wdelta.apply(paths["base"], delta, tmp_path / "out.safetensors", threads=threads)
    assert Path(out).read_bytes() == paths["target"].read_bytes()
    assert len(buffers) == 360 and None not in buffers
    assert len({id(b) for b in buffers}) <= 30


@given(extra=st.integers(0, 3 * ALIGN), phase=st.integers(0, ALIGN - 1))
def test_read_buffers_start_at_the_asked_phase(extra: int, phase: int) -> None:
    nbytes = DIRECT_MIN_BYTES + extra
    buffer = decoder._Buffer(nbytes, phase)
    words = buffer.take(nbytes)
    assert len(words) == nbytes and words.ctypes.data % ALIGN == phase
    buffer.place((phase + 1) % ALIGN)
    assert buffer.take(nbytes).ctypes.data % ALIGN == (phase + 1) % ALIGN


@given(nbytes=st.integers(1, DIRECT_MIN_BYTES - 1), phase=st.integers(0, ALIGN - 1))
def test_buffers_too_small_to_go_direct_carry_no_slack(nbytes: int, phase: int) -> None:
    buffer = decoder._Buffer(nbytes, phase)
    assert len(buffer.take(nbytes)) == nbytes == len(buffer._raw)


def test_chunks_decoded_in_place_are_written_without_the_staging_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Input chunks are read into buffers placed like their output file offsets, so a
    sparse or unchanged chunk (decoded in place) goes to O_DIRECT as it is."""
    rng = np.random.default_rng(5)
    base = {f"t{i}": rng.integers(0, 2**16, 50_001 + i, dtype=np.uint16) for i in range(4)}
    target = {k: v.copy() for k, v in base.items()}
    for v in list(target.values())[:3]:
        v[rng.random(len(v)) < 0.01] ^= 3
    paths = {}
    for side, arrays in (("base", base), ("target", target)):
        paths[side] = tmp_path / f"{side}.safetensors"
        raw = {k: as_raw(v.view(np.float16)) for k, v in arrays.items()}
        paths[side].write_bytes(safetensors_bytes(raw))
    delta = wdelta.diff(paths["base"], paths["target"], tmp_path / "d.wdelta")
    staged = record_staged(monkeypatch)
    direct: list[bool] = []
    real_init = OutputFile.__init__

    def recording_init(self: OutputFile, fd: int, direct_io: bool = True) -> None:
        real_init(self, fd, direct_io)
        direct.append(self.direct)

    monkeypatch.setattr(OutputFile, "__init__", recording_init)
    out = wdelta.apply(paths["base"], delta, tmp_path / "out.safetensors")
    assert Path(out).read_bytes() == paths["target"].read_bytes()
    if direct != [True]:
        pytest.skip("no O_DIRECT on this file system")
    assert staged == []


@pytest.mark.parametrize("local", [1 << 16, 0])
def test_verify_checks_every_blob_locally_and_on_the_pool(
    local: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_inline: None
) -> None:
    """verify without a base reads every blob, whether its chunk is checked by the
    calling thread (small chunks) or on the pool: a flipped byte of the last blob is
    found either way."""
    monkeypatch.setattr(pipeline, "LOCAL_ELEMENTS", local)
    rng = np.random.default_rng(3)
    base = {f"t{i}": rng.integers(0, 2**16, 600, dtype=np.uint16).view(np.float16)
            for i in range(12)}  # fmt: skip
    target = {k: v.copy() for k, v in base.items()}
    for v in target.values():
        v[rng.integers(0, 600, 40)] = 3.0
    delta = tmp_path / "d.wdelta"
    wdelta.diff(base, target, delta)
    wdelta.verify(delta, threads=2)
    with wdelta.open_delta(delta) as d:
        assert d.header.tensors[-1].chunks[0].in_data
    data = bytearray(delta.read_bytes())
    data[-1] ^= 1
    delta.write_bytes(bytes(data))
    with pytest.raises(wdelta.ChecksumMismatchError):
        wdelta.verify(delta, threads=2)
