"""A DCP folder written one tensor at a time, as ``world`` ranks would have saved it.

    tree = {"weight": Ref("weight", torch.float32, (4096, 1024), read_weight, order=0)}
    records = write_dcp(Path("out/dcp"), tree, world=8, sharded={id(tree["weight"])})
    # out/dcp: __0_0.distcp .. __7_0.distcp and .metadata; rank r's file holds its FSDP rows

``dcp.save`` needs every tensor in memory on every rank. Here a tree of :class:`Ref` (tensors
described, not read) is planned by DCP's own planner for each rank, then each tensor is read
once and its pieces appended to the files of the ranks that hold them: memory stays near the
largest tensor. Tensors whose ``id`` is in ``sharded`` are split along dim 0 as FSDP splits
them (:func:`fsdp_rows`); the others are saved whole, once, by the rank DCP's planner picks.
Used by ``paratrain ckpt reshard`` (a whole training state) and ``ckpt convert --to dcp``
(weights, one rank).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult

from paratrain.checkpoint.dcp_io import RecordingWriter
from paratrain.checkpoint.manifest import FileRecord
from paratrain.checkpoint.torch_save_writer import alone


@dataclass(frozen=True, eq=False)
class Ref:
    """One tensor of the input, not read yet: ``read()`` gives it (from its file)."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    read: Callable[[], torch.Tensor]
    order: int
    """Position in the input (tensors are read in this order)."""
    split: bool = False
    """True when a DCP input holds it in several pieces along dim 0 (a sharded parameter)."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True, eq=False)
class _Piece:
    """The rows ``start .. start + rows`` of a tensor, as one rank of the output saves them
    (``split``: a DTensor's shard; else a whole replicated tensor, saved once)."""

    ref: Ref
    start: int
    rows: int
    split: bool

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        shape = self.ref.shape
        offsets = torch.Size([self.start, *[0] * (len(shape) - 1)] if shape else [])
        sizes = torch.Size([self.rows, *shape[1:]] if shape else [])
        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD if self.split else WriteItemType.TENSOR,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                    properties=TensorProperties(dtype=self.ref.dtype),
                    size=torch.Size(shape),
                ),
            )
        ]

    def of(self, full: torch.Tensor) -> torch.Tensor:
        """This piece of the whole tensor, on a storage of its own bytes alone (torch.save
        writes the whole storage of a view, which for a view of a mapped file is the file): a
        slice of ``full``'s storage, no copy."""
        piece = full.narrow(0, self.start, self.rows) if self.split else full
        return alone(piece)


def fsdp_rows(length: int, rank: int, world: int) -> tuple[int, int]:
    """(first row, rows) of dim 0 that FSDP gives ``rank`` of ``world``: ``torch.chunk``'s
    split, ceil(length / world) rows a rank, the last ranks short or empty."""
    per = -(-length // world)
    start = min(rank * per, length)
    return start, min(per, length - start)


def _rank_tree(tree: Any, rank: int, world: int, sharded: set[int]) -> Any:
    if isinstance(tree, Ref):
        if id(tree) in sharded:
            start, rows = fsdp_rows(tree.shape[0], rank, world)
            return _Piece(tree, start, rows, split=True)
        return _Piece(tree, 0, tree.shape[0] if tree.shape else 0, split=False)
    if isinstance(tree, dict):
        return {k: _rank_tree(v, rank, world, sharded) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_rank_tree(v, rank, world, sharded) for v in tree]
    return tree


def write_dcp(
    folder: Path,
    tree: dict[str, Any],
    *,
    world: int,
    sharded: set[int],
    wrote: Callable[[int], None] | None = None,
) -> dict[str, FileRecord]:
    """Write ``tree`` (nested dicts and lists of :class:`Ref` and plain data) at the new folder
    ``folder`` as the DCP folder ``world`` FSDP ranks would save, refs whose ``id`` is in
    ``sharded`` split along dim 0. DCP's own planner plans every rank's items (and which rank
    writes each replicated one); each tensor is then read once and its pieces appended to the
    files of the ranks that hold them; ``wrote(nbytes)`` after each. Returns each file's record
    (size and block checksums, for a manifest)."""
    folder.mkdir()
    writer = RecordingWriter(str(folder), sync_files=True, overwrite=False)
    writer.set_up_storage_writer(True)
    planners = [DefaultSavePlanner() for _ in range(world)]
    plans = []
    for rank, planner in enumerate(planners):
        planner.set_up_planner(
            state_dict=_rank_tree(tree, rank, world, sharded),
            storage_meta=writer.storage_meta(),
            is_coordinator=rank == 0,
        )
        plans.append(writer.prepare_local_plan(planner.create_local_plan()))
    plans, metadata = planners[0].create_global_plan(plans)
    plans = writer.prepare_global_plan(plans)
    work: dict[int, list[tuple[int, WriteItem, _Piece]]] = {}
    results: list[list[WriteResult]] = [[] for _ in range(world)]
    with contextlib.ExitStack() as stack:
        files = {
            rank: stack.enter_context(writer.fs.create_stream(folder / f"__{rank}_0.distcp", "wb"))
            for rank in range(world)
        }

        def put(rank: int, item: WriteItem, write: Callable[[Any], object]) -> None:
            f = files[rank]
            f.tell()  # two calls in a row: the item starts aligned, as DCP's items do here
            offset = f.tell()
            write(f)
            length = f.tell() - offset
            results[rank].append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=length,
                    storage_data=_StorageInfo(f"__{rank}_0.distcp", offset, length),
                )
            )

        for rank, (planner, plan) in enumerate(zip(planners, plans, strict=True)):
            planner.finish_plan(plan)
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    data = planner.resolve_data(item)
                    put(rank, item, _bytes_writer(data))
                    continue
                piece = planner.state_dict[item.index.fqn]
                assert isinstance(piece, _Piece)
                work.setdefault(piece.ref.order, []).append((rank, item, piece))
        for order in sorted(work):
            holders = work[order]
            full = holders[0][2].ref.read().contiguous()
            for rank, item, piece in holders:
                put(rank, item, _tensor_writer(piece.of(full)))
            if wrote is not None:
                wrote(holders[0][2].ref.nbytes)
            del full
        for f in files.values():
            os.fsync(f.fileno())
    writer.finish(metadata, results)
    return dict(writer.records)


def _bytes_writer(data: Any) -> Callable[[Any], object]:
    return lambda f: f.write(data.getbuffer())


def _tensor_writer(tensor: torch.Tensor) -> Callable[[Any], object]:
    def write(f: Any) -> None:  # each tensor as DCP's FileSystemWriter writes it
        try:
            torch.save(tensor, f)
        except RuntimeError as err:
            # torch.save finishes its archive even when a write failed, and that fails too: the
            # first failure (a full disk, an interrupt) is the one to report.
            first = err.__context__
            if first is not None and not isinstance(first, RuntimeError):
                raise first from None
            raise

    return write
