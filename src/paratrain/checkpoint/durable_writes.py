"""Durable writes: fsync, atomic commit by rename, write-back started block by block.

    records = write_files_durable({a: chunks_a, b: chunks_b})  # several files, several threads
    atomic_torch_save(obj, path)                             # temp file, fsync, rename, fsync dir

Writes hash each block while the kernel flushes the file, start each block's write-back at once,
and several threads write, so a checkpoint moves at the disk's speed rather than one thread's
copy speed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from paratrain.checkpoint.verified_reads import (
    BLOCK_BYTES,
    BlockDigests,
    checksum_chunks,
)

_Sum = TypeVar("_Sum")


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


WRITE_THREADS = 4
"""Threads writing a checkpoint's files (measured by benchmarks/checkpoint_io.py)."""


_WRITE_BLOCK = 16 * 2**20


def _writeback_starter() -> Callable[[int, int, int], object] | None:
    """Linux ``sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE)``, or None elsewhere.

    Starting the write-back of each block as soon as it is written lets the disk work while the
    next blocks are copied into the page cache; the final fsync then waits for little.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    write_flag = 2  # SYNC_FILE_RANGE_WRITE: start write-back, do not wait for it

    def start(fd: int, offset: int, count: int) -> object:
        return call(fd, offset, count, write_flag)  # a hint: a failure changes nothing

    return start


start_writeback = _writeback_starter()
"""``start_writeback(fd, offset, count)`` on Linux, else None."""


def write_files_durable(
    files: Mapping[Path, list[memoryview]], *, threads: int = WRITE_THREADS
) -> dict[Path, tuple[int, int]]:
    """Write new files from their chunks, fsync them; return each one's (xxh3_64, bytes).

    Blocks of all files are written by ``threads`` threads in file order (``os.pwrite``
    releases the GIL) while this thread computes the checksums from the same memory, so
    neither waits for the other. Each block's write-back starts at once (Linux), and the
    closing fsyncs run in parallel. A file that already exists is an error (``FileExistsError``).
    """
    return _write_files(files, threads, checksum_chunks)


def write_files_blocked(
    files: Mapping[Path, list[memoryview]],
    *,
    block_bytes: int = BLOCK_BYTES,
    threads: int = WRITE_THREADS,
) -> dict[Path, tuple[list[int], int]]:
    """:func:`write_files_durable` with one XXH3-64 per ``block_bytes`` of each file (read
    back with :func:`read_windows_verified` or :func:`read_blocks_verified`)."""

    def blocks(chunks: list[memoryview]) -> list[int]:
        digests = BlockDigests(block_bytes)
        for chunk in chunks:
            digests.update(chunk.cast("B") if chunk.ndim != 1 or chunk.format != "B" else chunk)
        return digests.digests()

    return _write_files(files, threads, blocks)


def _write_files(
    files: Mapping[Path, list[memoryview]],
    threads: int,
    checksum: Callable[[list[memoryview]], _Sum],
) -> dict[Path, tuple[_Sum, int]]:
    fds: dict[Path, int] = {}
    try:
        for path in files:
            fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        blocks = queue.SimpleQueue[tuple[int, int, memoryview] | None]()
        for path, chunks in files.items():
            offset = 0
            for chunk in chunks:
                flat = chunk.cast("B") if chunk.ndim != 1 or chunk.format != "B" else chunk
                for start in range(0, flat.nbytes, _WRITE_BLOCK):
                    piece = flat[start : start + _WRITE_BLOCK]
                    blocks.put((fds[path], offset + start, piece))
                offset += flat.nbytes
        failures: list[BaseException] = []

        def write() -> None:
            while (item := blocks.get()) is not None:
                if failures:
                    continue
                fd, offset, piece = item
                try:
                    done = 0
                    while done < piece.nbytes:
                        done += os.pwrite(fd, piece[done:], offset + done)
                    if start_writeback is not None:
                        start_writeback(fd, offset, piece.nbytes)
                except BaseException as err:
                    failures.append(err)

        workers = [threading.Thread(target=write, daemon=True) for _ in range(max(1, threads))]
        for worker in workers:
            blocks.put(None)
            worker.start()
        digests = {path: (checksum(chunks), _nbytes(chunks)) for path, chunks in files.items()}
        for worker in workers:
            worker.join()
        if failures:
            raise failures[0]
        in_parallel([functools.partial(os.fsync, fd) for fd in fds.values()])
    finally:
        for fd in fds.values():
            os.close(fd)
    return digests


def in_parallel(calls: list[Callable[[], object]]) -> None:
    """Run each call in a thread of its own (blocking system calls: fsync); re-raise the first
    error once all have finished."""
    failures: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def _nbytes(chunks: list[memoryview]) -> int:
    return sum(chunk.nbytes for chunk in chunks)


def write_durable(path: Path, chunks: list[memoryview]) -> tuple[int, int]:
    """Write ``chunks`` to a new file and fsync it; return (xxh3_64 checksum, bytes)."""
    return write_files_durable({path: chunks})[path]


def write_bytes_durable(path: Path, data: bytes) -> tuple[int, int]:
    """``write_durable`` for one bytes object."""
    return write_durable(path, [memoryview(data)])


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

    def write(tmp: Path) -> None:  # straight to the file: no copy of the whole state in memory
        with tmp.open("xb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())

    atomic_replace(path, write)
