"""``python -m wdelta.conformance ARGS``: the same as ``wdelta conformance ARGS``, through
the main CLI so that signals, OS errors and bugs get its one-line contract."""

import sys

from ..cli import run

sys.exit(run(["conformance", *sys.argv[1:]]))
