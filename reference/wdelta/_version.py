"""The package version and the versions of the formats it reads and writes.

They live here, free of imports, so that ``wdelta --version`` is as cheap as
the interpreter start-up (the benchmark times it as such).
"""

__version__ = "0.1.0"
# The chain manifest's ``version`` (SPEC §17.2); wdelta.chain.model.manifest uses it.
CHAIN_MANIFEST_VERSION = 1
# The ``manifest_version`` of the conformance suite packaged with this release
# (conformance/manifest.json); tests/test_packaging.py keeps the two equal.
CONFORMANCE_SUITE_VERSION = 7
