"""Suite-wide settings: deterministic Hypothesis runs with no example database; fixtures."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from chainkit import S3Server, free_port
from wdelta.format import inline_blobs

# derandomize: every run draws the same examples, so a red CI run reproduces
# locally; no database, so runs leave nothing in the working tree.
settings.register_profile(
    "wdelta",
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("wdelta")


@pytest.fixture
def no_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder of this process keeps every blob in the data section (no SPEC §4.12
    inline blobs), for tests about blobs there: their checksums, reads, truncation."""
    monkeypatch.setattr(inline_blobs, "WRITE_MAX_BYTES", 0)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """moto's S3 server on loopback, one per test module (tests make their own buckets)."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def group() -> Iterator[None]:
    """A torch.distributed gloo group of one rank (this process), for collective code."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))  # fmt: skip
    yield
    dist.destroy_process_group()
