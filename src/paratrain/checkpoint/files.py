"""Durable file writes: fsync, atomic commit by rename, CRC32 checksums, zero-copy safetensors.

    crc, size = write_safetensors(path, {"w": tensor})     # fsynced; crc computed during fsync
    crc_file(path)                                          # the same value, read back
    atomic_torch_save(obj, path)                            # temp file, fsync, rename, fsync dir

CRC32 (zlib, several GB/s) is computed while the kernel flushes the file, so checksums cost
almost nothing on top of a plain write + fsync.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from paratrain.errors import CheckpointError

_CHUNK = 64 * 2**20
_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.complex64: "C64",
}


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc_bytes(chunks: list[memoryview], crc: int = 0) -> int:
    """CRC32 over ``chunks`` in order."""
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return crc


def crc_file(path: Path) -> int:
    """CRC32 of a file's content."""
    crc = 0
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


def write_durable(path: Path, chunks: list[memoryview]) -> tuple[int, int]:
    """Write ``chunks`` to a new file and fsync it; return (crc32, bytes)."""
    with path.open("xb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        syncer = threading.Thread(target=os.fsync, args=(f.fileno(),))
        syncer.start()  # fsync releases the GIL: checksum while the kernel writes back
        crc = crc_bytes(chunks)
        syncer.join()
    return crc, sum(c.nbytes for c in chunks)


def write_bytes_durable(path: Path, data: bytes) -> tuple[int, int]:
    """``write_durable`` for one bytes object."""
    return write_durable(path, [memoryview(data)])


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data


def write_safetensors(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """Write ``tensors`` in the safetensors format without an intermediate copy; fsynced."""
    header: dict[str, object] = {}
    views: list[memoryview] = []
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _ST_DTYPES:
            raise CheckpointError(
                f"{name} is a {tensor.dtype} tensor, which the safetensors format cannot hold. "
                f"Convert it (e.g. to {torch.float32}) before saving, or keep it out of the state."
            )
        view = _tensor_bytes(tensor)
        header[name] = {
            "dtype": _ST_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + view.nbytes],
        }
        views.append(view)
        offset += view.nbytes
    if metadata:
        header["__metadata__"] = dict(metadata)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format aligns the data section to 8 bytes
    head = memoryview(len(raw).to_bytes(8, "little") + raw)
    return write_durable(path, [head, *views])


def atomic_replace(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        tmp.unlink()
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save`` that leaves either the old file or the complete new one, never half."""

    def write(tmp: Path) -> None:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        write_bytes_durable(tmp, buffer.getvalue())

    atomic_replace(path, write)
