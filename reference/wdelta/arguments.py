"""Checks of the arguments of the public API, so that a caller's mistake is a
:class:`BadArgumentError` naming the argument, never a ``TypeError`` or
``AttributeError`` from deep inside.

Paths are accepted as ``str`` or ``os.PathLike[str]`` everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Union

from .errors import BadArgumentError

PathLike = Union[str, "os.PathLike[str]"]


def _kind(value: object) -> str:
    return "None" if value is None else type(value).__name__


def as_path(value: object, what: str) -> Path:
    """``value`` (a ``str`` or ``os.PathLike[str]``) as a Path.

    ``what`` names the argument in the message.  An empty string and a NUL
    character (which the operating system cannot take) are refused too.
    """
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str):
        raise BadArgumentError(f"{what} must be a path (str or os.PathLike), not {_kind(value)}")
    if not text:
        raise BadArgumentError(f"{what} is an empty path")
    if "\0" in text:
        raise BadArgumentError(f"{what} contains a NUL character: {text!r}")
    return Path(text)


def is_path(value: object) -> bool:
    """Whether ``value`` is a ``str`` or an ``os.PathLike`` (the checks are as_path's)."""
    return isinstance(value, (str, os.PathLike))


def check_int(value: object, what: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (no upper bound if None); bools are refused."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadArgumentError(f"{what} must be an integer, not {_kind(value)}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise BadArgumentError(f"{what} must be {bound}, got {value}")
    return value


def check_optional_int(value: object, what: str, low: int, high: int | None = None) -> int | None:
    """As :func:`check_int`, with None allowed (meaning: the default)."""
    return None if value is None else check_int(value, what, low, high)


def check_str_mapping(value: object, what: str) -> None:
    """``value`` must be None or a mapping of strings to strings."""
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadArgumentError(f"{what} must map strings to strings")


def check_seconds(value: object, what: str) -> float | None:
    """``value`` as a duration in seconds (a finite number >= 0), None allowed."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value < float("inf")
    ):
        raise BadArgumentError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def check_mapping(value: object, what: str, *, mutable: bool = False) -> None:
    """``value`` must be a mapping (a mutable one if ``mutable``) of tensors by name."""
    kind = MutableMapping if mutable else Mapping
    if not isinstance(value, kind):
        raise BadArgumentError(
            f"{what} must be a {'mutable ' if mutable else ''}mapping of tensor names to "
            f"arrays or tensors, not {_kind(value)}"
        )
