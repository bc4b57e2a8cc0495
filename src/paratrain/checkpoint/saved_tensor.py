"""A tensor written by ``torch.save``, taken out of memory without a copy.

    tensor = saved_tensor(buffer, start, length)   # a view of ``buffer``, or None
    if tensor is None:                             # anything unusual: let torch.load decide
        tensor = torch.load(io.BytesIO(...), weights_only=True)

DCP stores each tensor of a shard as a small ``torch.save`` archive (an uncompressed zip: a
pickle describing the tensor, and its raw bytes). ``torch.load`` copies those bytes into fresh
memory; when the file is already in memory (read once and verified), that copy and its page
faults are pure overhead. This module finds the raw bytes inside the zip and views them with
the pickled dtype, shape and strides. The pickle is read with an allow-list of exactly the
names a plain tensor needs; anything else (hooks, subclasses, big-endian data, an unexpected
layout) returns None so the caller falls back to ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zipfile
from collections import OrderedDict
from typing import Any, TypeGuard

import torch


class MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a slice of memory (no copy)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(target.nbytes, len(self._view) - self._pos))
        target[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


class _Unsupported(Exception):
    """Something a plain saved tensor does not contain: leave it to torch.load."""


class _Frozen:
    """No attributes set from the pickle (BUILD), which would bypass the checks below."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise _Unsupported("state set by the pickle")


class _Stored(_Frozen):
    """A storage named by the pickle: its data record key and dtype (None: untyped bytes)."""

    __slots__ = ("dtype", "key")

    def __init__(self, key: str, dtype: torch.dtype | None) -> None:
        self.key, self.dtype = key, dtype


class _Layout(_Frozen):
    """What the pickle says the tensor is: storage, offset (elements), size and stride."""

    __slots__ = ("offset", "size", "stored", "stride")

    def __init__(
        self, stored: _Stored, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> None:
        self.stored, self.offset, self.size, self.stride = stored, offset, size, stride


_LIMIT = 2**62  # beyond any real tensor; keeps every product below int64 overflow checks


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int and 0 <= v < _LIMIT for v in value):
        raise _Unsupported("size or stride")
    return value


def _rebuild_v2(
    stored: object,
    offset: object,
    size: object,
    stride: object,
    requires_grad: object,
    hooks: object,
    metadata: object = None,
) -> _Layout:
    if not isinstance(stored, _Stored) or stored.dtype is None:
        raise _Unsupported("storage")
    if type(offset) is not int or not 0 <= offset < _LIMIT:
        raise _Unsupported("storage offset")
    if hooks or metadata:
        raise _Unsupported("hooks or metadata")
    return _Layout(stored, offset, _ints(size), _ints(stride))


def _rebuild_v3(
    stored: object,
    offset: object,
    size: object,
    stride: object,
    requires_grad: object,
    hooks: object,
    dtype: object,
    metadata: object = None,
) -> _Layout:
    if not isinstance(stored, _Stored) or not isinstance(dtype, torch.dtype):
        raise _Unsupported("storage")
    typed = _Stored(stored.key, dtype)
    return _rebuild_v2(typed, offset, size, stride, requires_grad, hooks, metadata)


_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}
"""The typed storages torch.save names in its pickle (other dtypes use UntypedStorage)."""


class _TensorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_v2
        if (module, name) == ("torch._utils", "_rebuild_tensor_v3"):
            return _rebuild_v3
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return None  # untyped: the dtype comes with _rebuild_tensor_v3
        value = getattr(torch, name, None) if module == "torch" else None
        if isinstance(value, torch.dtype) and str(value) == f"torch.{name}":
            return value  # canonical names only, as torch.load's allow-list
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # torch.FloatStorage and friends: only the dtype counts
        raise _Unsupported(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> _Stored:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Unsupported("persistent id")
        _, dtype, key, _, _ = pid
        if not isinstance(key, str) or not (dtype is None or isinstance(dtype, torch.dtype)):
            raise _Unsupported("storage id")
        return _Stored(key, dtype)


def _record(archive: zipfile.ZipFile, view: memoryview, name: str) -> tuple[int, int]:
    """(offset, bytes) of an uncompressed record inside the archive's memory."""
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        raise _Unsupported("compressed record")
    header = bytes(view[info.header_offset : info.header_offset + 30])
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise _Unsupported("local header")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if info.header_offset < 0 or start < 0 or start + info.file_size > len(view):
        raise _Unsupported("record outside the archive")
    return start, info.file_size


def _layout(view: memoryview) -> tuple[_Layout, int, int]:
    """The pickled layout and (offset, bytes) of its storage's record."""
    archive = zipfile.ZipFile(MemoryFile(view))
    names = archive.namelist()
    if len(names) != len(set(names)):
        raise _Unsupported("duplicate records")  # which one wins differs between readers
    pickles = [n for n in names if n.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise _Unsupported("archive")
    prefix = pickles[0][: -len("data.pkl")]
    order = prefix + "byteorder"
    if sys.byteorder != "little":
        raise _Unsupported("byte order")
    if order in names:  # read in place: zipfile's read() insists on a CRC, and saves skip it
        start, length = _record(archive, view, order)
        if bytes(view[start : start + length]) != b"little":
            raise _Unsupported("byte order")
    start, length = _record(archive, view, pickles[0])
    layout = _TensorUnpickler(io.BytesIO(bytes(view[start : start + length]))).load()
    if not isinstance(layout, _Layout):
        raise _Unsupported("not one tensor")
    return layout, *_record(archive, view, f"{prefix}data/{layout.stored.key}")


_INTEGERS = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
}


def _plain(dtype: object) -> TypeGuard[torch.dtype]:
    """A dtype whose tensors are plain numbers (quantized ones are rebuilt differently)."""
    return isinstance(dtype, torch.dtype) and (
        dtype.is_floating_point or dtype.is_complex or dtype in _INTEGERS
    )


def saved_tensor(buffer: torch.Tensor, start: int, length: int) -> torch.Tensor | None:
    """The tensor ``torch.save`` wrote at ``buffer[start : start + length]`` (a uint8 CPU
    tensor), as a view of ``buffer``; None when the bytes are not a plain saved tensor."""
    try:
        return _view(buffer, start, length)
    except Exception:  # damaged or unusual bytes: torch.load gives the real verdict
        return None


def _view(buffer: torch.Tensor, start: int, length: int) -> torch.Tensor | None:
    view = buffer.numpy().data[start : start + length]
    layout, offset, nbytes = _layout(view)
    dtype = layout.stored.dtype
    if not _plain(dtype) or nbytes % dtype.itemsize:
        return None
    raw = buffer[start + offset : start + offset + nbytes]
    if raw.storage_offset() % dtype.itemsize or raw.data_ptr() % dtype.itemsize:
        raw = raw.clone()  # unaligned inside the file: one copy, then a typed view
    typed = raw.view(dtype)
    if len(layout.size) != len(layout.stride):
        return None
    reach = zip(layout.size, layout.stride, strict=True)
    extent = layout.offset + sum((n - 1) * s for n, s in reach)
    if all(layout.size) and extent >= typed.numel():
        return None  # it would reach past its own record
    return typed.as_strided(layout.size, layout.stride, typed.storage_offset() + layout.offset)
