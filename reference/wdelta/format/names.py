"""The names the header gives tensor ops (SPEC §4.5), chunk encodings (§7), value
transforms (§6) and blob codecs (§8): one ``Literal`` type and one tuple of its values each.

The header holds these names as JSON strings, so they stay plain ``str`` values;
the ``Literal`` types let mypy check every comparison and assignment against the set.
"""

from __future__ import annotations

from typing import Literal, get_args

Op = Literal["unchanged", "modified", "added", "removed"]
Encoding = Literal["unchanged", "sparse", "dense", "full"]
Transform = Literal["xor", "sub"]
Codec = Literal["zstd", "none"]

OPS: tuple[Op, ...] = get_args(Op)
ENCODINGS: tuple[Encoding, ...] = get_args(Encoding)
TRANSFORMS: tuple[Transform, ...] = get_args(Transform)
CODECS: tuple[Codec, ...] = get_args(Codec)
