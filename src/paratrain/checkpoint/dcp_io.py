"""torch.distributed.checkpoint (DCP) folders, read without executing pickled code.

DCP's ``.metadata`` is a pickle that ``FileSystemReader`` loads unrestricted, and its default load
planner unpickles non-tensor values with ``weights_only=False``. :class:`SafeReader` allows only
DCP's own metadata classes (by exact name) and checks that the metadata describes data inside the
folder; :class:`SafePlanner` loads values with ``weights_only=True``.

    meta = read_metadata(folder)              # CheckpointError if unreadable, hostile or malformed
    tensors = read_dcp_tensors(folder, prefix="model.")     # every tensor, without a model
    state = {"model": model_state}            # tensors to fill in place
    dcp.load(state, storage_reader=SafeReader(folder), planner=SafePlanner())
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import pickle
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeGuard, cast

import psutil
import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.futures import Future

from paratrain.checkpoint.durable_writes import start_writeback
from paratrain.checkpoint.formats import MALFORMED, describe
from paratrain.checkpoint.manifest import FileRecord
from paratrain.checkpoint.saved_tensor import MemoryFile, saved_tensor
from paratrain.checkpoint.verified_reads import (
    SHARD_BLOCK_BYTES,
    WINDOW_BYTES,
    BlockDigests,
    BlockWindows,
    window_groups,
)
from paratrain.errors import CheckpointDamagedError, CheckpointError

# Exact (module, name) pairs: a prefix rule would let a pickle reach any attribute of those modules
# (a dotted name such as "os.system" resolves through their imports).
_ALLOWED = {
    *(
        (dcp_metadata.__name__, name)
        for name, obj in vars(dcp_metadata).items()
        if isinstance(obj, type) and obj.__module__ == dcp_metadata.__name__
    ),
    (_StorageInfo.__module__, _StorageInfo.__name__),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    # The writer records its checkpoint_id as a path; building a path object runs no user code.
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"DCP metadata refers to {module}.{name}, which is not part of a checkpoint's "
            "metadata; the folder may be malicious. It was not loaded."
        )


def read_metadata(folder: Path) -> Metadata:
    """The ``.metadata`` of a DCP folder, unpickled with an allow-list and checked."""
    path = folder / ".metadata"
    try:
        meta = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except CheckpointError:  # a refused global: its message says more than "corrupt"
        raise
    except (*MALFORMED, RuntimeError) as err:  # RuntimeError: TensorProperties.__setstate__
        raise CheckpointError(
            f"{path} is unreadable or corrupt ({describe(err)}). Use another copy "
            "of the checkpoint."
        ) from None
    if not isinstance(meta, Metadata):
        raise CheckpointError(
            f"{path} does not hold DCP metadata (it holds a {type(meta).__name__}). Point at a "
            "folder written by torch.distributed.checkpoint.save."
        )
    problem = _metadata_problem(meta, folder)
    if problem:
        raise CheckpointError(f"{path} is corrupt or hostile: {problem}. It was not loaded.")
    return meta


def _is_size(value: object) -> TypeGuard[torch.Size]:
    return isinstance(value, torch.Size) and all(n >= 0 for n in value)


# Unpickling sets attributes from the file (BUILD): a damaged name leaves a field missing, so every
# field is read with getattr(..., None) until the metadata has been checked.


def _entry_problem(fqn: object, entry: object) -> str:
    if not isinstance(fqn, str):
        return f"a key is a {type(fqn).__name__}, not a name"
    if isinstance(entry, BytesStorageMetadata):
        return ""
    if not isinstance(entry, TensorStorageMetadata):
        return f"{fqn} is described by a {type(entry).__name__}"
    props, size = getattr(entry, "properties", None), getattr(entry, "size", None)
    if not isinstance(props, TensorProperties) or not isinstance(
        getattr(props, "dtype", None), torch.dtype
    ):
        return f"{fqn} has no valid dtype"
    if not _is_size(size):
        return f"{fqn} has an invalid size {size!r}"
    chunks = getattr(entry, "chunks", None)
    if not isinstance(chunks, list) or not all(
        isinstance(c, dcp_metadata.ChunkStorageMetadata)
        and _is_size(getattr(c, "offsets", None))
        and _is_size(getattr(c, "sizes", None))
        and len(c.offsets) == len(c.sizes) == len(size)
        for c in chunks
    ):
        return f"{fqn} has invalid chunks"
    return ""


def _storage_problem(index: object, info: object, sizes: dict[str, int]) -> str:
    fqn = getattr(index, "fqn", None)
    if not isinstance(index, MetadataIndex) or not isinstance(fqn, str):
        return "a storage entry has an invalid index"
    if not isinstance(info, _StorageInfo):
        return f"the storage of {fqn} is a {type(info).__name__}"
    name, offset, length, descriptors = (
        getattr(info, field, None)
        for field in ("relative_path", "offset", "length", "transform_descriptors")
    )
    if not isinstance(name, str) or name not in sizes:
        return f"the data of {fqn} is said to be in {name!r}, not a data file of the folder"
    if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
        return f"the data of {fqn} has an invalid range ({offset!r}, {length!r})"
    if offset + length > sizes[name]:
        return (
            f"the data of {fqn} lies beyond the end of {name} "
            f"(bytes {offset}..{offset + length} of {sizes[name]})"
        )
    if descriptors is not None and not (
        isinstance(descriptors, (list, tuple)) and all(isinstance(d, str) for d in descriptors)
    ):
        return f"the data of {fqn} has invalid transforms {descriptors!r}"
    return ""


def _metadata_problem(meta: Metadata, folder: Path) -> str:
    """What is wrong with unpickled metadata; '' when it describes data inside ``folder``."""
    entries = getattr(meta, "state_dict_metadata", None)
    storage = getattr(meta, "storage_data", None)
    if not isinstance(entries, dict):
        return "state_dict_metadata is missing or not a mapping"
    if not isinstance(storage, dict):
        return "storage_data is missing or not a mapping"
    # Only plain files of the folder itself: a relative path could reach any file on the machine.
    sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
    sizes.pop(".metadata", None)
    for fqn, entry in entries.items():
        problem = _entry_problem(fqn, entry)
        if problem:
            return problem
    for index, info in storage.items():
        problem = _storage_problem(index, info, sizes)
        if problem:
            return problem
    return ""


def model_prefix(meta: Metadata) -> str:
    """The prefix of a DCP folder's model tensors: ``"model."`` when it was saved as
    ``{"model": state_dict, ...}`` (as paratrain, torchtitan and most training scripts save
    model and optimizer together: only the model's tensors are weights), else ``""``."""
    paths = getattr(meta, "planner_data", None) or {}
    nested = any(
        isinstance(path, tuple) and len(path) > 1 and path[0] == "model"
        for key, path in paths.items()
        if isinstance(meta.state_dict_metadata.get(key), TensorStorageMetadata)
    )
    return "model." if nested else ""


def read_dcp_tensors(folder: Path, *, prefix: str | None) -> dict[str, torch.Tensor]:
    """The tensors of a DCP folder whose names start with ``prefix``, with the prefix removed
    (None: the model's tensors, see :func:`model_prefix`)."""
    meta = read_metadata(folder)
    if prefix is None:
        prefix = model_prefix(meta)
    state = {
        fqn: _empty_like_stored(folder, meta, fqn)
        for fqn, m in meta.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata) and fqn.startswith(prefix)
    }
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": that is the intent
            warnings.simplefilter("ignore", UserWarning)
            reader = SafeReader(str(folder))
            dcp_load(state, storage_reader=reader, planner=SafePlanner(), no_dist=True)
    except CheckpointException as err:  # DCP wraps every failure of its steps in this
        causes = [exc for exc, _ in err.failures.values()]
        ours = [exc for exc in causes if isinstance(exc, CheckpointError)]
        if ours:
            raise ours[0] from None
        detail = "; ".join(describe(exc) for exc in causes)
        raise CheckpointError(
            f"{folder} could not be read as a DCP checkpoint ({detail}). Its data files are "
            "damaged or do not match its .metadata: use another copy."
        ) from None
    return {k[len(prefix) :]: v for k, v in state.items()}


