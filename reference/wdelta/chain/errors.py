"""Error categories of the chain layer (SPEC §17.10).

The delta-file categories of :mod:`wdelta.errors` keep their meaning here
(a corrupt downloaded file is ``checksum-mismatch``, a transport failure is
``io-error``); these cover what only a chain can get wrong
(``signature-invalid`` and ``frozen`` only with a trust policy).
"""

from __future__ import annotations

from ..errors import WdeltaError


class ManifestInvalidError(WdeltaError):
    """A manifest is not valid JSON, violates the schema or a manifest rule."""

    category = "manifest-invalid"


class ChainBrokenError(WdeltaError):
    """A version cannot be reached, or a stored file disagrees with the manifest."""

    category = "chain-broken"


class NotFoundError(WdeltaError):
    """A file the manifest lists is missing from storage, or a version is unknown."""

    category = "not-found"


class ConflictError(WdeltaError):
    """A create-only write lost to another writer, or a version already exists."""

    category = "conflict"


class SignatureInvalidError(WdeltaError):
    """A trust policy refuses a revision or a root: too few valid signatures of trusted keys."""

    category = "signature-invalid"


class FrozenError(WdeltaError):
    """The newest signed revision (or the trust root) has expired: nothing fresh to serve."""

    category = "frozen"


def published_anyway(exc: WdeltaError, revision: int, version: int) -> WdeltaError:
    """``exc`` (same category) saying that revision ``revision`` (the new version
    ``version``) was published before it happened; ``published_revision`` is set."""
    new = type(exc)(f"{exc}; but revision {revision} was created first: version {version} "
                    "is published")  # fmt: skip
    new.published_revision = revision
    return new


CHAIN_CATEGORIES: tuple[str, ...] = (
    "manifest-invalid", "chain-broken", "not-found", "conflict", "signature-invalid", "frozen",
)  # fmt: skip
