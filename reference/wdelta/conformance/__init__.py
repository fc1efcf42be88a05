"""The wdelta conformance suite runner.

``python -m wdelta.conformance run`` (or ``wdelta conformance run``) checks an
implementation against the vectors of ``conformance/`` through command
templates, or the reference implementation itself when none is given.
Profiles: ``reader``, ``decoder``, ``reverse``, ``encoder`` (``manifest`` is
reserved for the chain layer).
"""

from .impl import Outcome, Reference, Templates
from .manifest import Case, Manifest, default_vectors, load
from .runner import Options, Result, of_version, run_all, select

__all__ = [
    "Case",
    "Manifest",
    "Options",
    "Outcome",
    "Reference",
    "Result",
    "Templates",
    "default_vectors",
    "load",
    "of_version",
    "run_all",
    "select",
]