def _empty_like_stored(folder: Path, meta: Metadata, fqn: str) -> torch.Tensor:
    """An uninitialised tensor for ``fqn``, after checking the folder stores that many bytes."""
    entry = meta.state_dict_metadata[fqn]
    assert isinstance(entry, TensorStorageMetadata)  # filtered by the caller
    dtype = entry.properties.dtype
    needed = math.prod(entry.size) * dtype.itemsize  # Python ints: a hostile size cannot overflow
    stored = [info for index, info in meta.storage_data.items() if index.fqn == fqn]
    if not any(info.transform_descriptors for info in stored):  # uncompressed: bytes >= tensor
        have = sum(info.length for info in stored)
        if needed > have:
            raise CheckpointError(
                f"{folder / '.metadata'} declares {fqn} as {tuple(entry.size)} {dtype} "
                f"({needed} bytes) but stores only {have} bytes for it: the metadata is corrupt. "
                "Use another copy of the checkpoint."
            )
    else:  # compressed: the stored length bounds nothing, so the machine's memory must
        free = psutil.virtual_memory().available
        if needed > free:
            raise CheckpointError(
                f"{folder / '.metadata'} declares the compressed {fqn} as {tuple(entry.size)} "
                f"{dtype} ({needed} bytes once decompressed), more than the {free} bytes of "
                "free memory here. The metadata is corrupt, or the checkpoint needs a larger "
                "machine to read."
            )
    return torch.empty(entry.size, dtype=dtype)


