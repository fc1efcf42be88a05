"""The suite under construction: vector files, cases and the manifest.

Files are collected in memory under paths relative to the manifest
(``vectors/...``) and written at the end, so that a case can only name files
that exist and two cases sharing a file share identical bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wdelta._version import CONFORMANCE_SUITE_VERSION

from .checkpoints import Checkpoint

# The suite version that introduced each case of suites 1 to 6 (taken once from the
# history of conformance/manifest.json on the main line); a case not listed is new in
# this version.  A case whose meaning changes gets a new id, never a new "since".
SINCE = {case_id: int(version)
         for version, ids in json.loads((Path(__file__).with_name("since.json")).read_text())
         .items() for case_id in ids}  # fmt: skip

MANIFEST_VERSION = CONFORMANCE_SUITE_VERSION
FORMAT_VERSION = 1
PROFILES = ("reader", "decoder", "reverse", "encoder", "manifest")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Suite:
    """Vector files by relative path and the cases that use them."""

    files: dict[str, bytes] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    cases: list[dict[str, Any]] = field(default_factory=list)

    def _put(self, path: str, data: bytes) -> None:
        if path in self.files and self.files[path] != data:
            raise ValueError(f"{path} registered twice with different bytes")
        self.files[path] = data

    def checkpoint(self, name: str, ckpt: Checkpoint) -> str:
        """Register a checkpoint: one file, or a folder when it is sharded."""
        files = ckpt.file_bytes()
        if ckpt.index is None:
            ((data,),) = [tuple(files.values())]
            path = f"vectors/ckpt/{name}.safetensors"
            self._put(path, data)
            self.inputs[path] = {"path": path, "sha256": sha256(data)}
            return path
        path = f"vectors/ckpt/{name}"
        for fname, data in files.items():
            self._put(f"{path}/{fname}", data)
        listing = {fname: sha256(data) for fname, data in sorted(files.items())}
        self.inputs[path] = {"path": path, "files": listing}
        return path

    def blob(self, path: str, data: bytes) -> str:
        """Register a single file (a delta, a malformed checkpoint) at ``path``."""
        path = f"vectors/{path}"
        self._put(path, data)
        self.inputs[path] = {"path": path, "sha256": sha256(data)}
        return path

    def add(
        self, case_id: str, profile: str, description: str, section: str, rule: str,
        inputs: dict[str, str], expect: dict[str, Any], out: str | None = None,
    ) -> None:  # fmt: skip
        """Add a case; ``inputs`` maps template roles to registered paths.

        ``out`` is the name given to ``{out}``: by default ``out.wdelta`` for
        encoders, ``out`` for a sharded (folder) output, else ``out.safetensors``.
        """
        assert profile in PROFILES and case_id.startswith(profile + "/"), case_id
        assert all(c["id"] != case_id for c in self.cases), case_id
        case: dict[str, Any] = {
            "id": case_id, "profile": profile, "description": description,
            "spec": {"section": section, "rule": rule},
            "inputs": {role: self.inputs[path] for role, path in sorted(inputs.items())},
            "expect": expect, "since": SINCE.get(case_id, MANIFEST_VERSION),
        }  # fmt: skip
        if profile == "encoder":
            case["out"] = "out.wdelta"
        elif profile not in ("reader", "manifest"):
            folder = expect.get("output", {}).get("layout") == "folder"
            case["out"] = out or ("out" if folder else "out.safetensors")
        self.cases.append(case)

    def prune(self) -> None:
        """Forget files that no case uses (e.g. a target only a reverse case would read)."""
        used: set[str] = set()
        for case in self.cases:
            for item in case["inputs"].values():
                names = item.get("files", {".": None})
                used |= {item["path"] if n == "." else f"{item['path']}/{n}" for n in names}
        self.files = {path: data for path, data in self.files.items() if path in used}

    def write(self, out: Path, manifest: dict[str, Any]) -> None:
        """Write every used file and ``manifest.json`` under ``out``."""
        self.prune()
        for rel, data in sorted(self.files.items()):
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        text = json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True) + "\n"
        (out / "manifest.json").write_text(text, encoding="utf-8")


def output_expect(ckpt: Checkpoint) -> dict[str, Any]:
    """What a correct apply writes: file hashes and the hash of every tensor."""
    files = {n: {"sha256": sha256(d), "size": len(d)} for n, d in ckpt.file_bytes().items()}
    tensors = {
        t.name: {"dtype": t.dtype, "shape": list(t.shape), "sha256": sha256(t.data)}
        for t in ckpt.tensors
    }
    if ckpt.index is None:
        ((only,),) = [tuple(files.values())]
        return {"layout": "file", **only, "tensors": tensors}
    return {"layout": "folder", "files": files, "tensors": tensors}


def valid(ckpt: Checkpoint) -> dict[str, Any]:
    """Expectation: success, writing ``ckpt`` exactly."""
    return {"outcome": "valid", "output": output_expect(ckpt)}


def accepted() -> dict[str, Any]:
    """Expectation for a reader: the delta is accepted."""
    return {"outcome": "valid"}


def invalid(category: str) -> dict[str, Any]:
    """Expectation: refusal with ``category``."""
    return {"outcome": "invalid", "category": category}
