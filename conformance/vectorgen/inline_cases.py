"""Cases of inline blobs, feature ``inline-blobs`` (SPEC §4.12): valid forms and each rule.

The blobs are those of the host delta (82, 47, 64, 5 and 17 stored bytes) and of
a pair of added tensors whose full chunks store 1, 2, 3 and 192 bytes: every
length of the base64url text modulo 4 that exists, and the largest blob allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import checkpoints as ck
from .builder import ChunkPlan, Delta, build, set_inline
from .common import Pair, add_valid
from .compactform import form
from .host import Host
from .suite import Suite
from .values import base_words

SECTION = "§4.12"
READ = ("an inline chunk is read as if its bytes were a blob of the data section: its length is "
        "the bytes inline encodes, it has no offset and no checksum (the header digest covers "
        "it)")  # fmt: skip
I1 = ("I1: inline together with offset, length or checksum (compact: i with l or h), or an "
      "inline text that is not canonical unpadded base64url of 1 to 192 bytes → header-invalid "
      "(by the schema)")  # fmt: skip
K2 = ("without the feature inline is an ignored member, and a chunk without offset, length and "
      "checksum lacks members marked R (K2) → header-invalid")  # fmt: skip
K9 = ("K9 with §4.12: codec none and the inline bytes' count differs from raw_length → "
      "header-invalid")  # fmt: skip
PLACEMENT = ("§4.7 with §4.12: inline chunks are not in B, so the first blob of the data section "
             "is at offset 0 → header-invalid")  # fmt: skip
OUTPUT = ("§10.2 step 7: the output digest covers what the inline bytes decode to → "
          "checksum-mismatch")  # fmt: skip
Edit = Callable[[dict[str, Any]], None]


def _blob_chunks(delta: Delta, *names: str) -> list[dict[str, Any]]:
    """The blob-holding chunks of the named tensors (all tensors if none), in header order."""
    return [c for t in delta.doc["tensors"] if not names or t["name"] in names
            for c in t.get("chunks", []) if "_stored" in c]  # fmt: skip


def _inline(delta: Delta, *names: str) -> Delta:
    set_inline(delta, _blob_chunks(delta, *names))
    return delta


def _host_some(host: Host) -> Delta:
    """Tensors b (dense, none, 64 B) and d (full, zstd, 17 B) inline, a and c in the data."""
    return _inline(host.delta(), "b", "d")


def _lengths_pair() -> Pair:
    """Added tensors whose full chunks store 1, 2, 3 and 192 bytes (random: codec none)."""
    shapes = {"w1": ("I8", (1,)), "w2": ("F16", (1,)), "w3": ("I8", (3,)), "w192": ("F32", (48,))}
    kept = ck.tensor("kept", "F32", (4,), base_words("inline/kept", "F32", 4))
    added = [ck.tensor(name, dtype, shape, base_words(f"inline/{name}", dtype, shape[0]))
             for name, (dtype, shape) in shapes.items()]  # fmt: skip
    return Pair("inline-lengths", ck.single([kept]), ck.single([kept, *added]))


def _edited(delta: Delta, edit: Edit, compact: bool = False) -> Delta:
    """``delta`` whose finished header object ``edit`` changes (then compacted if asked)."""
    if compact:
        delta.form = form(edit)
        return delta

    def apply(doc: dict[str, Any]) -> dict[str, Any]:
        edit(doc)
        return doc

    delta.form = apply
    return delta


def _chunk_of(doc: dict[str, Any], name: str, short: bool = False) -> dict[str, Any]:
    key = "n" if short else "name"
    entry = next(e for e in doc["tensors"] if e[key] == name)
    chunk: dict[str, Any] = entry["c" if short else "chunks"][0]
    return chunk


def add_inline_valid(suite: Suite, host: Host) -> None:
    cases: list[tuple[str, Pair, Delta, str, str]] = [
        ("host", host.pair, _host_some(host),
         "the host delta in the v1 form with tensors b (dense, codec none) and d (full, zstd) "
         "inline; a's two blobs and c's in the data section at offsets 0, 82 and 129", READ),
        ("compact", host.pair, _edited(_host_some(host), lambda d: None, compact=True),
         "the same in the compact form: i instead of l and h, offsets of the others implied",
         "§4.11 with §4.12: i is the compact name of inline; an inline chunk takes no offset"),
        ("all", host.pair, _edited(_inline(host.delta()), lambda d: None, compact=True),
         "every blob of the host delta inline: D = 0, an empty data section",
         "§4.12: D = 0 when every blob is inline"),
    ]
    pair = _lengths_pair()
    lengths = _inline(build(pair.base, pair.target, 64, lambda n, i: ChunkPlan("dense", "xor")))
    cases.append(("lengths", pair, lengths,
                  "added tensors whose inline blobs hold 1, 2, 3 and 192 bytes (texts of 2, 3, 4 "
                  "and 256 characters: last characters with 4, 2 and no unused bits)",
                  "§4.12: 1 to 192 bytes in unpadded base64url, unused low bits zero"))
    ignored = host.delta()
    cases.append(("ignored", host.pair,
                  _edited(ignored, lambda d: _unchanged_chunk(d).update(inline="AAAA")),
                  "a file without the feature whose unchanged chunk carries inline: an ignored "
                  "member (valid by the schema)", "§4.12: without the feature inline is ignored"))
    for name, case_pair, delta, what, rule in cases:
        add_valid(suite, f"valid/inline/{name}", case_pair, delta, what, SECTION, rule)


def _unchanged_chunk(doc: dict[str, Any]) -> dict[str, Any]:
    entry = next(e for e in doc["tensors"] if e["name"] == "a")
    chunk: dict[str, Any] = entry["chunks"][1]
    assert chunk["encoding"] == "unchanged"
    return chunk


def _pad_bits(doc: dict[str, Any]) -> None:
    """b's 64 bytes are 86 characters: the last one's 4 unused bits, one of them set."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    chunk = _chunk_of(doc, "b")
    text = chunk["inline"]
    chunk["inline"] = text[:-1] + alphabet[alphabet.index(text[-1]) + 1]


