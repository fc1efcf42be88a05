"""Reading checkpoints: safetensors headers, single files, sharded folders, arrays."""
