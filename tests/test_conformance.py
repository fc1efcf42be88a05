"""The conformance suite: its vectors, its runner, and that it catches broken implementations.

The vectors must regenerate byte for byte and match the manifest; the
reference must pass every case (but the known reference bugs listed in
conformance/generate.py); deliberately broken wrappers around the reference
(tests/broken_impl.py) must fail on the cases that check what they break.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from wdelta import cli
from wdelta.conformance import (
    Manifest,
    Options,
    Reference,
    Result,
    Templates,
    load,
    of_version,
    report,
    run_all,
    select,
)
from wdelta.conformance.impl import Outcome, category_of
from wdelta.conformance.manifest import CHAIN_CATEGORIES, PROFILES
from wdelta.conformance.writer import header_text_violations
from wdelta.errors import CATEGORIES, BadArgumentError, WdeltaError
from wdelta.format import schemas

REPO = Path(__file__).resolve().parents[1]
VECTORS = REPO / "conformance"
BROKEN = Path(__file__).with_name("broken_impl.py")
PYTHON = shlex.quote(sys.executable)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_generate", VECTORS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load(VECTORS)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """Case folders on a RAM disk when there is one: decoders fsync every output."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        yield Path(tmp)


def _run(manifest: Manifest, patterns: Sequence[str], impl: Templates | Reference,
         scratch: Path, strict: bool = False) -> dict[str, Result]:  # fmt: skip
    cases = select(manifest.cases, patterns)
    assert cases, patterns
    opts = Options(timeout=60, jobs=2, strict=strict, scratch=scratch)
    return {r.case.id: r for r in run_all(manifest, cases, impl, opts)}


def _broken(
    mode: str, profiles: Sequence[str] = ("reader", "decoder", "reverse", "encoder")
) -> Templates:
    tool = f"{PYTHON} {shlex.quote(str(BROKEN))} {mode}"
    templates = {
        "reader": f"{tool} verify {{delta}}",
        "decoder": f"{tool} apply {{base}} {{delta}} {{out}}",
        "reverse": f"{tool} apply --reverse {{target}} {{delta}} {{out}}",
        "encoder": f"{tool} diff {{base}} {{target}} {{out}}",
    }
    return Templates({p: templates[p] for p in profiles})


def test_manifest_lists_exactly_the_vector_files(manifest: Manifest) -> None:
    listed: set[Path] = set()
    for case in manifest.cases:
        assert case.outcome == "valid" or case.category in CATEGORIES + CHAIN_CATEGORIES
        for item in case.inputs.values():
            base = VECTORS / item.path
            listed |= {base if name == "." else base / name for name in item.files}
    on_disk = {p for p in (VECTORS / "vectors").rglob("*") if p.is_file()}
    assert listed == on_disk
    profiles = {p: sum(c.profile == p for c in manifest.cases) for p in PROFILES}
    assert min(profiles.values()) > 10, profiles


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    assert _generator().main(["--out", str(tmp_path), "--no-check"]) == 0
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    vendored = {Path("manifest.json"): (VECTORS / "manifest.json").read_bytes()}
    vendored |= {p.relative_to(VECTORS): p.read_bytes()
                 for p in (VECTORS / "vectors").rglob("*") if p.is_file()}  # fmt: skip
    assert sorted(fresh) == sorted(vendored)
    changed = [str(p) for p in fresh if fresh[p] != vendored[p]]
    assert not changed, f"regenerate with conformance/generate.py: {changed[:5]}"


def test_reference_passes_every_case(manifest: Manifest, scratch: Path) -> None:
    known_bug = _generator().known_bug
    results = _run(manifest, [], Reference(), scratch, strict=True)
    failed = {i: r.message for i, r in results.items() if r.status != "pass"}
    assert {i: m for i, m in failed.items() if not known_bug(i)} == {}
    assert set(failed) == {i for i in results if known_bug(i)}, "a known bug is fixed: update"


REFERENCE_CLI = Templates({
    "reader": f"{PYTHON} -m wdelta verify -q {{delta}}",
    "decoder": f"{PYTHON} -m wdelta apply -q {{base}} {{delta}} -o {{out}}",
    "reverse": f"{PYTHON} -m wdelta apply -q --reverse {{target}} {{delta}} -o {{out}}",
    "encoder": f"{PYTHON} -m wdelta diff -q {{base}} {{target}} -o {{out}}",
    "manifest": f"{PYTHON} -m wdelta chain check -q {{manifest}}",
    "manifest-store": f"{PYTHON} -m wdelta chain check -q {{manifest}} --store {{store}}",
    "manifest-trust": f"{PYTHON} -m wdelta chain check -q {{manifest}} --store {{store}} "
                      "--trust {trust}",
    "manifest-seen": f"{PYTHON} -m wdelta chain check -q {{manifest}} --after {{seen}}",
    "manifest-state": f"{PYTHON} -m wdelta chain check -q {{manifest}} --store {{store}} "
                      "--state {state}",
    "manifest-trust-state": f"{PYTHON} -m wdelta chain check -q {{manifest}} --store {{store}} "
                            "--trust {trust} --state {state}",
})  # fmt: skip
SAMPLE = ["*/valid/host", "*/valid/layout/sharded", "*/invalid/bitmap-trailing-bit",
          "decoder/base-mismatch/missing-tensor", "reverse/not-reversible/full-chunks",
          "encoder/sharded", "encoder/invalid/target-dtype-f4", "manifest/valid/typical",
          "manifest/invalid/unreachable", "manifest/store/delta-missing",
          "manifest/signed/revoked-key", "manifest/seen/valid-next",
          "manifest/seen/fork"]  # fmt: skip


