"""The ``wdelta`` command: its parser, built from the modules that add its commands,
and :func:`run`, which turns every failure into one line on stderr,
``error: CATEGORY: message``, and a non-zero exit status (2 for bad arguments,
1 otherwise, 128+N for signal N); no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn

from .._version import CHAIN_MANIFEST_VERSION, CONFORMANCE_SUITE_VERSION, __version__
from ..errors import BadArgumentError, InternalError, StorageError, WdeltaError
from ..format.header import FORMAT_VERSION
from ..io import interrupts
from ..io.filekind import os_message
from ..io.malloc_tuning import keep_chunk_buffers
from .flags import in_flags
from .options import Commands
from .terminal import printable


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadArgumentError(message)


class Group(NamedTuple):
    """Commands added to ``wdelta`` (``word`` None) or to ``wdelta WORD``, each module
    of ``modules`` through its ``register(commands)``."""

    word: str | None
    help: str
    modules: tuple[str, ...]


# Every command of the CLI, in the order --help lists them.
GROUPS = (
    Group(None, "", ("delta",)),
    Group("conformance", "run the conformance suite against an implementation", ("conformance",)),
    Group("chain", "publish and sync chains of deltas", ("chain", "signing")),
)


class _VersionAction(argparse.Action):
    """``--version``: the package and the format versions it reads and writes."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``wdelta 0.1.0 (format v1, chain manifest v1, conformance suite v1, backend native)``:
    the backend is the codec path in use (the compiled kernels, or NumPy only)."""
    from ..codec import native  # imported here: the other commands' start-up needs none

    return (
        f"wdelta {__version__} (format v{FORMAT_VERSION}, "
        f"chain manifest v{CHAIN_MANIFEST_VERSION}, "
        f"conformance suite v{CONFORMANCE_SUITE_VERSION}, backend {native.backend()})"
    )


def _subcommands(parser: argparse.ArgumentParser, word: str | None) -> Commands:
    prefix = "wdelta " if word is None else f"wdelta {word} "
    return parser.add_subparsers(
        dest=f"{word}_command" if word else "command", required=True, parser_class=_Parser,
        metavar="COMMAND", title="commands", help=f"`{prefix}COMMAND --help` describes each",
    )  # fmt: skip


def _register(commands: Commands, modules: Sequence[str]) -> None:
    for name in modules:
        importlib.import_module(f"{__package__}.{name}").register(commands)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``wdelta`` command.

    ``chain`` and ``conformance`` import their modules (storage clients, the
    vectors' manifest: ~60 ms) only when ``command`` names them; otherwise
    they are listed by name and help only, so that ``diff`` and ``apply``
    (and ``--version``, ``--help``) start faster.
    """
    parser = _Parser(prog="wdelta", description="Bit-exact weight deltas between checkpoints.")
    parser.add_argument("--version", action=_VersionAction)
    top = _subcommands(parser, None)
    for group in GROUPS:
        if group.word is None:
            _register(top, group.modules)
            continue
        group_parser = top.add_parser(group.word, help=group.help)
        if group.word == command:
            _register(_subcommands(group_parser, group.word), group.modules)
    return parser


def _subcommand_help(parser: argparse.ArgumentParser, path: Sequence[str]) -> str:
    """The help text of the (sub)command named by ``path`` (the top level if empty)."""
    for name in path:
        choices = next(
            a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        )
        parser = choices[name]
    return parser.format_help()


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
            if argv == words and words in ([], *([g.word] for g in GROUPS if g.word)):
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
        if exc.filename is not None:
            return _fail(StorageError(os_message(exc.filename, exc)))
        return _fail(StorageError(str(exc)))
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, interrupts.Interrupted) else signal.SIGINT
        print(f"error: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + signum
    except MemoryError as exc:
        why = f" ({exc})" if str(exc) else ""
        return _fail(StorageError(f"out of memory{why}: free memory or run with --threads 1"))
    except Exception as exc:  # a bug still gets the one-line contract of SPEC §12.2
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


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console-script entry point."""
    sys.exit(run(argv))