GROUP_BYTES = 256 * 2**20
"""Tensors of a DCP folder read together by :class:`DcpTensors` (one pass of DCP's reader per
group)."""


class DcpTensors:
    """The tensors of a DCP folder, one at a time, read in groups of about :data:`GROUP_BYTES`
    in the order of its metadata: asking for a tensor reads its group (dropping the group held
    before), and hands each tensor over once (the caller holds it from then on).

        tensors = DcpTensors(folder, read_metadata(folder), records)   # records: None, unverified
        for key in tensors.group_of:
            write(key, tensors.read(key))
    """

    def __init__(
        self, folder: Path, meta: Metadata, records: Mapping[str, FileRecord] | None
    ) -> None:
        self.folder, self.meta, self.records = folder, meta, records
        self.group_of: dict[str, int] = {}
        self.groups: list[list[str]] = [[]]
        size = 0
        for key, md in meta.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                continue
            nbytes = math.prod(md.size) * md.properties.dtype.itemsize
            if self.groups[-1] and size + nbytes > GROUP_BYTES:
                self.groups.append([])
                size = 0
            self.groups[-1].append(key)
            self.group_of[key] = len(self.groups) - 1
            size += nbytes
        self._held: dict[str, torch.Tensor] = {}

    def read(self, key: str) -> torch.Tensor:
        """The tensor ``key``, reading its group first unless it is held (each key once)."""
        if key not in self._held:
            self._held = {}  # the group before is dropped first
            self._held = self.load(dict.fromkeys(self.groups[self.group_of[key]]), tensors=True)
        return self._held.pop(key)

    def load(self, keys: dict[str, None], *, tensors: bool = False) -> dict[str, Any]:
        """The values of ``keys`` (tensors when ``tensors``, else pickled values), verified."""
        state: dict[str, Any] = dict(keys)
        if tensors:
            for key in keys:
                md = self.meta.state_dict_metadata[key]
                assert isinstance(md, TensorStorageMetadata)
                state[key] = torch.empty(md.size, dtype=md.properties.dtype)
        try:
            with warnings.catch_warnings():  # one process reading a sharded folder is meant
                warnings.simplefilter("ignore", UserWarning)
                reader = SafeReader(str(self.folder), self.records)
                dcp_load(state, storage_reader=reader, planner=SafePlanner(), no_dist=True)
        except CheckpointException as err:
            causes = [exc for exc, _ in err.failures.values()]
            raise CheckpointError(
                f"{self.folder} could not be read ({causes[0] if causes else err}). Use another "
                "copy of the checkpoint; nothing was written."
            ) from None
        return state


