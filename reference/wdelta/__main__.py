"""``python -m wdelta`` runs the command line."""

from .cli import main

main()
