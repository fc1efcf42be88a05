"""Coverage-guided fuzzing of every wdelta reader with atheris (libFuzzer).

Run (Python 3.11; atheris has wheels for x86-64 Linux)::

    pip install -e '.[test,fuzz]'
    python fuzz/atheris_fuzz.py -atheris_runs=200000 -max_len=65536

The first input byte picks a target; the rest is, by target: a delta header
(JSON put in front of a valid delta's data section with a fresh header
digest, so mutations get past the checksum), a whole delta file, a
safetensors file, a shard index, or a chain manifest.  Every target checks
the property of tests/fuzz_targets.py (the right result or a WdeltaError of a
documented category, no output left after a refusal, inputs unchanged); any
other exception is a crash that libFuzzer reports with its input.  The readers
run the compiled kernels where they are built (``wdelta --version`` names the
backend); ``WDELTA_NATIVE=0`` fuzzes the NumPy path.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

with atheris.instrument_imports():
    import fuzz_targets
    import wdelta  # noqa: F401

_ROOT = Path(tempfile.mkdtemp(prefix="wdelta-fuzz-"))
_SEEDS = fuzz_targets.Seeds(_ROOT)
_WORK = fuzz_targets.work_folder(_ROOT)


def one_input(data: bytes) -> None:
    if not data:
        return
    which, body = data[0] % 5, data[1:]
    if which == 0:
        fuzz_targets.check_delta(_SEEDS, fuzz_targets.with_header(_SEEDS.delta_bytes, body), _WORK)
    elif which == 1:
        fuzz_targets.check_delta(_SEEDS, body, _WORK)
    elif which == 2:
        fuzz_targets.check_safetensors(body, _WORK)
    elif which == 3:
        fuzz_targets.check_index(_SEEDS, body)
    else:
        fuzz_targets.check_manifest(body)


def _seed_corpus() -> str:
    """A folder holding one valid input per target (libFuzzer mutates from them)."""
    corpus = _ROOT / "corpus"
    corpus.mkdir()
    n = int.from_bytes(_SEEDS.delta_bytes[16:24], "little")
    seeds = [_SEEDS.delta_bytes[64 : 64 + n], _SEEDS.delta_bytes, _SEEDS.safetensors,
             _SEEDS.index, _SEEDS.manifest]  # fmt: skip
    for i, seed in enumerate(seeds):
        (corpus / f"seed{i}").write_bytes(bytes([i]) + seed)
    return str(corpus)


def main() -> None:
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):
        argv.append(_seed_corpus())  # no corpus folder given: start from the seeds
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