def _mutations() -> list[tuple[str, Callable[[Host], Delta], str, str, str]]:
    def with_member(member: str, value: Any) -> Callable[[Host], Delta]:
        return lambda h: _edited(_host_some(h), lambda d: _chunk_of(d, "b").update({member: value}))

    def compact_member(member: str, value: Any) -> Callable[[Host], Delta]:
        return lambda h: _edited(_host_some(h), lambda d: _chunk_of(d, "b", True).update(
            {member: value}), compact=True)  # fmt: skip

    def text(change: Callable[[str], str]) -> Callable[[Host], Delta]:
        def edit(d: dict[str, Any]) -> None:
            chunk = _chunk_of(d, "b")
            chunk["inline"] = change(chunk["inline"])

        return lambda h: _edited(_host_some(h), edit)

    return [
        ("inline-with-offset", with_member("offset", 0), "header-invalid", I1,
         "b's chunk has inline and offset 0"),
        ("inline-with-length", with_member("length", 64), "header-invalid", I1,
         "b's chunk has inline and length 64 (its true length)"),
        ("inline-with-checksum", with_member("checksum", "00" * 32), "header-invalid", I1,
         "b's chunk has inline and a checksum"),
        ("compact-inline-with-l", compact_member("l", 64), "header-invalid", I1,
         "compact form: b's chunk has i and l 64"),
        ("compact-inline-with-h", compact_member("h", "A" * 43), "header-invalid", I1,
         "compact form: b's chunk has i and h"),
        ("inline-pad-bits", lambda h: _edited(_host_some(h), _pad_bits), "header-invalid", I1,
         "b's inline text ends in a character with an unused bit set (same bytes to a lax "
         "decoder)"),
        ("inline-padded", text(lambda t: t + "=="), "header-invalid", I1,
         "b's inline text with base64 padding == appended"),
        ("inline-length-1-mod-4", text(lambda t: t[:-1]), "header-invalid", I1,
         "b's inline text without its last character: 85 characters, 1 modulo 4"),
        ("inline-standard-alphabet", text(lambda t: t[:4] + "+" + t[5:]), "header-invalid", I1,
         "b's inline text with a + (standard base64, not base64url)"),
        ("inline-without-feature", _without_feature, "header-invalid", K2,
         "b and d inline, inline-blobs not in required_features"),
        ("inline-short-for-codec-none", _short_inline, "header-invalid", K9,
         "b's inline blob of 63 bytes, codec none, raw_length 64"),
        ("inline-counted-in-placement", _shifted_offsets, "header-invalid", PLACEMENT,
         "a's chunk 0 inline, and the data blobs placed after its 82 bytes (offsets 82, 129)"),
    ]  # fmt: skip


def _without_feature(host: Host) -> Delta:
    delta = _host_some(host)
    delta.doc["required_features"].remove("inline-blobs")
    return delta


def _short_inline(host: Host) -> Delta:
    delta = _host_some(host)
    chunk = _blob_chunks(delta, "b")[0]
    chunk["_stored"] = chunk["_stored"][:-1]
    return delta


def _shifted_offsets(host: Host) -> Delta:
    delta = _inline(host.delta())
    first = _blob_chunks(delta, "a")[0]
    for c in _blob_chunks(delta):
        c["_inline"] = c is first
    delta.freeze()
    shift = len(first["_stored"])
    for c in delta.data_chunks():
        c["offset"] += shift
    return delta


def _too_long(host: Host) -> None:
    """A full chunk of 193 stored bytes inline: one byte over the cap (I1)."""
    base = ck.tensor("kept", "F32", (4,), base_words("inline/kept", "F32", 4))
    added = ck.tensor("w193", "I8", (193,), base_words("inline/w193", "I8", 193))
    pair = Pair("inline-too-long", ck.single([base]), ck.single([base, added]))
    paths = pair.paths(host.suite)
    delta = _inline(build(pair.base, pair.target, 256, lambda n, i: ChunkPlan("dense", "xor")))
    assert len(_blob_chunks(delta)[0]["_stored"]) == 193
    host.add("inline-too-long", delta.to_bytes(), "header-invalid", SECTION, I1,
             "an added I8 tensor's full chunk of 193 random bytes inline (257 characters)",
             pair=paths)  # fmt: skip


def _corrupt_output(host: Host) -> None:
    delta = _host_some(host)
    chunk = _blob_chunks(delta, "b")[0]
    stored = bytearray(chunk["_stored"])
    stored[10] ^= 0x01
    chunk["_stored"] = bytes(stored)
    host.add("inline-wrong-bytes", delta.to_bytes(), "checksum-mismatch", SECTION, OUTPUT,
             "b's inline dense payload with one bit flipped (header digest recomputed): a valid "
             "payload that decodes to the wrong tensor", ("decoder", "reverse"))  # fmt: skip


def add_inline_cases(host: Host) -> None:
    add_inline_valid(host.suite, host)
    for name, make, category, rule, what in _mutations():
        delta = make(host)
        host.add(name, delta.to_bytes(), category, SECTION, rule, what)
    _too_long(host)
    _corrupt_output(host)
