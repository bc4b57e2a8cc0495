"""torch.distributed.checkpoint (DCP) folders, read without executing pickled code.

DCP's ``.metadata`` is a pickle that ``FileSystemReader`` loads unrestricted, and its default load
planner unpickles non-tensor values with ``weights_only=False``. :class:`SafeReader` allows only
DCP's own metadata classes, and :class:`SafePlanner` loads values with ``weights_only=True``.

    state = {"model": model_state}            # tensors to fill in place
    dcp.load(state, storage_reader=SafeReader(folder), planner=SafePlanner())
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from paratrain.errors import CheckpointError

_ALLOWED = {
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
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(
            f"DCP metadata refers to {module}.{name}, which is not part of a checkpoint's "
            "metadata; the folder may be malicious. It was not loaded."
        )


def read_metadata(folder: Path) -> Metadata:
    """The ``.metadata`` of a DCP folder, unpickled with an allow-list."""
    path = folder / ".metadata"
    try:
        meta = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"{path} is unreadable or corrupt ({err}).") from None
    if not isinstance(meta, Metadata):
        raise CheckpointError(f"{path} does not hold DCP metadata.")
    return meta


class SafeReader(FileSystemReader):
    """A FileSystemReader whose metadata is unpickled with an allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = read_metadata(Path(self.path))
        storage = meta.storage_meta if meta.storage_meta is not None else StorageMeta()
        storage.load_id = self.load_id
        meta.storage_meta = storage
        return meta


class SafePlanner(DefaultLoadPlanner):
    """Loads non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
