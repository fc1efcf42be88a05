"""The typed Python API: ``diff``, ``apply``, ``verify``, ``open_delta``.

Checkpoints are paths (a ``.safetensors`` file or a folder with a sharded
checkpoint) or in-memory mappings of names to NumPy arrays (bf16/fp8 through
ml_dtypes dtypes).  All file outputs are atomic.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union, cast

import numpy as np

from ..arguments import PathLike, as_path, check_int, check_optional_int, is_path
from ..checkpoint.source import Checkpoint, open_checkpoint
from ..errors import (
    BadArgumentError,
    BaseMismatchError,
    DeltaFormatError,
    LimitExceededError,
    NotReversibleError,
    StorageError,
    UnsupportedFeatureError,
)
from ..format.container import DeltaFile, open_delta
from ..format.layout import SideLayout
from ..io.atomic import atomic_file, atomic_folder
from ..io.destination import check_output
from ..io.filekind import naming
from ..io.output_file import OutputFile
from ..limits import MAX_CHUNK_ELEMENTS
from . import decoder, tensors
from .encoder import DiffOptions, Progress, diff_checkpoints

# Mappings hold NumPy arrays (bf16/fp8 as ml_dtypes) and/or torch tensors.
CheckpointLike = Union[PathLike, Mapping[str, Any], Checkpoint]  # noqa: UP007


F = TypeVar("F", bound=Callable[..., Any])


def _storage_errors(func: F) -> F:
    """Report operating-system errors (disk full, missing folder) as StorageError."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OSError as exc:
            raise StorageError(str(exc)) from exc

    return cast(F, wrapper)


def _paths(**sources: object) -> list[Path]:
    """The sources given as paths (not arrays or open checkpoints), by argument name."""
    return [as_path(value, name) for name, value in sources.items() if is_path(value)]


@contextlib.contextmanager
def _checkpoint(source: CheckpointLike, what: str) -> Iterator[Checkpoint]:
    """``source`` as a Checkpoint; ``what`` names the argument in errors.

    A mapping (NumPy arrays and/or torch tensors) goes through ``tensors.checkpoint_of``.
    """
    if isinstance(source, Checkpoint):
        yield source
    elif isinstance(source, Mapping):
        yield tensors.checkpoint_of(source)
    elif is_path(source):
        with open_checkpoint(as_path(source, what)) as ckpt:
            yield ckpt
    else:
        raise BadArgumentError(
            f"{what} must be a checkpoint path, a mapping of tensor names to arrays or a "
            f"Checkpoint, not {type(source).__name__}"
        )


@contextlib.contextmanager
def _naming_inputs(delta: Path, base: object) -> Iterator[None]:
    """Name the file each error of apply or verify is about: the base or the delta."""
    about_delta = (DeltaFormatError, NotReversibleError, UnsupportedFeatureError,
                   LimitExceededError)  # fmt: skip
    with naming(delta, *about_delta):
        if not is_path(base):
            yield
            return
        with naming(as_path(base, "base"), BaseMismatchError, subject="input"):
            yield


def _check_options(threads: object, progress: object) -> int:
    if progress is not None and not callable(progress):
        raise BadArgumentError(f"progress must be callable, not {type(progress).__name__}")
    return check_int(threads, "threads", 1)


@_storage_errors
def diff(
    base: CheckpointLike, target: CheckpointLike, out: PathLike, *,
    level: int | None = None, threads: int = 2, chunk_elements: int | None = None,
    reversible: bool = True, progress: Progress | None = None, overwrite: bool = False,
    compact: bool = True,
) -> Path:  # fmt: skip
    """Encode the delta from ``base`` to ``target`` into the file ``out``.

    ``compact`` False writes a plain v1 file, for readers that predate features
    ``compact-header``, ``coded-values`` and ``inline-blobs``: the v1 header
    form instead of the compact one (SPEC §4.11), values as byte planes (not
    §7.6.6) and every blob in the data section (not §4.12).

    ``out`` must not be an input (nor a link to one) and must not exist
    unless ``overwrite`` (BadArgumentError, before anything is read).

    ``level`` is the zstd level of every blob; None uses the encoder's own
    policy (level 3 below 64 KiB, zstd's fast strategy tuned for delta
    payloads above, see ``codec.blob.compress``).
    """
    path = as_path(out, "out")
    level = check_optional_int(level, "level", -7, 22)
    chunks = check_optional_int(chunk_elements, "chunk_elements", 1, MAX_CHUNK_ELEMENTS)
    threads = _check_options(threads, progress)
    opts = DiffOptions(
        level,
        threads,
        chunks or DiffOptions.chunk_elements,
        bool(reversible),
        bool(compact),
        coded_values=bool(compact),
        inline_blobs=bool(compact),
    )
    check_output(path, _paths(base=base, target=target), overwrite=bool(overwrite))
    with _checkpoint(base, "base") as b, _checkpoint(target, "target") as t:
        tensors.compare_on_device(base, target, t)
        return diff_checkpoints(b, t, path, opts, progress, overwrite=bool(overwrite))


