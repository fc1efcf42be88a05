"""Cases of multi-part links: the header member ``part`` (SPEC §4.13) for readers and
decoders, and the manifest and store rules of SPEC §17.12 (CH-8, MP-4, MP-5).

A part is an ordinary delta of its tensors, so a decoder applies it to the
sub-checkpoint of those tensors; the set checks need the chain's files, so
they are storage cases of the manifest profile: a two-version chain whose
link is split into parts, and one defect of the set in each case.
"""

from __future__ import annotations

import copy
from typing import Any

import blake3

from . import checkpoints as ck
from .builder import ChunkPlan, Delta, build, uniform
from .chains import Doc, _text, manifest, rule_case, store_case, typical
from .common import add_valid
from .compactform import form
from .edge import changed
from .host import Host
from .payload import RICE
from .suite import Suite, accepted, invalid, sha256

SECTION = "§4.13"
P1 = "P1: a part's index is not below its count → header-invalid"
SCHEMA = ("§4.13: part is an object of index, count (2 to 65536), base and target (hex digests "
          "in both header forms) → header-invalid (by the schema)")  # fmt: skip
MP4 = ("SPEC §17.12: MP-4 a reader checks a multi-part link's parts as a set (part index and "
       "count, the link's digests, reversible, no tensor in two parts, the union hashing to the "
       "versions) → chain-broken; RD-3 a missing part → not-found")  # fmt: skip
CH8 = ("SPEC §17.3: CH-8 a link with parts needs the feature multi-part-links; a part listed "
       "twice → manifest-invalid")  # fmt: skip
MP5 = ("SPEC §17.12: MP-5 with the feature part-header-digests, each part's header digest (its "
       "prefix's, and the BLAKE3 of its header bytes) is the one the manifest lists → "
       "checksum-mismatch")  # fmt: skip
CH8_HEADERS = ("SPEC §17.3: CH-8 a part listing its header digest needs the feature "
               "part-header-digests, which needs every part's → manifest-invalid")  # fmt: skip
FEATURE = "multi-part-links"
HEADERS = "part-header-digests"
PLAN = uniform(ChunkPlan("sparse", "xor", "zstd", RICE))


def _part(index: int, count: int) -> dict[str, Any]:
    label = blake3.blake3(b"part-link").hexdigest()
    return {"index": index, "count": count, "base": label, "target": label[::-1]}


def _with_part(host: Host, part: dict[str, Any], compact: bool = False) -> Delta:
    delta = host.delta()
    delta.doc["part"] = part
    if compact:
        delta.form = form()
    return delta


def add_header_cases(host: Host) -> None:
    """Valid parts in both header forms, then P1 and the schema of ``part``."""
    rule = "§4.13: a part is an ordinary delta of its tensors; part changes no decoding"
    for name, compact in (("v1", False), ("compact", True)):
        what = f"the host delta as part 1 of 2 of a link ({name} form), decoded as any delta"
        add_valid(host.suite, f"valid/part/{name}", host.pair,
                  _with_part(host, _part(1, 2), compact), what, SECTION, rule)  # fmt: skip
    cases = [
        ("part-index-count", _part(2, 2), P1, "part index 2 of count 2"),
        ("part-count-1", _part(0, 1), SCHEMA, "part count 1 (a link of one file has no part)"),
        ("part-no-target", {k: v for k, v in _part(0, 2).items() if k != "target"}, SCHEMA,
         "part without target"),
        ("part-index-negative", {**_part(0, 2), "index": -1}, SCHEMA, "part index -1"),
    ]  # fmt: skip
    for name, part, rule, what in cases:
        host.add(name, _with_part(host, part).to_bytes(), "header-invalid", SECTION, rule, what)
    b64 = {**_part(0, 2), "base": "A" * 43}
    what = "compact form, part.base as a base64url digest (it stays hex)"
    data = _with_part(host, b64, True).to_bytes()
    host.add("part-base64-digest", data, "header-invalid", SECTION, SCHEMA, what)


def _pair() -> tuple[ck.Checkpoint, ck.Checkpoint, list[tuple[ck.TensorData, ck.TensorData]]]:
    pairs = [changed("parts", "w", "F32", (64,), 0.2), changed("parts", "x", "BF16", (40,), 0.3),
             changed("parts", "y", "F32", (16,), 0.5)]  # fmt: skip
    return ck.single([b for b, _ in pairs]), ck.single([t for _, t in pairs]), pairs


