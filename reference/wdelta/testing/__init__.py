"""Deterministic synthetic checkpoints and the demo, for tests, benchmarks and newcomers."""
