"""The writer requirements of SPEC §11.1 that a reader cannot check.

A reader validates everything a delta must satisfy on its own (§3 to §9).
Some requirements bind writers only, or need the base and the target to be
checked: SPEC lists them as W1 to W6 (§11.1), and :func:`writer_violations`
checks each of them on a delta that the reference reader has accepted, with
its base and target at hand.  Memory is bounded by one chunk of each input.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..chain.reading.local import digest_of_path
from ..checkpoint.source import Checkpoint, open_checkpoint
from ..codec import sparse
from ..errors import BadArgumentError, EncodingInvalidError, HeaderInvalidError
from ..format.container import PREFIX_SIZE, DeltaFile, open_delta
from ..format.header import Header, TensorEntry, entries_json
from ..format.layout import SideLayout
from ..format.names import Encoding

PAGE = 4096
# Members a writer MUST NOT write, by encoding (SPEC §4.6, "ignored").
IGNORED: dict[Encoding, tuple[str, ...]] = {
    "unchanged": ("transform", "codec", "offset", "length", "raw_length", "checksum", "inline"),
    "full": ("transform",),
    "sparse": (),
    "dense": (),
}


def header_text_violations(header: bytes) -> list[str]:
    """W1, W2: no byte-order mark or leading whitespace; padding of §4.1.

    The padding is the run of spaces that ends the header; any other JSON
    whitespace before it belongs to the JSON text.
    """
    problems = []
    if not header.startswith(b"{"):
        problems.append(f"W1 §4.1: the header starts with {header[:3]!r}, not '{{' "
                        "(no byte-order mark, no leading whitespace)")  # fmt: skip
    pad = len(header) - len(header.rstrip(b" "))
    aligned = (PREFIX_SIZE + len(header)) % PAGE == 0
    if pad > 7 and not (aligned and pad < PAGE):
        where = "the data section starts at a multiple of 4096" if aligned else "unaligned"
        problems.append(f"W2 §4.1: {pad} padding spaces ({where}); allowed: 0 to 7, or fewer "
                        "than 4096 that end the header at a 4096-byte boundary")  # fmt: skip
    return problems


def ignored_member_violations(entries: list[dict[str, Any]]) -> list[str]:
    """W3: chunk members marked ignored for their encoding are absent (``entries``: the
    header's tensor entries in the v1 form, :func:`~wdelta.format.header.entries_json`)."""
    problems = []
    for entry in entries:
        for i, chunk in enumerate(entry.get("chunks", [])):
            found = [k for k in IGNORED.get(chunk["encoding"], ()) if k in chunk]
            if found:
                problems.append(f"W3 §4.6: tensor {entry['name']!r} chunk {i} "
                                f"({chunk['encoding']}) has ignored members {found}")  # fmt: skip
    return problems


def _chunks(header: Header, entry: TensorEntry) -> Iterator[tuple[int, int, int]]:
    for i in range(len(entry.chunks)):
        start, m = header.chunk_span(entry, i)
        yield i, start, m


def changed_violations(d: DeltaFile, base: Checkpoint, target: Checkpoint) -> list[str]:
    """W4, W5: exact ``changed`` for every chunk; sparse lists exactly the changed elements."""
    problems = []
    for entry in d.header.tensors:
        if entry.op != "modified":
            continue
        b, t = base.tensors[entry.name], target.tensors[entry.name]
        for i, start, m in _chunks(d.header, entry):
            chunk = entry.chunks[i]
            diff = np.flatnonzero(b.read(start, m) != t.read(start, m))
            where = f"tensor {entry.name!r} chunk {i} ({chunk.encoding})"
            if chunk.changed != len(diff):
                problems.append(f"W4 §4.6: {where}: changed = {chunk.changed}, but "
                                f"{len(diff)} elements differ")  # fmt: skip
            if chunk.encoding != "sparse":
                continue
            pos, _ = sparse.decode(
                d.payload(chunk), m, entry.dtype.word, d.header.coded_values, chunk.changed
            )
            listed = np.asarray(pos, dtype=np.int64)
            if listed.shape != diff.shape or not np.array_equal(listed, diff):
                extra = sorted(set(listed.tolist()) - set(diff.tolist()))[:3]
                missing = sorted(set(diff.tolist()) - set(listed.tolist()))[:3]
                problems.append(f"W5 §7.6.5: {where}: positions not exactly the changed "
                                f"elements (unchanged listed {extra}, changed missing "
                                f"{missing})")  # fmt: skip
    return problems


def _input_layout(ckpt: Checkpoint) -> tuple[dict[str, str], tuple[str, str] | None]:
    return {name: f.header_text for name, f in ckpt.files.items()}, ckpt.index


def layout_violations(side: str, recorded: SideLayout, ckpt: Checkpoint) -> list[str]:
    """W6: a side records its input's files: exact headers, and for an index its files."""
    files, index = _input_layout(ckpt)
    mine = {path: layout.header_text for path, layout in recorded.files}
    if index is None and recorded.index is None:
        # A single file's recorded path is informational (§10.4).
        same = list(mine.values()) == list(files.values())
    else:
        same = mine == files and recorded.index == index
    if same:
        return []
    return [f"W6 §4.9: the {side} side does not record the {side} checkpoint's files "
            f"(recorded {sorted(mine)}, index {recorded.index is not None}; input "
            f"{sorted(files)}, index {index is not None}) or their exact headers"]  # fmt: skip


def writer_violations(delta: Path, base: Path, target: Path) -> list[str]:
    """Every writer requirement W1 to W6 (SPEC §11.1) that ``delta`` breaks.

    ``delta`` must already satisfy the reader's rules (``api.verify``) and
    apply to ``target``; errors of the reference reader propagate.
    """
    with open_delta(delta) as d:
        with open(delta, "rb") as f:
            f.seek(PREFIX_SIZE)
            header = f.read(d.header_length)
        problems = header_text_violations(header)
        problems += ignored_member_violations(entries_json(header))
        with open_checkpoint(base) as b, open_checkpoint(target) as t:
            problems += changed_violations(d, b, t)
            problems += layout_violations("base", d.header.base, b)
            problems += layout_violations("target", d.header.target, t)
    return problems


def check_writer(delta: Path, base: Path, target: Path) -> None:
    """Raise for the first writer requirement ``delta`` breaks (``wdelta verify --strict-writer``).

    ``delta`` must already have been verified against ``base``.  W5 is a break
    of the payload (``encoding-invalid``), the others of the header
    (``header-invalid``); a ``target`` that is not the delta's is a bad argument.
    """
    with open_delta(delta) as d:
        recorded = d.header.raw["target"]["digest"]
    if digest_of_path(target) != recorded:
        raise BadArgumentError(f"{target} is not the target of {delta} (checkpoint digest)")
    problems = writer_violations(delta, base, target)
    if problems:
        error = EncodingInvalidError if problems[0].startswith("W5") else HeaderInvalidError
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise error(f"writer requirement {problems[0]}{more}")