def test_reference_cli_passes_through_templates(manifest: Manifest, scratch: Path) -> None:
    results = _run(manifest, SAMPLE, REFERENCE_CLI, scratch, strict=True)
    assert {i: r.message for i, r in results.items() if r.status != "pass"} == {}
    assert {r.case.profile for r in results.values()} == set(PROFILES)


# mode -> (selected cases, cases that must fail, text of their message, cases that must pass)
BROKEN_CASES = {
    "ignore-checksums": (
        ["*/invalid/blob-checksum", "*/invalid/header-corrupted",
         "reader/invalid/removed-blob-checksum", "decoder/valid/host"],
        [f"{p}/invalid/{c}" for p in ("reader", "decoder", "reverse")
         for c in ("blob-checksum", "header-corrupted")] + ["reader/invalid/removed-blob-checksum"],
        "accepted an invalid input", ["decoder/valid/host"],
    ),
    "nan-canonical": (
        ["decoder/valid/special/F16", "decoder/valid/special/BF16", "decoder/valid/special/F32",
         "reverse/valid/special/F64", "decoder/valid/special/F8_E5M2",
         "decoder/valid/matrix/I32/full"],
        ["decoder/valid/special/F16", "decoder/valid/special/BF16", "decoder/valid/special/F32",
         "reverse/valid/special/F64"],
        "elements differ", ["decoder/valid/special/F8_E5M2", "decoder/valid/matrix/I32/full"],
    ),
    "clamp-indices": (
        ["*/invalid/rice-index-past-*", "*/invalid/bitmap-index-past-end",
         "reader/invalid/bitmap-trailing-bit", "decoder/valid/positions/last-rice-k17"],
        [f"{p}/invalid/{c}" for p in ("reader", "decoder", "reverse")
         for c in ("rice-index-past-end", "rice-index-past-2-32", "bitmap-index-past-end")]
        + ["reader/invalid/bitmap-trailing-bit"],
        "accepted an invalid input", ["decoder/valid/positions/last-rice-k17"],
    ),
    "never-refuse": (
        ["reader/invalid/bad-magic", "decoder/base-mismatch/unchanged-tensor-bytes",
         "reverse/not-reversible/removed-dropped", "encoder/invalid/target-truncated",
         "reader/valid/host"],
        ["reader/invalid/bad-magic", "decoder/base-mismatch/unchanged-tensor-bytes",
         "reverse/not-reversible/removed-dropped", "encoder/invalid/target-truncated"],
        "accepted an invalid input", ["reader/valid/host"],
    ),
    "canonical-by-name": (
        ["*/valid/compact/canonical-order", "*/valid/compact/host"],
        ["decoder/valid/compact/canonical-order", "reverse/valid/compact/canonical-order",
         "decoder/valid/compact/host"],
        "recorded safetensors header",
        # The host base's canonical order is its name order.
        ["reader/valid/compact/canonical-order", "reverse/valid/compact/host"],
    ),
    "lax-compact": (
        ["*/invalid/compact-chunk-offset", "*/invalid/compact-digest-pad-bits",
         "reader/valid/compact/host"],
        [f"{p}/invalid/{c}" for p in ("reader", "decoder")
         for c in ("compact-chunk-offset", "compact-digest-pad-bits")],
        "accepted an invalid input", ["reader/valid/compact/host"],
    ),
    "same-as-own-path": (
        ["*/valid/compact/same-as-base", "*/valid/compact/sharded-same-index"],
        [f"{p}/valid/compact/same-as-base" for p in ("reader", "decoder", "reverse")],
        "on a valid input",
        # Shards that say same_as_base under their own path are looked up right by chance.
        [f"{p}/valid/compact/sharded-same-index" for p in ("reader", "decoder", "reverse")],
    ),
    "coded-no-level-cap": (
        ["*/invalid/coded-nine-levels", "reader/valid/coded/widths"],
        [f"{p}/invalid/coded-nine-levels" for p in ("reader", "decoder", "reverse")],
        "accepted an invalid input", ["reader/valid/coded/widths"],
    ),
    "coded-one-level-less": (
        ["*/valid/coded/*", "reader/valid/host"],
        [f"{p}/valid/coded/{c}" for p in ("reader", "decoder", "reverse")
         for c in ("widths", "host", "compact")],
        "", ["reader/valid/host"],
    ),
    "compact-codec-zstd": (
        ["*/valid/coded/compact", "reader/valid/coded/widths", "reader/valid/compact/*"],
        [f"{p}/valid/coded/compact" for p in ("reader", "decoder", "reverse")],
        "", ["reader/valid/coded/widths"],
    ),
    "inline-ignored": (
        ["*/valid/inline/*", "reader/valid/host"],
        [f"{p}/valid/inline/{c}" for p in ("reader", "decoder", "reverse")
         for c in ("host", "compact", "all", "lengths")],
        "", ["reader/valid/host", "reader/valid/inline/ignored"],
    ),
    "inline-in-placement": (
        ["*/valid/inline/host", "*/invalid/inline-counted-in-placement", "reader/valid/host"],
        # The file it wrongly accepts then fails its blob checksums: a soft failure there.
        [f"{p}/valid/inline/host" for p in ("reader", "decoder", "reverse")],
        "", ["reader/valid/host"],
    ),
    "lax-remainder-padding": (
        ["*/invalid/coded-remainder-padding", "reader/invalid/rice-remainder-padding-bit",
         "reader/valid/coded/widths"],
        [f"{p}/invalid/coded-remainder-padding" for p in ("reader", "decoder", "reverse")]
        + ["reader/invalid/rice-remainder-padding-bit"],
        "accepted an invalid input", ["reader/valid/coded/widths"],
    ),
    "no-digit-limit": (
        ["*/invalid/json-number-4301-digits", "reader/valid/number-4300-digits"],
        ["reader/invalid/json-number-4301-digits", "decoder/invalid/json-number-4301-digits"],
        "accepted an invalid input", ["reader/valid/number-4300-digits"],
    ),
    "partial-output": (
        ["*/invalid/blob-checksum", "decoder/base-mismatch/missing-tensor",
         "decoder/invalid/layout-index-disagrees", "encoder/invalid/target-not-safetensors",
         "decoder/valid/host"],
        ["decoder/invalid/blob-checksum", "reverse/invalid/blob-checksum",
         "decoder/base-mismatch/missing-tensor", "decoder/invalid/layout-index-disagrees",
         "encoder/invalid/target-not-safetensors"],
        "left output", ["reader/invalid/blob-checksum", "decoder/valid/host"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("mode", sorted(BROKEN_CASES))
def test_broken_implementation_is_caught(mode: str, manifest: Manifest, scratch: Path) -> None:
    patterns, must_fail, why, must_pass = BROKEN_CASES[mode]
    results = _run(manifest, patterns, _broken(mode), scratch)
    failed = {i for i, r in results.items() if r.status == "fail"}
    assert failed == set(must_fail), {i: results[i].message for i in failed ^ set(must_fail)}
    assert all(why in results[i].message for i in must_fail), [
        results[i].message for i in must_fail
    ]
    assert all(results[i].status == "pass" for i in must_pass)
    assert not report.passed(list(results.values()))


def test_wrong_category_is_a_soft_failure_unless_strict(manifest: Manifest, scratch: Path) -> None:
    cases = ["reader/invalid/bad-magic", "reader/valid/host"]
    soft = _run(manifest, cases, _broken("wrong-category", ["reader"]), scratch)
    assert [soft[c].status for c in cases] == ["soft-fail", "pass"]
    assert "refused with 'io-error', expected 'bad-magic'" in soft[cases[0]].message
    assert report.passed(list(soft.values()))
    hard = _run(manifest, cases[:1], _broken("wrong-category", ["reader"]), scratch, strict=True)
    assert hard[cases[0]].status == "fail"


def test_modified_input_crash_and_timeout_fail(manifest: Manifest, scratch: Path) -> None:
    modifies = _run(manifest, ["reader/valid/host"], _broken("modify-input", ["reader"]), scratch)
    assert "modified its input files ['delta/host.wdelta']" in modifies["reader/valid/host"].message
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    crash = Templates({"reader": f"{PYTHON} -c {shlex.quote(kill)} {{delta}}"})
    crashed = _run(manifest, ["reader/invalid/bad-magic"], crash, scratch)[
        "reader/invalid/bad-magic"
    ]
    assert (crashed.status, crashed.message) == ("fail", "crashed: killed by signal 9")
    sleep = Templates({"reader": f"{PYTHON} -c 'import time; time.sleep(30)' {{delta}}"})
    opts = Options(timeout=0.5, scratch=scratch)
    (slow,) = run_all(manifest, select(manifest.cases, ["reader/valid/host"]), sleep, opts)
    assert (slow.status, slow.message) == ("fail", "timeout: no exit after 0.5 s")


def test_cli_reports_and_untested_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    argv = ["conformance", "run", "--vectors", str(VECTORS), "--filter", "*/valid/host",
            "--reader", _broken("faithful", ["reader"]).templates["reader"],
            "--json-report", str(json_path), "--junit", str(junit_path)]  # fmt: skip
    assert cli.run(argv) == 0
    text = capsys.readouterr().out
    assert "reverse" in text and "(not tested)" in text and "result: PASS" in text
    doc = json.loads(json_path.read_text())
    schemas.validator("conformance-report").validate(doc)
    assert doc["profiles"]["reader"]["pass"] == 1 and doc["profiles"]["decoder"]["not-tested"] == 1
    suites = {s.get("name"): s for s in ET.parse(junit_path).getroot()}
    assert suites["decoder"].get("skipped") == "1" and suites["reader"].get("failures") == "0"


def test_cli_reports_replace_atomically_and_never_the_suite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(VECTORS / "vectors", suite / "vectors")
    shutil.copy(VECTORS / "manifest.json", suite / "manifest.json")
    before = (suite / "manifest.json").read_bytes()
    reader = _broken("faithful", ["reader"]).templates["reader"]
    argv = ["conformance", "run", "--vectors", str(suite), "--filter", "*/valid/host",
            "--reader", reader]  # fmt: skip
    some_vector = next(p for p in (suite / "vectors").rglob("*") if p.is_file())
    for wrong in (suite / "manifest.json", some_vector, Path("-")):
        assert cli.run([*argv, "--json-report", str(wrong)]) == 2
        assert capsys.readouterr().err.startswith("error: bad-argument:")
        assert cli.run([*argv, "--junit", str(wrong)]) == 2
        assert capsys.readouterr().err.startswith("error: bad-argument:")
    assert (suite / "manifest.json").read_bytes() == before
    report = tmp_path / "r.json"
    report.write_text("old report\n")
    inode = report.stat().st_ino
    assert cli.run([*argv, "--json-report", str(report)]) == 0
    assert json.loads(report.read_text())["profiles"]["reader"]["pass"] == 1
    assert report.stat().st_ino != inode  # renamed into place, not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "suite"]


def test_cli_list_and_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["conformance", "run", "--vectors", str(VECTORS)]
    assert cli.run([*base, "--list", "--filter", "encoder/*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("encoder/") for line in lines)
    assert cli.run([*base, "--filter", "no/such/case"]) == 2
    assert capsys.readouterr().err.startswith("error: bad-argument:")
    with pytest.raises(BadArgumentError, match="lacks"):
        Templates({"decoder": "tool apply {base} {out}"})


def test_every_case_records_the_suite_version_that_introduced_it(manifest: Manifest) -> None:
    """'since' comes from vectorgen/since.json for the cases of suites 1 to 6 and is the
    current version for the others; an id the suite no longer has must leave the table."""
    table = json.loads((VECTORS / "vectorgen" / "since.json").read_text(encoding="utf-8"))
    listed = {case_id: int(v) for v, ids in table.items() for case_id in ids}
    newest = manifest.raw["manifest_version"]
    assert set(listed) <= {c.id for c in manifest.cases}
    assert max(listed.values()) < newest
    assert all(c.since == listed.get(c.id, newest) for c in manifest.cases)


def test_suite_version_judges_against_an_older_suite(manifest: Manifest, tmp_path: Path) -> None:
    """--suite-version N runs the cases suite N had (their 'since' at most N), through the
    CLI, and the report says which version was judged; a version the suite lacks is refused."""
    v6 = of_version(manifest, 6)
    assert {c.since for c in v6} == {1, 2, 3, 4, 5, 6} and len(v6) < len(manifest.cases)
    assert {c.id for c in manifest.cases if c.since == 7} >= {
        "manifest/signed/key-id-not-its-key", "manifest/state/other-chain"}  # fmt: skip
    base = [sys.executable, "-m", "wdelta", "conformance", "run", "--vectors", str(VECTORS)]
    listed = subprocess.run([*base, "--suite-version", "6", "--list", "--filter",
                             "manifest/state/*"], capture_output=True, text=True,
                            check=True)  # fmt: skip
    ids = {line.split("\t")[0] for line in listed.stdout.splitlines()}
    assert ids == {c.id for c in v6 if c.id.startswith("manifest/state/")} and len(ids) == 9
    report = tmp_path / "r.json"
    run = subprocess.run([*base, "--suite-version", "6", "--filter", "manifest/state/signed-*",
                          "--json-report", str(report)], capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "judged against suite v6's cases" in run.stdout
    data = json.loads(report.read_text())
    assert data["suite"]["judged_version"] == 6 and data["suite"]["manifest_version"] == 7
    assert schemas.violation("conformance-report", data) is None
    for bad in ("8", "0"):
        refused = subprocess.run([*base, "--suite-version", bad, "--list"], capture_output=True,
                                 text=True)  # fmt: skip
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines()[-1].startswith("error: bad-argument:")


class _AcceptsEverything:
    """An in-process implementation that succeeds without doing anything."""

    name = "accepts everything"

    def supports(self, profile: str) -> bool:
        return profile == "reader"

    def run(self, profile: str, paths: Mapping[str, Path], timeout: float) -> Outcome:
        return Outcome("ok", None, "", "true")


def test_fail_fast_skips_the_rest_and_work_dir_keeps_cases(
    manifest: Manifest, tmp_path: Path
) -> None:
    cases = select(manifest.cases, ["reader/invalid/bad-magic*", "decoder/valid/host"])
    opts = Options(fail_fast=True, work_dir=tmp_path)
    results = run_all(manifest, cases, _AcceptsEverything(), opts)
    statuses = [r.status for r in results]
    assert statuses == ["not-tested", "fail", "skipped", "skipped"], statuses
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["0001-reader__invalid__bad-magic"]
    assert (tmp_path / kept[0] / "in" / "delta" / "bad-magic.wdelta").is_file()


@pytest.mark.parametrize(("stderr", "category"), [
    ("error: checksum-mismatch: blob 3\n", "checksum-mismatch"),
    ("warning: slow disk\nerror: base-mismatch\n\n", "base-mismatch"),
    ("error: checksum-mismatch: x\nTraceback (most recent call last):\nValueError\n", None),
    ("", None),
])  # fmt: skip
def test_category_is_read_from_the_last_stderr_line(stderr: str, category: str | None) -> None:
    assert category_of(stderr) == category


@pytest.mark.slow
def test_reference_cli_passes_the_whole_suite(manifest: Manifest, scratch: Path) -> None:
    known_bug = _generator().known_bug
    results = _run(manifest, [], REFERENCE_CLI, scratch, strict=True)
    assert {
        i: r.message for i, r in results.items() if r.status != "pass" and not known_bug(i)
    } == {}


def _encoders() -> ModuleType:
    spec = importlib.util.spec_from_file_location("broken_encoders", ENCODERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ENCODERS = Path(__file__).with_name("broken_encoders.py")
SPEC_ENCODERS = _encoders()


class _SpecEncoder:
    """An encoder of tests/broken_encoders.py, run in-process (the suite is slow otherwise)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.name = f"spec encoder {mode}"

    def supports(self, profile: str) -> bool:
        return profile == "encoder"

    def run(self, profile: str, paths: Mapping[str, Path], timeout: float) -> Outcome:
        try:
            data = SPEC_ENCODERS.encode(self.mode, paths["base"], paths["target"])
        except WdeltaError as exc:
            return Outcome("refused", exc.category, str(exc), self.name)
        paths["out"].write_bytes(data)
        return Outcome("ok", None, "", self.name)


ENCODER_SAMPLE = ["encoder/ops", "encoder/sharded", "encoder/finetune-bf16", "encoder/scalars",
                  "encoder/single-with-index",
                  "encoder/invalid/target-index-missing-shard"]  # fmt: skip


@pytest.mark.parametrize("mode", sorted(SPEC_ENCODERS.VARIANTS))
def test_spec_permitted_encoder_choices_pass(
    mode: str, manifest: Manifest, scratch: Path
) -> None:
    results = _run(manifest, ENCODER_SAMPLE, _SpecEncoder(mode), scratch, strict=True)
    assert {i: r.message for i, r in results.items() if r.status != "pass"} == {}


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(SPEC_ENCODERS.VARIANTS))
def test_spec_permitted_encoder_choices_pass_every_case(
    mode: str, manifest: Manifest, scratch: Path
) -> None:
    results = _run(manifest, ["encoder/*"], _SpecEncoder(mode), scratch, strict=True)
    assert {i: r.message for i, r in results.items() if r.status != "pass"} == {}


# mode -> (cases it must fail, cases where its defect cannot occur and that pass)
BROKEN_ENCODER_CASES = {
    "leading-whitespace": (["encoder/ops", "encoder/finetune-bf16"], []),
    "byte-order-mark": (["encoder/ops"], []),
    "padding-8-to-15": (["encoder/ops", "encoder/finetune-bf16"], []),
    "ignored-member": (["encoder/ops", "encoder/sharded"], ["encoder/finetune-bf16"]),
    "changed-off-by-one": (["encoder/finetune-bf16", "encoder/sharded"], ["encoder/identical"]),
    "sparse-extra-position": (["encoder/finetune-bf16"], ["encoder/all-changed"]),
    "base-layout-respaced": (["encoder/finetune-bf16", "encoder/ops"], []),
    "compact-base-canonical": (["encoder/exact-header", "encoder/metadata"],
                               ["encoder/finetune-bf16"]),
    "compact-ignored-member": (["encoder/ops", "encoder/sharded"], ["encoder/finetune-bf16"]),
}


@pytest.mark.parametrize("mode", sorted(SPEC_ENCODERS.BROKEN))
def test_encoder_breaking_a_writer_requirement_is_caught(
    mode: str, manifest: Manifest, scratch: Path
) -> None:
    must_fail, must_pass = BROKEN_ENCODER_CASES[mode]
    rule = SPEC_ENCODERS.BROKEN[mode][1]
    results = _run(manifest, must_fail + must_pass, _SpecEncoder(mode), scratch)
    for case in must_fail:
        assert results[case].status == "fail" and rule in results[case].message, results[case]
    assert all(results[c].status == "pass" for c in must_pass), results


def test_spec_encoders_run_through_templates(manifest: Manifest, scratch: Path) -> None:
    tool = f"{PYTHON} {shlex.quote(str(ENCODERS))}"
    good = Templates({"encoder": f"{tool} page-padding {{base}} {{target}} {{out}}"})
    bad = Templates({"encoder": f"{tool} changed-off-by-one {{base}} {{target}} {{out}}"})
    cases = ["encoder/sharded", "encoder/invalid/target-dtype-f6"]
    assert {r.status for r in _run(manifest, cases, good, scratch, strict=True).values()} == {
        "pass"
    }
    failed = _run(manifest, cases[:1], bad, scratch)["encoder/sharded"]
    assert failed.status == "fail" and "W4 §4.6" in failed.message


def test_size_is_reported_and_gated_only_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["conformance", "run", "--vectors", str(VECTORS), "--filter", "encoder/finetune-bf16",
            "-v"]  # fmt: skip
    assert cli.run(argv) == 0
    out = capsys.readouterr().out
    assert "1.00x the reference encoder's" in out and "the information estimate" in out
    report_path = tmp_path / "r.json"
    argv += ["--max-size-ratio", "0.5", "--json-report", str(report_path)]
    assert cli.run(argv) == 1
    assert "larger than --max-size-ratio 0.5" in capsys.readouterr().out
    doc = json.loads(report_path.read_text())
    schemas.validator("conformance-report").validate(doc)
    assert doc["options"]["max_size_ratio"] == 0.5
    assert cli.run([*argv[:-2], "--max-size-ratio", "0"]) == 2
    assert "error: bad-argument: --max-size-ratio" in capsys.readouterr().err


@pytest.mark.parametrize(("header", "rules"), [
    (b'{"a":1}' + b" ", []),
    (b'{"a":1}\n' + b" " * 7, []),
    (b'{\n "a": 1\n}', []),
    (b'{"a":1}' + b" " * 9, ["W2"]),
    (b'{"a":1}' + b" " * (4096 - 64 - 7), []),
    (b'{"a":1}' + b" " * (2 * 4096 - 64 - 7), ["W2"]),
    (b' {"a":1}', ["W1"]),
    (b'\xef\xbb\xbf{"a":1}' + b" " * 12, ["W1", "W2"]),
])  # fmt: skip
def test_header_text_writer_rules(header: bytes, rules: list[str]) -> None:
    found = [p.split()[0] for p in header_text_violations(header)]
    assert found == rules


def test_docs_give_the_suite_case_counts(manifest: Manifest) -> None:
    suite_doc = (VECTORS / "README.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    total = len(manifest.cases)
    assert f"): {total} cases over" in suite_doc and f"SPEC.md: {total} cases in" in readme
    for profile in PROFILES:
        count = sum(c.profile == profile for c in manifest.cases)
        assert f"| `{profile}` | {count} |" in suite_doc, profile


READERS = Path(__file__).with_name("broken_manifest_reader.py")
# mode -> (cases it must fail, cases it must pass)
BROKEN_READER_CASES = {
    "plain-json": (["manifest/invalid/duplicate-key",
                    "manifest/invalid/lone-surrogate", "manifest/invalid/nesting-65"],
                   ["manifest/valid/typical", "manifest/invalid/unreachable"]),
    "no-reachability": (["manifest/invalid/unreachable",
                         "manifest/invalid/unreachable-irreversible"],
                        ["manifest/valid/large", "manifest/invalid/link-dangling"]),
    "skip-missing": (["manifest/store/delta-missing", "manifest/store/snapshot-missing"],
                     ["manifest/store/valid", "manifest/store/delta-corrupted"]),
    "ignore-signatures": ([f"manifest/signed/{n}" for n in (
        "unsigned", "wrong-key", "tampered-byte", "tampered-signature", "wrong-revision",
        "wrong-chain", "threshold-not-met", "revoked-key", "root-not-signed-by-previous",
        "expired", "root-expired", "root-signed-by-revisions-key", "revision-signed-by-root-key",
        "root-threshold-not-met")],
        ["manifest/signed/valid", "manifest/signed/rotated-key", "manifest/signed/threshold-met",
         "manifest/signed/root-role-rotated"]),
    "any-role": (["manifest/signed/root-signed-by-revisions-key",
                  "manifest/signed/revision-signed-by-root-key"],
                 ["manifest/signed/valid", "manifest/signed/root-role-rotated",
                  "manifest/signed/revoked-key"]),
    "ignore-after": (["manifest/seen/lower", "manifest/seen/lower-by-three",
                      "manifest/seen/rewritten", "manifest/seen/fork"],
                     ["manifest/seen/valid-same", "manifest/seen/valid-next",
                      "manifest/seen/valid-later"]),
    "no-part-set": ([f"manifest/store/parts-{n}" for n in (
        "missing-part", "missing-tensor", "overlapping", "other-step", "out-of-order",
        "reversible-disagrees")],
        ["manifest/store/parts-valid", "manifest/store/parts-part-corrupted"]),
    "part-headers-only": (["manifest/store/parts-missing-tensor",
                           "manifest/store/parts-overlapping"],
                          ["manifest/store/parts-valid", "manifest/store/parts-other-step"]),
    "revision-only": (["manifest/seen/rewritten", "manifest/seen/rewritten-whitespace",
                       "manifest/seen/fork"],
                      ["manifest/seen/lower", "manifest/seen/valid-later"]),
    "forget-trust": ([f"manifest/state/{n}" for n in (
        "unsigned-after-signed", "trust-moved-back", "fast-forward-recovered")],
        ["manifest/state/signed-same", "manifest/state/unsigned-state",
         "manifest/state/fast-forward-kept"]),
    "no-reset": (["manifest/state/fast-forward-recovered"],
                 ["manifest/state/fast-forward-kept", "manifest/state/rotation-keeps-signer",
                  "manifest/state/signed-same", "manifest/state/trust-moved-back"]),
    "reset-on-rotation": (["manifest/state/rotation-keeps-signer"],
                          ["manifest/state/fast-forward-recovered",
                           "manifest/state/fast-forward-kept"]),
    "part-member-optional": (["manifest/store/parts-part-without-member"],
                             ["manifest/store/parts-valid", "manifest/store/parts-count-wrong"]),
    "no-part-count": (["manifest/store/parts-count-wrong"],
                      ["manifest/store/parts-valid", "manifest/store/parts-missing-part"]),
    "no-snapshot-digest": (["manifest/store/snapshot-other-version"],
                           ["manifest/store/valid", "manifest/store/snapshot-corrupted"]),
    "no-digit-limit": (["manifest/invalid/number-4301-digits"],
                       ["manifest/valid/typical", "manifest/invalid/nesting-65"]),
    "trust-file-unsigned": (["manifest/signed/trust-signed-by-revisions-key",
                             "manifest/signed/trust-unsigned"],
                            ["manifest/signed/valid",
                             "manifest/signed/root-not-signed-by-own-role"]),
    "successor-not-self-signed": (["manifest/signed/root-not-signed-by-own-role"],
                                  ["manifest/signed/rotated-key",
                                   "manifest/signed/trust-signed-by-revisions-key"]),
    "no-successor-identity": (["manifest/signed/stored-root-wrong-version",
                               "manifest/signed/stored-root-wrong-chain"],
                              ["manifest/signed/rotated-key", "manifest/signed/root-role-rotated"]),
    "count-signature-entries": (["manifest/signed/trust-signature-listed-twice",
                                 "manifest/signed/stored-root-signature-listed-twice"],
                                ["manifest/signed/valid",
                                 "manifest/signed/root-threshold-not-met"]),
    "no-key-id-check": (["manifest/signed/key-id-not-its-key"],
                        ["manifest/signed/valid", "manifest/signed/wrong-key"]),
    "no-threshold-check": (["manifest/signed/threshold-above-keys-rotated"],
                           ["manifest/signed/valid", "manifest/signed/role-threshold-above-keys"]),
    "state-other-chain": (["manifest/state/other-chain"],
                          ["manifest/state/signed-same", "manifest/state/fast-forward-recovered"]),
    "release-when-no-signer": (["manifest/state/release-threshold-2"],
                               ["manifest/state/fast-forward-recovered",
                                "manifest/state/rotation-keeps-signer"]),
    "release-counts-root-keys": (["manifest/state/release-signer-moved-to-root-role"],
                                 ["manifest/state/fast-forward-recovered",
                                  "manifest/state/release-threshold-2"]),
    "state-revision-only": (["manifest/state/rewritten", "manifest/state/forked-parent"],
                            ["manifest/state/unsigned-rolled-back", "manifest/seen/rewritten",
                             "manifest/state/signed-same"]),
    "state-no-schema": (["manifest/state/schema-signers-empty"],
                        ["manifest/state/signed-same", "manifest/state/unsigned-state"]),
    "state-v1-trust": (["manifest/state/version-1-with-trust"],
                       ["manifest/state/unsigned-state", "manifest/state/schema-signers-empty"]),
}  # fmt: skip


def _reader(mode: str) -> Templates:
    tool = f"{PYTHON} {shlex.quote(str(READERS))} {mode}"
    return Templates({"manifest": f"{tool} {{manifest}}",
                      "manifest-store": f"{tool} {{manifest}} --store {{store}}",
                      "manifest-seen": f"{tool} {{manifest}} --after {{seen}}",
                      "manifest-trust": f"{tool} {{manifest}} --store {{store}} "
                                        "--trust {trust}",
                      "manifest-state": f"{tool} {{manifest}} --store {{store}} --state {{state}}",
                      "manifest-trust-state": f"{tool} {{manifest}} --store {{store}} "
                                              "--trust {trust} --state {state}"})  # fmt: skip


@pytest.mark.parametrize("mode", sorted(BROKEN_READER_CASES))
def test_broken_manifest_reader_is_caught(mode: str, manifest: Manifest, scratch: Path) -> None:
    must_fail, must_pass = BROKEN_READER_CASES[mode]
    results = _run(manifest, must_fail + must_pass, _reader(mode), scratch, strict=True)
    failed = {i for i, r in results.items() if r.status == "fail"}
    assert failed == set(must_fail), {i: results[i].message for i in failed ^ set(must_fail)}
    # A broken reader fails by accepting what it must refuse or, for the rules that
    # release a node (SG-10), by refusing what it must accept: never by a wrong category.
    assert all("accepted an invalid input" in results[i].message
               or "on a valid input" in results[i].message for i in must_fail)  # fmt: skip


def test_storage_cases_need_the_store_template(manifest: Manifest, scratch: Path) -> None:
    only = Templates({"manifest": _reader("faithful").templates["manifest"]})
    results = _run(manifest, ["manifest/store/valid", "manifest/valid/minimal"], only, scratch)
    assert results["manifest/store/valid"].status == "not-tested"
    assert results["manifest/store/valid"].message == "the template has no {store}"
    assert results["manifest/valid/minimal"].status == "pass"
    with pytest.raises(BadArgumentError, match=r"lacks \{store\}"):
        Templates({"manifest-store": "tool check {manifest}"})


def test_signature_cases_need_the_trust_template(manifest: Manifest, scratch: Path) -> None:
    store_only = Templates({k: v for k, v in _reader("faithful").templates.items()
                            if k != "manifest-trust"})  # fmt: skip
    results = _run(manifest, ["manifest/signed/valid", "manifest/store/valid"], store_only,
                   scratch)  # fmt: skip
    assert results["manifest/signed/valid"].status == "not-tested"
    assert results["manifest/signed/valid"].message == "the template has no {trust}"
    assert results["manifest/store/valid"].status == "pass"
    with pytest.raises(BadArgumentError, match=r"lacks \{trust\}"):
        Templates({"manifest-trust": "tool check {manifest} --store {store}"})
def test_state_cases_need_a_state_template(manifest: Manifest, scratch: Path) -> None:
    """Cases with a node's acceptance state run only with a {state} template (with a
    trust root or without); an implementation without one is reported as not tested."""
    faithful = _reader("faithful").templates
    without = Templates({k: v for k, v in faithful.items() if "state" not in k})
    results = _run(manifest, ["manifest/state/*"], without, scratch)
    assert {r.status for r in results.values()} == {"not-tested"}
    assert {r.message for r in results.values()} == {"the template has no {state}"}
    results = _run(manifest, ["manifest/state/*"], _reader("faithful"), scratch, strict=True)
    assert len(results) == 16 and {r.status for r in results.values()} == {"pass"}
    with pytest.raises(BadArgumentError, match=r"lacks \{state\}"):
        Templates({"manifest-trust-state": "tool check {manifest} --store {store} --trust {trust}"})


def test_seen_cases_need_the_seen_template(manifest: Manifest, scratch: Path) -> None:
    """RD-1 needs a reader's memory: its cases run only with a {seen} template, and a
    reader that has none is reported as not tested, never failed."""
    faithful = _reader("faithful").templates
    only = Templates({"manifest": faithful["manifest"]})
    results = _run(manifest, ["manifest/seen/*"], only, scratch)
    assert {r.status for r in results.values()} == {"not-tested"}
    assert {r.message for r in results.values()} == {"the template has no {seen}"}
    both = Templates({"manifest": faithful["manifest"], "manifest-seen": faithful["manifest-seen"]})
    results = _run(manifest, ["manifest/seen/*", "manifest/store/valid"], both, scratch)
    assert results.pop("manifest/store/valid").status == "not-tested"
    assert {r.status for r in results.values()} == {"pass"} and len(results) == 9
    with pytest.raises(BadArgumentError, match=r"lacks \{seen\}"):
        Templates({"manifest-seen": "tool check {manifest}"})


def test_verify_strict_writer_command(tmp_path: Path) -> None:
    ckpt = VECTORS / "vectors" / "ckpt"
    base, target = ckpt / "enc-finetune-base.safetensors", ckpt / "enc-finetune-target.safetensors"

    def verify(delta: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "wdelta", "verify", str(delta), *extra]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    strict = ["--base", str(base), "--target", str(target), "--strict-writer"]
    good, bad = tmp_path / "good.wdelta", tmp_path / "bad.wdelta"
    good.write_bytes(SPEC_ENCODERS.encode("page-padding", base, target))
    bad.write_bytes(SPEC_ENCODERS.encode("changed-off-by-one", base, target))
    ok = verify(good, *strict)
    assert ok.returncode == 0 and "meets the writer requirements W1-W6" in ok.stdout
    assert verify(bad, "--base", str(base)).returncode == 0  # a reader cannot tell
    refused = verify(bad, *strict)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: header-invalid: writer requirement W4 §4.6")
    wrong = verify(good, "--base", str(base), "--target", str(base), "--strict-writer")
    assert wrong.returncode == 2 and "is not the target" in wrong.stderr
    assert verify(good, "--strict-writer").returncode == 2


def test_python_dash_m_entry_point() -> None:
    """``python -m wdelta.conformance`` is ``wdelta conformance``: output, exit status
    and the one-line error contract."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "wdelta.conformance", *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    listed = run("run", "--list", "--filter", "encoder/*", "--vectors", str(VECTORS))
    assert listed.returncode == 0 and listed.stdout.startswith("encoder/"), listed.stderr
    wrong = run("run", "--filter", "no/such/case", "--vectors", str(VECTORS))
    assert wrong.returncode == 2 and wrong.stderr.splitlines() == [
        "error: bad-argument: no case matches ['no/such/case']"
    ]
    # A report in a missing folder was an OS error after the run (a traceback through
    # the old entry point, then a message naming the temporary file); it is now
    # refused before any case runs.
    unwritable = run("run", "--filter", "reader/valid/host", "--vectors", str(VECTORS),
                     "--json-report", "/nonexistent-folder/r.json")  # fmt: skip
    assert unwritable.returncode == 1
    assert unwritable.stderr.splitlines() == [
        "error: io-error: /nonexistent-folder/r.json: its folder /nonexistent-folder does "
        "not exist: nothing was written; create it or choose another output path"
    ]
    assert unwritable.stdout == ""
