"""Conversions that hold one tensor in memory at a time, whatever the checkpoint's size.

    source = streamed_source(Path("gpt-hf"))           # safetensors files and folders, DCP
    if source is not None:                             # folders, paratrain checkpoints
        write_streamed(source, names, Path("out"), to="hf", max_shard_bytes=5 * 10**9)
    write_hf_folder(state_dict, Path("out"))           # a state dict in memory, the same way

A source lists every tensor (name, dtype, shape, the file and byte range holding it) from the
files' headers, without reading a tensor. The output's headers are computed from that list, then
each tensor is taken, written, and dropped: a view of the input's file mapped privately (page
cache, no copy; a tensor at an offset its dtype cannot be viewed at is read into memory of its
own), and for a DCP input the same through :class:`~paratrain.checkpoint.mapped_dcp.MappedDcp`
(pieces of a sharded tensor assembled into one buffer). Every output format is written this way:
a safetensors file, a Hugging Face folder, a torch.save file
(:mod:`~paratrain.checkpoint.torch_save_writer`) and a DCP folder
(:mod:`~paratrain.checkpoint.dcp_writer`). ``convert`` maps a torch.save zip file's tensors from
the file (``read_state_dict(lazy=True)``) and hands them over as a state dict
(:meth:`Source.of`); legacy pickles are read whole.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from paratrain.checkpoint.dcp_io import DcpTensors, model_prefix, read_metadata
from paratrain.checkpoint.dcp_writer import Ref, write_dcp
from paratrain.checkpoint.durable_writes import fsync_dir, write_bytes_durable
from paratrain.checkpoint.hf_folder import DEFAULT_SHARD_BYTES, INDEX, hf_shards, is_hf_folder
from paratrain.checkpoint.manifest import MANIFEST, Manifest
from paratrain.checkpoint.mapped_dcp import MappedDcp, mapped_file, own_buffer
from paratrain.checkpoint.safetensors_io import (
    _ST_DTYPES,
    StoredTensor,
    file_entries,
    tied_in,
    untie,
)
from paratrain.checkpoint.torch_save_writer import alone, write_torch_save
from paratrain.errors import CheckpointError


@dataclass
class Source:
    """The tensors of a checkpoint, by name: each one's dtype, shape and bytes (``entries``;
    where in which file they lie, for a file's tensors), and its tied names (each dropped name to
    the kept one). :meth:`read` gives one tensor."""

    entries: dict[str, StoredTensor]
    tied: dict[str, str]
    fmt: str
    files: dict[str, Path] = field(default_factory=dict)
    """The file holding each tensor (empty for tensors in memory)."""
    held: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Tensors in memory, by name (a state dict to write)."""
    _mapped: dict[Path, torch.Tensor] = field(default_factory=dict, repr=False)
    """Each file read so far, mapped (its tensors are views of it)."""

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor]) -> Source:
        """A state dict in memory; names of one storage recorded as tied (see ``untie``)."""
        entries = {
            k: StoredTensor(k, t.dtype, list(t.shape), 0, t.numel() * t.element_size())
            for k, t in state.items()
        }
        return cls(entries, untie(state)[1], "state dict", held=state)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name``: the one held, or read from its file into memory of its own."""
        if name in self.held:
            return self.held[name].contiguous()
        entry, path = self.entries[name], self.files[name]
        if entry.start % entry.dtype.itemsize or not entry.nbytes:  # unaligned: a copy
            return read_stored(path, entry)
        whole = self._mapped.get(path)
        if whole is None:  # file pages, read as written, no copy
            whole = self._mapped[path] = mapped_file(path)
        if entry.start + entry.nbytes > whole.numel():
            raise CheckpointError(
                f"{path} ended inside {name}: it was cut short or changed while being read. "
                "Use a complete copy. Nothing was written."
            )
        raw = whole[entry.start : entry.start + entry.nbytes]
        return alone(raw.view(entry.dtype).reshape(entry.shape))  # on a slice of the storage


def read_stored(path: Path, entry: StoredTensor) -> torch.Tensor:
    """The tensor ``entry`` describes, read from ``path`` into memory of its own
    (:func:`~paratrain.checkpoint.mapped_dcp.own_buffer`)."""
    buffer = own_buffer(entry.nbytes)
    view = buffer.numpy().data
    with path.open("rb", buffering=0) as f:
        f.seek(entry.start)
        got = 0
        while got < entry.nbytes:
            n = f.readinto(view[got:])
            if not n:
                raise CheckpointError(
                    f"{path} ended inside {entry.name}: it was cut short or changed while being "
                    "read. Use a complete copy. Nothing was written."
                )
            got += n
    return buffer.view(entry.dtype).reshape(entry.shape)


def _from_files(entries: dict[Path, list[StoredTensor]], tied: dict[str, str], fmt: str) -> Source:
    """The tensors of files; a tied name the files leave out (written once, under the name it
    is tied to) is listed too, read from the same bytes."""
    listed = {e.name: e for found in entries.values() for e in found}
    files = {e.name: path for path, found in entries.items() for e in found}
    for name, kept in tied.items():
        if name not in listed and kept in listed:
            listed[name] = replace(listed[kept], name=name)
            files[name] = files[kept]
    return Source(listed, tied, fmt, files=files)


def safetensors_source(path: Path) -> Source | None:
    """The tensors of ``path`` when it is a safetensors file, a Hugging Face folder or a
    paratrain checkpoint holding ``model.safetensors`` (checked first); else None."""
    if path.is_file() and path.suffix == ".safetensors":
        entries, metadata = file_entries(path)
        return _from_files({path: entries}, tied_in(metadata), "safetensors")
    if path.is_dir() and is_hf_folder(path):
        shards, tied = hf_shards(path)
        return _from_files({shard: file_entries(shard)[0] for shard in shards}, tied, "hf folder")
    if path.is_dir() and (path / MANIFEST).is_file() and (path / "model.safetensors").is_file():
        problems = Manifest.read(path).verify(path)
        if problems:
            raise CheckpointError(f"{path} is damaged: {'; '.join(problems)}.")
        entries, metadata = file_entries(path / "model.safetensors")
        return _from_files({path / "model.safetensors": entries}, tied_in(metadata), "paratrain")
    return None


@dataclass
class DcpSource(Source):
    """The tensors of a DCP folder, viewed in its mapped files (:class:`MappedDcp`), keys
    without ``prefix``."""

    tensors: MappedDcp | None = None
    prefix: str = ""

    def read(self, name: str) -> torch.Tensor:
        assert self.tensors is not None
        return self.tensors.read(self.prefix + name)


def dcp_source(path: Path) -> Source | None:
    """The model tensors of ``path`` when it is a DCP folder or a sharded paratrain checkpoint
    (verified block by block as read, against its manifest); else None."""
    if not path.is_dir():
        return None
    if (path / MANIFEST).is_file() and (path / "dcp" / ".metadata").is_file():
        manifest = Manifest.read(path)
        for name, record in manifest.files.items():  # the shards are verified as read
            if not name.startswith("dcp/") or name == "dcp/.metadata":
                problem = record.problem(path / name)
                if problem:
                    raise CheckpointError(f"{path} is damaged: {problem}.")
        records = {k[len("dcp/") :]: r for k, r in manifest.files.items() if k.startswith("dcp/")}
        folder, prefix, fmt = path / "dcp", "model.", "paratrain (sharded)"
    elif (path / ".metadata").is_file():
        folder, prefix, fmt, records = path, None, "dcp", None
    else:
        return None
    meta = read_metadata(folder)
    prefix = model_prefix(meta) if prefix is None else prefix
    tensors = DcpTensors(folder, meta, records)
    entries = {}
    for key in tensors.group_of:
        if key.startswith(prefix):
            md = tensors.meta.state_dict_metadata[key]
            assert isinstance(md, TensorStorageMetadata)  # group_of lists tensors alone
            dtype, shape = md.properties.dtype, list(md.size)
            nbytes = math.prod(shape) * dtype.itemsize
            entries[key[len(prefix) :]] = StoredTensor(key[len(prefix) :], dtype, shape, 0, nbytes)
    mapped = MappedDcp(folder, meta, records, tensors)
    return DcpSource(entries, {}, fmt, tensors=mapped, prefix=prefix)


def streamed_source(path: Path) -> Source | None:
    """``path`` as a :class:`Source` when its tensors can be read one at a time (safetensors
    files and folders, DCP folders, paratrain checkpoints of any layout); else None."""
    return safetensors_source(path) or dcp_source(path)


def write_hf_folder(
    state: Mapping[str, torch.Tensor], dst: Path, *, max_shard_bytes: int = DEFAULT_SHARD_BYTES
) -> None:
    """Write the state dict ``state`` at the new folder ``dst`` as a Hugging Face folder (see
    :mod:`paratrain.checkpoint.hf_folder`): shards of at most ``max_shard_bytes`` each (a larger
    tensor gets a shard of its own), each storage once, and the index."""
    write_streamed(Source.of(state), {k: k for k in state}, dst, to="hf",
                   max_shard_bytes=max_shard_bytes)  # fmt: skip


def write_streamed(
    source: Source,
    names: Mapping[str, str],
    dst: Path,
    *,
    to: str,
    max_shard_bytes: int,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Write the tensors ``names`` maps (output name -> source name) at the new path ``dst`` as
    ``to``: one safetensors file, a Hugging Face folder (tied names written once), a torch.save
    file (tied names sharing one storage, as in a ``state_dict()``) or a one-rank DCP folder;
    one tensor in memory at a time; nothing is left at ``dst`` on an error.
    ``progress(done, total)`` is called with the bytes written after each tensor."""
    entries = {new: source.entries[old] for new, old in names.items()}
    ties: dict[str, str] = {}  # an output name -> the output name whose storage it shares
    if to in ("hf", "pt"):
        back = {old: new for new, old in names.items()}
        for new, old in names.items():
            kept = source.tied.get(old)
            if kept is not None and kept in back:
                ties[new] = back[kept]
    if to == "hf":  # a tied name whose kept name is written too is dropped, and recorded
        entries = {k: v for k, v in entries.items() if k not in ties}
    files = _shards(entries, max_shard_bytes) if to == "hf" else [("", list(entries))]
    total = sum(e.nbytes for k, e in entries.items() if to != "pt" or k not in ties)
    done = 0

    def wrote(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        if progress is not None:
            progress(done, total)

    def read(name: str) -> torch.Tensor:
        return source.read(names[name])

    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{dst.name}-", dir=dst.parent))
    try:
        if to == "hf":
            for file_name, members in files:
                _write_file(staging / file_name, members, entries, read, wrote)
            index = {
                "metadata": {"total_size": total, **({"tied": ties} if ties else {})},
                "weight_map": {n: f for f, members in files for n in members},
            }
            write_bytes_durable(staging / INDEX, json.dumps(index, indent=2).encode())
            fsync_dir(staging)
            os.rename(staging, dst)
        else:
            out = staging / "out"
            if to == "safetensors":
                _write_file(out, files[0][1], entries, read, wrote)
            elif to == "pt":
                write_torch_save(out, entries, read, tied=ties, wrote=wrote)
            else:  # dcp: one rank's folder, as dcp.save writes a state dict in one process
                tree = {
                    k: Ref(k, e.dtype, tuple(e.shape), partial(read, k), order)
                    for order, (k, e) in enumerate(entries.items())
                }
                write_dcp(out, tree, world=1, sharded=set(), wrote=wrote)
            os.rename(out, dst)
            shutil.rmtree(staging)
        fsync_dir(dst.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _shards(entries: Mapping[str, StoredTensor], cap: int) -> list[tuple[str, list[str]]]:
    groups: list[list[str]] = [[]]
    size = 0
    for name, entry in entries.items():
        if groups[-1] and size + entry.nbytes > cap:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += entry.nbytes
    if len(groups) == 1:
        return [("model.safetensors", groups[0])]
    count = len(groups)
    return [(f"model-{i + 1:05d}-of-{count:05d}.safetensors", g) for i, g in enumerate(groups)]


def _write_file(
    path: Path,
    members: list[str],
    entries: Mapping[str, StoredTensor],
    read: Callable[[str], torch.Tensor],
    wrote: Callable[[int], None],
) -> None:
    """One safetensors file of ``members``, each tensor got by ``read(name)`` in turn."""
    with path.open("wb") as f:
        write_tensors(f, {m: entries[m] for m in members}, read, wrote=wrote)
        f.flush()
        os.fsync(f.fileno())


class Writable(Protocol):
    """Anything with ``write(bytes)``: a file, or a stream that hashes what it writes."""

    def write(self, data: Any, /) -> Any: ...


def write_tensors(
    f: Writable,
    entries: Mapping[str, StoredTensor],
    read: Callable[[str], torch.Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
    wrote: Callable[[int], None] | None = None,
) -> None:
    """Write a safetensors file of ``entries`` to ``f``: its header from the entries, then each
    tensor got by ``read(name)``, written, and dropped before the next is read (wider elements
    first, as paratrain writes: aligned views on read). ``metadata``: the header's
    ``__metadata__`` (default ``{"format": "pt"}``)."""
    order = sorted(entries, key=lambda n: -entries[n].dtype.itemsize)
    header: dict[str, object] = {}
    offset = 0
    for name in order:
        entry = entries[name]
        if name == "__metadata__":
            raise CheckpointError(
                "A tensor is named __metadata__, which the safetensors format keeps for its "
                "header's metadata. Rename it (--map, or in the state dict) before saving."
            )
        if entry.dtype not in _ST_DTYPES:  # a state dict's tensor
            raise CheckpointError(
                f"{name} is a {entry.dtype} tensor, which the safetensors format cannot "
                f"hold. Convert it (e.g. to {torch.float32}) before saving, or keep it out of the "
                "state."
            )
        header[name] = {
            "dtype": _ST_DTYPES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    f.write(len(raw).to_bytes(8, "little") + raw)
    for name in order:
        _write_tensor(f, read(name))
        if wrote is not None:
            wrote(entries[name].nbytes)


def _write_tensor(f: Writable, tensor: torch.Tensor) -> None:
    flat = tensor.reshape(-1)
    if flat.numel():
        f.write(flat.view(torch.uint8).numpy().data)
