"""``wdelta chain init | append | log | verify | check | pull | squash | prune | gc |
check-storage``: the commands that publish, read and maintain a chain (its signing
commands are in :mod:`.signing`).

Each command's ``func`` returns the exit status and lets WdeltaError propagate to
:func:`.app.run`, which prints ``error: CATEGORY: message``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..chain.model.manifest import Manifest, read_manifest
from ..chain.reading.cachegc import gc_chain
from ..chain.reading.pull import PullResult, follow, pull
from ..chain.storage import open_storage
from ..chain.storage.backoff import Backoff
from ..chain.storage.checkstore import check_storage
from ..chain.store import Chain
from ..chain.trust import acceptance, signatures
from ..chain.trust.freshness import parse_duration
from ..chain.trust.updater import Trust
from ..chain.writing import append as ops
from ..chain.writing.compose import squash
from ..chain.writing.prune import Policy, prune
from ..checkpoint.source import open_checkpoint
from ..errors import BadArgumentError, WdeltaError
from . import options
from .flags import in_flags
from .options import Commands, open_chain
from .signing import cosign_hint, signature_lines
from .terminal import printable


def _n(count: int, noun: str) -> str:
    """``1 hop``, ``2 hops``: a count with its noun in the right number."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _metadata(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadArgumentError(f"--meta expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(printable(text))


def _cmd_init(args: argparse.Namespace) -> int:
    with open_chain(args) as c, options.progress(args, "upload") as on_bytes:
        m = ops.init(
            c,
            Path(args.checkpoint),
            step=args.step,
            metadata=_metadata(args.meta),
            progress=on_bytes,
        )
    _say(args, f"chain at {args.url}: version 0 {m.head.digest[:16]} (revision 1)")
    _cosign_hint(args, c, m)
    return 0


def _cmd_append(args: argparse.Namespace) -> int:
    encoding = ops.AppendOptions(args.level, args.chunk_elements, args.threads, args.snapshot)
    with open_chain(args) as c, options.progress(args, "upload") as on_bytes:
        m = ops.append(
            c,
            Path(args.checkpoint),
            Path(args.base),
            step=args.step,
            metadata=_metadata(args.meta),
            options=encoding,
            progress=on_bytes,
        )
    link = m.links[-1]
    _say(
        args,
        f"version {m.head.number} {m.head.digest[:16]}: link {link.size} bytes "
        f"(revision {m.revision})",
    )
    _cosign_hint(args, c, m)
    return 0


def _cosign_hint(args: argparse.Namespace, c: Chain, m: Manifest) -> None:
    """After a publication signed below the threshold, what the co-signers run (WS-6)."""
    hint = cosign_hint(c, m)
    if hint is not None:
        _say(args, hint)


def _format_log(m: Manifest) -> str:
    lines = [
        f"revision {m.revision}  {len(m.versions)} versions  {len(m.links)} links  "
        f"{len(m.snapshots)} snapshots",
        f"{'version':>7} {'step':>8} {'digest':16} {'time':20} {'snapshot':>12} links in",
    ]
    for row in ops.log_rows(m):
        links = ", ".join(f"{k['from']} ({k['size']} B)" for k in row["links_in"]) or "-"
        step = "-" if row["step"] is None else str(row["step"])
        snap = "-" if row["snapshot_bytes"] is None else str(row["snapshot_bytes"])
        lines.append(
            f"{row['number']:>7} {step:>8} {row['digest'][:16]:16} "
            f"{row['time'] or '-':20} {snap:>12} {links}"
        )
    return "\n".join(printable(line) for line in lines)


