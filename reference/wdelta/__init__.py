"""wdelta: bit-exact, streaming weight deltas between neural-network checkpoints.

Public API::

    wdelta.diff(base, target, "step.wdelta")          # encode
    wdelta.apply(base, "step.wdelta", "new.safetensors")  # decode, verified
    wdelta.verify("step.wdelta", base=base)           # integrity (+ base)
    wdelta.apply_inplace(model_state, "step.wdelta")  # live tensors, all or nothing
    for c in wdelta.changes("step.wdelta"): ...       # per-chunk changes, for engines
    with wdelta.open_delta("step.wdelta") as d: d.header  # inspect

Every failure raises a :class:`WdeltaError` subclass with a stable
``category`` (SPEC §12).
"""

from ._version import __version__
from .checkpoint.source import Checkpoint, from_arrays, open_checkpoint
from .errors import (
    CATEGORIES,
    BadArgumentError,
    BadMagicError,
    BaseMismatchError,
    CheckpointInvalidError,
    ChecksumMismatchError,
    DeltaFormatError,
    EncodingInvalidError,
    HeaderInvalidError,
    IndexOutOfRangeError,
    InternalError,
    LimitExceededError,
    NotReversibleError,
    StorageError,
    TruncatedError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
    WdeltaError,
)
from .format.container import DeltaFile, open_delta
from .format.header import Chunk, Header, TensorEntry
from .ops.api import apply, diff, verify
from .ops.inplace import apply_inplace
from .ops.stream import ChunkChange, changed_tensors, changes, verify_weights
from .ops.summary import DeltaSummary, summarize

__all__ = [
    "CATEGORIES",
    "BadArgumentError",
    "BadMagicError",
    "BaseMismatchError",
    "Checkpoint",
    "CheckpointInvalidError",
    "ChecksumMismatchError",
    "Chunk",
    "ChunkChange",
    "DeltaFile",
    "DeltaFormatError",
    "DeltaSummary",
    "EncodingInvalidError",
    "Header",
    "HeaderInvalidError",
    "IndexOutOfRangeError",
    "InternalError",
    "LimitExceededError",
    "NotReversibleError",
    "StorageError",
    "TensorEntry",
    "TruncatedError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "WdeltaError",
    "__version__",
    "apply",
    "apply_inplace",
    "changed_tensors",
    "changes",
    "diff",
    "from_arrays",
    "open_checkpoint",
    "open_delta",
    "summarize",
    "verify",
    "verify_weights",
]
