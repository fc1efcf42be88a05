"""``wdelta diff``, ``apply``, ``inspect`` and ``verify``: the commands on delta files."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..checkpoint.source import open_checkpoint
from ..errors import BadArgumentError, WdeltaError
from ..format.container import open_delta
from ..ops import api
from ..ops.summary import DeltaSummary, summarize
from . import options
from .options import CHECKPOINT_HELP, Commands
from .terminal import printable


def _checkpoint_bytes(path: str) -> int:
    with open_checkpoint(path) as ckpt:
        return sum(t.nbytes for t in ckpt.tensors.values())


def _cmd_diff(args: argparse.Namespace) -> int:
    def total() -> int:
        return _checkpoint_bytes(args.base) + _checkpoint_bytes(args.target)

    with options.progress(args, "diff", total) as progress:
        api.diff(
            args.base, args.target, args.output, level=args.level, threads=args.threads,
            chunk_elements=args.chunk_elements, reversible=not args.no_reverse,
            progress=progress, overwrite=args.force, compact=not args.compat,
        )  # fmt: skip
    if not args.quiet:
        try:
            with open_delta(args.output) as d:
                s = summarize(d)
        except WdeltaError:
            # A command that reports an error leaves no output (SPEC §10.5).
            os.unlink(args.output)
            raise
        print(printable(f"wrote {args.output}: {s.file_bytes} bytes, {s.ratio:.4%} of the target"))
    return 0


def _cmd_apply(args: argparse.Namespace) -> int:
    def total() -> int:
        with open_delta(args.delta) as d:
            return sum(t.nbytes for t in d.header.tensors)

    with options.progress(args, "apply", total) as progress:
        api.apply(
            args.base, args.delta, args.output, reverse=args.reverse, threads=args.threads,
            progress=progress, overwrite=args.force,
        )  # fmt: skip
    return 0


def _part_line(part: dict[str, Any] | None) -> list[str]:
    if part is None:
        return []
    return [f"part {part['index']} of {part['count']} of the link {part['base']} -> "
            f"{part['target']}"]  # fmt: skip


# The tensor column is as wide as the longest name up to this; a longer name is
# printed whole and pushes its row's other columns right, never cut.
MAX_NAME_COLUMN = 64


def _format_summary(s: DeltaSummary) -> str:
    width = min(MAX_NAME_COLUMN, max([len("tensor"), *(len(t.name) for t in s.tensors)]))
    lines = [
        f"wdelta v{s.version}  generator {s.generator}  chunk {s.chunk_elements} elements",
        f"base   {s.base_digest}",
        f"target {s.target_digest}",
        f"reversible {s.reversible}   ops {json.dumps(s.ops)}   "
        f"features {' '.join(s.required_features) or 'none'}",
        f"file {s.file_bytes} bytes for a {s.target_bytes}-byte target: ratio {s.ratio:.4%}",
        *_part_line(s.part),
        "",
        f"{'tensor':{width}} {'op':9} {'dtype':8} {'density':>9} {'raw':>12} {'stored':>11} "
        "encodings / transforms",
    ]
    for t in s.tensors:
        enc = ",".join(f"{k}:{v}" for k, v in t.encodings.items())
        tr = ",".join(f"{k}:{v}" for k, v in t.transforms.items())
        lines.append(
            f"{t.name:{width}} {t.op:9} {t.dtype:8} {t.density:9.4%} {t.raw_bytes:12} "
            f"{t.stored_bytes:11} {enc} {tr}".rstrip()
        )
    # Names and the generator come from the (possibly hostile) file.
    return "\n".join(printable(line) for line in lines)


def _cmd_inspect(args: argparse.Namespace) -> int:
    with open_delta(args.delta) as d:
        s = summarize(d)
    print(json.dumps(s.to_json(), indent=2) if args.json else _format_summary(s))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    def total() -> int:
        with open_delta(args.delta) as d:
            if args.base is not None:
                return sum(t.nbytes for t in d.header.tensors)
            return d.data_length

    wanted = (args.strict_writer, args.base is not None, args.target is not None)
    if (args.strict_writer or args.target is not None) and not all(wanted):
        raise BadArgumentError("--strict-writer and --target go together, with --base")
    with options.progress(args, "verify", total) as progress:
        api.verify(args.delta, args.base, threads=args.threads, progress=progress)
    if args.strict_writer:
        from ..conformance.writer import check_writer

        check_writer(Path(args.delta), Path(args.base), Path(args.target))
    if not args.quiet:
        line = f"ok: {args.delta}" + (f" applies to {args.base}" if args.base else "")
        line += " and meets the writer requirements W1-W6" if args.strict_writer else ""
        print(printable(line))
    return 0


def register(commands: Commands) -> None:
    """Add diff, apply, inspect and verify to the top-level ``commands``."""
    _register_diff(commands)
    _register_apply(commands)
    p = commands.add_parser("inspect", help="summarise a delta")
    p.add_argument("delta", metavar="DELTA", help="the .wdelta file to describe")
    options.add_json(p, "machine-readable output")
    p.set_defaults(func=_cmd_inspect, quiet=True)
    _register_verify(commands)


def _add_common(p: argparse.ArgumentParser) -> None:
    options.add_quiet(p, "no progress bar or summary")
    options.add_threads(p, min(2, os.cpu_count() or 1))


def _register_diff(commands: Commands) -> None:
    p = commands.add_parser("diff", help="encode the delta BASE -> TARGET")
    p.add_argument("base", metavar="BASE", help=CHECKPOINT_HELP.format("the older checkpoint"))
    p.add_argument("target", metavar="TARGET", help=CHECKPOINT_HELP.format("the newer one"))
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the .wdelta file to write")  # fmt: skip
    options.add_encoding(p)
    p.add_argument("--no-reverse", action="store_true",
                   help="allow full chunks and drop removed tensors (not reversible)")  # fmt: skip
    p.add_argument("--compat", action="store_true",
                   help="write a plain v1 file (v1 header form, byte-plane values, no "
                        "inline blobs), for readers without compact-header, coded-values "
                        "and inline-blobs")  # fmt: skip
    options.add_force(p)
    _add_common(p)
    p.set_defaults(func=_cmd_diff)


def _register_apply(commands: Commands) -> None:
    p = commands.add_parser("apply", help="rebuild the target from BASE and DELTA")
    base_help = CHECKPOINT_HELP.format("the delta's base (its target with --reverse)")
    p.add_argument("base", metavar="BASE", help=base_help)
    p.add_argument("delta", metavar="DELTA", help="the .wdelta file to apply")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the checkpoint to write (a folder if sharded)")  # fmt: skip
    p.add_argument("--reverse", action="store_true", help="BASE is the target; rebuild the base")
    options.add_force(p)
    _add_common(p)
    p.set_defaults(func=_cmd_apply)


def _register_verify(commands: Commands) -> None:
    p = commands.add_parser("verify", help="check integrity (and that it applies to --base)")
    p.add_argument("delta", metavar="DELTA", help="the .wdelta file to check")
    p.add_argument("--base", default=None, metavar="BASE",
                   help="also apply the delta to this checkpoint, writing nothing")  # fmt: skip
    p.add_argument("--target", default=None, metavar="TARGET",
                   help="the delta's target (with --strict-writer)")  # fmt: skip
    p.add_argument("--strict-writer", action="store_true",
                   help="also check the writer requirements W1-W6 of SPEC §11.1 (needs --base "
                   "and --target)")  # fmt: skip
    _add_common(p)
    p.set_defaults(func=_cmd_verify, synopsis="wdelta verify DELTA [--base BASE]")