def _cmd_log(args: argparse.Namespace) -> int:
    """The head's versions, then (for a signed chain, or with --trust) who signed each
    stored revision: the table's head is read without the trust policy so that a
    refused revision is shown as such rather than hiding the log (--json, for tools,
    prints only a head the policy accepts)."""
    trust = options.trust_args(args)["trust"]
    c = Chain(open_storage(args.url), trust=trust if args.json else None)
    m = c.head()
    if args.json:
        print(json.dumps(m.to_json(), indent=2))
        return 0
    print(_format_log(m))
    c.trust = trust
    for line in signature_lines(c):
        print(printable(line))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    with open_chain(args) as c, options.progress(args, "verify") as on_bytes:
        m = ops.verify(c, deep=args.deep, progress=on_bytes)
    _say(
        args,
        f"ok: revision {m.revision}, {len(m.versions)} versions, {len(m.links)} links, "
        f"{len(m.snapshots)} snapshots" + (" (deep)" if args.deep else ""),
    )
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    """One manifest revision file (CH-1..CH-9); with --after, against a revision accepted
    before (RD-1); with --store, the files it lists (RD-2, RD-3); with --trust (needs
    --store), its signatures first (SG-1..SG-5)."""
    policy = _check_trust_args(args)
    m = read_manifest(args.manifest)
    with tempfile.TemporaryDirectory(prefix="wdelta-check-") as tmp:
        c = None if args.store is None else Chain(open_storage(args.store), Path(tmp))
        if args.after is not None:
            acceptance.check_after(args.manifest, m, args.after,
                                   acceptance.stored_digests(c))  # fmt: skip
        if args.state is not None and c is not None:
            acceptance.check_state(args.manifest, m, args.state, policy, c.storage,
                                   acceptance.stored_digests(c))  # fmt: skip
        if c is not None:
            ops.check_files(c, m)
    files = ", files verified" if args.store else ""
    _say(args, f"ok: revision {m.revision}, {len(m.versions)} versions, {len(m.links)} links, "
               f"{len(m.snapshots)} snapshots{files}")  # fmt: skip
    return 0


def _check_trust_args(args: argparse.Namespace) -> Trust | None:
    """``check``'s trust policy: SG-1..SG-5 checked first for ``--trust`` (which, like
    ``--state``, needs ``--store``: signatures and roots live there)."""
    for flag, value in (("--trust", args.trust), ("--state", args.state)):
        if value is not None and args.store is None:
            raise BadArgumentError(f"check {flag} needs --store (the chain's storage)")
    if args.after is not None and args.state is not None:
        raise BadArgumentError("check takes --after or --state, not both")
    if args.trust is None:
        return None
    policy = Trust.from_file(Path(args.trust))
    signatures.check_signatures(Path(args.manifest), open_storage(args.store), policy)
    return policy


def _report(args: argparse.Namespace, r: PullResult) -> None:
    _say(
        args,
        f"{args.local}: version {r.version.number} {r.version.digest[:16]} "
        f"(revision {r.revision}, {_n(len(r.hops), 'hop')}, {r.downloaded} bytes fetched)",
    )


def _retrying(exc: WdeltaError, delay: float) -> None:
    """One line per failed poll of ``pull --follow`` (the node keeps its version)."""
    message = in_flags(str(exc))
    print(f"pull failed: {exc.category}: {message}; retrying in {delay:.1f} s", file=sys.stderr)


_UNAUTHENTICATED = "warning: no trust policy (--trust ROOT): revisions are not authenticated"


def _warn_if_no_tensor(args: argparse.Namespace) -> None:
    """A --tensors pattern that matched nothing (a mistyped name) leaves a checkpoint
    without tensors, which is no error for the pull: say so rather than succeed silently
    (unless --quiet, as the other warnings)."""
    if args.tensors is None or args.quiet:
        return
    with open_checkpoint(args.local) as ckpt:
        if ckpt.tensors:
            return
    print(printable(f"warning: --tensors {args.tensors!r} matches no tensor of the version: "
                    f"{args.local} holds none (patterns are globs on whole names, such as "
                    "'model.layers.1.*')"), file=sys.stderr)  # fmt: skip


def _report_once_unauthenticated(args: argparse.Namespace) -> Callable[[PullResult], None]:
    """``_report``, and after the first success without --trust the warning (once, on
    stderr; a failure stays the single ``error:`` line of §12.2).  ``--quiet`` asks for
    no output on success, so it silences the warning too, as before signing existed."""
    warned = args.trust is not None or args.quiet

    def report(r: PullResult) -> None:
        nonlocal warned
        _report(args, r)
        _warn_if_no_tensor(args)
        if not warned:
            print(_UNAUTHENTICATED, file=sys.stderr)
            warned = True

    return report


def _cmd_pull(args: argparse.Namespace) -> int:
    local = Path(args.local)
    report = _report_once_unauthenticated(args)
    kwargs: dict[str, Any] = {"tensors": args.tensors, "threads": args.threads}
    kwargs["cache_max_bytes"] = args.cache_max_bytes
    kwargs["state"] = args.state or True
    kwargs["accept_rollback"] = args.accept_rollback
    kwargs["allow_unsigned"] = args.allow_unsigned
    kwargs["max_age"] = None if args.max_age is None else parse_duration(args.max_age)
    cache = local.parent / ".wdelta-cache"
    with open_chain(args, cache) as c, options.progress(args, "pull") as on_bytes:
        kwargs["progress"] = on_bytes
        if not args.follow:
            report(pull(c, local, to=args.to, **kwargs))
            return 0
        follow(
            c,
            local,
            interval=args.interval,
            max_iterations=args.max_iterations,
            timeout=args.timeout,
            on_update=report,
            on_error=_retrying,
            backoff=Backoff(base=min(1.0, args.backoff_cap), cap=args.backoff_cap),
            **kwargs,
        )
    return 0


