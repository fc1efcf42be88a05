"""Into the store: ``init``, ``append``, ``squash``, ``prune``."""
