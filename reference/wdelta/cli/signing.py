"""``wdelta chain keygen | root | rotate | sign | refresh``, the signature lines of
``chain log`` (one per stored revision) and the co-signing hint of a publication
signed below the threshold (SPEC §17.11)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NamedTuple

from ..arguments import as_path
from ..chain.errors import ConflictError, NotFoundError, SignatureInvalidError
from ..chain.model.manifest import Manifest, Version, parse_manifest, revision_key
from ..chain.reading.local import digest_of_path
from ..chain.storage import open_storage
from ..chain.storage.base import Storage
from ..chain.store import Chain
from ..chain.trust.signing import (
    KEY_ROLES,
    check_role,
    generate,
    load_public_key,
    load_revision_key,
    load_signing_key,
    write_json,
)
from ..chain.trust.updater import (
    Trust,
    check_successor,
    expires_in,
    format_time,
    make_root,
    parse_predecessor,
    read_previous_root,
    read_root_file,
    root_key,
)
from ..errors import BadArgumentError, WdeltaError
from ..format.digest import digest_bytes
from ..limits import MAX_DOCUMENT_BYTES, MAX_MANIFEST_BYTES
from . import options
from .options import Commands, open_chain
from .terminal import printable


def _cmd_keygen(args: argparse.Namespace) -> int:
    key, path = generate(), Path(args.keyfile)
    public = Path(f"{path}.pub")
    if public.exists():
        raise BadArgumentError(f"{public} exists; choose another key file name")
    label = {} if args.role is None else {"role": args.role}
    write_json(path, {**key.to_json(), **label}, private=True)
    write_json(public, {**key.public.to_json(), **label})
    role = "" if args.role is None else f"{args.role} "
    print(f"{role}key {key.public.keyid}: private {path} (mode 600), public {public}")
    return 0


def _cmd_root(args: argparse.Namespace) -> int:
    """Write a root: its root role (offline keys, they sign roots) and its revisions
    role (online keys, they sign revisions), signed by root keys (``--sign``) of this
    root and, for a rotation, of the previous root's root role."""
    previous = None if args.previous is None else read_previous_root(Path(args.previous))
    chain_id = args.chain_id or (previous.chain if previous else None)
    if chain_id is None:
        raise BadArgumentError("a first root needs --chain-id NAME")
    if previous is not None and chain_id != previous.chain:
        raise BadArgumentError(f"--chain-id differs from the previous root's {previous.chain!r}")
    if not args.root_key or not args.revision_key or not args.sign:
        raise BadArgumentError(
            "a root needs at least one --root-key PUB, one --revision-key PUB and one "
            "--sign KEY (a private root key)"
        )
    for flag, role, paths in (("--root-key", "root", args.root_key), ("--sign", "root", args.sign),
                              ("--revision-key", "revisions", args.revision_key)):  # fmt: skip
        for k in paths:
            check_role(Path(k), role, flag)
    root = make_root(
        chain_id,
        root_keys=[load_public_key(Path(k)) for k in args.root_key],
        root_threshold=args.root_threshold,
        revision_keys=[load_public_key(Path(k)) for k in args.revision_key],
        revision_threshold=args.revision_threshold,
        expires=format_time(time.time() + args.expires_days * 86400.0),
        signers=[load_signing_key(Path(k)) for k in args.sign],
        previous=previous,
    )
    write_json(Path(args.out), root.to_json())
    print(
        f"root version {root.version} of chain {printable(root.chain)}: root role "
        f"{root.root.threshold} of {len(root.root.keyids)} keys, revisions role "
        f"{root.revisions.threshold} of {len(root.revisions.keyids)} keys, expires {root.expires}"
    )
    return 0


def _stored_roots(storage: Storage) -> list[int]:
    found = []
    for info in storage.list("trust/"):
        name = info.key.rsplit("/", 1)[-1]
        if name.startswith("root-") and name.endswith(".json") and name[5:-5].isdigit():
            found.append(int(name[5:-5]))
    return sorted(found)


