"""Operating-system plumbing: atomic outputs, renames, positioned writes, signals, file kinds."""
