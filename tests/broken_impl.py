"""Deliberately broken implementations around the reference CLI, for the conformance tests.

    python tests/broken_impl.py MODE verify DELTA
    python tests/broken_impl.py MODE apply [--reverse] INPUT DELTA OUT
    python tests/broken_impl.py MODE diff BASE TARGET OUT

MODE ``faithful`` is the reference itself; each other mode breaks one
promise of SPEC.md, and the conformance suite must catch it:
``ignore-checksums``, ``clamp-indices``, ``nan-canonical``, ``never-refuse``,
``partial-output``, ``wrong-category`` (refuses with io-error),
``modify-input`` (appends a byte to the delta it reads), and for the compact
header form (SPEC §4.11) ``canonical-by-name`` (canonical layouts in name
order), ``lax-compact`` (ignores a chunk's ``offset`` member and the unused
bits of base64url digests) and ``same-as-own-path`` (a target file's
``same_as_base`` read as the base file of the target file's own path); for
coded values (SPEC §7.6.6) ``coded-no-level-cap`` (reads up to 255 levels),
``coded-one-level-less`` (takes L - 1 for L), ``lax-remainder-padding``
(clears the padding bits of every Rice remainder stream before reading it) and
``compact-codec-zstd`` (a compact chunk without ``z`` is zstd even with
coded-values, the C2 of compact files without coded values); for inline blobs
(SPEC §4.12) ``inline-ignored`` (knows the feature's name but never reads
``inline``) and ``inline-in-placement`` (places the data section's blobs as if
inline ones were in it, §4.7); ``no-digit-limit`` parses integers of any length
(§4.1's 4300 digits).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import struct
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import wdelta.codec.coded_values
import wdelta.codec.positions
import wdelta.format.compact
import wdelta.format.container
import wdelta.format.header
import wdelta.format.inline_blobs
from wdelta import cli
from wdelta.checkpoint.safetensors_header import FileLayout, parse_header
from wdelta.checkpoint.source import pread_into

# Bit patterns of the canonical quiet NaN per float dtype, and its exponent mask.
_NAN = {"F16": (0x7E00, 0x7C00, 0x03FF), "BF16": (0x7FC0, 0x7F80, 0x007F),
        "F32": (0x7FC00000, 0x7F800000, 0x007FFFFF),
        "F64": (0x7FF8000000000000, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF)}  # fmt: skip
_SIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


class _Anything(bytes):
    """Compares unequal to nothing: makes the header digest check pass."""

    def __ne__(self, other: object) -> bool:
        return False


def ignore_checksums() -> None:
    """Skip the header digest and blob checksum checks."""
    parse_prefix = wdelta.format.container.parse_prefix

    def lenient_prefix(prefix: bytes, size: int) -> tuple[int, bytes, int]:
        n, _, d = parse_prefix(prefix, size)
        return n, _Anything(), d

    def read_blob(self: Any, chunk: Any) -> bytes:
        buf = bytearray(chunk.length)
        pread_into(self._fd, memoryview(buf), self.data_start + chunk.offset)
        return bytes(buf)

    wdelta.format.container.parse_prefix = lenient_prefix  # type: ignore[assignment]
    wdelta.format.container.DeltaFile.read_blob = read_blob  # type: ignore[method-assign]


def clamp_indices() -> None:
    """Move sparse positions past the chunk to its last element instead of refusing."""

    def bitmap_decode(data: Any, count: int, m: int) -> Any:
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return np.minimum(np.flatnonzero(bits), m - 1).astype(np.int64)

    def rice_decode(unary: Any, remainders: Any, k: int, count: int, m: int) -> Any:
        ubits = np.unpackbits(np.frombuffer(unary, dtype=np.uint8), bitorder="little")
        rbits = np.unpackbits(np.frombuffer(remainders, dtype=np.uint8), bitorder="little")
        positions, prev, start = [], -1, 0
        for i, one in enumerate(np.flatnonzero(ubits)[:count]):
            rem = sum(int(rbits[i * k + j]) << j for j in range(k))
            prev = prev + 1 + ((int(one) - start) << k) + rem
            start = int(one) + 1
            positions.append(min(prev, m - 1))
        return np.array(positions, dtype=np.int64)

    wdelta.codec.positions.bitmap_decode = bitmap_decode
    wdelta.codec.positions.rice_decode = rice_decode


def canonical_by_name() -> None:
    """Lay canonical headers out in name order, forgetting element sizes (§4.11 step 1)."""

    def build(tensors: list[Any], metadata: dict[str, str] | None) -> FileLayout:
        doc: dict[str, Any] = {} if metadata is None else {"__metadata__": metadata}
        cursor = 0
        for name, dtype, shape in sorted(tensors, key=lambda t: t[0]):
            end = cursor + math.prod(shape) * dtype.size
            doc[name] = {"dtype": dtype.name, "shape": list(shape), "data_offsets": [cursor, end]}
            cursor = end
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
        return parse_header((text + " " * (-len(text.encode()) % 8)).encode())

    wdelta.format.compact.build_header = build  # type: ignore[assignment]


def _respell(digest: Any) -> Any:
    """A digest's canonical spelling, whatever its unused bits (or the value unchanged)."""
    if not isinstance(digest, str) or len(digest) != 43:
        return digest
    try:
        return wdelta.format.compact.b64(wdelta.format.compact.hex_digest(digest))
    except wdelta.WdeltaError:
        return digest