def _cmd_rotate(args: argparse.Namespace) -> int:
    """Store a new root version (WS-3): the next version, signed by the stored previous one."""
    new = read_root_file(Path(args.root))
    storage = open_storage(args.url)
    stored = _stored_roots(storage)
    if stored:
        last = stored[-1]
        if new.version != last + 1:
            raise ConflictError(f"the chain's newest root is version {last}; {args.root} is "
                                f"version {new.version}, not {last + 1}")  # fmt: skip
        old = parse_predecessor(storage.read(root_key(last), MAX_DOCUMENT_BYTES), root_key(last))
        check_successor(new, old, str(args.root))
    if not storage.create(root_key(new.version), new.to_bytes()):
        raise ConflictError(f"root version {new.version} was stored meanwhile")
    print(f"root version {new.version} stored: nodes move to it at their next pull")
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    """Add signatures to the head revision (co-signing, or a head whose writer could not
    store its own): show what is signed, check it against the --expect-* flags
    (WS-6) and the signatures as a node would (WS-5), then store them."""
    trust = Trust.from_file(Path(args.trust))
    keys = [load_revision_key(Path(k)) for k in args.sign]
    if not keys:
        raise BadArgumentError("sign needs at least one --sign KEY")
    expected = {_digest_argument(d) for d in args.expect_digest}
    expected |= {digest_of_path(as_path(f, "--expect-checkpoint")) for f in args.expect_checkpoint}
    expires = expires_in(args.expires_days * 86400.0)
    c = Chain(open_storage(args.url))
    revisions = c.revisions()
    if not revisions:
        raise NotFoundError(f"{args.url}: no chain here (no manifest revision)")
    revision = revisions[-1]  # only the head: a fresh signature of an older revision would
    data = c.storage.read(
        revision_key(revision), MAX_MANIFEST_BYTES
    )  # serve as fresh after a rollback
    m = parse_manifest(data, expected_revision=revision)
    trust.update(c.storage)
    review = _review(c, trust, m)
    print("\n".join(map(printable, _summary(c.storage, trust, m, data, review))), flush=True)
    _check_expected(args, m, review.versions, expected)
    trust.check_signers(c.storage, keys, expires)
    trust.sign(c.storage, m.revision, data, keys, expires)
    print(f"revision {m.revision} (head version {m.head.number}) signed by "
          f"{', '.join(k.public.keyid[:16] for k in keys)} until {expires}")  # fmt: skip
    return 0


def _digest_argument(text: str) -> str:
    digest = text.lower()
    if len(digest) != 64 or not set(digest) <= set("0123456789abcdef"):
        raise BadArgumentError(
            f"--expect-digest {printable(text)}: not a checkpoint digest (all 64 hex digits, "
            "as a signing 'chain append' prints it; or give --expect-checkpoint FILE)"
        )
    return digest


class _Review(NamedTuple):
    """What a co-signer vouches for beyond what the trust root accepted already."""

    versions: list[Version]  # added, or changed in any member (digest, step, metadata...)
    known: frozenset[int]  # numbers of the versions the accepted parent held
    basis: str  # what they were compared with


def _review(c: Chain, trust: Trust, m: Manifest) -> _Review:
    """The versions ``m`` adds to or changes in its parent revision: every version, unless
    the parent is stored with the digest ``m`` names and the trust policy accepts it
    (SG-1..SG-4, expiry not checked)."""
    if m.parent is None:
        return _Review(list(m.versions), frozenset(), "revision 1: every version is new")
    previous = m.revision - 1
    data = c.revision_bytes(previous)
    if data is None or digest_bytes(data) != m.parent[1]:
        why = f"revision {previous} is not stored: every version counts as new"
        return _Review(list(m.versions), frozenset(), why)
    try:
        trust.check_revision(c.storage, previous, data, fresh=False)
        old = {v.number: v for v in parse_manifest(data, expected_revision=previous).versions}
    except WdeltaError as exc:
        why = f"revision {previous} refused ({exc}): every version counts as new"
        return _Review(list(m.versions), frozenset(), why)
    changed = [v for v in m.versions if old.get(v.number) != v]
    why = f"compared with revision {previous}, accepted by the trust root"
    return _Review(changed, frozenset(old), why)


def _version_line(v: Version) -> str:
    step = "no step" if v.step is None else f"step {v.step}"
    return f"version {v.number} ({step}): checkpoint digest {v.digest}"


def _summary(
    storage: Storage, trust: Trust, m: Manifest, data: bytes, review: _Review
) -> list[str]:
    """What ``chain sign`` is about to sign, for the signer to compare with its records."""
    root = trust.root
    lines = [f"revision {m.revision} of chain {printable(root.chain)}, manifest BLAKE3 "
             f"{digest_bytes(data)}", f"head: {_version_line(m.head)}"]  # fmt: skip
    lines += [
        f"{'changes' if v.number in review.known else 'adds'} {_version_line(v)}"
        for v in review.versions
    ] or ["adds no version"]
    lines.append(f"  ({review.basis})")
    valid = trust.valid_signatures(storage, m.revision, data)
    who = ", ".join(f"{k[:16]} (until {format_time(t)})" for k, t in valid.items()) or "no key"
    lines.append(f"signed already by {who}; {root.revisions.threshold} needed "
                 f"(trust root version {root.version})")  # fmt: skip
    return lines