def _parts(split: list[list[str]], count: int | None = None, other: set[int] | None = None,
           bare: set[int] | None = None) -> tuple[list[bytes], str, str]:  # fmt: skip
    """Part files of the link base -> target for ``split`` (tensor names per part);
    the parts in ``other`` name another link's target, those in ``bare`` have no
    ``part`` member."""
    base, target, pairs = _pair()
    whole = build(base, target, 32, PLAN)
    whole.to_bytes()
    digests = whole.doc["base"]["digest"], whole.doc["target"]["digest"]
    by_name = {b.name: (b, t) for b, t in pairs}
    files = []
    for i, names in enumerate(split):
        sub = build(ck.single([by_name[n][0] for n in names]),
                    ck.single([by_name[n][1] for n in names]), 32, PLAN)  # fmt: skip
        wrong = i in (other or set())
        sub.doc["part"] = {"index": i, "count": count or len(split), "base": digests[0],
                           "target": digests[1][::-1] if wrong else digests[1]}  # fmt: skip
        if i in (bare or set()):
            del sub.doc["part"]
        files.append(sub.to_bytes())
    return files, digests[0], digests[1]


def _chain(files: list[bytes], base: str, target: str, listed: list[int] | None = None,
           headers: list[int] | None = None) -> tuple[dict[str, bytes], Doc]:  # fmt: skip
    """The chain of one link of parts ``files`` (those in ``listed``, in its order); with
    ``headers``, each part lists the header digest of the file at that index (MP-5)."""
    snapshot_ckpt, _, _ = _pair()
    ((snap_name, snap),) = snapshot_ckpt.file_bytes().items()
    stored = {f"snapshots/{sha256(snap)}/{snap_name}": snap}
    parts = []
    for data in files:
        digest = blake3.blake3(data).hexdigest()
        stored[f"deltas/{digest}.wdelta"] = data
        parts.append({"digest": digest, "size": len(data)})
    if headers is not None:
        for part, i in zip(parts, headers, strict=True):
            part["header"] = files[i][24:56].hex()  # the prefix's header digest (§3.2)
    parts = [parts[i] for i in (listed if listed is not None else range(len(parts)))]
    doc = manifest(2, [{"number": 0, "digest": base}, {"number": 1, "digest": target}],
                   [{"version": 0, "files": [{"name": snap_name, "sha256": sha256(snap),
                                              "size": len(snap)}]}],
                   [{"from": 0, "to": 1, "parts": parts, "reversible": True}])  # fmt: skip
    doc["required_features"] = [FEATURE] + ([HEADERS] if headers is not None else [])
    return stored, doc


SPLIT = [["w", "y"], ["x"]]


def _single_with_part() -> tuple[dict[str, bytes], Doc]:
    """The two-version chain of a single-file link whose delta has a ``part`` member."""
    base, target, _ = _pair()
    whole = build(base, target, 32, PLAN)
    whole.to_bytes()
    whole.doc["part"] = {"index": 0, "count": 2, "base": whole.doc["base"]["digest"],
                         "target": whole.doc["target"]["digest"]}  # fmt: skip
    stored, doc = _chain([whole.to_bytes(), whole.to_bytes()], whole.doc["base"]["digest"],
                         whole.doc["target"]["digest"])  # fmt: skip
    link = doc["links"][0]
    link.update(link.pop("parts")[0])
    doc["required_features"] = []
    return stored, doc


def add_store_cases(suite: Suite) -> None:
    good, base, target = _parts(SPLIT)
    stored, doc = _chain(good, base, target)
    three, _, _ = _parts([["w"], ["x"], ["y"]])
    not_reversible = copy.deepcopy(doc)
    not_reversible["links"][0]["reversible"] = False
    corrupted = dict(stored)
    key = f"deltas/{doc['links'][0]['parts'][1]['digest']}.wdelta"
    corrupted[key] = stored[key][:-1] + bytes([stored[key][-1] ^ 1])
    cases: list[tuple[str, str, tuple[dict[str, bytes], Doc], dict[str, Any]]] = [
        ("parts-valid", "a link of two parts (w, y and x), both stored", (stored, doc),
         accepted()),
        ("parts-three-valid", "a link of three parts, one tensor each",
         _chain(three, base, target), accepted()),
        ("parts-part-not-stored", "RD-3: the second part is not stored",
         ({k: v for k, v in stored.items() if k != key}, doc), invalid("not-found")),
        ("parts-part-corrupted", "RD-2: the second part's last byte flipped",
         (corrupted, doc), invalid("checksum-mismatch")),
        ("parts-missing-part", "MP-4: parts 0 and 1 of 3 listed, part 2 (tensor y) left out",
         _chain(three, base, target, [0, 1]), invalid("chain-broken")),
        ("parts-missing-tensor", "MP-4: two parts of 2 holding w and x; tensor y is in none",
         _chain(_parts([["w"], ["x"]])[0], base, target), invalid("chain-broken")),
        ("parts-overlapping", "MP-4: tensor x in both parts",
         _chain(_parts([["w", "x", "y"], ["x"]])[0], base, target), invalid("chain-broken")),
        ("parts-other-step", "MP-4: the second part names another link's target",
         _chain(_parts(SPLIT, other={1})[0], base, target), invalid("chain-broken")),
        ("parts-out-of-order", "MP-4: the parts listed in the order 1, 0",
         _chain(good, base, target, [1, 0]), invalid("chain-broken")),
        ("parts-part-without-member", "MP-4: the second part's header has no part member",
         _chain(_parts(SPLIT, bare={1})[0], base, target), invalid("chain-broken")),
        ("parts-count-wrong", "MP-4: both parts say they are of 3 parts; 2 are listed and "
         "they hold every tensor", _chain(_parts(SPLIT, count=3)[0], base, target),
         invalid("chain-broken")),
        ("single-link-with-part", "§17.12: a single-file link whose delta (the whole link, its "
         "digests the link's) carries a part member: checked as any single-file link, the "
         "member is not read", _single_with_part(), accepted()),
        ("parts-reversible-disagrees", "MP-4: the link says not reversible, every part is",
         (stored, not_reversible), invalid("chain-broken")),
    ]  # fmt: skip
    for name, what, (files, mdoc), expect in cases:
        store_case(suite, f"store/{name}", what, mdoc, files, expect, "§17.12", MP4)
    headed = [
        ("parts-header-digests-valid", "MP-5: both parts list their header digests",
         _chain(good, base, target, headers=[0, 1]), accepted()),
        ("parts-header-digest-differs", "MP-5: part 1 lists part 0's header digest",
         _chain(good, base, target, headers=[0, 0]), invalid("checksum-mismatch")),
    ]  # fmt: skip
    for name, what, (files, mdoc), expect in headed:
        store_case(suite, f"store/{name}", what, mdoc, files, expect, "§17.12", MP5)