def lax_compact() -> None:
    """Drop chunks' offset members and respell digests before the schema sees them."""
    validate = wdelta.format.header._validate_schema

    def lax(raw: dict[str, Any], compact_form: bool) -> None:
        if compact_form:
            for side in ("base", "target"):
                if isinstance(raw.get(side), dict):
                    raw[side]["digest"] = _respell(raw[side].get("digest"))
            for entry in raw.get("tensors", []):
                for key in ("b", "t"):
                    if key in entry:
                        entry[key] = _respell(entry[key])
                for chunk in entry.get("c", []):
                    chunk.pop("offset", None)
                    if "h" in chunk:
                        chunk["h"] = _respell(chunk["h"])
        validate(raw, compact_form)

    wdelta.format.header._validate_schema = lax


def same_as_own_path() -> None:
    """Look a same_as_base file up under its own path, not the base path it names (C3)."""
    expand = wdelta.format.compact._expand_side

    def own_path(
        side: dict[str, Any], base: Any, listing: Any, name: str, built: Any
    ) -> dict[str, Any]:
        files = [{**f, "same_as_base": f["path"]} if "same_as_base" in f else f
                 for f in side["files"]]  # fmt: skip
        return expand({**side, "files": files}, base, listing, name, built)

    wdelta.format.compact._expand_side = own_path


def coded_no_level_cap() -> None:
    """Accept any number of split levels (V1 dropped)."""
    wdelta.codec.coded_values.MAX_LEVELS = 255


def coded_one_level_less() -> None:
    """An off-by-one loop: one split level fewer than L is read."""
    decode = wdelta.codec.coded_values.decode

    def short(view: memoryview, count: int, word: Any) -> Any:
        data = bytearray(view)
        data[0] = max(0, data[0] - 1)
        return decode(memoryview(bytes(data)), count, word)

    wdelta.codec.coded_values.decode = short


def compact_codec_zstd() -> None:
    """Expand a compact chunk without z to codec zstd, whatever the features (C2 dropped)."""
    wdelta.format.compact._default_codec = lambda chunk, raw_by_default, inline: "zstd"


def lax_remainder_padding() -> None:
    """Clear the padding bits of a Rice remainder stream instead of refusing them (V7, S9),
    on the NumPy path (remainder_fields) and the native one (check_remainders)."""
    fields, check = wdelta.codec.positions.remainder_fields, wdelta.codec.positions.check_remainders

    def cleared(data: Any, count: int, k: int) -> bytes:
        raw, used = bytearray(data), count * k
        if used % 8 and raw:
            raw[-1] &= (1 << (used % 8)) - 1
        return bytes(raw)

    wdelta.codec.positions.remainder_fields = lambda d, c, k: fields(cleared(d, c, k), c, k)
    wdelta.codec.positions.check_remainders = lambda d, c, k: check(cleared(d, c, k), c, k)


