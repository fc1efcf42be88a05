"""Trust in a chain (SPEC §17.11): the pure trusted set, its I/O (``updater.Trust``), key
files, signature lines, the node's acceptance state and freshness."""
