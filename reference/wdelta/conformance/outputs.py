"""Comparing a written checkpoint with the expected one, and saying how it differs.

The check itself is the sha256 of every output file.  When it fails, the
files are read leniently as safetensors so the message can name the tensors
that differ (and, given the expected bytes, the first differing element), or
say that the tensors are right but the recorded file header was not
reproduced.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from ..format.dtypes import DTYPES
from .manifest import Output, sha256_file

TensorBytes = dict[str, tuple[str, list[int], bytes]]
_SHOW = 4


def read_tensors(path: Path) -> TensorBytes:
    """name -> (dtype, shape, bytes) of every ``*.safetensors`` file at ``path``."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    out: TensorBytes = {}
    for f in files:
        data = f.read_bytes()
        (n,) = struct.unpack_from("<Q", data)
        header: dict[str, Any] = json.loads(data[8 : 8 + n])
        header.pop("__metadata__", None)
        for name, info in header.items():
            begin, end = info["data_offsets"]
            out[name] = (info["dtype"], info["shape"], data[8 + n + begin : 8 + n + end])
    return out


def _files(path: Path, expected: Output) -> dict[str, Path]:
    if expected.layout == "file":
        return {".": path}
    return {p.name: p for p in sorted(path.iterdir())}


def compare(path: Path, expected: Output, reference: Path | None = None) -> str | None:
    """None if ``path`` holds exactly ``expected``, else what differs.

    ``reference`` is a correct output (the reference decoder's), used only to
    locate the first differing element of a tensor.
    """
    want_dir = expected.layout == "folder"
    if not path.exists() or path.is_dir() != want_dir:
        return f"no output {'folder' if want_dir else 'file'} was written at {path.name}"
    files = _files(path, expected)
    if set(files) != set(expected.files):
        missing, extra = (
            sorted(set(expected.files) - set(files)),
            sorted(set(files) - set(expected.files)),
        )
        return f"output folder: missing files {missing}, unexpected files {extra}"
    wrong = [
        name
        for name, p in files.items()
        if not p.is_file() or sha256_file(p) != expected.files[name]
    ]
    if not wrong:
        return None
    what = f"output files {wrong} differ" if want_dir else "the output file differs"
    return f"{what} from the expected bytes: {diagnose(path, expected, reference)}"


def diagnose(path: Path, expected: Output, reference: Path | None) -> str:
    """Which tensors differ, and where; or that only the file framing differs."""
    try:
        got = read_tensors(path)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        return f"not readable as safetensors ({type(exc).__name__}: {exc})"
    want = expected.tensors
    problems = [f"missing tensor {n!r}" for n in sorted(set(want) - set(got))]
    problems += [f"unexpected tensor {n!r}" for n in sorted(set(got) - set(want))]
    for name in sorted(set(want) & set(got)):
        dtype, shape, data = got[name]
        if (dtype, shape) != (want[name]["dtype"], want[name]["shape"]):
            problems.append(f"{name!r} is {dtype} {shape}, expected "
                            f"{want[name]['dtype']} {want[name]['shape']}")  # fmt: skip
        elif hashlib.sha256(data).hexdigest() != want[name]["sha256"]:
            problems.append(_element_difference(name, data, dtype, reference))
    if not problems:
        return ("every tensor is right, the file bytes are not: the recorded safetensors "
                "header (key order, spacing, padding, __metadata__) or index was not "
                "reproduced exactly")  # fmt: skip
    more = f" (+{len(problems) - _SHOW} more)" if len(problems) > _SHOW else ""
    return "; ".join(problems[:_SHOW]) + more


def _element_difference(name: str, data: bytes, dtype: str, reference: Path | None) -> str:
    size = DTYPES[dtype].size if dtype in DTYPES else 1
    if reference is None:
        return f"tensor {name!r} bytes differ"
    try:
        want = read_tensors(reference)[name][2]
    except (OSError, ValueError, KeyError, struct.error):
        return f"tensor {name!r} bytes differ"
    for i in range(0, min(len(data), len(want)), size):
        if data[i : i + size] != want[i : i + size]:
            got_w = int.from_bytes(data[i : i + size], "little")
            want_w = int.from_bytes(want[i : i + size], "little")
            count = sum(data[j : j + size] != want[j : j + size] for j in range(0, len(want), size))
            digits = 2 * size
            return (f"tensor {name!r}: {count} of {len(want) // size} elements differ, first at "
                    f"element {i // size}: got 0x{got_w:0{digits}x}, "
                    f"expected 0x{want_w:0{digits}x}")  # fmt: skip
    return f"tensor {name!r} has {len(data)} bytes, expected {len(want)}"