def _check_expected(
    args: argparse.Namespace, m: Manifest, added: list[Version], expected: set[str]
) -> None:
    """WS-6: the revision, head version and the digests of the versions it adds (or its
    head's, if it adds none) must be what the signer expects (ConflictError); with no
    --expect-digest, only --yes or a confirmation at a terminal lets it sign."""
    if args.expect_revision is not None and m.revision != args.expect_revision:
        raise ConflictError(f"the revision to sign is {m.revision}, not the expected "
                            f"{args.expect_revision}: nothing signed")  # fmt: skip
    if args.expect_version is not None and m.head.number != args.expect_version:
        raise ConflictError(f"revision {m.revision}'s head is version {m.head.number}, not the "
                            f"expected {args.expect_version}: nothing signed")  # fmt: skip
    if not expected:
        if not (args.yes or _confirmed(m)):
            raise BadArgumentError(
                f"nothing to check revision {m.revision} against: give --expect-digest HEX "
                "(the checkpoint digest you expect) or --expect-checkpoint FILE, or --yes "
                "once you checked the lines above"
            )
        return
    wanted = {v.digest: v for v in added} or {m.head.digest: m.head}
    stray, unnamed = sorted(expected - wanted.keys()), sorted(wanted.keys() - expected)
    if stray:
        raise ConflictError(f"revision {m.revision} does not add checkpoint digest {stray[0]} "
                            f"(its head: {_version_line(m.head)}): nothing signed")  # fmt: skip
    if unnamed:
        raise ConflictError(f"revision {m.revision} also adds or changes "
                            f"{_version_line(wanted[unnamed[0]])}"
                            ", which no --expect-digest names: nothing signed")  # fmt: skip


