"""`wdelta inspect --json` follows schema/inspect.schema.json for every valid delta of the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from wdelta.format import schemas
from wdelta.format.container import open_delta
from wdelta.ops.summary import summarize

VECTORS = Path(__file__).resolve().parents[1] / "conformance" / "vectors" / "delta" / "valid"


def test_every_valid_vector_summary_follows_the_schema() -> None:
    validator = schemas.validator("inspect")
    deltas = sorted(VECTORS.rglob("*.wdelta"))
    assert len(deltas) > 100
    for path in deltas:
        with open_delta(path) as d:
            validator.validate(summarize(d).to_json())


def test_cli_json_follows_the_schema_and_the_schema_is_strict() -> None:
    path = VECTORS / "host.wdelta"
    out = subprocess.run([sys.executable, "-m", "wdelta", "inspect", "--json", str(path)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    doc = json.loads(out)
    validator = schemas.validator("inspect")
    validator.validate(doc)
    for broken in ({**doc, "extra": 1}, {**doc, "ratio": -1},
                   {**doc, "tensors": [{**doc["tensors"][0], "op": "moved"}]}):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(broken)