def _cmd_squash(args: argparse.Namespace) -> int:
    base = Path(args.base) if args.base else None
    with open_chain(args) as c, options.progress(args, "squash") as on_bytes:
        m = squash(c, args.source, args.target, base=base, threads=args.threads, progress=on_bytes)
    link = next(
        k
        for k in m.links
        if (k.source, k.target) == (m.version(args.source).number, m.version(args.target).number)
    )
    _say(args, f"link {link.source}->{link.target}: {link.size} bytes (revision {m.revision})")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    policy = Policy(args.snapshot_every, args.keep_links, args.keep_revisions)
    with open_chain(args) as c:
        m, deleted = prune(c, policy, dry_run=args.dry_run)
    kept = (
        f"{_n(len(m.versions), 'version')}, {_n(len(m.links), 'link')}, "
        f"{_n(len(m.snapshots), 'snapshot')}"
    )
    if args.dry_run:
        files = _n(len(deleted), "file")
        print(f"dry run: revision {m.revision} would keep {kept}; would delete {files}")
        for key in deleted:
            print(f"  {key}")
        return 0
    _say(args, f"revision {m.revision}: kept {kept}; deleted {_n(len(deleted), 'file')}")
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    if not (args.cache or os.environ.get("WDELTA_CACHE")):
        raise BadArgumentError("gc needs the cache folder: --cache DIR or $WDELTA_CACHE")
    with open_chain(args) as c:
        r = gc_chain(c, args.max_bytes)
    _say(
        args, f"removed {_n(len(r.removed), 'file')} ({r.freed} bytes); cache holds {r.kept} bytes"
    )
    return 0


def _cmd_check_storage(args: argparse.Namespace) -> int:
    if args.writers < 2 or args.rounds < 1:
        raise BadArgumentError("check-storage needs --writers >= 2 and --rounds >= 1")
    report = check_storage(lambda: open_storage(args.url), writers=args.writers, rounds=args.rounds)
    if args.json:
        doc = {
            "url": report.url, "prefix": report.prefix, "passed": report.passed,
            "rules": [vars(r) for r in report.results], "leftover": report.leftover,
        }  # fmt: skip
        print(json.dumps(doc, indent=2))
    else:
        for r in report.results:
            print(f"{r.rule} {'PASS' if r.passed else 'FAIL'}: {r.observed}")
        if report.leftover is not None:
            print(f"cleanup FAIL: {report.leftover}")
    return 0 if report.passed else 1


def _common(p: argparse.ArgumentParser, *, cache: bool = False, threads: bool = False) -> None:
    """URL and --quiet, and if asked --cache and --threads: the options of most commands."""
    options.add_url(p)
    options.add_quiet(p)
    if cache:
        options.add_cache(p)
    if threads:
        options.add_threads(p)


def _publish_args(p: argparse.ArgumentParser) -> None:
    """CHECKPOINT, --step and --meta: what ``init`` and ``append`` publish."""
    p.add_argument("checkpoint", help="the checkpoint to publish (.safetensors or folder)")
    p.add_argument("--step", type=int, default=None, help="training step of this version")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                   help="free metadata (repeatable)")  # fmt: skip


def register(commands: Commands) -> None:
    """Add the commands that publish, read and maintain a chain to ``wdelta chain``."""
    _register_publishers(commands)
    _register_maintainers(commands)
    _register_checkers(commands)
    _register_pull(commands)
    p = commands.add_parser("gc", help="remove cache entries the head no longer names, then LRU")
    _common(p, cache=True)
    p.add_argument("--max-bytes", type=int, default=None, help="shrink the cache to this size")
    p.set_defaults(func=_cmd_gc)
    p = commands.add_parser(
        "check-storage", help="test a store against the storage contract (ST-1..3)"
    )
    options.add_url(p, "a folder, s3://BUCKET/PREFIX or hf://...; keys go under a new prefix")
    options.add_json(p, "the verdicts as JSON")
    p.add_argument("--writers", type=int, default=8, help="concurrent create-only writers (8)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the create race (3)")
    p.set_defaults(func=_cmd_check_storage)


