"""The ``wdelta`` command line: diff, apply, inspect, verify.

Every failure ends with one line on stderr, ``error: CATEGORY: message``, and
a non-zero exit status (2 for bad arguments, 1 otherwise); no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._version import CHAIN_MANIFEST_VERSION, CONFORMANCE_SUITE_VERSION, __version__
from ..checkpoint.source import open_checkpoint
from ..errors import BadArgumentError, InternalError, StorageError, WdeltaError
from ..format.container import open_delta
from ..format.header import FORMAT_VERSION
from ..io import interrupts
from ..io.malloc_tuning import keep_chunk_buffers
from ..ops import api
from ..ops.summary import DeltaSummary, summarize
from .flags import in_flags
from .terminal import printable


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadArgumentError(message)


@contextlib.contextmanager
def _progress(
    args: argparse.Namespace, total: Callable[[], int], label: str
) -> Iterator[Callable[[int], None]]:
    """A byte-counting progress bar on stderr, silent if --quiet or not a TTY.

    ``total`` is only called (it opens the inputs) when the bar is shown.
    """
    if args.quiet or not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm import tqdm

    with tqdm(total=total(), unit="B", unit_scale=True, desc=label, file=sys.stderr) as bar:
        yield bar.update


def _checkpoint_bytes(path: str) -> int:
    with open_checkpoint(path) as ckpt:
        return sum(t.nbytes for t in ckpt.tensors.values())


def _cmd_diff(args: argparse.Namespace) -> int:
    def total() -> int:
        return _checkpoint_bytes(args.base) + _checkpoint_bytes(args.target)

    with _progress(args, total, "diff") as progress:
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
            # A command that reports an error leaves no output (SPEC.md §10.5).
            os.unlink(args.output)
            raise
        print(printable(f"wrote {args.output}: {s.file_bytes} bytes, {s.ratio:.4%} of the target"))
    return 0


def _cmd_apply(args: argparse.Namespace) -> int:
    def total() -> int:
        with open_delta(args.delta) as d:
            return sum(t.nbytes for t in d.header.tensors)

    with _progress(args, total, "apply") as progress:
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


def _format_summary(s: DeltaSummary) -> str:
    lines = [
        f"wdelta v{s.version}  generator {s.generator}  chunk {s.chunk_elements} elements",
        f"base   {s.base_digest}",
        f"target {s.target_digest}",
        f"reversible {s.reversible}   ops {json.dumps(s.ops)}   "
        f"features {' '.join(s.required_features) or 'none'}",
        f"file {s.file_bytes} bytes for a {s.target_bytes}-byte target: ratio {s.ratio:.4%}",
        *_part_line(s.part),
        "",
        f"{'tensor':40} {'op':9} {'dtype':8} {'density':>9} {'raw':>12} {'stored':>11} "
        "encodings / transforms",
    ]
    for t in s.tensors:
        enc = ",".join(f"{k}:{v}" for k, v in t.encodings.items())
        tr = ",".join(f"{k}:{v}" for k, v in t.transforms.items())
        lines.append(
            f"{t.name[:40]:40} {t.op:9} {t.dtype:8} {t.density:9.4%} {t.raw_bytes:12} "
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
    with _progress(args, total, "verify") as progress:
        api.verify(args.delta, args.base, threads=args.threads, progress=progress)
    if args.strict_writer:
        from ..conformance.writer import check_writer

        check_writer(Path(args.delta), Path(args.base), Path(args.target))
    if not args.quiet:
        line = f"ok: {args.delta}" + (f" applies to {args.base}" if args.base else "")
        line += " and meets the writer requirements W1-W6" if args.strict_writer else ""
        print(printable(line))
    return 0


def _add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", "-f", action="store_true",
                   help="replace the output if it exists (never an input)")  # fmt: skip


def _add_common(p: argparse.ArgumentParser, threads: bool = True) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    if threads:
        p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                       help="worker threads (default: 2)")  # fmt: skip


def _level(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a zstd level: {text!r}") from None


_CHAIN_HELP = "publish and sync chains of deltas"
_CHECKPOINT_HELP = "{}: a .safetensors file, or a folder holding a sharded checkpoint"
_CONFORMANCE_HELP = "run the conformance suite against an implementation"


def _add_chain(sub: Any, full: bool) -> None:
    if not full:
        sub.add_parser("chain", help=_CHAIN_HELP)
        return
    from ..chain import cli as chain_cli

    chain_cli.register(sub, _CHAIN_HELP)


def _add_conformance(sub: Any, full: bool) -> None:
    p = sub.add_parser("conformance", help=_CONFORMANCE_HELP)
    if not full:
        return
    from ..conformance import cli as conformance_cli

    conformance_cli.add_subcommands(p)
    p.set_defaults(func=conformance_cli.run_command)


class _VersionAction(argparse.Action):
    """``--version``: the package and the format versions it reads and writes."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``wdelta 0.1.0 (format v1, chain manifest v1, conformance suite v1)``."""
    return (
        f"wdelta {__version__} (format v{FORMAT_VERSION}, "
        f"chain manifest v{CHAIN_MANIFEST_VERSION}, "
        f"conformance suite v{CONFORMANCE_SUITE_VERSION})"
    )


