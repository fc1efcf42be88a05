"""Retry delays: exponential, capped, jittered (one policy for every retry loop).

After the ``n``-th consecutive failure (n >= 1) the nominal delay is
``min(cap, base * factor ** (n - 1))`` seconds; the actual delay is drawn
uniformly from ``[nominal * (1 - jitter), nominal]``, so a fleet that failed
together does not retry in lockstep, and a delay never exceeds ``cap``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ...errors import BadArgumentError

# factor ** 64 already exceeds any sensible cap; stops float overflow for long outages.
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class Backoff:
    """``base`` and ``cap`` in seconds (0 <= base <= cap), ``factor`` >= 1, 0 <= ``jitter`` <= 1."""

    base: float = 1.0
    cap: float = 300.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (0 <= self.base <= self.cap and self.factor >= 1 and 0 <= self.jitter <= 1):
            raise BadArgumentError(
                "backoff needs 0 <= base <= cap, factor >= 1 and 0 <= jitter <= 1"
            )

    def nominal(self, failures: int) -> float:
        """The delay before jitter after ``failures`` consecutive failures (>= 1)."""
        exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
        return float(min(self.cap, self.base * self.factor**exponent))

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after ``failures`` consecutive failures, jittered."""
        draw = (rng or random).random()
        return self.nominal(failures) * (1 - self.jitter * draw)