def _multi_part(doc: Doc) -> None:
    """Link 3 -> 4 of the typical manifest as two parts."""
    link = doc["links"][3]
    link["parts"] = [{"digest": blake3.blake3(f"p{i}".encode()).hexdigest(), "size": 900 + i}
                     for i in range(2)]  # fmt: skip
    del link["digest"], link["size"]
    doc["required_features"] = [FEATURE]


def _headed(doc: Doc) -> None:
    """Every part lists a header digest; the feature part-header-digests listed."""
    for i, part in enumerate(doc["links"][3]["parts"]):
        part["header"] = blake3.blake3(f"h{i}".encode()).hexdigest()
    doc["required_features"] = [FEATURE, HEADERS]


def header_rule_cases() -> list[tuple[str, Doc, str, dict[str, Any]]]:
    """(name, manifest, what, expect) of the manifest rules about part header digests."""
    valid = typical()
    _multi_part(valid)
    _headed(valid)
    no_feature, one_missing = copy.deepcopy(valid), copy.deepcopy(valid)
    no_feature["required_features"] = [FEATURE]
    del one_missing["links"][3]["parts"][1]["header"]
    return [
        ("valid/part-header-digests", valid,
         "link 3 -> 4 of two parts listing their header digests, both features listed",
         accepted()),
        ("invalid/part-header-without-feature", no_feature,
         "parts list header digests, part-header-digests not listed",
         invalid("manifest-invalid")),
        ("invalid/part-header-missing", one_missing,
         "part-header-digests listed, the second part lists no header digest",
         invalid("manifest-invalid")),
    ]  # fmt: skip


def _no_parts(doc: Doc) -> None:
    doc.update(typical())
    doc["required_features"] = [FEATURE]


def rule_cases() -> list[tuple[str, Doc, str, dict[str, Any]]]:
    """(name, manifest, what, expect) of the manifest rules about parts (no storage)."""
    valid = typical()
    _multi_part(valid)

    def edited(change: Any) -> Doc:
        doc = copy.deepcopy(valid)
        change(doc)
        return doc

    return [
        ("valid/multi-part", valid, "link 3 -> 4 of two parts, the feature listed", accepted()),
        ("valid/multi-part-feature-no-parts", edited(_no_parts),
         "multi-part-links listed while no link has parts (a reader that implements the "
         "feature accepts it)", accepted()),
        ("invalid/parts-without-feature", edited(lambda d: d.update(required_features=[])),
         "a link with parts, multi-part-links not listed", invalid("manifest-invalid")),
        ("invalid/part-twice", edited(lambda d: d["links"][3]["parts"].append(
            d["links"][3]["parts"][0])), "a link listing one part twice",
         invalid("manifest-invalid")),
        ("invalid/parts-and-digest", edited(lambda d: d["links"][3].update(
            digest=d["links"][0]["digest"], size=5000)), "a link with parts and digest, size",
         invalid("manifest-invalid")),
        ("invalid/parts-one", edited(lambda d: d["links"][3]["parts"].pop()),
         "a link of one part (a single file is listed by digest and size)",
         invalid("manifest-invalid")),
        ("invalid/part-size-small", edited(lambda d: d["links"][3]["parts"][0].update(size=63)),
         "a part of 63 bytes", invalid("manifest-invalid")),
    ]  # fmt: skip


def add_rule_cases(suite: Suite) -> None:
    for name, doc, what, expect in rule_cases():
        rule_case(suite, name, _text(doc), doc["revision"], what, CH8, expect)
    for name, doc, what, expect in header_rule_cases():
        rule_case(suite, name, _text(doc), doc["revision"], what, CH8_HEADERS, expect)