class SafeReader(FileSystemReader):
    """A FileSystemReader whose metadata is unpickled with an allow-list and checked.

    Given ``records`` (file name -> FileRecord, from a paratrain manifest), every byte is
    verified before it is used. A file checked per block is read once, only in the blocks that
    hold this rank's items, window by window through one reused buffer: each window's blocks
    are checked, then its items copied into their tensors (no second pass, no fresh copy of the
    shard, whose page faults cost more than the read). Items written by paratrain start aligned
    in the file (see ``_HashedFile.tell``), so each tensor is copied from the buffer in place.
    An older file is read whole. A damaged block raises CheckpointDamagedError before any byte
    of its window is used; items of earlier windows may be loaded by then, which a resume
    handles as any load that fails part way (it loads an older checkpoint over them, or stops).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        records: Mapping[str, FileRecord] | None = None,
    ) -> None:
        super().__init__(path)
        self.records = records

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the items of ``plan`` file by file, each file verified before it is used."""
        if self.records is None:
            return super().read_data(plan, planner)
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        for name, items in per_file.items():
            record = self.records.get(name)
            if record is None:
                raise CheckpointDamagedError(
                    f"{name} is not listed in the checkpoint's manifest: the folder was altered"
                )
            infos = [self.storage_data[item.storage_index] for item in items]
            path = Path(self.path) / name
            if record.blocks is None:  # one checksum for the file: verified whole
                buffer = record.read(path, [(i.offset, i.length) for i in infos])
                for item, info in zip(items, infos, strict=True):
                    self._load_item(item, info, buffer, planner, 0)
                continue
            self._read_blocked(path, record, items, infos, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_blocked(
        self,
        path: Path,
        record: FileRecord,
        items: list[ReadItem],
        infos: list[_StorageInfo],
        planner: LoadPlanner,
    ) -> None:
        """Load ``items`` from a file checked per block, window by window: the blocks of each
        item this rank loads whole, and of an item it needs part of (its rows of a piece saved
        at another world size) the blocks of its zip records (head and tail) and then only those
        of the elements it keeps."""
        assert record.block_bytes is not None and record.blocks is not None
        block = record.block_bytes
        ranges = [(i.offset, i.length) for i in infos]
        shape = (path, record.bytes, block, record.blocks)
        groups, empty = window_groups(*shape, ranges, WINDOW_BYTES)
        for i in empty:
            self._load_item(items[i], infos[i], torch.empty(0, dtype=torch.uint8), planner, 0)
        if not groups:
            return
        largest = max((end - first) * block for first, end, _ in groups)
        with BlockWindows(*shape, largest) as windows:
            for first, end, members in groups:
                windows.start(first, end)
                part = [i for i in members if _part_of_piece(items[i], infos[i], planner)]
                whole = [ranges[i] for i in members if i not in part]
                windows.clear([ranges[i] for i in part])  # its layout is parsed from these
                windows.fill(whole + [r for i in part for r in _zip_records(infos[i])])
                kept: dict[int, torch.Tensor] = {}
                spans = []
                for i in part:
                    found = _elements(items[i], infos[i], windows.buffer, windows.base)
                    if found is None:  # unusual bytes: the whole item, as torch.load reads it
                        spans.append(ranges[i])
                    else:
                        kept[i], span = found
                        spans.append(span)
                windows.fill(spans)
                for i in members:
                    base = windows.base
                    self._load_item(items[i], infos[i], windows.buffer, planner, base, kept.get(i))

    def _load_item(
        self,
        item: ReadItem,
        info: _StorageInfo,
        buffer: torch.Tensor,
        planner: LoadPlanner,
        base: int,
        tensor: torch.Tensor | None = None,
    ) -> None:
        """Load one item from the verified bytes of its file, in ``buffer`` (which holds the
        file from byte ``base`` on; ``tensor``: the stored tensor, a view of ``buffer``, when
        already found). The tensor is copied into its target: nothing keeps a view of
        ``buffer``."""
        start = info.offset - base
        if tensor is None and item.type != LoadItemType.BYTE_IO and not info.transform_descriptors:
            tensor = saved_tensor(buffer, start, info.length)  # no copy
        if tensor is None:
            stored = buffer.numpy().data[start : start + info.length]
            source = self.transforms.transform_load_stream(
                item, info.transform_descriptors or (), cast(IO[bytes], MemoryFile(stored))
            )
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(source.read(-1)))
                return
            seekable: Any = source if source.seekable() else io.BytesIO(source.read(-1))
            tensor = torch.load(seekable, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointError(
                f"{item.storage_index.fqn} is stored as {tuple(tensor.size())} but the "
                f"model expects {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checked metadata of the folder (see :func:`read_metadata`)."""
        meta = read_metadata(Path(self.path))
        storage = getattr(meta, "storage_meta", None)
        if not isinstance(storage, StorageMeta):
            storage = meta.storage_meta = StorageMeta()
        storage.load_id = self.load_id
        return meta


_PROBE = 4096
"""Bytes read at each end of a stored tensor (a small zip archive) to find its layout: the
pickle and the local headers lie at its head, the central directory at its tail."""


def _part_of_piece(item: ReadItem, info: _StorageInfo, planner: LoadPlanner) -> bool:
    """Whether ``item`` loads only part of a plain stored tensor much larger than its zip
    records (a rank's rows of a piece saved at another world size)."""
    if item.type == LoadItemType.BYTE_IO or info.transform_descriptors:
        return False
    if info.length <= 4 * _PROBE:
        return False
    meta = getattr(planner, "metadata", None)
    entry = meta.state_dict_metadata.get(item.storage_index.fqn) if meta is not None else None
    if not isinstance(entry, TensorStorageMetadata):
        return False
    offset = tuple(item.storage_index.offset or ())
    sizes = next((tuple(c.sizes) for c in entry.chunks if tuple(c.offsets) == offset), None)
    return sizes is not None and (any(item.storage_offsets) or tuple(item.lengths) != sizes)


def _zip_records(info: _StorageInfo) -> list[tuple[int, int]]:
    """The head and the tail of a stored tensor (file offsets), where its layout is."""
    end = info.offset + info.length
    return [(info.offset, _PROBE), (end - _PROBE, _PROBE)]


def _elements(
    item: ReadItem, info: _StorageInfo, buffer: torch.Tensor, base: int
) -> tuple[torch.Tensor, tuple[int, int]] | None:
    """The stored tensor of ``item`` as a view of ``buffer`` (the file from ``base`` on, its
    zip records read) and the file range of the elements ``item`` loads; None when its bytes
    are not a plain saved tensor viewed in place (then the whole item is read)."""
    start = info.offset - base
    tensor = saved_tensor(buffer, start, info.length)
    if tensor is None:
        return None
    try:
        part = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
    except (RuntimeError, IndexError, ValueError):
        return None
    lo = part.data_ptr() - buffer.data_ptr()
    reach = sum((n - 1) * s for n, s in zip(part.size(), part.stride(), strict=True)) + 1
    hi = lo + reach * part.element_size() if part.numel() else lo
    if not start <= lo <= hi <= start + info.length:  # copied out (unaligned): not in place
        return None
    return tensor, (base + lo, hi - lo)


class SafePlanner(DefaultLoadPlanner):
    """Loads non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Unpickle one non-tensor value with ``weights_only=True``."""
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _HashedFile(io.RawIOBase):
    """A new file written front to back, hashed per block as it is written (no second pass).

    Write-back of every 16 MiB starts at once (see :mod:`paratrain.checkpoint.durable_writes`).
    ``fileno()`` flushes first, so an ``os.fsync`` on it covers every byte written so far.
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._file = path.open("xb")
        self._blocks = BlockDigests(SHARD_BLOCK_BYTES)
        self._size = 0
        self._started = 0  # bytes whose write-back has been started
        self._told = False  # the last call was tell(): the next tell() starts an item

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._told = False
        return self._write(data)

    def _write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._file.write(view)
        self._blocks.update(view)
        self._size += view.nbytes
        if start_writeback is not None and self._size - self._started >= _WRITEBACK_EVERY:
            self._file.flush()
            start_writeback(self._file.fileno(), self._started, self._size - self._started)
            self._started = self._size
        return view.nbytes

    def tell(self) -> int:
        """The position. DCP's writer asks for it before and after each item it writes; two
        calls in a row are the end of one item and the start of the next, and the next item
        then starts at a multiple of :data:`ITEM_ALIGN` (zero bytes between): the tensor data
        inside it lies aligned in the file, so a reader views it in place instead of copying
        it to an aligned buffer first."""
        if self._told and self._size % ITEM_ALIGN:
            self._write(bytes(ITEM_ALIGN - self._size % ITEM_ALIGN))
        self._told = True
        return self._size

    def fileno(self) -> int:
        self._file.flush()
        return self._file.fileno()

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        super().close()  # flushes first
        self._file.close()

    def record(self) -> FileRecord:
        """Size and per-block checksums of what was written."""
        blocks = self._blocks
        return FileRecord(bytes=self._size, block_bytes=blocks.block_bytes, blocks=blocks.digests())


_WRITEBACK_EVERY = 16 * 2**20
ITEM_ALIGN = 64
"""Items of a DCP file start at multiples of this (``torch.save`` aligns a tensor's data to 64
bytes within its record, so the data is aligned in the file too)."""


class _RecordingFileSystem(FileSystem):
    """DCP's local file system, recording the size and checksums of each file it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, FileRecord] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        file = _HashedFile(Path(path))
        try:
            yield file
        finally:
            file.close()
        self.records[Path(path).name] = file.record()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        if Path(path).name in self.records:  # .metadata.tmp -> .metadata
            self.records[Path(new_path).name] = self.records.pop(Path(path).name)


@contextlib.contextmanager
def zip_crc_skipped() -> Iterator[None]:
    """``torch.save`` called by this thread inside the block writes 0 for each record's zip
    CRC-32 instead of computing it (``torch.serialization.set_crc32_options``); the previous
    setting is back afterwards.

    with zip_crc_skipped():
        dcp.save(state, storage_writer=RecordingWriter(folder))

    For the files of a sharded save, which :class:`RecordingWriter` checksums per block as it
    writes them: the CRC pass is a second hash of every byte (0.06 s of 0.31 s for 512 MiB in
    one process on a 2-core VM), and nothing needs it: ``torch.load`` does not check it (a
    flipped byte loads silently), a ``.distcp`` file is many archives end to end that no unzip
    tool opens, and paratrain checks every block against the manifest before using it.

    Only where the setting belongs to the calling thread (torch keeps it in a context variable
    in recent releases): where it is process-wide, another thread's ``torch.save`` meanwhile
    (the script's own files) would lose its CRCs, so the CRCs are computed as before. DCP
    writes in the calling thread unless told to use more (``thread_count``), so the skip covers
    a blocking save; an asynchronous one writes in a thread of its own and keeps the CRCs.
    """
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None or not _crc_option_per_thread():
        yield
        return
    before = get()
    set_(False)
    try:
        yield
    finally:
        set_(before)


@functools.cache
def _crc_option_per_thread() -> bool:
    """Whether ``set_crc32_options`` in one thread leaves the others' setting alone: a thread
    of its own changes it, and this one looks (where it is process-wide, the change lasts
    the few microseconds until that thread puts it back)."""
    changed = threading.Event()
    looked = threading.Event()

    def change() -> None:
        before = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(not before)
        changed.set()
        looked.wait()
        torch.serialization.set_crc32_options(before)

    probe = threading.Thread(target=change, name="paratrain-crc-probe")
    mine = torch.serialization.get_crc32_options()
    probe.start()
    changed.wait()
    unchanged = torch.serialization.get_crc32_options() == mine
    looked.set()
    probe.join()
    return unchanged


class RecordingWriter(FileSystemWriter):
    """A ``FileSystemWriter`` that records the size and block checksums of each file this rank
    writes.

    writer = RecordingWriter(folder, sync_files=True, overwrite=False)
    dcp.save(state, storage_writer=writer)
    writer.records        # {"__0_0.distcp": FileRecord(bytes=..., blocks=[...]), ".metadata": ...}
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        self.fs: _RecordingFileSystem = _RecordingFileSystem()

    @property
    def records(self) -> dict[str, FileRecord]:
        """File name (inside the folder) -> its record, for the files this rank wrote."""
        return self.fs.records
