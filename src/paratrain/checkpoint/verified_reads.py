"""Checksums and verified reads: each file (or each 4 MiB block of it) is read and hashed in one
pass, by several threads, and refused when it does not match its record.

    digest = checksum_file(path, "xxh3_64")
    buffer = read_verified(path, "xxh3_64", digest, size)    # read and check together
    for window, offset, blocks in read_windows_verified(path, size, block_bytes, digests, ranges):
        ...                                                    # a reused buffer, checked again

New checkpoints use xxHash's XXH3-64 (``xxhash``, over 10 GB/s per core); checkpoints of
format 2 carry zlib CRC32 and are still read. Reading hashes each block while the next one is
read, so checks cost almost nothing on top of the I/O itself.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import torch
import xxhash

from paratrain.errors import CheckpointDamagedError

_CHUNK = 8 * 2**20
"""Bytes read at a time by a whole-file check: hashed while still in the CPU's cache (a file of
256 MiB checks in 0.02 s this way, 0.07 s in 64 MiB pieces), and the buffer stays small."""


_READ_BLOCK = 8 * 2**20  # small enough to stay in cache between reading and hashing


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 4


READ_THREADS = max(4, min(8, _cores() // 2))
"""Threads reading one checkpoint file: 4, or half the cores up to 8 (on 16 cores a cold resume
of 512 MiB ran at 1.26 x a raw read with 8, 1.04 x with 4; benchmarks/checkpoint_io.py)."""


_BLOCKS_PER_READER = 4  # a file shorter than this many blocks per thread uses fewer threads


CHECKSUM = "xxh3_64"
"""The checksum new checkpoints record per file."""


class Digest(Protocol):
    """A running checksum."""

    def update(self, data: memoryview, /) -> None: ...
    def intdigest(self) -> int: ...


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: memoryview, /) -> None:
        self.value = zlib.crc32(data, self.value)

    def intdigest(self) -> int:
        return self.value


def new_digest(algorithm: str) -> Digest:
    """A running ``xxh3_64`` or ``crc32`` checksum."""
    if algorithm == "xxh3_64":
        return xxhash.xxh3_64()
    if algorithm == "crc32":
        return _Crc32()
    raise ValueError(f"unknown checksum {algorithm!r}")


def checksum_chunks(chunks: list[memoryview], algorithm: str = CHECKSUM) -> int:
    """The checksum of ``chunks`` in order, as if they were one file."""
    digest = new_digest(algorithm)
    for chunk in chunks:
        digest.update(chunk)
    return digest.intdigest()


def checksum_file(path: Path, algorithm: str = CHECKSUM) -> int:
    """The checksum of a file's content."""
    digest = new_digest(algorithm)
    with path.open("rb", buffering=0) as f:
        view = memoryview(bytearray(min(_CHUNK, max(1, os.fstat(f.fileno()).st_size))))
        while n := f.readinto(view):
            digest.update(view[:n])
    return digest.intdigest()


def _presence_problem(path: Path, size: int) -> str | None:
    """A missing file or one of another size (OSError when it cannot be looked at)."""
    if not path.is_file():
        return f"{path.name} is missing"
    actual = path.stat().st_size
    return None if actual == size else f"{path.name} has {actual} bytes, expected {size}"


def file_problem(path: Path, algorithm: str, expected: int, size: int) -> str | None:
    """What is wrong with ``path`` (missing, resized, corrupted, unreadable), or None."""
    try:
        problem = _presence_problem(path, size)
        if problem:
            return problem
        if checksum_file(path, algorithm) != expected:
            return f"{path.name} fails its checksum (corrupted)"
    except OSError as err:
        return f"{path.name} cannot be read ({err.strerror or err})"
    return None


def size_checked(path: Path, size: int) -> None:
    """CheckpointDamagedError unless ``path`` can be looked at and has ``size`` bytes."""
    try:
        actual = path.stat().st_size
    except OSError as err:
        raise CheckpointDamagedError(
            f"{path.name} cannot be read ({err.strerror or err})"
        ) from None
    if actual != size:
        raise CheckpointDamagedError(f"{path.name} has {actual} bytes, expected {size}")


_IOV_MAX = 1024  # pieces per preadv call (Linux's IOV_MAX)


