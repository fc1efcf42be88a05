"""The former name of :mod:`.blob` (SPEC.md §8), for ``chain/partial.py`` only until
its import names :mod:`.blob`; then this module goes."""

from __future__ import annotations

from .blob import decompress

__all__ = ["decompress"]
