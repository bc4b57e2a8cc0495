"""One fresh bucket on the moto S3 server per test (see tests/checkpoint/conftest.py).

def test_x(s3: Bucket) -> None:
    pt.Run(ckpt_dir=s3.url("run1"))           # s3://<bucket>/run1
    s3.folders("run1")                        # ["step-00000003", ...]
    s3.flip_byte("run1/step-00000003/model.safetensors", -3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.moto_s3 import MotoS3


@dataclass
class Bucket:
    server: MotoS3
    name: str

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    @property
    def client(self) -> Any:
        return self.server.client()

    def url(self, path: str = "") -> str:
        return f"s3://{self.name}/{path}" if path else f"s3://{self.name}"

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=prefix
        )
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def folders(self, prefix: str) -> list[str]:
        """The folders directly inside ``prefix`` that hold objects."""
        inside = [key[len(prefix) + 1 :] for key in self.keys(prefix + "/")]
        return sorted({rel.split("/", 1)[0] for rel in inside if "/" in rel})

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.name, Key=key)["Body"].read()
        return body

    def flip_byte(self, key: str, offset: int) -> None:
        """Overwrite one byte of an object (the damage a bad disk or transfer leaves)."""
        data = bytearray(self.get(key))
        data[offset] ^= 0x10
        self.put(key, bytes(data))
