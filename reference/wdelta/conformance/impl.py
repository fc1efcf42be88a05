"""Implementations under test: external commands (templates) or the reference in-process.

The contract (SPEC §16): exit status 0 and a written ``{out}``
is success; a non-zero exit status is a refusal, whose category is read from
the last non-empty line of stderr, ``error: CATEGORY[: message]``.  A process
killed by a signal or past the timeout has neither succeeded nor refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..chain.model.manifest import read_manifest
from ..chain.storage import LocalStorage
from ..chain.store import Chain
from ..chain.trust.acceptance import check_after, check_state, stored_digests
from ..chain.trust.signatures import check_signatures
from ..chain.trust.updater import Trust
from ..chain.writing.append import check_files
from ..errors import BadArgumentError, WdeltaError
from ..ops import api
from .manifest import TEMPLATE_ROLES, placeholder_of, template_of

_CATEGORY = re.compile(r"^error:\s*([a-z][a-z0-9-]*)\s*(?::|$)")
_TAIL = 2000


@dataclass(frozen=True)
class Outcome:
    """What an implementation did with one case.

    ``kind``: ``ok`` (exit 0), ``refused`` (exit > 0), ``crashed`` (killed by a
    signal, or an unexpected exception in-process) or ``timeout``.
    """

    kind: str
    category: str | None
    detail: str
    command: str

    def describe(self) -> str:
        if self.kind == "ok":
            return "succeeded"
        if self.kind == "refused":
            return f"refused with {self.category!r}" if self.category else "refused (no category)"
        return f"{self.kind}: {self.detail}"


class Implementation(Protocol):
    """Runs one profile's operation with the placeholders filled in."""

    @property
    def name(self) -> str: ...

    def supports(self, profile: str) -> bool: ...

    def run(self, profile: str, paths: Mapping[str, Path], timeout: float) -> Outcome: ...


def category_of(stderr: str) -> str | None:
    """The category on the last non-empty line of stderr, if it follows the contract."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    match = _CATEGORY.match(lines[-1].strip()) if lines else None
    return match.group(1) if match else None


@dataclass(frozen=True)
class Templates:
    """Command templates by profile, e.g. ``{"decoder": "tool apply {base} {delta} {out}"}``.

    Manifest cases with a chain root (``{store}``) use the ``manifest-store``
    Manifest cases with a chain root (``{store}``) use the ``manifest-store``
    template, those with a trust root too (``{trust}``) the ``manifest-trust``
    template, those with a revision accepted before (``{seen}``) the
    ``manifest-seen`` template, those with a node's acceptance state (``{state}``)
    the ``manifest-state`` template, or ``manifest-trust-state`` with a trust root
    too; without it they are not tested.
    """

    templates: Mapping[str, str]
    name: str = "templates"

    def __post_init__(self) -> None:
        for profile, template in self.templates.items():
            if profile not in TEMPLATE_ROLES:
                raise BadArgumentError(f"unknown profile {profile!r}")
            missing = [r for r in TEMPLATE_ROLES[profile] if "{" + r + "}" not in template]
            if missing:
                raise BadArgumentError(
                    f"the {profile} template lacks {', '.join('{' + r + '}' for r in missing)}"
                )

    def supports(self, profile: str) -> bool:
        return profile in self.templates

    def lacks(self, profile: str, roles: Collection[str]) -> str | None:
        """The placeholder (``{store}``, ``{seen}``) a case with input ``roles`` needs
        and no given template holds; None if the case can run."""
        name = template_of(profile, roles)
        if name == profile or name in self.templates:
            return None
        return placeholder_of(name)

    def command(self, profile: str, paths: Mapping[str, Path]) -> list[str]:
        """The argument vector: the template split like a shell would, placeholders filled."""
        args = shlex.split(self.templates[template_of(profile, paths)])
        for role, path in paths.items():
            args = [a.replace("{" + role + "}", str(path)) for a in args]
        return args

    def run(self, profile: str, paths: Mapping[str, Path], timeout: float) -> Outcome:
        args = self.command(profile, paths)
        shown = shlex.join(args)
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            return Outcome("crashed", None, f"cannot start {args[0]!r}: {exc}", shown)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The command runs in its own session: end everything it started.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return Outcome("timeout", None, f"no exit after {timeout:g} s", shown)
        stderr = err.decode("utf-8", "replace")[-_TAIL:]
        if proc.returncode < 0:
            return Outcome("crashed", None, f"killed by signal {-proc.returncode}", shown)
        if proc.returncode == 0:
            return Outcome("ok", None, stderr, shown)
        return Outcome("refused", category_of(stderr), stderr.strip(), shown)


@dataclass(frozen=True)
class Reference:
    """The reference implementation, called in-process through its public API.

    Runs cannot be interrupted, so the timeout does not apply.
    """

    name: str = "reference (in-process)"

    def supports(self, profile: str) -> bool:
        return profile in TEMPLATE_ROLES

    def run(self, profile: str, paths: Mapping[str, Path], timeout: float) -> Outcome:
        shown = f"wdelta {profile} " + " ".join(f"{k}={v}" for k, v in sorted(paths.items()))
        try:
            if profile == "reader":
                api.verify(paths["delta"])
            elif profile == "decoder":
                api.apply(paths["base"], paths["delta"], paths["out"])
            elif profile == "reverse":
                api.apply(paths["target"], paths["delta"], paths["out"], reverse=True)
            elif profile == "manifest":
                _check_manifest(paths)
            else:
                api.diff(paths["base"], paths["target"], paths["out"])
        except WdeltaError as exc:
            return Outcome("refused", exc.category, str(exc), shown)
        except OSError as exc:
            return Outcome("refused", "io-error", str(exc), shown)
        except Exception as exc:  # a crash is a result to report, not to propagate
            return Outcome("crashed", None, f"{type(exc).__name__}: {exc}", shown)
        return Outcome("ok", None, "", shown)


def _check_manifest(paths: Mapping[str, Path]) -> None:
    """``wdelta chain check MANIFEST [--store STORE [--trust ROOT] [--state STATE]]
    [--after SEEN]``."""
    policy = Trust.from_file(paths["trust"]) if "trust" in paths else None
    if policy is not None:
        check_signatures(paths["manifest"], LocalStorage(paths["store"]), policy)
    m = read_manifest(paths["manifest"])
    with tempfile.TemporaryDirectory(prefix="wdelta-conformance-cache-") as tmp:
        chain = Chain(paths["store"], Path(tmp)) if "store" in paths else None
        if "seen" in paths:
            check_after(paths["manifest"], m, paths["seen"], stored_digests(chain))
        if "state" in paths:
            assert chain is not None  # the manifest schema: a state comes with a store
            check_state(paths["manifest"], m, paths["state"], policy, chain.storage,
                        stored_digests(chain))  # fmt: skip
        if chain is not None:
            check_files(chain, m)