def _confirmed(m: Manifest) -> bool:
    """At a terminal, the signer's answer to a question; elsewhere False."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return False
    # The question goes to stdout with the summary (input() would write it to stderr).
    print(f"sign revision {m.revision} (head version {m.head.number})? [y/N] ", end="", flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cosign_hint(c: Chain, m: Manifest) -> str | None:
    """For a revision its writer signed below the threshold: the command co-signers run."""
    if c.trust is None or not c.signers or len(c.signers) >= c.trust.root.revisions.threshold:
        return None
    return (
        f"revision {m.revision} needs {c.trust.root.revisions.threshold - len(c.signers)} more "
        f"signature(s): co-sign with 'wdelta chain sign {c.url} --trust ROOT --sign KEY "
        f"--expect-revision {m.revision} --expect-digest {m.head.digest}'"
    )


def _cmd_refresh(args: argparse.Namespace) -> int:
    """Publish the head's content again as a new revision: freshly signed (WS-4), or for
    an unsigned chain with a new ``updated`` time (what ``pull --max-age`` reads)."""
    with open_chain(args) as c:
        if c.trust is not None and not c.signers:
            raise BadArgumentError("refresh with --trust ROOT needs --sign KEY")
        m = c.publish(lambda cur: cur.successor())
    renewed = "signatures renewed" if c.signers else f"updated {m.updated} (unsigned)"
    print(f"revision {m.revision}: head version {m.head.number}, {renewed}")
    hint = cosign_hint(c, m)
    if hint is not None:
        print(printable(hint))
    return 0


def _found_signers(storage: Storage, digest: str) -> list[str]:
    """Key id prefixes of the signature objects stored for manifest BLAKE3 ``digest``."""
    return sorted(
        o.key.rsplit("/", 1)[-1].removesuffix(".json")[:16]
        for o in storage.list(f"signatures/{digest}/")
    )


def _signature_line(storage: Storage, trust: Trust | None, revision: int) -> str:
    """Who signed one stored revision: verified key ids with ``trust``, else those found;
    an unsigned or refused revision says so."""
    data = storage.read(revision_key(revision), MAX_MANIFEST_BYTES)
    found = _found_signers(storage, digest_bytes(data))
    if not found:
        return f"revision {revision} unsigned"
    if trust is None:
        return f"revision {revision} has signatures of {', '.join(found)} (unverified: no --trust)"
    try:
        valid = trust.check_revision(storage, revision, data, fresh=False)
    except SignatureInvalidError as exc:
        return f"revision {revision} INVALID: {exc}"
    ids = ", ".join(k[:16] for k in valid)
    return f"revision {revision} signed by {ids} (trust root version {trust.root.version})"


def signature_lines(c: Chain) -> list[str]:
    """One line per stored manifest revision, oldest first (the head last), saying who
    signed it (with ``c.trust``, checked as SG-2..SG-4 but not for expiry); none for a
    chain without any signature, whose log is unchanged."""
    if c.trust is not None:
        c.trust.update(c.storage)
    lines = [_signature_line(c.storage, c.trust, r) for r in c.revisions()]
    if c.trust is None and all(line.endswith(" unsigned") for line in lines):
        return []
    return lines


def register(commands: Commands) -> None:
    """Add keygen, root, rotate, sign and refresh to ``wdelta chain``."""
    p = commands.add_parser("keygen", help="create an Ed25519 signing key (KEY) and KEY.pub")
    p.add_argument("keyfile", help="the private key file to create (mode 600)")
    p.add_argument("--role", choices=KEY_ROLES, default=None,
                   help="label the key: 'root' (offline, signs roots) or 'revisions' "
                   "(online, signs revisions); commands refuse it in the other role")  # fmt: skip
    p.set_defaults(func=_cmd_keygen)
    _register_root(commands)
    p = commands.add_parser("rotate", help="store the next trust root version in the chain")
    options.add_url(p)
    p.add_argument("root", help="the new root (written by 'chain root --previous')")
    p.set_defaults(func=_cmd_rotate)
    _register_sign(commands)
    p = commands.add_parser(
        "refresh", help="republish the head, freshly signed or dated (against 'frozen')"
    )
    options.add_url(p)
    options.add_quiet(p)
    options.add_signing(p)
    p.set_defaults(func=_cmd_refresh)


def _register_root(commands: Commands) -> None:
    p = commands.add_parser("root", help="write a signed trust root (or its next version)")
    p.add_argument("out", help="the root file to create")
    p.add_argument("--chain-id", default=None, help="the chain's name (first root)")
    p.add_argument("--root-key", action="append", default=[], metavar="PUB",
                   help="an offline key that signs root versions (repeatable)")  # fmt: skip
    p.add_argument("--root-threshold", type=int, default=1,
                   help="root key signatures a root version needs (1)")  # fmt: skip
    p.add_argument("--revision-key", action="append", default=[], metavar="PUB",
                   help="an online key that signs revisions (repeatable)")  # fmt: skip
    p.add_argument("--revision-threshold", type=int, default=1,
                   help="revision key signatures a revision needs (1)")  # fmt: skip
    p.add_argument("--previous", default=None, metavar="ROOT",
                   help="the root this one rotates (of format version 2, or 1 to migrate: "
                   "its keys then sign as the root role)")  # fmt: skip
    options.add_sign(p, "a private root key signing it (of this root or --previous)",
                     expires_days=365.0, expires_help="validity in days ({:g})")  # fmt: skip
    p.set_defaults(func=_cmd_root)


def _register_sign(commands: Commands) -> None:
    p = commands.add_parser("sign", help="add signatures to the head revision (co-sign)")
    options.add_url(p)
    options.add_trust(p, "the chain's trust root", required=True)
    options.add_sign(p, "signing key", expires_help="validity in days ({:g})")
    p.add_argument(
        "--expect-digest", action="append", default=[], metavar="HEX",
        help="the checkpoint digest the revision must add (repeatable: one per version it "
        "adds; its head's if it adds none); anything else is refused",
    )  # fmt: skip
    p.add_argument(
        "--expect-checkpoint", action="append", default=[], metavar="FILE",
        help="as --expect-digest, the digest of this checkpoint (file or sharded folder)",
    )  # fmt: skip
    p.add_argument("--expect-version", type=int, default=None, metavar="N",
                   help="refuse unless the head version is N")  # fmt: skip
    p.add_argument("--expect-revision", type=int, default=None, metavar="R",
                   help="refuse unless the revision signed is R")  # fmt: skip
    p.add_argument("--yes", action="store_true",
                   help="sign without --expect-digest (check what it prints)")  # fmt: skip
    p.set_defaults(func=_cmd_sign)
