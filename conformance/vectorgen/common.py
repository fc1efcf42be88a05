"""Registering a valid delta as reader, decoder and reverse cases at once."""

from __future__ import annotations

from dataclasses import dataclass

from .builder import Delta
from .checkpoints import Checkpoint
from .suite import Suite, accepted, valid


@dataclass(frozen=True)
class Pair:
    """A base and a target checkpoint registered under ``name``-base/-target."""

    name: str
    base: Checkpoint
    target: Checkpoint

    def paths(self, suite: Suite) -> tuple[str, str]:
        return (
            suite.checkpoint(f"{self.name}-base", self.base),
            suite.checkpoint(f"{self.name}-target", self.target),
        )


def add_valid(
    suite: Suite, group: str, pair: Pair, delta: Delta, description: str, section: str,
    rule: str,
) -> str:  # fmt: skip
    """Register ``delta`` as valid for the reader, decoder and (if reversible) reverse.

    A reader must accept it, a decoder rebuild the target, a reverse decoder the
    base.  Returns the path of the delta file.
    """
    base, target = pair.paths(suite)
    path = suite.blob(f"delta/{group}.wdelta", delta.to_bytes())
    suite.add(f"decoder/{group}", "decoder", description, section, rule,
              {"base": base, "delta": path}, valid(pair.target))  # fmt: skip
    suite.add(f"reader/{group}", "reader", description, section, rule,
              {"delta": path}, accepted())  # fmt: skip
    if delta.doc["reversible"]:
        suite.add(f"reverse/{group}", "reverse", description + " (applied in reverse)",
                  section, rule, {"target": target, "delta": path}, valid(pair.base))  # fmt: skip
    return path
