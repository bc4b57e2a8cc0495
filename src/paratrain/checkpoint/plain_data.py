"""Values a checkpoint can hold safely: what ``torch.load(weights_only=True)`` reads back.

trainer["extras"] = plain(extras, "extras")     # numpy values and paths converted
plain(object(), "extras")                       # CheckpointError naming where and the fix
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
from typing import Any

import numpy as np
import torch

from paratrain.errors import CheckpointError

_PLAIN = (bool, int, float, str, bytes, type(None))


def plain(value: Any, where: str) -> Any:
    """``value`` as data that loads with ``weights_only=True``; numpy values and paths are
    converted, anything else that would make the checkpoint unloadable is refused now."""
    if type(value) in _PLAIN or isinstance(value, torch.Tensor):  # not subclasses (enums)
        return value
    if isinstance(value, np.generic):
        return plain(value.item(), where)
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return plain(value.item(), where)
        try:
            return torch.from_numpy(np.array(value))
        except TypeError:
            _refuse(value, where)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if isinstance(value, dict):
        return {_key(k, where): plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value), where)
    try:  # anything torch's safe loader accepts (torch.Size, dtypes, sets) is kept as it is
        buffer = io.BytesIO()
        torch.save(value, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:
        _refuse(value, where)
    return value


def _key(key: Any, where: str) -> Any:
    if isinstance(key, np.generic):
        key = key.item()
    if isinstance(key, pathlib.PurePath):
        key = str(key)
    if type(key) not in _PLAIN:
        raise CheckpointError(
            f"{where} has a key of type {type(key).__qualname__} ({key!r}); a checkpoint's "
            "dict keys must be strings or numbers. Use str(key) or int(key)."
        )
    return key


def _refuse(value: Any, where: str) -> None:
    raise CheckpointError(
        f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which a "
        "checkpoint cannot hold safely (resuming would have to run pickled code). Store "
        "plain data: numbers, strings, lists, dicts, tensors (e.g. float(x), str(path))."
    ) from None
