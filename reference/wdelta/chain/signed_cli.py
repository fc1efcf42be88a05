"""``wdelta chain keygen | root | rotate | sign | refresh`` and the signature lines of
``chain log`` (one per stored revision) and ``chain check --trust`` (SPEC.md "Signed
revisions")."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..digest import digest_bytes
from ..errors import BadArgumentError, StorageError
from ..terminal import printable
from .errors import ConflictError, NotFoundError, SignatureInvalidError
from .manifest import parse_manifest, revision_key, revision_of_key
from .signing import (
    KEY_ROLES,
    check_role,
    generate,
    load_public_key,
    load_revision_key,
    load_signing_key,
    write_json,
)
from .storage import open_storage
from .storage.base import Storage
from .store import Chain
from .trust import (
    Trust,
    check_successor,
    format_time,
    make_root,
    parse_root,
    read_root_file,
    root_key,
)


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
    previous = None if args.previous is None else read_root_file(Path(args.previous))
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
        old = parse_root(storage.read(root_key(last)), root_key(last))
        check_successor(new, old, str(args.root))
    if not storage.create(root_key(new.version), new.to_bytes()):
        raise ConflictError(f"root version {new.version} was stored meanwhile")
    print(f"root version {new.version} stored: nodes move to it at their next pull")
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    """Add signatures to an existing revision (co-signing, or signing an unsigned chain)."""
    trust = Trust.from_file(Path(args.trust))
    keys = [load_revision_key(Path(k)) for k in args.sign]
    if not keys:
        raise BadArgumentError("sign needs at least one --sign KEY")
    c = Chain(open_storage(args.url))
    revisions = c.revisions()
    revision = args.revision or (revisions[-1] if revisions else 0)
    if revision not in revisions:
        raise NotFoundError(f"{args.url}: no revision {revision}")
    data = c.storage.read(revision_key(revision))
    m = parse_manifest(data, expected_revision=revision)
    trust.update(c.storage)
    expires = format_time(time.time() + args.expires_days * 86400.0)
    trust.sign(c.storage, m.revision, data, keys, expires)
    print(f"revision {m.revision} (head version {m.head.number}) signed by "
          f"{', '.join(k.public.keyid[:16] for k in keys)} until {expires}")  # fmt: skip
    return 0


def _cmd_refresh(args: argparse.Namespace) -> int:
    """Publish the head's content again as a new revision: freshly signed (WS-4), or for
    an unsigned chain with a new ``updated`` time (what ``pull --max-age`` reads)."""
    from .cli import _chain  # here: cli imports this module

    with _chain(args) as c:
        if c.trust is not None and not c.signers:
            raise BadArgumentError("refresh with --trust ROOT needs --sign KEY")
        m = c.publish(lambda cur: cur.successor())
    renewed = "signatures renewed" if c.signers else f"updated {m.updated} (unsigned)"
    print(f"revision {m.revision}: head version {m.head.number}, {renewed}")
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
    data = storage.read(revision_key(revision))
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


def check_signatures(manifest: Path, storage: Storage, trust: Path | Trust) -> list[str]:
    """SG-1..SG-5 for one manifest revision file against the signatures in ``storage``,
    with the trust root file (or policy) ``trust``."""
    revision = revision_of_key(f"manifests/{manifest.name}")
    if revision is None:
        raise BadArgumentError(f"{manifest} is not named rev-RRRRRRRRRRRR.json")
    try:
        data = manifest.read_bytes()
    except OSError as exc:
        raise StorageError(f"cannot read {manifest}: {exc.strerror or exc}") from exc
    policy = trust if isinstance(trust, Trust) else Trust.from_file(trust)
    return policy.check_revision(storage, revision, data)


def register_signing(
    sub: Any, common: Callable[..., None], signing_args: Callable[..., None]
) -> None:
    """Add keygen, root, rotate, sign and refresh to ``wdelta chain``."""
    p = sub.add_parser("keygen", help="create an Ed25519 signing key (KEY) and KEY.pub")
    p.add_argument("keyfile", help="the private key file to create (mode 600)")
    p.add_argument("--role", choices=KEY_ROLES, default=None,
                   help="label the key: 'root' (offline, signs roots) or 'revisions' "
                   "(online, signs revisions); commands refuse it in the other role")  # fmt: skip
    p.set_defaults(func=_cmd_keygen)
    p = sub.add_parser("root", help="write a signed trust root (or its next version)")
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
    p.add_argument("--sign", action="append", default=[], metavar="KEY",
                   help="a private root key signing it (of this root or --previous)")  # fmt: skip
    p.add_argument("--previous", default=None, metavar="ROOT", help="the root this one rotates")
    p.add_argument("--expires-days", type=float, default=365.0, help="validity in days (365)")
    p.set_defaults(func=_cmd_root)
    p = sub.add_parser("rotate", help="store the next trust root version in the chain")
    p.add_argument("url", help="chain location")
    p.add_argument("root", help="the new root (written by 'chain root --previous')")
    p.set_defaults(func=_cmd_rotate)
    p = sub.add_parser("sign", help="add signatures to a revision (co-sign)")
    p.add_argument("url", help="chain location")
    p.add_argument("--trust", required=True, metavar="ROOT", help="the chain's trust root")
    p.add_argument("--sign", action="append", default=[], metavar="KEY", help="signing key")
    p.add_argument("--revision", type=int, default=None, help="revision (default: the head)")
    p.add_argument("--expires-days", type=float, default=7.0, help="validity in days (7)")
    p.set_defaults(func=_cmd_sign)
    p = sub.add_parser(
        "refresh", help="republish the head, freshly signed or dated (against 'frozen')"
    )
    common(p)
    signing_args(p)
    p.set_defaults(func=_cmd_refresh)
