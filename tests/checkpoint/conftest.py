"""``s3``: a fresh bucket on a real S3 API server (moto on loopback, one per session)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from benchmarks.moto_s3 import MotoS3, moto_s3

from tests.support.s3 import Bucket

_AWS_SETTINGS = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoS3]:
    with moto_s3() as server:
        yield server


@pytest.fixture
def s3(moto_server: MotoS3, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A new bucket, and the environment that reaches it (inherited by forked and spawned
    ranks)."""
    for name in _AWS_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for name, value in moto_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = Bucket(moto_server, f"t-{uuid.uuid4().hex[:16]}")
    moto_server.make_bucket(bucket.name)
    return bucket
