"""Deliberately broken manifest readers around ``wdelta chain check``, for the conformance tests.

    python tests/broken_manifest_reader.py MODE MANIFEST [--store STORE [--trust ROOT]]
        [--after SEEN]

``faithful`` is the reference; ``plain-json`` parses with ``json.loads``
(duplicate keys, NaN, lone surrogates and deep nesting pass); ``no-reachability``
skips CH-9; ``skip-missing`` skips listed files missing from storage (RD-3);
``ignore-signatures`` takes ``--trust`` but never checks a signature (SG-1..SG-5);
``any-role`` lets every key of a trust root sign both roots and revisions (no roles);
``forget-trust`` reads ``--state`` without the trust it records (SG-8, SG-9);
``no-reset`` never releases a state after a root rotation (SG-10);
``reset-on-rotation`` releases it after any newer root, even one that keeps the signers;
``ignore-after`` drops ``--after`` (no memory of an accepted revision, RD-1);
``revision-only`` compares revision numbers with the accepted one, never digests;
``no-part-set`` checks each part of a multi-part link alone, never the set (MP-4);
``part-headers-only`` checks each part's ``part`` member, but not that the parts' tensors
are disjoint and hash to the link's versions.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import wdelta.chain.acceptance
import wdelta.chain.manifest
import wdelta.chain.ops
import wdelta.chain.parts
import wdelta.chain.signatures
import wdelta.chain.trusted_set
from wdelta import cli
from wdelta.chain.errors import ManifestInvalidError, NotFoundError
from wdelta.chain.fetch import fetch_link, materialize_snapshot
from wdelta.ops import api


def plain_json(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ManifestInvalidError("not an object")
    return value


def skip_missing(chain: Any, m: Any) -> None:
    for link in m.links:
        try:
            api.verify(fetch_link(chain, m, link))
        except NotFoundError:
            continue
    with tempfile.TemporaryDirectory() as tmp:
        for snap in m.snapshots:
            try:
                materialize_snapshot(chain, m, snap, Path(tmp) / f"v{snap.version}")
            except NotFoundError:
                continue


def revision_only(accepted: Any, revision: int, *rest: Any) -> None:
    if accepted is not None and revision < accepted.revision:
        raise ManifestInvalidError(f"revision {revision} is lower than {accepted.revision}")


def forget_trust() -> None:
    load = wdelta.chain.acceptance.load
    wdelta.chain.acceptance.load = lambda path: dataclasses.replace(load(path), trust=None)  # type: ignore[type-var]


def no_reset() -> None:
    rotated = wdelta.chain.acceptance.trust_rotated
    wdelta.chain.acceptance.trust_rotated = lambda *a: rotated(*a) and False


def reset_on_rotation() -> None:
    rotated = wdelta.chain.acceptance.trust_rotated

    def any_newer_root(record: Any, policy: Any, *rest: Any) -> bool:
        rotated(record, policy, *rest)  # its refusals (another chain, an older root)
        return bool(policy.root.version > record.root)

    wdelta.chain.acceptance.trust_rotated = any_newer_root


STATE_MODES = {"forget-trust": forget_trust, "no-reset": no_reset,
               "reset-on-rotation": reset_on_rotation}  # fmt: skip


def part_headers_only(m: Any, link: Any, headers: Any) -> None:
    want = (m.version(link.source).digest, m.version(link.target).digest)
    for i, h in enumerate(headers):
        if h.part != (i, len(link.parts), *want):
            raise wdelta.chain.parts.ChainBrokenError(f"part {i} is not the link's")


def main(mode: str, args: list[str]) -> int:
    if mode == "plain-json":
        wdelta.chain.manifest._load_json = plain_json  # type: ignore[assignment]
    if mode == "no-reachability":
        wdelta.chain.manifest.unreachable_versions = lambda m: []  # type: ignore[assignment]
    if mode == "skip-missing":
        wdelta.chain.ops.check_files = skip_missing
    if mode == "ignore-signatures":
        wdelta.chain.signatures.check_signatures = lambda *args: []
    if mode == "any-role":
        wdelta.chain.trusted_set.role_keys = lambda root, role: root.keys
    if mode in STATE_MODES:
        STATE_MODES[mode]()
    if mode == "ignore-after" and "--after" in args:
        at = args.index("--after")
        args = args[:at] + args[at + 2 :]
    if mode == "no-part-set":
        wdelta.chain.parts.check_parts = lambda *args: None
    if mode == "part-headers-only":
        wdelta.chain.parts.check_parts = part_headers_only
    if mode == "revision-only":
        wdelta.chain.acceptance.check = revision_only
    return cli.run(["chain", "check", "-q", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
