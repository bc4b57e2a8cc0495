"""A ``torch.save`` file written one tensor at a time.

    write_torch_save(path, entries, read)          # entries: name -> StoredTensor (no data)
    torch.load(path, weights_only=True)            # {name: tensor}, as torch.save wrote it

``torch.save(state_dict)`` needs every tensor in memory: it pickles the dict, then copies each
storage into the zip archive. The pickle, though, holds only each tensor's dtype, shape and
storage key, so it can be written from the tensors' descriptions alone; each storage record is
then written from ``read(name)`` and dropped before the next is read. The file is the one
``torch.save`` writes for the same dict of contiguous tensors, through torch's own archive
writer (aligned records, CRC-32s): the same pickle bytes, the same records in the same order
(a test compares them). Names listed in ``tied`` share the storage of the name they map to, as
tied weights do in a ``state_dict()``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from paratrain.checkpoint.safetensors_io import StoredTensor

_PROTOCOL = 2
"""The pickle protocol ``torch.save`` uses by default."""


class _Storage:
    """A storage not read yet, pickled as ``torch.save``'s persistent id for it."""

    __slots__ = ("dtype", "key", "numel")

    def __init__(self, key: str, dtype: torch.dtype, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _Tensor:
    """A contiguous tensor not read yet, pickled as ``torch.save`` pickles one."""

    __slots__ = ("shape", "storage")

    def __init__(self, storage: _Storage, shape: tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        stride = _contiguous_strides(self.shape)
        args: tuple[Any, ...] = (self.storage, 0, self.shape, stride, False, OrderedDict())
        if _untyped(self.storage.dtype):  # dtypes newer than the typed storages
            return (torch._utils._rebuild_tensor_v3, (*args, self.storage.dtype))
        return (torch._utils._rebuild_tensor_v2, args)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides torch gives a contiguous tensor of ``shape`` (an empty dim counts as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _untyped(dtype: torch.dtype) -> bool:
    return dtype in torch.storage._new_dtypes()


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> tuple[Any, ...] | None:
        if not isinstance(obj, _Storage):
            return None
        if _untyped(obj.dtype):
            kind: Any = torch.UntypedStorage
            numel = obj.numel * obj.dtype.itemsize
        else:
            kind = getattr(torch, torch.storage._dtype_to_storage_type_map()[obj.dtype])
            numel = obj.numel
        return ("storage", kind, obj.key, "cpu", numel)


def write_torch_save(
    path: Path,
    entries: Mapping[str, StoredTensor],
    read: Callable[[str], torch.Tensor],
    *,
    tied: Mapping[str, str] | None = None,
    wrote: Callable[[int], None] | None = None,
) -> None:
    """Write at the new file ``path`` what ``torch.save({name: tensor})`` would, for the
    tensors ``entries`` describes, in their order; ``read(name)`` gives each one's data when its
    record is written, and ``wrote(nbytes)`` is called after. A name in ``tied`` is not read: it
    shares the storage of the name it maps to (same dtype and shape). The file is flushed to
    disk before returning."""
    tied = dict(tied or {})
    storages: dict[str, _Storage] = {}
    state: dict[str, _Tensor] = {}
    for name, entry in entries.items():
        owner = tied.get(name)
        if owner is not None and owner in storages:
            storage = storages[owner]
        else:
            numel = math.prod(entry.shape)
            storage = _Storage(str(len(storages)), entry.dtype, numel)
            storages[name] = storage
        state[name] = _Tensor(storage, tuple(entry.shape))
    pickled = io.BytesIO()
    _Pickler(pickled, protocol=_PROTOCOL).dump(state)
    try:  # torch's own archive writer: a path it opens itself is written without copies
        str(path).encode("ascii")
        stream = None
        writer = torch._C.PyTorchFileWriter(str(path), True, _alignment())
    except UnicodeEncodeError:  # it takes ascii paths only
        stream = path.open("xb")
        writer = torch._C.PyTorchFileWriter(stream, True, _alignment())
    try:
        records = {  # what torch.save writes before the storages, in its order
            "data.pkl": pickled.getvalue(),
            ".format_version": b"1",
            ".storage_alignment": str(_alignment()).encode(),
            "byteorder": sys.byteorder.encode(),
        }
        for record, data in records.items():
            writer.write_record(record, data, len(data))
        for name, storage in storages.items():
            tensor = alone(read(name))
            nbytes = tensor.numel() * tensor.element_size()
            if tensor.dtype != storage.dtype or tensor.numel() != storage.numel:
                raise ValueError(f"{name}: read {tensor.dtype} x {tensor.numel()}, listed as "
                                 f"{storage.dtype} x {storage.numel}")  # fmt: skip
            storage_bytes = tensor.untyped_storage()  # as torch.save passes it (not in the stub)
            writer.write_record(f"data/{storage.key}", storage_bytes, nbytes)  # type: ignore[arg-type]
            del tensor, storage_bytes  # before the next is read
            if wrote is not None:
                wrote(nbytes)
        writer.write_end_of_file()
    except BaseException as err:
        # Finish the archive here: left to its destructor, a failing end of file (the disk
        # full) is thrown where nothing can catch it, and the process aborts.
        with contextlib.suppress(Exception):
            writer.write_end_of_file()
        if isinstance(err, RuntimeError):  # the archive writer's own failure to write
            raise OSError(f"{path.name} could not be written: {_first_line(err)}") from None
        raise
    finally:
        del writer
        if stream is not None:
            stream.close()
    with path.open("rb+") as f:
        os.fsync(f.fileno())


def alone(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on a storage of its own bytes alone, as ``torch.save`` needs (it writes a
    tensor's whole storage: a view into a mapped file would take the file along). A contiguous
    view gets a slice of its storage, no copy; anything else is made contiguous (a copy)."""
    tensor = tensor.contiguous()
    nbytes = tensor.numel() * tensor.element_size()
    if not tensor.storage_offset() and tensor.untyped_storage().nbytes() == nbytes:
        return tensor
    if not nbytes:
        return torch.empty(tensor.shape, dtype=tensor.dtype)
    first = tensor.storage_offset() * tensor.element_size()
    storage = tensor.untyped_storage()[first : first + nbytes]
    shape = tuple(tensor.shape)
    return torch.empty(0, dtype=tensor.dtype).set_(storage, 0, shape, _contiguous_strides(shape))


def _first_line(err: BaseException) -> str:
    """torch's C++ errors carry a stack after their first line: the message alone."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _alignment() -> int:
    from torch.serialization import _get_storage_alignment

    return int(_get_storage_alignment())
