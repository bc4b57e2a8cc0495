"""A real S3 API on loopback for tests and benchmarks: moto's server in a subprocess.

    with moto_s3() as server:                 # python -m moto.server on a free port
        server.make_bucket("ckpts")
        os.environ.update(server.env)         # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID=testing, ...
        pt.Run(ckpt_dir="s3://ckpts/run1")

A subprocess, not moto's in-process mock: the code under test forks and spawns ranks, and every
one of them must reach the same server over HTTP, as they would reach a real object store.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MotoS3:
    """A running moto server."""

    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        """What boto3/s3fs read to reach it (fake credentials moto accepts)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client for it."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_s3(timeout_s: float = 60.0) -> Iterator[MotoS3]:
    """Start ``python -m moto.server`` on a free loopback port; stop it afterwards."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto's S3 server did not start on port {port} (is moto[server] "
                        "installed? pip install 'moto[server]')"
                    ) from None
                time.sleep(0.05)
        yield MotoS3(endpoint)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
