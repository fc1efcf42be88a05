"""The signatures of one manifest revision file on disk, checked against a chain's
storage (SG-1..SG-5): what ``wdelta chain check --trust`` and the conformance
suite's manifest-trust profile run."""

from __future__ import annotations

from pathlib import Path

from ...errors import BadArgumentError, StorageError
from ...io.filekind import os_message
from ..model.manifest import revision_of_key
from ..storage.base import Storage
from .updater import Trust


def check_signatures(manifest: Path, storage: Storage, trust: Path | Trust) -> list[str]:
    """SG-1..SG-5 for one manifest revision file against the signatures in ``storage``,
    with the trust root file (or policy) ``trust``."""
    revision = revision_of_key(f"manifests/{manifest.name}")
    if revision is None:
        raise BadArgumentError(f"{manifest} is not named rev-RRRRRRRRRRRR.json")
    try:
        data = manifest.read_bytes()
    except OSError as exc:
        raise StorageError(os_message(manifest, exc)) from exc
    policy = trust if isinstance(trust, Trust) else Trust.from_file(trust)
    return policy.check_revision(storage, revision, data)
