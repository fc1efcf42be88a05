"""How the command line names the options that the Python API takes as keywords.

Library messages name an option the way the API spells it (``overwrite=True``),
since that is what a Python caller passes; the CLI prints every message through
:func:`in_flags`, so that its users read the flag they would type (``--force``).
"""

from __future__ import annotations

import re

# API spelling in library messages -> the CLI's spelling of the same choice.
API_TO_FLAG = {
    "overwrite=True": "--force",
    "accept_rollback=True": "--accept-rollback",
    "allow_unsigned=True": "--allow-unsigned",
    "compact=True": "without --compat",
    "chunk_elements=N": "--chunk-elements N",
    "trust=ROOT": "--trust ROOT",
    "base=BASE": "--base BASE",
    "open the chain as chain.Chain(LOCATION, cache=FOLDER)": "pass --cache FOLDER",
}


# A ``name=True`` left after API_TO_FLAG names a field of a file, not an option
# (``header says reversible=True``): said as the file spells it, in JSON.
_FIELD = re.compile(r"\b([a-z]+(?:_[a-z]+)*)=(True|False)\b")


def in_flags(message: str) -> str:
    """``message`` with each API keyword of :data:`API_TO_FLAG` replaced by its flag,
    and any other ``name=True`` or ``name=False`` by ``name: true`` or ``name: false``."""
    for keyword, flag in API_TO_FLAG.items():
        message = message.replace(keyword, flag)
    return _FIELD.sub(lambda m: f"{m[1]}: {m[2].lower()}", message)
