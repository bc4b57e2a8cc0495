"""The tensors of a DCP folder as views of its files, mapped: nothing read into memory of its own.

    meta = read_metadata(folder)
    tensors = MappedDcp(folder, meta, records, DcpTensors(folder, meta, records))
    weight = tensors.read("model.tok.weight")  # a view of the mapped file

A DCP file holds each item as the bytes ``torch.save`` writes for it. A tensor saved in one
piece is the piece's data, in place in its file: mapped privately, it is a view of page cache,
written out by a conversion without a copy. A tensor saved in pieces (an FSDP parameter, by
rows) is assembled from their views into one buffer of its own. With ``records`` (a paratrain
manifest), every block a piece lies in is checked before the piece is used, each block once.
A tensor with anything unusual (a compressed piece, bytes that are not a plain saved tensor) is
read by DCP's reader instead, in its group (:class:`~paratrain.checkpoint.dcp_io.DcpTensors`).
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from paratrain.checkpoint.dcp_io import DcpTensors
from paratrain.checkpoint.manifest import FileRecord
from paratrain.checkpoint.saved_tensor import saved_tensor
from paratrain.checkpoint.torch_save_writer import alone
from paratrain.checkpoint.verified_reads import check_blocks
from paratrain.errors import CheckpointDamagedError, CheckpointError


class MappedDcp:
    """Views of the tensors of the DCP folder ``folder`` (see the module's docstring)."""

    def __init__(
        self,
        folder: Path,
        meta: Metadata,
        records: Mapping[str, FileRecord] | None,
        groups: DcpTensors,
    ) -> None:
        self.folder, self.meta, self.records, self.groups = folder, meta, records, groups
        self._files: dict[str, torch.Tensor] = {}
        self._checked: dict[str, set[int]] = {}

    def read(self, key: str) -> torch.Tensor:
        """The tensor ``key``: a view of its file when saved in one piece, else its pieces
        copied into a buffer of its own; read in its group when a piece cannot be viewed."""
        found = self._viewed(key)
        return self.groups.read(key) if found is None else found

    def _viewed(self, key: str) -> torch.Tensor | None:
        md = self.meta.state_dict_metadata[key]
        assert isinstance(md, TensorStorageMetadata)
        dtype, size = md.properties.dtype, tuple(md.size)
        pieces = []
        for chunk in md.chunks:
            if not math.prod(chunk.sizes):
                continue
            info = self.meta.storage_data[MetadataIndex(key, chunk.offsets)]
            if info.transform_descriptors:  # compressed: torch's reader decodes it
                return None
            whole = self._file(info.relative_path)
            if info.offset + info.length > whole.numel():
                raise CheckpointError(
                    f"{self.folder / info.relative_path} ended inside {key}: it was cut short. "
                    "Use a complete copy of the checkpoint. Nothing was written."
                )
            self._check(info.relative_path, whole, info.offset, info.length)
            view = saved_tensor(whole, info.offset, info.length)
            if view is None or view.dtype != dtype or tuple(view.shape) != tuple(chunk.sizes):
                return None
            pieces.append((tuple(chunk.offsets), view))
        if len(pieces) == 1 and pieces[0][1].shape == size:
            return alone(pieces[0][1])  # its own bytes: torch.save of it never takes the file
        out = own_buffer(math.prod(size) * dtype.itemsize).view(dtype).reshape(size)
        for offsets, view in pieces:
            target = out
            for dim, (start, length) in enumerate(zip(offsets, view.shape, strict=True)):
                target = target.narrow(dim, start, length)
            target.copy_(view)
        return out

    def _file(self, name: str) -> torch.Tensor:
        whole = self._files.get(name)
        if whole is None:
            path = self.folder / name
            size = path.stat().st_size
            record = None if self.records is None else self.records.get(name)
            if self.records is not None and (record is None or record.bytes != size):
                raise CheckpointDamagedError(
                    f"{name} is {'resized' if record else 'not listed in the manifest'}: the "
                    "checkpoint was altered"
                )
            whole = self._files[name] = mapped_file(path, size)
        return whole

    def _check(self, name: str, whole: torch.Tensor, start: int, length: int) -> None:
        """Check the blocks of ``name`` holding ``start .. start + length`` not checked yet."""
        if self.records is None:
            return
        record = self.records[name]
        checked = self._checked.setdefault(name, set())
        if record.blocks is None:  # one checksum for the whole file: checked whole, once
            if not checked:
                problem = record.problem(self.folder / name)
                if problem:
                    raise CheckpointDamagedError(f"{name}: {problem}")
                checked.add(0)
            return
        assert record.block_bytes is not None
        block = record.block_bytes
        first, end = start // block, -(-(start + length) // block)
        todo = [b for b in range(first, end) if b not in checked]
        if todo:
            check_blocks(
                self.folder / name, whole.numpy().data, record.block_bytes, record.blocks, todo
            )
            checked.update(todo)


def mapped_file(path: Path, size: int | None = None) -> torch.Tensor:
    """The bytes of ``path`` (``size`` of them; default: all), mapped privately: page cache,
    read as they are used; writes to them would stay in this process."""
    size = path.stat().st_size if size is None else size
    return torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)


def own_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of memory of its own (uint8), anonymously mapped when large: given back to the
    system when dropped, whatever was allocated meanwhile (a heap keeps a freed block below a
    newer small one: one conversion grew by 224 of its 256 MiB so)."""
    if nbytes < 2**20:
        return torch.empty(nbytes, dtype=torch.uint8)
    populate = getattr(mmap, "MAP_POPULATE", 0)  # its pages made at once, not fault by fault
    area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return torch.frombuffer(area, dtype=torch.uint8)
