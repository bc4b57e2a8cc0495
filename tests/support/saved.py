"""Bytes written by torch.save, placed inside a larger buffer, for reading them back in place."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import torch

PLAIN_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
"""Every dtype a plain tensor may have."""


def saved_bytes(obj: object) -> bytes:
    """What ``torch.save(obj)`` writes."""
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


def in_buffer(data: bytes, lead: int, fill: int = 0xAB, tail: int = 9) -> torch.Tensor:
    """A uint8 tensor holding ``data`` at offset ``lead``, between bytes of ``fill``."""
    buffer = torch.full((lead + len(data) + tail,), fill, dtype=torch.uint8)
    if data:
        buffer[lead : lead + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buffer


def zip_crcs(folder: Path) -> list[int]:
    """The CRC-32 recorded for every zip record of every item in the DCP folder ``folder``."""
    from torch.distributed.checkpoint import FileSystemReader

    crcs = []
    for info in FileSystemReader(str(folder)).read_metadata().storage_data.values():
        with (folder / info.relative_path).open("rb") as f:
            f.seek(info.offset)
            item = f.read(info.length)
        crcs += [record.CRC for record in zipfile.ZipFile(io.BytesIO(item)).infolist()]
    return crcs