def _register_publishers(commands: Commands) -> None:
    p = commands.add_parser(
        "init", help="start a chain from a base checkpoint (stored as a snapshot)"
    )
    _common(p)
    _publish_args(p)
    options.add_signing(p)
    p.set_defaults(func=_cmd_init)
    p = commands.add_parser("append", help="publish a checkpoint as a delta from --base")
    _common(p, threads=True)
    _publish_args(p)
    p.add_argument("--base", required=True, help="local copy of the head (or another version)")
    p.add_argument("--snapshot", action="store_true", help="also store a full snapshot")
    options.add_encoding(p)
    options.add_signing(p)
    p.set_defaults(func=_cmd_append)


def _register_maintainers(commands: Commands) -> None:
    p = commands.add_parser(
        "squash", help="publish one link composed of the links between versions"
    )
    _common(p, cache=True, threads=True)
    p.add_argument("--from", dest="source", required=True, help="older version")
    p.add_argument("--to", dest="target", default="head", help="newer version (default head)")
    p.add_argument("--base", default=None, help="local checkpoint at --from (else its snapshot)")
    options.add_signing(p)
    p.set_defaults(func=_cmd_squash)
    p = commands.add_parser("prune", help="drop links and snapshots outside a retention policy")
    _common(p)
    p.add_argument("--snapshot-every", type=int, required=True,
                   help="keep snapshots of every Nth version")  # fmt: skip
    p.add_argument("--keep-links", type=int, required=True, help="keep the last K links")
    p.add_argument("--keep-revisions", type=int, default=10, help="manifest revisions kept (10)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be removed, remove nothing")  # fmt: skip
    options.add_signing(p)
    p.set_defaults(func=_cmd_prune)


def _register_checkers(commands: Commands) -> None:
    p = commands.add_parser("log", help="the history of versions")
    _common(p)
    options.add_json(p, "the head manifest as JSON")
    options.add_trust(p)
    p.set_defaults(func=_cmd_log)
    p = commands.add_parser("verify", help="check every manifest rule, digest and header")
    _common(p, cache=True)
    p.add_argument("--deep", action="store_true",
                   help="also rebuild every version and apply every link")  # fmt: skip
    p.set_defaults(func=_cmd_verify)
    p = commands.add_parser("check", help="check one manifest revision file (and --store's files)")
    p.add_argument("manifest", help="a manifest file named rev-RRRRRRRRRRRR.json")
    p.add_argument("--store", default=None, help="the chain's root: verify every listed file")
    options.add_trust(p, "check its signatures in --store")
    p.add_argument("--after", default=None, metavar="SEEN",
                   help="a revision file accepted before: refuse a rollback or fork from it "
                   "(RD-1)")  # fmt: skip
    options.add_state(p, "a node's acceptance state (needs --store): RD-1 and the trust it records")
    options.add_quiet(p, "no output on success")
    p.set_defaults(func=_cmd_check)


def _register_pull(commands: Commands) -> None:
    p = commands.add_parser("pull", help="bring a local checkpoint to the head or --to VERSION")
    _common(p, cache=True, threads=True)
    p.add_argument("local", help="the node's checkpoint file (or symlink to a sharded folder)")
    p.add_argument("--to", default="head", help="version: number, step:N, digest prefix or head")
    p.add_argument("--tensors", default=None, metavar="PATTERN",
                   help="partial pull: comma-separated globs of tensor names")  # fmt: skip
    p.add_argument("--follow", action="store_true", help="keep polling and applying new versions")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between polls (10)")
    p.add_argument("--max-iterations", type=int, default=None, help="stop after N polls")
    p.add_argument("--timeout", type=float, default=None, help="stop after S seconds")
    p.add_argument("--cache-max-bytes", type=int, default=None,
                   help="after each pull, shrink the cache to this size (least recently used "
                   "first)")  # fmt: skip
    p.add_argument("--backoff-cap", type=float, default=300.0,
                   help="longest wait in seconds between retries of a failing --follow poll "
                   "(300)")  # fmt: skip
    options.add_trust(p)
    options.add_state(p, "where the accepted head revision is kept, to refuse a rolled-back "
                      "chain (default: .LOCAL.wdelta-accepted.json beside LOCAL)")  # fmt: skip
    p.add_argument(
        "--max-age", default=None, metavar="DURATION",
        help="refuse (error: frozen) a head published longer ago: 90s, 30m, 12h, 7d",
    )  # fmt: skip
    p.add_argument("--accept-rollback", action="store_true",
                   help="accept the current head even if lower than (or a rewrite of) the "
                   "accepted one")  # fmt: skip
    p.add_argument(
        "--allow-unsigned", action="store_true",
        help="read without --trust although this node accepted signed revisions "
        "(its state then stops requiring signatures)",
    )  # fmt: skip
    p.set_defaults(func=_cmd_pull)
