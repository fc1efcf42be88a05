"""The ``wdelta`` command line."""

from .delta import main

__all__ = ["main"]
