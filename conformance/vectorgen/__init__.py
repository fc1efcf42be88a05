"""Building blocks of ``conformance/generate.py`` (not part of the installed package).

Checkpoints, deltas and cases are built in memory from fixed seeds, written
under ``vectors/`` and listed in ``manifest.json``; nothing depends on the
clock, the file system order or the random state of the process.
"""
