"""Weights in memory: publishing and following (``weights``), moving to any version,
a step published by many ranks and followed by a node's ranks together."""