def _output_layout(delta: DeltaFile, reverse: bool) -> SideLayout:
    return delta.header.base if reverse else delta.header.target


def _apply_to_files(
    delta: DeltaFile, ckpt: Checkpoint, steps: list[decoder.Step], out: Path,
    threads: int, progress: Progress | None, reverse: bool, overwrite: bool,
) -> None:  # fmt: skip
    layout = _output_layout(delta, reverse)
    offsets = decoder.output_tensor_offsets(layout.files)
    if layout.index is None:
        ((path, file_layout),) = layout.files
        with atomic_file(out, overwrite=overwrite) as fd:
            decoder.init_file(fd, file_layout)
            output = OutputFile(fd)
            try:
                sink = decoder.file_sink({path: output}, offsets)
                decoder.run_steps(delta, ckpt, steps, sink, threads, progress)
                output.finish()
            finally:
                output.close()
        return
    with atomic_folder(out, overwrite=overwrite) as folder, contextlib.ExitStack() as stack:
        files: dict[str, OutputFile] = {}
        for path, file_layout in layout.files:
            fd = os.open(folder / path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            stack.callback(os.close, fd)
            decoder.init_file(fd, file_layout)
            files[path] = OutputFile(fd)
            stack.callback(files[path].close)
        decoder.run_steps(delta, ckpt, steps, decoder.file_sink(files, offsets), threads, progress)
        for output in files.values():
            output.finish()
        (folder / layout.index[0]).write_text(layout.index[1], encoding="utf-8")


def _apply_to_arrays(
    delta: DeltaFile, ckpt: Checkpoint, steps: list[decoder.Step], threads: int,
    progress: Progress | None, device: Any,
) -> dict[str, Any]:  # fmt: skip
    outputs = {
        s.entry.name: np.empty(s.entry.elements, dtype=s.entry.dtype.word)
        for s in steps if s.dst_digest is not None
    }  # fmt: skip

    def sink(name: str, byte_offset: int, words: Any) -> None:
        out = outputs[name]
        start = byte_offset // out.itemsize
        out[start : start + len(words)] = words

    decoder.run_steps(delta, ckpt, steps, sink, threads, progress)
    shapes = {s.entry.name: s.entry for s in steps if s.dst_digest is not None}
    return {
        name: tensors.present(words, shapes[name].dtype, shapes[name].shape, device)
        for name, words in outputs.items()
    }


@_storage_errors
def apply(
    base: CheckpointLike, delta: PathLike, out: PathLike | None = None, *,
    reverse: bool = False, threads: int = 2, progress: Progress | None = None,
    overwrite: bool = False,
) -> Path | dict[str, Any]:  # fmt: skip
    """Apply ``delta`` to ``base`` (or, with ``reverse``, undo it on the target).

    With ``out`` the result is written atomically (a file, or a folder for a
    sharded checkpoint) and its path returned; without, the tensors are
    returned: torch tensors (on the base tensors' device) when ``base`` is a
    mapping holding torch tensors, else NumPy arrays (ml_dtypes for bf16/fp8).
    Every digest is verified; on any failure nothing is written at ``out``.
    ``out`` must not be an input (nor a link to one, nor inside an input
    folder) and must not exist unless ``overwrite`` (BadArgumentError, before
    anything is read).
    """
    threads = _check_options(threads, progress)
    path = None if out is None else as_path(out, "out")
    delta_path = as_path(delta, "delta")
    if path is not None:
        check_output(path, _paths(base=base, delta=delta_path), overwrite=bool(overwrite))
    with (
        open_delta(delta_path) as d,
        _checkpoint(base, "base") as ckpt,
        _naming_inputs(delta_path, base),
    ):
        steps = decoder.plan_steps(d.header, reverse)
        decoder.check_input(d.header, ckpt, reverse)
        if path is None:
            device = tensors.torch_device(base)
            return _apply_to_arrays(d, ckpt, steps, threads, progress, device)
        _apply_to_files(d, ckpt, steps, path, threads, progress, reverse, bool(overwrite))
        return path


@_storage_errors
def verify(
    delta: PathLike, base: CheckpointLike | None = None, *, threads: int = 2,
    progress: Progress | None = None,
) -> None:  # fmt: skip
    """Check a delta's integrity; with ``base``, also that it applies to it.

    Without a base every blob is read, checksummed, decompressed and parsed.
    With a base the full apply runs without writing, so every digest is checked.
    """
    threads = _check_options(threads, progress)
    delta_path = as_path(delta, "delta")
    with open_delta(delta_path) as d, _naming_inputs(delta_path, base):
        if base is None:
            decoder.check_blobs(d, threads, progress)
            return
        with _checkpoint(base, "base") as ckpt:
            steps = decoder.plan_steps(d.header, False)
            decoder.check_input(d.header, ckpt, False)
            decoder.run_steps(d, ckpt, steps, None, threads, progress)


__all__ = ["DeltaFile", "apply", "diff", "open_delta", "verify"]
