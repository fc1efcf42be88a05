"""The delta file format: container, header (v1 and compact), layouts, dtypes, digests, JSON."""
