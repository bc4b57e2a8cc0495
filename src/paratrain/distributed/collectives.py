"""Reduce metrics across ranks: sum, mean, max, min, and gather of any picklable object.

    correct = run.reduce(correct, "sum")      # python numbers come back as python numbers
    losses = run.gather(loss.item())          # [rank0_value, rank1_value, ...] on every rank

In a one-process job these return their input unchanged (gather returns ``[value]``).
"""

from __future__ import annotations

import datetime
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from paratrain.errors import ConfigError, ParatrainError, lost_a_peer

Number = TypeVar("Number", int, float, torch.Tensor)

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def reduce(
    value: Number, op: str = "sum", *, device: torch.device | None = None, copies: int = 1
) -> Number:
    """All-reduce ``value`` over ranks with ``op`` (sum, mean, max, min); every rank gets it.

    ``copies``: how many ranks hold each value (the ranks of one tp group, which read the same
    batch); a sum then counts each group once."""
    if op not in _OPS:
        raise ConfigError(f"Unknown reduce op {op!r}. Available: {', '.join(_OPS)}.")
    if isinstance(value, (np.generic, np.ndarray)):
        return _reduce_numpy(value, op, device, copies)  # type: ignore[no-any-return]
    if not _active():
        return value
    if isinstance(value, torch.Tensor):
        tensor = value.detach().clone()
    else:
        dtype = torch.float64 if isinstance(value, float) or op == "mean" else torch.int64
        tensor = torch.tensor(value, dtype=dtype, device=device)
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        tensor = tensor.to(device or torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(tensor, op=_OPS[op])
    if op == "sum" and copies > 1:  # each group's value arrived ``copies`` times
        tensor = tensor / copies if tensor.is_floating_point() else tensor // copies
    if op == "mean":
        tensor = tensor / dist.get_world_size()
    if isinstance(value, torch.Tensor):
        return tensor.to(value.device)
    return tensor.item()  # type: ignore[return-value]


def _reduce_numpy(
    value: np.generic | np.ndarray, op: str, device: torch.device | None, copies: int
) -> Any:
    """numpy scalars and arrays keep their type and dtype (a 0-d float32 stays a float)."""
    array = np.asarray(value)
    if not _active():
        return value
    tensor = torch.from_numpy(np.array(array, dtype=np.float64 if op == "mean" else array.dtype))
    result = reduce(tensor, op, device=device, copies=copies).cpu().numpy()
    if op == "mean" and not np.issubdtype(array.dtype, np.floating):
        return result if array.ndim else result.item()
    result = result.astype(array.dtype)
    if isinstance(value, np.generic):
        return result.dtype.type(result)
    return result


def gather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if not _active():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def named_barrier(name: str, *, timeout_s: float, group: Any = None) -> None:
    """Wait for every rank at barrier ``name``; name the ranks that are late or elsewhere.

    Uses gloo's monitored barrier (``group`` must be a gloo group), then checks that all ranks
    passed a barrier of the same name.
    """
    if not _active():
        return
    try:
        dist.monitored_barrier(
            group=group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True
        )
    except RuntimeError as err:
        if lost_a_peer(str(err)):
            raise ParatrainError(
                f"barrier {name!r}: another rank failed before it arrived ({err}). That "
                "rank's own error, printed by it, is the one to read and fix."
            ) from None
        raise ParatrainError(
            f"barrier {name!r}: not every rank arrived within {timeout_s:.0f}s ({err}). The "
            "late ranks are stuck or took another code path; their stacks tell which."
        ) from None
    names: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, name, group=group)
    if len(set(names)) > 1:
        where = ", ".join(f"rank {r}: {n!r}" for r, n in enumerate(names))
        raise ConfigError(
            f"Ranks reached different barriers ({where}). Every rank must pass the same "
            "barriers in the same order; look for a barrier inside `if run.is_main:`."
        )


_GLOO: dict[int, Any] = {}


def gloo_group() -> Any:
    """The default group when it is gloo, else a gloo group made once per default group
    (a collective: every rank calls it the first time)."""
    if dist.get_backend() == "gloo":
        return None
    key = id(dist.group.WORLD)
    if key not in _GLOO:
        _GLOO[key] = dist.new_group(backend="gloo")
    return _GLOO[key]
