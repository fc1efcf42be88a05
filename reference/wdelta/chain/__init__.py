"""Chains of deltas in shared storage: a trainer appends, a fleet of nodes pulls.

Python API (SPEC §17)::

    from wdelta import chain
    c = chain.Chain(chain.open_storage("s3://bucket/run1"), cache=Path("cache"))
    chain.init(c, Path("step0.safetensors"))
    chain.append(c, Path("step1.safetensors"), base=Path("step0.safetensors"))
    chain.pull(c, Path("node/model.safetensors"))            # to the head
    chain.Publisher(c).publish(model.state_dict(), step=1)   # from memory
    for v in chain.follow_weights(c, weights): ...           # into memory
    chain.prefetch(c, at=3, to=7)                            # download ahead
    moved = chain.move_weights(c, weights, at=3, to=7)      # in memory, to version 7
    m = chain.parse_manifest(data)                           # read-only tooling

Every failure is a :class:`wdelta.WdeltaError` with a stable category; the
chain adds ``manifest-invalid``, ``chain-broken``, ``not-found`` and ``conflict``,
and with a trust policy (``Chain(..., trust=ROOTFILE)``, SPEC §17.11)
``signature-invalid`` and ``frozen``.
"""

from .errors import (
    CHAIN_CATEGORIES,
    ChainBrokenError,
    ConflictError,
    FrozenError,
    ManifestInvalidError,
    NotFoundError,
    SignatureInvalidError,
)
from .live.distributed import DistributedPublisher, assign_by_bytes
from .live.group_follow import follow_in_group
from .live.move import Moved, move_weights, prefetch
from .live.weights import Publisher, follow_weights, load, save_weights, weights_digest
from .model.manifest import (
    Link,
    Manifest,
    Snapshot,
    SnapshotFile,
    Version,
    parse_manifest,
    read_manifest,
)
from .reading.cachegc import GcResult, gc_chain
from .reading.pull import PullResult, follow, pull
from .storage import LocalStorage, ObjectInfo, Storage, open_storage
from .storage.backoff import Backoff
from .storage.transfer import Transfer
from .store import Chain
from .trust.signing import PublicKey, SigningKey, load_public_key, load_signing_key
from .trust.updater import Root, Trust, make_root, read_root_file
from .writing.append import AppendOptions, append, append_delta, init, log_rows, verify
from .writing.compose import compose, squash
from .writing.prune import Policy, prune

__all__ = [
    "CHAIN_CATEGORIES",
    "AppendOptions",
    "Backoff",
    "Chain",
    "ChainBrokenError",
    "ConflictError",
    "DistributedPublisher",
    "FrozenError",
    "GcResult",
    "Link",
    "LocalStorage",
    "Manifest",
    "ManifestInvalidError",
    "Moved",
    "NotFoundError",
    "ObjectInfo",
    "Policy",
    "PublicKey",
    "Publisher",
    "PullResult",
    "Root",
    "SignatureInvalidError",
    "SigningKey",
    "Snapshot",
    "SnapshotFile",
    "Storage",
    "Transfer",
    "Trust",
    "Version",
    "append",
    "append_delta",
    "assign_by_bytes",
    "compose",
    "follow",
    "follow_in_group",
    "follow_weights",
    "gc_chain",
    "init",
    "load",
    "load_public_key",
    "load_signing_key",
    "log_rows",
    "make_root",
    "move_weights",
    "open_storage",
    "parse_manifest",
    "prefetch",
    "prune",
    "pull",
    "read_manifest",
    "read_root_file",
    "save_weights",
    "squash",
    "verify",
    "weights_digest",
]
