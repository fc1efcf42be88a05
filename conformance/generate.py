#!/usr/bin/env python3
"""Generate the wdelta conformance vectors and their manifest.

    python conformance/generate.py            # rewrite conformance/vectors + manifest.json
    python conformance/generate.py --out DIR  # write elsewhere (e.g. to compare)

Deterministic: the same bytes on every run (data from BLAKE3 of fixed labels,
no timestamps, sorted JSON).  zstd frames come from the installed zstandard
library at level 3; a libzstd that compresses differently changes the zstd
blobs, and the regeneration test says so.  After writing, the reference
implementation is run on every case and must pass all of them with the exact
error category (``--no-check`` skips this).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vectorgen import (  # noqa: E402
    chains,
    coded_cases,
    compact_cases,
    edge,
    encoder,
    host,
    inline_cases,
    invalid_decode,
    invalid_header,
    invalid_layout,
    invalid_payload,
    invalid_prefix,
    invalid_rules,
    layouts,
    matrix,
    parts_cases,
    positions,
    signatures,
    special,
    state_cases,
)
from vectorgen.suite import FORMAT_VERSION, MANIFEST_VERSION, Suite  # noqa: E402

from wdelta.conformance.manifest import CHAIN_CATEGORIES  # noqa: E402
from wdelta.errors import CATEGORIES  # noqa: E402

PROFILES = {
    "reader": "parses and validates a delta without its base (verify): accepts every valid "
    "delta, refuses every invalid one with the required error category",
    "decoder": "applies a delta to its base: writes the target files byte for byte, or "
    "refuses with the required category and leaves nothing at the output path",
    "reverse": "applies a reversible delta to its target to rebuild the base, with the same "
    "guarantees as decoder; refuses non-reversible deltas",
    "encoder": "writes, from a base and a target, a delta that the reference reads and "
    "applies to the exact target (and base, if reversible) and that meets the writer "
    "requirements W1-W6 of SPEC §11.1; refuses malformed checkpoints; size is reported, "
    "not bounded",
    "manifest": "reads a chain manifest revision ({manifest}, named by its key): accepts every "
    "valid one, refuses every one breaking CH-1..CH-9 with the required category; with the "
    "chain's files ({store}), refuses missing (RD-3) and disagreeing (RD-2) files; after a "
    "revision it accepted ({seen}), refuses a lower, rewritten or forked revision (RD-1); with a "
    "trust root ({trust}) and a node's acceptance state ({state}), accepts and refuses revisions "
    "as SG-1 to SG-10 of SPEC §17.11 say; one profile, run through six templates",
}


def build_suite() -> Suite:
    suite = Suite()
    matrix.add_matrix(suite)
    for add in (edge.add_shapes, edge.add_densities, edge.add_ops, edge.add_reader_latitude,
                special.add_specials, positions.add_boundary, positions.add_gaps,
                positions.add_rice_k, positions.add_zstd_window, layouts.add_shards,
                layouts.add_exact_headers, layouts.add_names, layouts.add_more_layouts,
                layouts.add_chunking, layouts.add_header_text):  # fmt: skip
        add(suite)
    h = host.make_host(suite)
    for add_invalid in (invalid_prefix.add_prefix_cases, invalid_header.add_header_cases,
                        invalid_rules.add_rule_cases, invalid_layout.add_layout_cases,
                        invalid_payload.add_payload_cases, invalid_decode.add_integrity_cases,
                        invalid_decode.add_base_cases,
                        compact_cases.add_compact_cases, coded_cases.add_coded_cases,
                        inline_cases.add_inline_cases,
                        parts_cases.add_header_cases):  # fmt: skip
        add_invalid(h)
    encoder.add_encoder_cases(suite)
    chains.add_rule_cases(suite)
    chains.add_store_cases(suite)
    parts_cases.add_rule_cases(suite)
    parts_cases.add_store_cases(suite)
    signatures.add_signature_cases(suite)
    state_cases.add_state_cases(suite)
    chains.add_seen_cases(suite)
    return suite


def manifest(suite: Suite) -> dict[str, Any]:
    return {
        "manifest_version": MANIFEST_VERSION,
        "format_version": FORMAT_VERSION,
        "generator": "conformance/generate.py",
        "profiles": PROFILES,
        "categories": list(CATEGORIES) + list(CHAIN_CATEGORIES),
        "cases": sorted(suite.cases, key=lambda c: c["id"]),
    }


# Cases the reference gets wrong, by id glob, with the reason; the check fails
# if one of them passes (the entry must then go) or if any other case fails.
KNOWN_REFERENCE_BUGS: dict[str, str] = {}


def known_bug(case_id: str) -> str | None:
    """The reason the reference fails ``case_id``, if it is a known bug."""
    return next(
        (why for pat, why in KNOWN_REFERENCE_BUGS.items() if fnmatchcase(case_id, pat)), None
    )


def check(out: Path) -> int:
    """Run the reference on every case (strict); returns the number of surprises."""
    from wdelta.conformance import Options, Reference, load, run_all

    loaded = load(out)
    results = run_all(loaded, loaded.cases, Reference(), Options(strict=True, jobs=2))
    surprises = 0
    for r in results:
        why = known_bug(r.case.id)
        if (r.status == "pass") == (why is None):
            continue
        surprises += 1
        if why is None:
            print(f"reference fails {r.case.id}: {r.message}", file=sys.stderr)
        else:
            print(f"reference now passes {r.case.id}: drop it from KNOWN_REFERENCE_BUGS",
                  file=sys.stderr)  # fmt: skip
    return surprises


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: here)")
    parser.add_argument("--no-check", action="store_true", help="skip the reference run")
    args = parser.parse_args(argv)
    suite = build_suite()
    shutil.rmtree(args.out / "vectors", ignore_errors=True)
    suite.write(args.out, manifest(suite))
    total = sum(len(d) for d in suite.files.values())
    print(f"{len(suite.cases)} cases, {len(suite.files)} files, {total} bytes -> {args.out}")
    return 1 if not args.no_check and check(args.out) else 0


if __name__ == "__main__":
    sys.exit(main())
