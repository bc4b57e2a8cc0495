"""A checkpoint's safetensors file read straight into one fresh tensor per entry, verified.

    tensors = read_tensors_verified(folder / "optimizer.safetensors", record)
    tensors["0.weight::exp_avg"]          # its own storage, every byte of the file checked

The file is read once: reader threads scatter each block's bytes into the tensors it covers
(``preadv`` into several buffers) and check the block right away, while its bytes are still in
the CPU's caches (a file with one checksum for the whole is checked here, in file order). Each
tensor gets a storage of its own, as ``torch.load`` gives: nothing else is kept alive by one of
them, and the model can adopt them without a copy (:meth:`ModuleLoader.adopt`). The bytes that
were checked are the bytes the tensors hold; no second pass reads them again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import torch
import xxhash

from paratrain.checkpoint.manifest import FileRecord
from paratrain.checkpoint.safetensors_io import (
    StoredTensor,
    safetensors_entries,
    safetensors_header_bytes,
)
from paratrain.checkpoint.verified_reads import new_digest, read_ranges, size_checked
from paratrain.errors import CheckpointDamagedError, CheckpointError

_RANGE_BYTES = 8 * 2**20
"""Bytes per range read and checked at a time when the file has one checksum for the whole."""


def read_tensors_verified(path: Path, record: FileRecord) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path``, each in a fresh storage of its own, after
    checking every byte of the file against ``record`` (its blocks, or its whole checksum).

    Raises CheckpointDamagedError naming the file when it is missing, resized, unreadable or
    fails a checksum, and CheckpointError when an intact file is not a safetensors file.
    """
    size_checked(path, record.bytes)
    try:
        head, entries = _layout(path, record.bytes)
    except CheckpointError:
        record.read(path)  # a damaged header reads as a damaged file (CheckpointDamagedError)
        raise
    tensors = {e.name: torch.empty(e.shape, dtype=e.dtype) for e in entries}
    header = bytearray(len(head))
    segments = _segments(record.bytes, header, entries, tensors)
    block = record.block_bytes if record.blocks is not None else _RANGE_BYTES
    assert block is not None
    ranges = _ranges(record.bytes, block, segments)
    check = _checker(path, record, ranges, block)
    if record.blocks is not None:  # each block checked by the thread that read it
        read_ranges(path, ranges, _nothing, in_reader=check)
    else:  # one running checksum: in file order, here
        read_ranges(path, ranges, check)
    if header != head:  # the layout came from an unchecked read of the header
        raise CheckpointDamagedError(f"{path.name} changed while it was read")
    return tensors


def _nothing(i: int) -> None:
    pass


def _layout(path: Path, size: int) -> tuple[bytes, list[StoredTensor]]:
    """The file's first bytes up to the end of its header, and its entries in file order
    (CheckpointError when they overlap or the header is not one)."""
    try:
        with path.open("rb", buffering=0) as f:
            first = f.read(8)
            length = safetensors_header_bytes(memoryview(first), size, path.name)
            head = first + f.read(length)
    except OSError as err:
        raise CheckpointDamagedError(
            f"{path.name} cannot be read ({err.strerror or err})"
        ) from None
    entries = sorted(
        safetensors_entries(memoryview(head)[8:], size, path.name, aligned=False),
        key=lambda e: e.start,
    )
    for before, after in itertools.pairwise(entries):
        if before.start + before.nbytes > after.start:
            raise CheckpointError(
                f"{path.name} is not a readable safetensors file ({before.name} and "
                f"{after.name} overlap)"
            )
    return head, entries


def _segments(
    size: int, header: bytearray, entries: list[StoredTensor], tensors: dict[str, torch.Tensor]
) -> list[tuple[int, memoryview]]:
    """Where each byte of the file goes, in file order: the header, each tensor's memory, and a
    scratch buffer for any gap between them."""
    out: list[tuple[int, memoryview]] = [(0, memoryview(header))]
    at = len(header)
    for entry in entries:
        if not entry.nbytes:
            continue
        if entry.start > at:
            out.append((at, memoryview(bytearray(entry.start - at))))
        out.append((entry.start, tensors[entry.name].reshape(-1).view(torch.uint8).numpy().data))
        at = entry.start + entry.nbytes
    if at < size:
        out.append((at, memoryview(bytearray(size - at))))
    return out


def _ranges(
    size: int, block: int, segments: list[tuple[int, memoryview]]
) -> list[tuple[int, list[memoryview]]]:
    """The file cut into ``block``-byte ranges, each with the pieces of memory it fills."""
    ranges: list[tuple[int, list[memoryview]]] = [(start, []) for start in range(0, size, block)]
    for start, view in segments:
        done = 0
        while done < view.nbytes:
            at = start + done
            take = min(view.nbytes - done, (at // block + 1) * block - at)
            ranges[at // block][1].append(view[done : done + take])
            done += take
    return ranges


def _checker(
    path: Path, record: FileRecord, ranges: list[tuple[int, list[memoryview]]], block: int
) -> Callable[[int], None]:
    """What checks range ``i`` as it arrives: its block's checksum, or the whole file's
    running one (compared after the last range)."""
    if record.blocks is not None:
        digests = record.blocks
        if len(digests) != len(ranges):
            raise CheckpointDamagedError(
                f"{path.name} lists {len(digests)} block checksums for {len(ranges)} blocks"
            )

        def check_block(i: int) -> None:
            digest = xxhash.xxh3_64()
            for piece in ranges[i][1]:
                digest.update(piece)
            if digest.intdigest() != digests[i]:
                start = ranges[i][0]
                end = min(record.bytes, start + block)
                raise CheckpointDamagedError(
                    f"{path.name} fails its checksum in bytes {start}..{end} (corrupted)"
                )

        return check_block
    algorithm, expected = record.checksum
    running = new_digest(algorithm)

    def check_file(i: int) -> None:
        for piece in ranges[i][1]:
            running.update(piece)
        if i == len(ranges) - 1 and running.intdigest() != expected:
            raise CheckpointDamagedError(f"{path.name} fails its checksum (corrupted)")

    if not ranges and running.intdigest() != expected:
        raise CheckpointDamagedError(f"{path.name} fails its checksum (corrupted)")
    return check_file