def _subcommand_help(parser: argparse.ArgumentParser, path: Sequence[str]) -> str:
    """The help text of the (sub)command named by ``path`` (the top level if empty)."""
    for name in path:
        choices = next(
            a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        )
        parser = choices[name]
    return parser.format_help()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``wdelta`` command.

    ``chain`` and ``conformance`` import their modules (storage clients, the
    vectors' manifest: ~60 ms) only when ``command`` names them; otherwise
    they are listed by name and help only, so that ``diff`` and ``apply``
    (and ``--version``, ``--help``) start faster.
    """
    parser = _Parser(prog="wdelta", description="Bit-exact weight deltas between checkpoints.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
        title="commands", help="`wdelta COMMAND --help` describes each",
    )  # fmt: skip
    p = sub.add_parser("diff", help="encode the delta BASE -> TARGET")
    p.add_argument("base", metavar="BASE", help=_CHECKPOINT_HELP.format("the older checkpoint"))
    p.add_argument("target", metavar="TARGET", help=_CHECKPOINT_HELP.format("the newer one"))
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the .wdelta file to write")  # fmt: skip
    p.add_argument("--level", type=_level, default=None,
                   help="zstd level -7..22 or auto (default: SPEC 11.2)")  # fmt: skip
    p.add_argument("--chunk-elements", type=int, default=None, help="elements per chunk")
    p.add_argument("--no-reverse", action="store_true",
                   help="allow full chunks and drop removed tensors (not reversible)")  # fmt: skip
    p.add_argument("--compat", action="store_true",
                   help="write a plain v1 file (v1 header form, byte-plane values, no "
                        "inline blobs), for readers without compact-header, coded-values "
                        "and inline-blobs")  # fmt: skip
    _add_force(p)
    _add_common(p)
    p.set_defaults(func=_cmd_diff)
    p = sub.add_parser("apply", help="rebuild the target from BASE and DELTA")
    base_help = _CHECKPOINT_HELP.format("the delta's base (its target with --reverse)")
    p.add_argument("base", metavar="BASE", help=base_help)
    p.add_argument("delta", metavar="DELTA", help="the .wdelta file to apply")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the checkpoint to write (a folder if sharded)")  # fmt: skip
    p.add_argument("--reverse", action="store_true", help="BASE is the target; rebuild the base")
    _add_force(p)
    _add_common(p)
    p.set_defaults(func=_cmd_apply)
    p = sub.add_parser("inspect", help="summarise a delta")
    p.add_argument("delta", metavar="DELTA", help="the .wdelta file to describe")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_inspect, quiet=True)
    p = sub.add_parser("verify", help="check integrity (and that it applies to --base)")
    p.add_argument("delta", metavar="DELTA", help="the .wdelta file to check")
    p.add_argument("--base", default=None, metavar="BASE",
                   help="also apply the delta to this checkpoint, writing nothing")  # fmt: skip
    p.add_argument("--target", default=None, metavar="TARGET",
                   help="the delta's target (with --strict-writer)")  # fmt: skip
    p.add_argument("--strict-writer", action="store_true",
                   help="also check the writer requirements W1-W6 of SPEC 11.1 (needs --base "
                   "and --target)")  # fmt: skip
    _add_common(p)
    p.set_defaults(func=_cmd_verify, synopsis="wdelta verify DELTA [--base BASE]")
    _add_conformance(sub, command == "conformance")
    _add_chain(sub, command == "chain")
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # The command is the first argument that is not an option (the top level
    # has only --help and --version, which take no value).
    words = [a for a in argv if not a.startswith("-")]
    command = words[0] if words else None
    keep_chunk_buffers()
    parser, args = None, None
    try:
        with interrupts.as_exceptions():
            parser = build_parser(command)
            if argv == words and words in ([], ["chain"], ["conformance"]):
                # A command with nothing to do is a request for usage, as with git.
                print(_subcommand_help(parser, words), end="", file=sys.stderr)
                return 2
            args = parser.parse_args(argv)
            func: Callable[[argparse.Namespace], int] = args.func
            return func(args)
    except WdeltaError as exc:
        if exc.mixed_up and parser is not None and args is not None:
            exc.message += f": usage: {synopsis(parser, args)}"
        return _fail(exc)
    except BrokenPipeError:
        # The reader of our output went away (`wdelta inspect ... | head`):
        # not an error of ours; silence the flush at exit like other tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        return _fail(StorageError(str(exc)))
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, interrupts.Interrupted) else signal.SIGINT
        print(f"error: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    except MemoryError as exc:
        why = f" ({exc})" if str(exc) else ""
        return _fail(StorageError(f"out of memory{why}: free memory or run with --threads 1"))
    except Exception as exc:  # a bug still gets the one-line contract of SPEC 12.2
        return _fail(_unexpected(exc))


def _unexpected(exc: Exception) -> InternalError:
    """The one-line report of an exception wdelta did not anticipate."""
    if os.environ.get("WDELTA_TRACEBACK"):
        traceback.print_exc()
    return InternalError(
        f"unexpected {type(exc).__name__}: {exc} (a bug in wdelta {__version__}: please report "
        "it with the command; WDELTA_TRACEBACK=1 prints where it happened)"
    )


def synopsis(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The short usage of the command ``args`` was parsed for: its ``synopsis`` default
    if it sets one, else its name, positional arguments and required options
    (``wdelta apply BASE DELTA -o OUT``)."""
    while True:
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subcommands:
            break
        parser = subcommands[0].choices[getattr(args, subcommands[0].dest)]
    given: str | None = getattr(args, "synopsis", None)
    if given is not None:
        return given
    words = [parser.prog]
    words += [str(a.metavar or a.dest.upper()) for a in parser._actions if not a.option_strings]
    words += [
        f"{a.option_strings[0]} {a.metavar or a.dest.upper()}"
        for a in parser._actions
        if a.option_strings and a.required
    ]
    return " ".join(words)


def _fail(exc: WdeltaError) -> int:
    # Library messages name options as the API spells them; the CLI user types flags.
    message = printable(" ".join(in_flags(str(exc)).split()))
    print(f"error: {exc.category}: {message}", file=sys.stderr)
    return 2 if isinstance(exc, BadArgumentError) else 1


def main(argv: Sequence[str] | None = None) -> Any:
    """Console-script entry point."""
    sys.exit(run(argv))
