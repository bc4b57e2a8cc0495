"""Model and optimizer state in a portable form: FQN keys, no wrapper prefixes, flat tensors.

    model_sd, optim_sd = collect(target, [optimizer], full=True)   # every rank calls it
    tensors, meta = flatten_optimizer(optim_sd)                    # safetensors + plain data
    apply(target, [optimizer], model_sd, unflatten_optimizer(tensors, meta), full=True)

``torch.distributed.checkpoint.state_dict`` does the unwrapping: the same keys come out of a
plain module, DDP, FSDP2 and ``torch.compile`` (``_orig_mod.``), so a checkpoint written under
one strategy loads under any other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from paratrain.errors import CheckpointError

_SEP = "\x1f"  # unit separator: cannot occur in a parameter name or a state key


def collect(
    target: nn.Module,
    optimizers: list[Optimizer],
    *,
    full: bool,
    offload: bool | None = None,
    flat: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, state of all its optimizers); ``full`` gathers sharded tensors.

    Full states are copied to CPU unless ``offload=False`` (the caller stages them itself).
    ``flat``: optimizer settings keyed by parameter name (pipeline stages, DCP only).
    """
    options = StateDictOptions(
        full_state_dict=full,
        cpu_offload=full if offload is None else offload,
        flatten_optimizer_state_dict=flat,
    )
    if not optimizers:
        return get_model_state_dict(target, options=options), {}
    model_sd, optim_sd = get_state_dict(target, optimizers, options=options)
    return model_sd, optim_sd


def apply(
    target: nn.Module,
    optimizers: list[Optimizer],
    model_sd: dict[str, Any],
    optim_sd: dict[str, Any],
    *,
    full: bool,
    flat: bool = False,
) -> None:
    """Load states produced by :func:`collect` (at any world size or strategy)."""
    # Full optimizer states are distributed to the ranks' devices tensor by tensor; torch cannot
    # tell the device of a state without tensors (plain SGD). Such a state is the same on every
    # rank, so it loads as it is.
    full_optim = full and _has_tensors(optim_sd.get("state", {}))
    options = StateDictOptions(full_state_dict=full, strict=True)
    try:
        if not optimizers or not optim_sd:
            set_model_state_dict(target, model_sd, options=options)
        else:
            set_model_state_dict(target, model_sd, options=options)
            if full and _load_optimizers_by_name(target, optimizers, optim_sd):
                return
            set_optimizer_state_dict(
                target,
                optimizers,
                optim_sd,
                options=StateDictOptions(
                    full_state_dict=full_optim, strict=True, flatten_optimizer_state_dict=flat
                ),
            )
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(
            f"The checkpoint does not fit this model/optimizer: {str(err).strip(' .')}. Resume "
            "with the model "
            "and optimizer that wrote it, or load the weights alone with paratrain.load_weights "
            "to see a report of missing, unexpected and mismatched keys."
        ) from None


def _load_optimizers_by_name(
    target: nn.Module, optimizers: list[Optimizer], optim_sd: dict[str, Any]
) -> bool:
    """Load a full, FQN-keyed optimizer state with each optimizer's own ``load_state_dict``.

    Saved tensors already on the parameters' device and dtype are adopted, not copied, and no
    optimizer step is simulated to create the state first (which ``set_optimizer_state_dict``
    does). Returns False, loading nothing, when a name or group does not match: the caller then
    takes torch's general path.
    """
    names = {id(p): n for n, p in target.named_parameters()}  # a tied one by its first name
    saved_groups = optim_sd.get("param_groups")
    saved_state = optim_sd.get("state", {})
    if not isinstance(saved_groups, list) or not isinstance(saved_state, dict):
        return False
    plans: list[tuple[Optimizer, dict[str, Any]]] = []
    position = 0
    for optimizer in optimizers:
        groups = saved_groups[position : position + len(optimizer.param_groups)]
        position += len(optimizer.param_groups)
        if len(groups) != len(optimizer.param_groups):
            return False
        state: dict[int, Any] = {}
        plain_groups = []
        index = 0
        for group, saved in zip(optimizer.param_groups, groups, strict=True):
            fqns = [names.get(id(p)) for p in group["params"]]
            if None in fqns or list(saved.get("params", [])) != fqns:
                return False
            ids = list(range(index, index + len(fqns)))
            index += len(fqns)
            state.update(
                {i: saved_state[f] for i, f in zip(ids, fqns, strict=True) if f in saved_state}
            )
            plain_groups.append({**saved, "params": ids})
        plans.append((optimizer, {"state": state, "param_groups": plain_groups}))
    if position != len(saved_groups):
        return False
    for optimizer, plain in plans:
        optimizer.load_state_dict(plain)
    return True


def _has_tensors(tree: Any) -> bool:
    if isinstance(tree, torch.Tensor):
        return tree.dim() > 0
    if isinstance(tree, dict):
        return any(_has_tensors(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(_has_tensors(v) for v in tree)
    return False


def flatten_optimizer(optim_sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an FQN-keyed optimizer state into tensors and plain data."""
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for fqn, entries in optim_sd.get("state", {}).items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{fqn}{_SEP}{key}"] = value
            else:
                plain.setdefault(fqn, {})[key] = value
    return tensors, {"param_groups": optim_sd.get("param_groups", []), "state": plain}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_optimizer`."""
    state: dict[str, dict[str, Any]] = {k: dict(v) for k, v in meta.get("state", {}).items()}
    for name, tensor in tensors.items():
        fqn, key = name.split(_SEP)
        state.setdefault(fqn, {})[key] = tensor
    return {"state": state, "param_groups": meta.get("param_groups", [])}