def canonicalize_nans(out: Path) -> None:
    """Rewrite every NaN of a float tensor in the output as the canonical quiet NaN."""
    for path in sorted(out.glob("*.safetensors")) if out.is_dir() else [out]:
        data = bytearray(path.read_bytes())
        (n,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8 : 8 + n])
        for name, info in header.items():
            if name == "__metadata__" or info["dtype"] not in _NAN:
                continue
            nan, exponent, mantissa = _NAN[info["dtype"]]
            begin, end = (8 + n + o for o in info["data_offsets"])
            words = np.frombuffer(data, dtype=f"<u{_SIZE[info['dtype']]}", count=(end - begin)
                                  // _SIZE[info["dtype"]], offset=begin).copy()  # fmt: skip
            is_nan = ((words & exponent) == exponent) & ((words & mantissa) != 0)
            words[is_nan] = nan
            data[begin:end] = words.tobytes()
        path.write_bytes(bytes(data))


def _argv(args: list[str]) -> tuple[list[str], Path | None, Path | None]:
    """Reference CLI arguments, the output path and the input checkpoint."""
    op, rest = args[0], args[1:]
    if op == "verify":
        return ["verify", "-q", *rest], None, None
    reverse = rest[0] == "--reverse"
    if reverse:
        rest = rest[1:]
    a, b, out = rest
    command = ["apply", a, b] if op == "apply" else ["diff", a, b]
    return [*command, "-o", out, "-q", *(["--reverse"] if reverse else [])], Path(out), Path(a)


def inline_ignored() -> None:
    """List inline-blobs as known but read no chunk's inline member (K2 on every one)."""
    wdelta.format.inline_blobs.FEATURE = "inline-blobs (not read)"


def inline_in_placement() -> None:
    """Count inline blobs in the offsets of the data section's blobs (§4.7 broken)."""
    check = wdelta.format.header._check_blobs

    def counted(tensors: Any, data_length: int) -> None:
        cursor = inline = 0
        moved = []
        for t in tensors:
            chunks = []
            for c in t.chunks:
                if c.inline is not None:  # as if it were the next blob of the data section
                    c, inline = replace(c, inline=None, offset=cursor), inline + c.length
                cursor += c.length if c.encoding != "unchanged" else 0
                chunks.append(c)
            moved.append(replace(t, chunks=tuple(chunks)))
        check(tuple(moved), data_length + inline)

    wdelta.format.header._check_blobs = counted


# Modes that patch the reference and then run it as it is.
def no_digit_limit() -> None:
    """Parse integers of any length (Python's own bound of 4300 digits lifted, §4.1)."""
    sys.set_int_max_str_digits(0)


PATCHES = {
    "ignore-checksums": ignore_checksums,
    "clamp-indices": clamp_indices,
    "canonical-by-name": canonical_by_name,
    "lax-compact": lax_compact,
    "same-as-own-path": same_as_own_path,
    "coded-no-level-cap": coded_no_level_cap,
    "coded-one-level-less": coded_one_level_less,
    "lax-remainder-padding": lax_remainder_padding,
    "compact-codec-zstd": compact_codec_zstd,
    "inline-ignored": inline_ignored,
    "inline-in-placement": inline_in_placement,
    "no-digit-limit": no_digit_limit,
}


def main(mode: str, args: list[str]) -> int:
    argv, out, source = _argv(args)
    if mode in PATCHES:
        PATCHES[mode]()
    if mode == "never-refuse":
        cli.run(argv)
        if out is not None and not out.exists() and source is not None:
            shutil.copyfile(source, out) if source.is_file() else shutil.copytree(source, out)
        return 0
    if mode == "modify-input":
        delta = Path(args[-1] if args[0] == "verify" else args[-2])
        delta.write_bytes(delta.read_bytes() + b"\x00")
    if mode == "wrong-category":
        with contextlib.redirect_stderr(io.StringIO()):
            status = cli.run(argv)
        if status:
            print("error: io-error: the real category was hidden", file=sys.stderr)
        return status
    status = cli.run(argv)
    if mode == "nan-canonical" and status == 0 and out is not None and args[0] == "apply":
        canonicalize_nans(out)
    if mode == "partial-output" and status != 0 and out is not None:
        out.write_bytes(b"partial")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
