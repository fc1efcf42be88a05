"""Suite-wide settings: deterministic Hypothesis runs with no example database."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# derandomize: every run draws the same examples, so a red CI run reproduces
# locally; no database, so runs leave nothing in the working tree.
settings.register_profile(
    "wdelta",
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("wdelta")
