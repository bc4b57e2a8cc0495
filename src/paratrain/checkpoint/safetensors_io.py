"""safetensors without copies: write tensors' bytes as chunks, read a file's tensors as views of
its buffer, and its header's entries (name, dtype, shape, byte range).

    digest, size = write_safetensors(path, {"w": tensor})   # fsynced, with its xxh3_64
    tensors = tensors_from_safetensors(buffer, name)          # views, no copy
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from paratrain.checkpoint.durable_writes import write_durable
from paratrain.errors import CheckpointError

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
SAFETENSORS_DTYPES = frozenset(_ST_DTYPES)
"""The dtypes a safetensors file can hold."""


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data


def write_safetensors(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """Write ``tensors`` in the safetensors format without an intermediate copy; fsynced."""
    return write_durable(path, safetensors_chunks(tensors, metadata))


def safetensors_chunks(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> list[memoryview]:
    """The bytes of a safetensors file of ``tensors``: its header, then views of the tensors."""
    header: dict[str, object] = {}
    views: list[memoryview] = []
    offset = 0
    # Wider elements first (stable): every tensor then starts at a multiple of its element size,
    # as views of the file's bytes need, with no padding (the format allows none).
    for name, tensor in sorted(tensors.items(), key=lambda item: -item[1].element_size()):
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
    return [memoryview(len(raw).to_bytes(8, "little") + raw), *views]


_DTYPES_ST = {name: dtype for dtype, name in _ST_DTYPES.items()}


def tensors_from_safetensors(buffer: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in ``buffer`` (uint8), as views: no copy.

    Every entry is checked against the buffer's bounds; a bad one raises CheckpointError.
    """
    data = buffer.numpy().data
    header = data[8 : 8 + safetensors_header_bytes(data[:8], len(data), name)]
    return {
        entry.name: entry.view(buffer, 0) for entry in safetensors_entries(header, len(data), name)
    }


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: its bytes are ``start .. start + nbytes`` of the file."""

    name: str
    dtype: torch.dtype
    shape: list[int]
    start: int
    nbytes: int

    def view(self, buffer: torch.Tensor, base: int) -> torch.Tensor:
        """The tensor, as a view of ``buffer`` (uint8) holding the file's bytes from ``base``."""
        if not self.nbytes:
            return torch.empty(self.shape, dtype=self.dtype)
        at = self.start - base
        return buffer[at : at + self.nbytes].view(self.dtype).reshape(self.shape)


def safetensors_header_bytes(first: memoryview, size: int, name: str) -> int:
    """The length of a safetensors header, from the file's first 8 bytes (CheckpointError when
    it cannot be one)."""
    if len(first) < 8:
        raise CheckpointError(
            f"{name} is not a readable safetensors file (shorter than its 8-byte header length)"
        )
    length = int.from_bytes(first[:8], "little")
    if length > size - 8:
        raise CheckpointError(
            f"{name} is not a readable safetensors file (header of {length} bytes in a file of "
            f"{size})"
        )
    return length


def safetensors_entries(
    header: memoryview, size: int, name: str, *, aligned: bool = True
) -> list[StoredTensor]:
    """The tensors listed by a safetensors ``header`` (the JSON after the length) of a file of
    ``size`` bytes, in the header's order; every entry checked against the file's bounds, and
    (``aligned``: to be viewed in the file's bytes) to start at a multiple of its element
    size."""
    start = 8 + len(header)
    out = []
    try:
        parsed = json.loads(bytes(header))
        if not isinstance(parsed, dict):
            raise ValueError("the header is not a JSON object")
        for key, entry in parsed.items():
            if key == "__metadata__":
                continue
            dtype = _DTYPES_ST[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
            count = 1
            for d in shape:
                count *= d
            if min(shape, default=0) < 0 or not 0 <= begin <= end <= size - start:
                raise ValueError(f"{key} lies outside the file")
            if end - begin != count * dtype.itemsize or (
                aligned and (start + begin) % dtype.itemsize
            ):
                raise ValueError(f"{key} does not match its shape {shape}")
            out.append(StoredTensor(key, dtype, shape, start + begin, end - begin))
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"{name} is not a readable safetensors file ({err})") from None
    return out


def file_entries(path: Path) -> tuple[list[StoredTensor], dict[str, str]]:
    """The entries and the ``__metadata__`` of a safetensors file, from its header only (no
    tensor read); CheckpointError when the header cannot be one of a file this size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            first = f.read(8)
            length = safetensors_header_bytes(memoryview(first), size, path.name)
            header = f.read(length)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror or err}).") from None
    entries = safetensors_entries(memoryview(header), size, str(path), aligned=False)
    metadata = json.loads(header).get("__metadata__") or {}  # parsed by the entries already
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(
            f"{path} is not a readable safetensors file (its __metadata__ is not an object of "
            "strings). Use another copy."
        )
    return entries, metadata


def tied_in(metadata: Mapping[str, str]) -> dict[str, str]:
    """The tied names a paratrain ``model.safetensors`` records in its header's metadata
    (``{"tied": "{\\"head.weight\\": \\"tok.weight\\"}"}``); {} when none or unreadable."""
    try:
        tied = json.loads(metadata.get("tied", "{}"))
    except json.JSONDecodeError:
        return {}
    if not isinstance(tied, dict):
        return {}
    return {k: v for k, v in tied.items() if isinstance(k, str) and isinstance(v, str)}


def tied_names(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each name of ``state`` whose tensor is one met before under another name (the same
    storage, offset, shape, strides and dtype: tied weights), mapped to that first name."""
    return untie(state)[1]


def tie(state: dict[str, torch.Tensor], tied: Mapping[str, str]) -> None:
    """Make each name of ``tied`` the very tensor of the name it maps to again (in place), when
    both are in ``state`` with one shape and dtype, or only the kept one is."""
    for alias, kept in tied.items():
        if kept not in state:
            continue
        other = state.get(alias)
        if other is None or (other.shape == state[kept].shape and other.dtype == state[kept].dtype):
            state[alias] = state[kept]


def untie(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors with each storage once (under its first name), and the dropped names mapped
    to the kept ones."""
    first: dict[tuple[object, ...], str] = {}
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    for key, tensor in state.items():
        if tensor.numel() == 0:
            kept[key] = tensor
            continue
        view = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if view in first:
            tied[key] = first[view]
        else:
            first[view] = key
            kept[key] = tensor
    return kept, tied