def _read_pieces(fd: int, pieces: list[memoryview], offset: int) -> None:
    """Fill ``pieces`` in order with the file's bytes from ``offset`` on (one preadv for up to
    :data:`_IOV_MAX` of them at a time)."""
    first = 0
    while first < len(pieces):
        n = os.preadv(fd, pieces[first : first + _IOV_MAX], offset)
        if n <= 0:
            raise OSError(f"it ended after {offset} bytes")
        offset += n
        while first < len(pieces) and n >= pieces[first].nbytes:
            n -= pieces[first].nbytes
            first += 1
        if n:
            pieces[first] = pieces[first][n:]


def read_ranges(
    path: Path,
    ranges: list[tuple[int, list[memoryview]]],
    consume: Callable[[int], None],
    *,
    in_reader: Callable[[int], None] | None = None,
) -> None:
    """Read each ``(offset, pieces)`` of ``ranges``: the file's bytes from ``offset`` on fill
    ``pieces`` in order (scattered into as many buffers as needed). ``consume(i)`` is called in
    order as range ``i`` arrives (ranges must not overlap); ``in_reader(i)``, if given, by the
    thread that read range ``i``, right after it (while its bytes are still in the CPU's caches:
    a per-block checksum), in any order. A CheckpointDamagedError from either is raised as is.

    Reader threads, each with its own descriptor and a contiguous run of ranges (so the kernel
    reads ahead for each), fill the memory (``os.preadv`` releases the GIL) while this thread
    consumes what has arrived. A read failure raises CheckpointDamagedError naming the file.
    """
    done = [threading.Event() for _ in ranges]
    failures: list[BaseException] = []
    readers = max(1, min(READ_THREADS, len(ranges) // _BLOCKS_PER_READER))
    share = -(-len(ranges) // readers) if ranges else 0  # contiguous runs, one per reader

    def read(first: int) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except BaseException as err:
            failures.append(err)
            for event in done:
                event.set()
            return
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger read-ahead
            for i in range(first, min(first + share, len(ranges))):
                offset, pieces = ranges[i]
                _read_pieces(fd, list(pieces), offset)
                if in_reader is not None:
                    in_reader(i)
                done[i].set()
        except BaseException as err:  # handed to the consuming side
            failures.append(err)
            for event in done:
                event.set()
        finally:
            os.close(fd)

    threads = [
        threading.Thread(target=read, args=(k * share,), daemon=True) for k in range(readers)
    ]
    for thread in threads:
        thread.start()
    try:
        for i, event in enumerate(done):
            event.wait()
            if failures:
                break
            consume(i)
    finally:
        for thread in threads:
            thread.join()
    if failures:
        failure = failures[0]
        if isinstance(failure, CheckpointDamagedError):
            raise failure
        text = (
            failure.strerror if isinstance(failure, OSError) and failure.strerror else str(failure)
        )
        raise CheckpointDamagedError(f"{path.name} cannot be read ({text})")


def read_verified(path: Path, algorithm: str, expected: int, size: int) -> torch.Tensor:
    """The bytes of ``path`` as a uint8 tensor, after checking its size and checksum.

    One pass over the file: several threads read it while this one hashes each block as it
    arrives. Raises :class:`CheckpointDamagedError` naming the file when it is missing, resized,
    corrupted or unreadable; no caller sees a byte of a file that failed.
    """
    size_checked(path, size)
    buffer = torch.empty(size, dtype=torch.uint8)
    view = buffer.numpy().data if size else memoryview(b"")
    blocks = [(start, min(_READ_BLOCK, size - start)) for start in range(0, size, _READ_BLOCK)]
    digest = new_digest(algorithm)

    def hash_block(i: int) -> None:
        start, length = blocks[i]
        digest.update(view[start : start + length])

    read_ranges(path, [(start, [view[start : start + n]]) for start, n in blocks], hash_block)
    if digest.intdigest() != expected:
        raise CheckpointDamagedError(f"{path.name} fails its checksum (corrupted)")
    return buffer


BLOCK_BYTES = 4 * 2**20
"""Bytes per checksum in the files of a replicated checkpoint (safetensors, ``trainer.pt``):
each is read whole, or a model window by window."""

SHARD_BLOCK_BYTES = 32 * 2**10
"""Bytes per checksum in the files of a sharded (DCP) checkpoint: each rank reads and verifies
only the blocks that hold what it loads. A rank resuming at another world size needs part of a
stored piece (half of its rows, say): small blocks keep what it reads beyond that to a few
percent (32 KiB: 8 bytes of checksum per 32 KiB, 0.03 % of the data in the manifest)."""


class BlockDigests:
    """XXH3-64 of every ``block_bytes`` of a stream, fed in pieces of any size.

    blocks = BlockDigests()
    blocks.update(view)                # as the bytes are written
    blocks.digests()                   # [xxh3 of bytes 0..4 MiB, of 4..8 MiB, ..., of the rest]
    """

    def __init__(self, block_bytes: int = BLOCK_BYTES) -> None:
        self.block_bytes = block_bytes
        self._done: list[int] = []
        self._digest = xxhash.xxh3_64()
        self._filled = 0

    def update(self, data: memoryview, /) -> None:
        """Feed the next bytes."""
        size, end, pos = self.block_bytes, data.nbytes, 0
        if self._filled:  # finish the block begun by an earlier piece
            pos = min(size - self._filled, end)
            self._digest.update(data[:pos])
            self._filled += pos
            if self._filled < size:
                return
            self._done.append(self._digest.intdigest())
            self._digest.reset()
            self._filled = 0
        whole = pos + (end - pos) // size * size  # whole blocks: one call each, no hasher object
        self._done.extend(
            xxhash.xxh3_64_intdigest(data[at : at + size]) for at in range(pos, whole, size)
        )
        if whole < end:
            self._digest.update(data[whole:])
            self._filled = end - whole

    def digests(self) -> list[int]:
        """One checksum per block so far (the last one may be short)."""
        return self._done + ([self._digest.intdigest()] if self._filled else [])


def read_blocks_verified(
    path: Path,
    size: int,
    block_bytes: int,
    digests: list[int],
    wanted: list[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """The bytes of ``path`` as a uint8 tensor; with ``wanted`` (start, length) ranges, only the
    blocks that cover them are read (the rest of the tensor is left unset).

    Every block read is checked against its checksum before the tensor is returned: a damaged
    block raises :class:`CheckpointDamagedError` naming the file and the bytes.
    """
    count = _checked_blocks(path, size, block_bytes, digests)
    if wanted is None:
        needed = list(range(count))
    else:
        chosen: set[int] = set()
        for start, length in wanted:
            span = _block_span(start, length, size, block_bytes)
            if span is not None:
                chosen.update(range(*span))
        needed = sorted(chosen)
    buffer = torch.empty(size, dtype=torch.uint8)
    view = buffer.numpy().data if size else memoryview(b"")
    ranges = [(b * block_bytes, min(block_bytes, size - b * block_bytes)) for b in needed]

    def check(i: int) -> None:
        start, length = ranges[i]
        if xxhash.xxh3_64_intdigest(view[start : start + length]) != digests[needed[i]]:
            raise CheckpointDamagedError(
                f"{path.name} fails its checksum in bytes {start}..{start + length} (corrupted)"
            )

    read_ranges(path, [(start, [view[start : start + n]]) for start, n in ranges], check)
    return buffer


def _checked_blocks(path: Path, size: int, block_bytes: int, digests: list[int]) -> int:
    """The number of blocks of ``path``, after checking its size and its count of checksums."""
    size_checked(path, size)
    count = -(-size // block_bytes)
    if len(digests) != count:
        raise CheckpointDamagedError(
            f"{path.name} lists {len(digests)} block checksums for {count} blocks"
        )
    return count


def check_blocks(
    path: Path, data: memoryview, block_bytes: int, digests: list[int], blocks: list[int]
) -> None:
    """Check the ``blocks`` (indices) of ``data``, the whole of ``path`` in memory (mapped, say),
    against their checksums; CheckpointDamagedError naming the first damaged one's bytes."""
    count = -(-data.nbytes // block_bytes)
    if len(digests) != count:
        raise CheckpointDamagedError(
            f"{path.name} lists {len(digests)} block checksums for {count} blocks"
        )
    for b in blocks:
        start = b * block_bytes
        _check_window(path, data[start : start + block_bytes], start, b, block_bytes, digests)


def _block_span(start: int, length: int, size: int, block_bytes: int) -> tuple[int, int] | None:
    """(first block, end block) covering the bytes of ``start..start+length`` inside the file."""
    first, end = max(0, start), min(size, start + length)
    if end <= first:
        return None
    return first // block_bytes, (end - 1) // block_bytes + 1


def window_groups(
    path: Path,
    size: int,
    block_bytes: int,
    digests: list[int],
    wanted: list[tuple[int, int]],
    window_bytes: int,
) -> tuple[list[tuple[int, int, list[int]]], list[int]]:
    """The ranges ``wanted`` grouped in file order into windows of whole blocks, about
    ``window_bytes`` each (a larger range gets a window of its own): ``(first block, end block,
    members)`` per window, and the ranges that are empty or outside the file. Checks the file's
    size and its count of checksums first (CheckpointDamagedError)."""
    _checked_blocks(path, size, block_bytes, digests)
    spans = [_block_span(start, length, size, block_bytes) for start, length in wanted]
    order = sorted((span[0], span[1], i) for i, span in enumerate(spans) if span is not None)
    empty = [i for i, span in enumerate(spans) if span is None]
    groups: list[tuple[int, int, list[int]]] = []
    for first, end, i in order:
        if groups:
            g_first, g_end, members = groups[-1]
            if (max(g_end, end) - g_first) * block_bytes <= window_bytes:
                groups[-1] = (g_first, max(g_end, end), [*members, i])
                continue
        groups.append((first, end, [i]))
    return groups, empty


def _check_window(
    path: Path, data: memoryview, base: int, first: int, block_bytes: int, digests: list[int]
) -> None:
    """Check each block of ``data`` (the file's bytes from block ``first`` on, at ``base``)."""
    for b in range(first, first + -(-data.nbytes // block_bytes)):
        start = (b - first) * block_bytes
        block = data[start : min(data.nbytes, start + block_bytes)]
        if xxhash.xxh3_64_intdigest(block) != digests[b]:
            raise CheckpointDamagedError(
                f"{path.name} fails its checksum in bytes {base + start}.."
                f"{base + start + block.nbytes} (corrupted)"
            )


WINDOW_BYTES = 16 * 2**20
"""Bytes read, verified and handed over at a time by :func:`read_windows_verified`: the buffer
is reused, so its pages are touched once per load, not once per byte of the file."""


class BlockWindows:
    """A file checked per block, read window by window into one reused buffer: only the
    blocks asked for, each checked before anything sees it, and none read twice (a block the
    window before read and this one needs again is moved to its new place, not read again).

        with BlockWindows(path, size, block_bytes, digests, largest) as windows:
            for first, end, members in groups:             # see window_groups
                windows.start(first, end)                  # blocks first..end of the file
                windows.fill([(start, length), ...])       # read and check what covers these
                windows.buffer                             # the file's bytes from windows.base

    Bytes of the window that no ``fill`` covered are left as they were (stale) unless
    ``clear`` zeroed them: read only what was filled. ``fill`` may be called again (a second
    range that depends on the first).
    """

    def __init__(
        self, path: Path, size: int, block_bytes: int, digests: list[int], largest: int
    ) -> None:
        self.path, self.size, self.block_bytes, self.digests = path, size, block_bytes, digests
        self._all = torch.empty(max(0, min(largest, size)), dtype=torch.uint8)
        self._view = self._all.numpy().data
        self._first = self._end = 0
        self._filled: set[int] = set()  # blocks of the current window read and checked
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            raise CheckpointDamagedError(
                f"{path.name} cannot be read ({err.strerror or err})"
            ) from None
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def __enter__(self) -> BlockWindows:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    @property
    def base(self) -> int:
        """The file offset of the buffer's first byte."""
        return self._first * self.block_bytes

    @property
    def buffer(self) -> torch.Tensor:
        """The window: the file's bytes ``base..`` (those filled are read and checked)."""
        return self._all[: min(self.size, self._end * self.block_bytes) - self.base]

    def start(self, first: int, end: int) -> None:
        """Begin the window of blocks ``first..end``; blocks the window before filled that
        lie in it are moved to their new place (windows come in file order)."""
        block = self.block_bytes
        kept = sorted(b for b in self._filled if first <= b < end) if first >= self._first else []
        shift = (first - self._first) * block  # a multiple of the block: no overlap
        for b in kept:
            if shift:
                at, n = (b - self._first) * block, min(block, self.size - b * block)
                self._view[at - shift : at - shift + n] = self._view[at : at + n]
        self._first, self._end, self._filled = first, end, set(kept)

    def clear(self, ranges: list[tuple[int, int]]) -> None:
        """Zero the blocks of the window that cover ``ranges`` and are not filled: bytes that
        were not read then hold zeros, never another window's bytes (a parser that strays
        outside what was read finds nothing it could take for data)."""
        for lo, hi in self._unfilled(ranges):
            at = (lo - self._first) * self.block_bytes
            self._all[at : min(self.size, hi * self.block_bytes) - self.base].zero_()

    def _unfilled(self, ranges: list[tuple[int, int]]) -> list[list[int]]:
        """Runs ``[first, end)`` of neighbouring blocks of the window that cover ``ranges`` and
        are not filled yet."""
        needed: set[int] = set()
        for start, length in ranges:
            span = _block_span(start, length, self.size, self.block_bytes)
            if span is not None:
                needed.update(range(max(self._first, span[0]), min(self._end, span[1])))
        runs: list[list[int]] = []
        for b in sorted(needed - self._filled):
            if runs and runs[-1][1] == b:
                runs[-1][1] = b + 1
            else:
                runs.append([b, b + 1])
        return runs

    def fill(self, ranges: list[tuple[int, int]]) -> None:
        """Read and check the blocks of the window that cover ``ranges`` (file offsets, each
        ``(start, length)``) and are not filled yet; runs of neighbouring blocks are read in
        one call. CheckpointDamagedError names a damaged or unreadable block."""
        block, first = self.block_bytes, self._first
        for lo, hi in self._unfilled(ranges):
            at, stop = (lo - first) * block, min(self.size, hi * block) - first * block
            data = self._view[at:stop]
            _read_exactly(self._fd, self.path, data, lo * block)
            _check_window(self.path, data, lo * block, lo, block, self.digests)
            self._filled.update(range(lo, hi))


def read_windows_verified(
    path: Path,
    size: int,
    block_bytes: int,
    digests: list[int],
    wanted: list[tuple[int, int]],
    *,
    window_bytes: int = WINDOW_BYTES,
    verify_first: bool = False,
) -> Iterator[tuple[torch.Tensor, int, list[int]]]:
    """For the byte ranges ``wanted`` of ``path``: ``(buffer, base, indices)``, window by window.

    ``buffer`` holds the file's bytes ``base..base+len(buffer)``, every block of them checked
    against its checksum; ``indices`` are the ranges (positions in ``wanted``) that lie wholly
    inside it. The buffer is reused for the next window: copy what you need before asking for
    it. Ranges are grouped in file order into windows of about ``window_bytes`` (a larger range
    gets a window of its own), so loading into existing tensors (model weights, FSDP shards)
    touches one small buffer instead of a fresh copy of the file, whose page faults cost more
    than the read itself. A damaged or unreadable block raises CheckpointDamagedError before
    any byte of its window is handed over.

        for buffer, base, indices in read_windows_verified(path, size, 4 << 20, digests, ranges):
            for i in indices:
                start, length = ranges[i]
                target[i].copy_(buffer[start - base : start - base + length])
    """
    groups, empty = window_groups(path, size, block_bytes, digests, wanted, window_bytes)
    if empty:  # empty or outside the file: nothing to read for them
        yield torch.empty(0, dtype=torch.uint8), 0, empty
    if not groups:
        return
    largest = max((end - first) * block_bytes for first, end, _ in groups)
    with BlockWindows(path, size, block_bytes, digests, largest) as windows:
        for hand_over in (False, True) if verify_first else (True,):
            for first, end, members in groups:
                windows.start(first, end)
                windows.fill([(first * block_bytes, (end - first) * block_bytes)])
                if hand_over:
                    yield windows.buffer, windows.base, members


def map_windows_verified(
    path: Path,
    size: int,
    block_bytes: int,
    digests: list[int],
    wanted: list[tuple[int, int]],
    *,
    window_bytes: int = WINDOW_BYTES,
    populate: bool = True,
) -> Iterator[tuple[torch.Tensor, int, list[int]]]:
    """:func:`read_windows_verified` for a file whose every block was just read and checked
    (so its pages are in the page cache): each window is a read-only view of the file mapped
    in memory, checked again block by block (in a helper thread, one window ahead) before it is
    handed over. No bytes are copied on the way: a window goes from the page cache straight to
    its target, so the second pass of a verified resume costs one copy, its checksums beside it.

        for window, base, indices in map_windows_verified(path, size, 4 << 20, digests, ranges):
            ...                                   # read-only: copy out, never write into it

    ``populate``: the page tables of the whole mapping are filled at once (``MAP_POPULATE``),
    which reads any page not cached yet: for a file read whole. Without it, only the pages of
    ``wanted`` are touched (a rank's part of a shared file, its blocks just read and cached).

    The mapping is read after the caller's own check of the whole file, and its size is checked
    again as it is mapped; a file cut short after that would fault the process when read (a
    committed checkpoint's files are never rewritten in place).
    """
    groups, empty = window_groups(path, size, block_bytes, digests, wanted, window_bytes)
    if empty:
        yield torch.empty(0, dtype=torch.uint8), 0, empty
    if not groups:
        return
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise OSError(
                    f"it changed size while being read, to {os.fstat(f.fileno()).st_size}"
                )
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            mapped = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    except OSError as err:
        raise CheckpointDamagedError(
            f"{path.name} cannot be read ({err.strerror or err})"
        ) from None
    view = memoryview(mapped)
    with warnings.catch_warnings():  # read-only on purpose: windows are only copied from
        warnings.filterwarnings("ignore", "The given buffer is not writable")
        whole = torch.frombuffer(mapped, dtype=torch.uint8)

    def check(group: tuple[int, int, list[int]]) -> None:
        first, end, _ = group
        base = first * block_bytes
        _check_window(
            path, view[base : min(size, end * block_bytes)], base, first, block_bytes, digests
        )

    try:
        with ThreadPoolExecutor(1) as ahead:
            checked = ahead.submit(check, groups[0])
            for k, (first, end, members) in enumerate(groups):
                checked.result()  # CheckpointDamagedError before the window is handed over
                if k + 1 < len(groups):
                    checked = ahead.submit(check, groups[k + 1])
                base = first * block_bytes
                yield whole[base : min(size, end * block_bytes)], base, members
    finally:
        del whole
        with contextlib.suppress(BufferError):  # a window still held: closed when it goes
            view.release()
            mapped.close()


def _read_exactly(fd: int, path: Path, view: memoryview, offset: int) -> None:
    got = 0
    try:
        while got < view.nbytes:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n <= 0:
                raise OSError(f"it ended after {offset + got} bytes")
            got += n
    except OSError as err:
        raise CheckpointDamagedError(
            f"{path.name} cannot be read ({err.strerror or err})"
        ) from None


def blocks_problem(path: Path, size: int, block_bytes: int, digests: list[int]) -> str | None:
    """What is wrong with a file checked block by block (missing, resized, corrupted), or None."""
    try:
        problem = _presence_problem(path, size)
        if problem:
            return problem
        blocks = BlockDigests(block_bytes)
        with path.open("rb", buffering=0) as f:
            view = memoryview(bytearray(min(_CHUNK, max(1, size))))
            while n := f.readinto(view):
                blocks.update(view[:n])
        for i, (got, want) in enumerate(zip(blocks.digests(), digests, strict=True)):
            if got != want:
                start = i * block_bytes
                end = min(size, start + block_bytes)
                return f"{path.name} fails its checksum in bytes {start}..{end} (corrupted)"
    except OSError as err:
        return f"{path.name} cannot be read ({err.strerror or err})"
    except ValueError:  # zip(strict=True): a count that does not match the size
        return f"{path.name} lists {len(digests)} block checksums, not one per {block_bytes} bytes"
    return None
