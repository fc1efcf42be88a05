"""The options that two or more commands take, each defined once, and what they mean.

``add_*`` put an option (or a set that goes together) on a command's parser;
:func:`progress` is the bar that ``--quiet`` silences and :func:`open_chain` the
chain that ``URL``, ``--cache``, ``--trust``, ``--sign`` and ``--expires-days``
describe.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ..io.atomic import temp_dir

if TYPE_CHECKING:
    from ..chain.store import Chain

#: The subcommands of a command, to which each CLI module's ``register`` adds its own.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

CHECKPOINT_HELP = "{}: a .safetensors file, or a folder holding a sharded checkpoint"
URL_HELP = "chain location: a folder, s3://BUCKET/PREFIX or hf://..."


def add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", "-f", action="store_true",
                   help="replace the output if it exists (never an input)")  # fmt: skip


def add_quiet(p: argparse.ArgumentParser, help: str = "no progress or summary") -> None:
    p.add_argument("--quiet", "-q", action="store_true", help=help)


def add_state(p: argparse.ArgumentParser, help: str) -> None:
    """``--state FILE``: a node's acceptance state (SPEC §17.7), for ``pull`` and ``check``."""
    p.add_argument("--state", default=None, metavar="FILE", help=help)


def add_threads(p: argparse.ArgumentParser, default: int = 2) -> None:
    p.add_argument("--threads", type=int, default=default,
                   help=f"worker threads (default: {default})")  # fmt: skip


def add_json(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--json", action="store_true", help=help)


def _level(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a zstd level: {text!r}") from None


def add_encoding(p: argparse.ArgumentParser) -> None:
    """``--level`` and ``--chunk-elements``, for the commands that encode a delta."""
    p.add_argument("--level", type=_level, default=None,
                   help="zstd level -7..22 or auto (default: SPEC §11.2)")  # fmt: skip
    p.add_argument("--chunk-elements", type=int, default=None, help="elements per chunk")


def add_url(p: argparse.ArgumentParser, help: str = URL_HELP) -> None:
    p.add_argument("url", help=help)


def add_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache", default=None,
        help="folder of verified downloads (default: $WDELTA_CACHE or temporary)",
    )  # fmt: skip


def add_trust(
    p: argparse.ArgumentParser,
    help: str = "the chain's trust root: refuse revisions not signed by its keys",
    required: bool = False,
) -> None:
    p.add_argument("--trust", default=None, required=required, metavar="ROOT", help=help)


def add_sign(
    p: argparse.ArgumentParser,
    help: str,
    expires_days: float = 7.0,
    expires_help: str = "days the signatures stay valid ({:g}): nodes report 'frozen' after",
) -> None:
    """``--sign KEY`` (repeatable) and ``--expires-days``."""
    p.add_argument("--sign", action="append", default=[], metavar="KEY", help=help)
    p.add_argument("--expires-days", type=float, default=expires_days,
                   help=expires_help.format(expires_days))  # fmt: skip


def add_signing(p: argparse.ArgumentParser) -> None:
    """``--trust``, ``--sign`` and ``--expires-days`` of the commands that publish."""
    add_trust(p)
    add_sign(p, "sign the new revision with this private key (repeatable; needs --trust)")


@contextlib.contextmanager
def progress(
    args: argparse.Namespace, label: str, total: Callable[[], int] | None = None
) -> Iterator[Callable[[int], None]]:
    """A byte-counting progress bar on stderr, silent with --quiet or when stderr is
    not a TTY.  ``total`` is only called (it may open the inputs) when a bar is shown."""
    if args.quiet or not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm import tqdm

    size = None if total is None else total()
    with tqdm(total=size, unit="B", unit_scale=True, desc=label, file=sys.stderr) as bar:
        yield bar.update


def trust_args(args: argparse.Namespace) -> dict[str, Any]:
    """Chain(...) keywords from --trust, --sign and --expires-days."""
    # Imported here: the chain's modules (storage clients, signing) would slow
    # the start of diff and apply, which share this module.
    from ..chain.trust.signing import load_revision_key
    from ..chain.trust.updater import Trust

    trust = getattr(args, "trust", None)
    keys = [load_revision_key(Path(k)) for k in getattr(args, "sign", None) or []]
    out: dict[str, Any] = {"trust": None if trust is None else Trust.from_file(Path(trust))}
    if keys:
        out["sign"] = keys
        out["sign_seconds"] = args.expires_days * 86400.0
    return out


@contextlib.contextmanager
def open_chain(args: argparse.Namespace, default_cache: Path | None = None) -> Iterator[Chain]:
    """The chain at URL with its trust and signing options, caching in --cache,
    $WDELTA_CACHE, ``default_cache`` or else a temporary folder."""
    from ..chain.storage import open_storage
    from ..chain.store import Chain

    trust = trust_args(args)
    storage = open_storage(args.url)
    cache = getattr(args, "cache", None) or os.environ.get("WDELTA_CACHE") or default_cache
    if cache is not None:
        yield Chain(storage, Path(cache), **trust)
        return
    with temp_dir(Path(tempfile.gettempdir()), "cache") as tmp:
        yield Chain(storage, tmp, **trust)
