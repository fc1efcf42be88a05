"""``python -m wdelta.conformance``."""

from .cli import main

main()
