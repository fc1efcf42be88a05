"""Deciding pass, fail or soft failure from a case and what the implementation did.

Hard failures: accepting an invalid input, refusing a valid one, a wrong
output, leaving output behind after a refusal, modifying an input, crashing
or timing out.  Refusing with another category than the expected one is a
soft failure (hard under ``--strict``): the input was refused, as it must be,
but the implementation tells its users the wrong reason.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import WdeltaError
from ..format.container import open_delta
from ..ops import api
from .impl import Outcome
from .manifest import Case, Output
from .outputs import compare
from .writer import writer_violations

PASS, FAIL, SOFT, NOT_TESTED, SKIPPED = "pass", "fail", "soft-fail", "not-tested", "skipped"
# The reference's output for a case, to locate the first differing element.
ReferenceOutput = Callable[[], Path | None]


@dataclass(frozen=True)
class Verdict:
    """A case's status (one of the constants above) and why."""

    status: str
    message: str


def judge(case: Case, outcome: Outcome, paths: Mapping[str, Path],
          reference: ReferenceOutput, max_size_ratio: float | None = None) -> Verdict:  # fmt: skip
    """The verdict for one run of ``case``.

    ``max_size_ratio``: an encoder's delta larger than this multiple of the
    reference encoder's fails (a quality gate; by default size never fails).
    """
    if outcome.kind in ("crashed", "timeout"):
        return Verdict(FAIL, outcome.describe())
    if case.outcome == "invalid":
        return _judge_refusal(case, outcome, paths)
    if outcome.kind != "ok":
        return Verdict(FAIL, f"{outcome.describe()} on a valid input: {_tail(outcome.detail)}")
    if case.profile in ("reader", "manifest"):
        return Verdict(PASS, "accepted")
    if case.profile == "encoder":
        return _judge_encoder(case, paths, max_size_ratio)
    assert case.output is not None
    problem = compare(paths["out"], case.output, None)
    if problem is not None:
        problem = compare(paths["out"], case.output, reference())
        return Verdict(FAIL, problem or "output changed while being checked")
    return Verdict(PASS, "output matches")


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def _judge_refusal(case: Case, outcome: Outcome, paths: Mapping[str, Path]) -> Verdict:
    expected = case.category
    if outcome.kind == "ok":
        return Verdict(FAIL, f"accepted an invalid input (expected refusal with {expected!r})")
    out = paths.get("out")
    if out is not None and (out.exists() or out.is_symlink()):
        return Verdict(FAIL, f"refused ({outcome.category}) but left output at {out.name}")
    if outcome.category != expected:
        got = repr(outcome.category) if outcome.category else "no 'error: CATEGORY' line"
        return Verdict(SOFT, f"refused with {got}, expected {expected!r}: {_tail(outcome.detail)}")
    return Verdict(PASS, f"refused with {expected!r}")


def _judge_encoder(case: Case, paths: Mapping[str, Path], max_size_ratio: float | None) -> Verdict:
    delta = paths["out"]
    if not delta.is_file():
        return Verdict(FAIL, f"exited 0 but wrote no delta file at {delta.name}")
    try:
        api.verify(delta)
        with open_delta(delta) as d:
            reversible = d.header.reversible
    except WdeltaError as exc:
        return Verdict(FAIL, f"the reference reader refuses the delta: {exc.category}: {exc}")
    assert case.output is not None and case.reverse_output is not None
    problem = _reference_apply(paths["base"], delta, case.output, reverse=False)
    if problem is None and reversible:
        problem = _reference_apply(paths["target"], delta, case.reverse_output, reverse=True)
    if problem is not None:
        return Verdict(FAIL, problem)
    broken = writer_violations(delta, paths["base"], paths["target"])
    if broken:
        return Verdict(FAIL, "breaks writer requirements: " + "; ".join(broken))
    return _judge_size(case, delta.stat().st_size, max_size_ratio)


def _judge_size(case: Case, size: int, max_size_ratio: float | None) -> Verdict:
    """Size is quality, not validity: reported, and failed only past ``max_size_ratio``."""
    ref, info = case.reference_delta_bytes, case.information_bytes
    text = f"valid delta of {size} bytes"
    if ref:
        text += f", {size / ref:.2f}x the reference encoder's {ref}"
    if info:
        text += f", {size / info:.2f}x the information estimate {info}"
    if max_size_ratio is not None and ref and size > max_size_ratio * ref:
        return Verdict(FAIL, f"{text}: larger than --max-size-ratio {max_size_ratio:g}")
    return Verdict(PASS, text)


def _reference_apply(source: Path, delta: Path, expected: Output, reverse: bool) -> str | None:
    """Apply with the reference decoder and compare; None when it reproduces ``expected``."""
    direction = "in reverse " if reverse else ""
    with tempfile.TemporaryDirectory(prefix="wdelta-conformance-") as tmp:
        out = Path(tmp) / ("out" if expected.layout == "folder" else "out.safetensors")
        try:
            api.apply(source, delta, out, reverse=reverse, threads=1)
        except WdeltaError as exc:
            return f"the reference decoder refuses to apply it {direction}({exc.category}: {exc})"
        problem = compare(out, expected)
        return None if problem is None else f"applied {direction}by the reference: {problem}"


def reference_output(case: Case, paths: Mapping[str, Path], scratch: Path) -> Path | None:
    """The reference decoder's output for a decoder/reverse case, written under ``scratch``."""
    if case.output is None:
        return None
    out = scratch / ("expected" if case.output.layout == "folder" else "expected.safetensors")
    if out.exists():
        return out
    scratch.mkdir(exist_ok=True)
    source = paths["target"] if case.profile == "reverse" else paths["base"]
    try:
        api.apply(source, paths["delta"], out, reverse=case.profile == "reverse", threads=1)
    except WdeltaError:
        shutil.rmtree(out, ignore_errors=True)
        return None
    return out
