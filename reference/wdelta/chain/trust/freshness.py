"""``--max-age``: refuse a head revision published too long ago (SPEC §17.7).

The age is the node's clock minus the head manifest's ``updated`` time.
Without a trust policy ``updated`` is unauthenticated: a stalled trainer is
caught, an attacker who rewrites it is not (signature expiry, SG-5, is what
catches an attacker replaying a stale revision).
"""

from __future__ import annotations

import math
import re
import time

from ...errors import BadArgumentError
from ..errors import FrozenError
from ..model.manifest import Manifest
from .updater import parse_time

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UPDATED = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?Z")


def parse_duration(text: str) -> float:
    """Seconds of ``N``, ``Ns``, ``Nm``, ``Nh`` or ``Nd`` (N decimal, > 0)."""
    match = _DURATION.fullmatch(text.strip())
    seconds = float(match[1]) * _UNITS[match[2] or "s"] if match else 0.0
    if not 0 < seconds < math.inf:
        raise BadArgumentError(
            f"--max-age expects a duration > 0 such as 90s, 30m, 12h or 7d, got {text!r}"
        )
    return seconds


def check_max_age(value: object) -> float | None:
    """``max_age`` of the API: None, or a finite number of seconds > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise BadArgumentError(f"max_age must be a number of seconds > 0, got {value!r}")
    return float(value)


def published(m: Manifest) -> int | None:
    """POSIX seconds of ``m.updated`` (fraction dropped), None if absent or no date."""
    match = None if m.updated is None else _UPDATED.fullmatch(m.updated)
    if match is None:
        return None
    try:
        return parse_time(match[1] + "Z")
    except ValueError:
        return None


def check_fresh(m: Manifest, max_age: float | None, now: float | None = None) -> None:
    """FrozenError if head ``m`` was published more than ``max_age`` seconds before
    ``now`` (or carries no time to tell); nothing if ``max_age`` is None."""
    if max_age is None:
        return
    at = published(m)
    if at is None:
        raise FrozenError(
            f"head revision {m.revision} has no valid 'updated' time, so its age is "
            f"unknown; a max age of {max_age:g} s refuses it"
        )
    age = (time.time() if now is None else now) - at
    if age > max_age:
        raise FrozenError(
            f"head revision {m.revision} was published at {m.updated}, {age:.0f} s ago, "
            f"more than the max age of {max_age:g} s: the chain is frozen (nothing fresh "
            "to serve); the node keeps its version"
        )
