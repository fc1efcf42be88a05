"""Chunk encodings (sparse, dense, full), value transforms and the blob codec."""
