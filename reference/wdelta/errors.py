"""The wdelta exception hierarchy.

Every failure the library reports is a :class:`WdeltaError` carrying a stable
``category`` string defined in SPEC §12).  The CLI prints
``error: CATEGORY: message`` and exits non-zero; the conformance suite compares
categories, never messages.
"""

from __future__ import annotations


class WdeltaError(Exception):
    """Base class of every error raised by wdelta."""

    category = "error"
    #: True when the file is of the other kind (a delta where a checkpoint goes,
    #: a checkpoint or a folder where a delta goes): the CLI then adds the usage
    #: of the command that was run, which the library cannot know.
    mixed_up = False
    #: The manifest revision a publish created although it then failed (a rank of a
    #: distributed publish failed after rank 0's commit): the step is on the chain.
    #: None when nothing was published.
    published_revision: int | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class DeltaFormatError(WdeltaError):
    """The delta file is malformed (base class of the file-level categories)."""

    category = "header-invalid"


class BadMagicError(DeltaFormatError):
    """The file does not start with the wdelta magic bytes."""

    category = "bad-magic"


class HeaderInvalidError(DeltaFormatError):
    """The header is not valid JSON, violates the schema or a header rule."""

    category = "header-invalid"


class TruncatedError(DeltaFormatError):
    """The file is shorter than its prefix and header say."""

    category = "truncated"


class ChecksumMismatchError(DeltaFormatError):
    """A stored checksum or digest does not match the bytes it covers."""

    category = "checksum-mismatch"


class EncodingInvalidError(DeltaFormatError):
    """A blob's payload violates the layout of its encoding or codec."""

    category = "encoding-invalid"


class IndexOutOfRangeError(EncodingInvalidError):
    """A sparse position lies outside its chunk."""

    category = "index-out-of-range"


class UnsupportedVersionError(WdeltaError):
    """The file's format version is not one this reader implements."""

    category = "unsupported-version"


class UnsupportedFeatureError(WdeltaError):
    """A required feature, dtype, encoding, transform, codec or op is unknown."""

    category = "unsupported-feature"


class LimitExceededError(WdeltaError):
    """A size or count exceeds a limit; raised before anything is allocated."""

    category = "limit-exceeded"


class BaseMismatchError(WdeltaError):
    """The checkpoint given as base is not the one the delta was made from."""

    category = "base-mismatch"


class NotReversibleError(WdeltaError):
    """Reverse application was requested for a delta that cannot be reversed."""

    category = "not-reversible"


class CheckpointInvalidError(WdeltaError):
    """An input checkpoint (safetensors file or sharded folder) is malformed."""

    category = "checkpoint-invalid"


class BadArgumentError(WdeltaError):
    """A caller passed an invalid argument or option."""

    category = "bad-argument"


class StorageError(WdeltaError):
    """An operating-system or storage error while reading or writing."""

    category = "io-error"


class InternalError(WdeltaError):
    """The implementation failed in a way it did not anticipate: a bug in wdelta."""

    category = "internal-error"


# The categories an input can earn, so the ones a conformance case may expect;
# internal-error (a bug of the implementation) is deliberately not among them.
CATEGORIES: tuple[str, ...] = (
    "bad-magic",
    "unsupported-version",
    "unsupported-feature",
    "header-invalid",
    "limit-exceeded",
    "truncated",
    "checksum-mismatch",
    "base-mismatch",
    "index-out-of-range",
    "encoding-invalid",
    "not-reversible",
    "checkpoint-invalid",
    "bad-argument",
    "io-error",
)
