"""Model and optimizer state in a portable form: FQN keys, no wrapper prefixes, flat tensors.

    model_sd, optim_sd = collect(target, [optimizer], full=True)   # every rank calls it
    tensors, meta = flatten_optimizer(optim_sd)                    # safetensors + plain data
    apply(target, [optimizer], model_sd, unflatten_optimizer(tensors, meta), full=True)

``torch.distributed.checkpoint.state_dict`` does the unwrapping: the same keys come out of a
plain module, DDP, FSDP2 and ``torch.compile`` (``_orig_mod.``), so a checkpoint written under
one strategy loads under any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
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
    create: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, state of all its optimizers); ``full`` gathers sharded tensors.

    Full states are copied to CPU unless ``offload=False`` (the caller stages them itself).
    ``flat``: optimizer settings keyed by parameter name (pipeline stages, DCP only).
    An optimizer that has not stepped yet has no state, and is saved without: torch's helper
    would create its state by a step with zero gradients (Adam then counts that step).
    ``create=True`` lets it (the target of a sharded load needs every tensor laid out).
    """
    options = StateDictOptions(
        full_state_dict=full,
        cpu_offload=full if offload is None else offload,
        flatten_optimizer_state_dict=flat,
    )
    if not optimizers:
        return get_model_state_dict(target, options=options), {}
    with contextlib.nullcontext() if create else no_state_created(optimizers):
        model_sd, optim_sd = get_state_dict(target, optimizers, options=options)
    return model_sd, optim_sd


@contextlib.contextmanager
def no_state_created(optimizers: list[Optimizer]) -> Iterator[None]:
    """Keep torch's state-dict helpers from stepping an optimizer that has no state yet.

    ``get_state_dict``/``set_optimizer_state_dict`` initialise an empty optimizer with a step on
    zero gradients unless a parameter already has a gradient; a save before the first step would
    then leave Adam with ``step=1`` and change training. A zero gradient on one parameter of each
    such optimizer, removed afterwards, tells torch the state is as it should be.
    """
    lent: list[torch.Tensor] = []
    for optimizer in optimizers:
        if optimizer.state:
            continue
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if params and all(p.grad is None for p in params):
            smallest = min(params, key=lambda p: p.numel())
            smallest.grad = torch.zeros_like(smallest)
            lent.append(smallest)
    try:
        yield
    finally:
        for param in lent:
            param.grad = None


def apply(
    target: nn.Module,
    optimizers: list[Optimizer],
    model_sd: dict[str, Any] | None,
    optim_sd: dict[str, Any],
    *,
    full: bool,
    flat: bool = False,
    strict_optimizer: bool = True,
) -> None:
    """Load states produced by :func:`collect` (at any world size or strategy); a model state
    of None leaves the model as it is (loaded already, see :func:`apply_part`).
    ``strict_optimizer=False``: parameters without saved optimizer state (never stepped: no
    gradient yet, or an optimizer saved before its first step) resume without state."""
    # Full optimizer states are distributed to the ranks' devices tensor by tensor; torch cannot
    # tell the device of a state without tensors (plain SGD). Such a state is the same on every
    # rank, so it loads as it is.
    full_optim = full and _has_tensors(optim_sd.get("state", {}))
    options = StateDictOptions(full_state_dict=full, strict=True)
    try:
        if model_sd is not None:
            set_model_state_dict(target, model_sd, options=options)
        if optimizers and optim_sd:
            if full and _load_optimizers_by_name(target, optimizers, optim_sd):
                return
            # torch distributes a full state onto tensors it lays out by creating the target's
            # state first (a step on zero gradients); what the checkpoint did not hold is
            # dropped again afterwards, so a parameter saved without state resumes without.
            creating = full_optim and not flat
            with contextlib.nullcontext() if creating else no_state_created(optimizers):
                set_optimizer_state_dict(
                    target,
                    optimizers,
                    optim_sd,
                    options=StateDictOptions(
                        full_state_dict=full_optim,
                        strict=strict_optimizer,
                        flatten_optimizer_state_dict=flat,
                    ),
                )
            if creating:
                _drop_unsaved_state(target, optimizers, optim_sd.get("state", {}))
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(
            f"The checkpoint does not fit this model/optimizer: {str(err).strip(' .')}. Resume "
            "with the model "
            "and optimizer that wrote it, or load the weights alone with paratrain.load_weights "
            "to see a report of missing, unexpected and mismatched keys."
        ) from None


class ModuleLoader:
    """Loads a model's tensors a few modules at a time, straight into the model: each module
    through its own ``_load_from_state_dict`` (its pre-hooks and extra state included).

        loader = ModuleLoader.of(model)    # None: DTensors, wrapper prefixes or post-hooks
        loader.check({"0.weight": [4, 4], ...})              # names and shapes, nothing loaded
        loader.load({"0.weight": tensor, "0.bias": tensor})  # complete modules at a time

    ``partial``: the model is a part of the saved one (pipeline stages); the checkpoint's other
    tensors are left out, not refused.
    """

    def __init__(
        self, target: nn.Module, own: dict[str, list[int] | None], partial: bool = False
    ) -> None:
        self._own = own
        self._modules = dict(target.named_modules(remove_duplicate=False))
        self.partial = partial

    def keeps(self, name: str) -> bool:
        """True when the model holds the checkpoint's tensor ``name``."""
        return name in self._own

    @staticmethod
    def of(target: nn.Module, *, partial: bool = False) -> ModuleLoader | None:
        """A loader for ``target``, or None when it must be loaded whole by torch (sharded or
        split tensors, keys that differ from the portable names, load post-hooks, a load
        pre-hook on a module with children)."""
        tensors = (*target.parameters(), *target.buffers())
        if any(isinstance(t, DTensor) for t in tensors):
            return None
        if any(m._load_state_dict_post_hooks for m in target.modules()):
            return None
        if any(
            m._load_state_dict_pre_hooks and any(True for _ in m.children())
            for m in target.modules()
        ):
            return None  # a parent's pre-hook may rewrite its children's keys
        state = get_model_state_dict(target)
        if list(state) != list(target.state_dict(keep_vars=True)):
            return None  # wrapper prefixes (a compiled module): torch maps the names
        # Shapes only: holding the state's tensors would hold the model's storages too.
        own = {k: list(v.shape) if isinstance(v, torch.Tensor) else None for k, v in state.items()}
        return ModuleLoader(target, own, partial)

    def check(self, shapes: dict[str, list[int]]) -> None:
        """Refuse a model state (name -> shape) whose names or shapes differ from the model's,
        before anything is loaded."""
        own = self._own
        missing = [k for k in own if k not in shapes]
        unexpected = [] if self.partial else [k for k in shapes if k not in own]
        wrong = [
            f"{k} is {tuple(shapes[k])} in the checkpoint, {tuple(shape)} in the model"
            for k, shape in own.items()
            if k in shapes and shape is not None and shape != list(shapes[k])
        ]
        problems = [
            *([f"missing keys {_some(missing)}"] if missing else []),
            *([f"unexpected keys {_some(unexpected)}"] if unexpected else []),
            *wrong[:5],
        ]
        if problems:
            raise CheckpointError(
                f"The checkpoint does not fit this model: {'; '.join(problems)}. Resume with "
                "the model that wrote it, or load the weights alone with paratrain.load_weights "
                "to see a report of missing, unexpected and mismatched keys."
            )

    def load(self, part: dict[str, torch.Tensor]) -> None:
        """Copy ``part`` (every tensor of each module it touches, names checked) into the model."""
        by_module: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in part.items():
            by_module.setdefault(name.rpartition(".")[0], {})[name] = tensor
        errors: list[str] = []
        for path, tensors in by_module.items():
            module = self._modules[path]
            prefix = f"{path}." if path else ""
            version = getattr(module, "_version", None)
            meta = {} if version is None else {"version": version}
            module._load_from_state_dict(tensors, prefix, meta, False, [], [], errors)
        if errors:
            raise CheckpointError(
                f"The checkpoint does not fit this model: {'; '.join(errors)}. Resume with the "
                "model that wrote it."
            )

    def adopt(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load ``tensors`` (each in a fresh storage of its own, read for this load) with no
        copy where that is safe: the model's tensor takes the new storage (``tensor.data =
        new``, as ``module.to()`` does), keeping its identity, so optimizers and wrappers that
        hold it see the loaded values. A tensor that cannot take it (on another device, a view
        of a larger storage, sharing its storage, another layout or type, in a module with its
        own loading code) is copied into instead, through :meth:`load`.

        The model's old storages are freed once nothing else holds them: loading needs room for
        one more copy of the weights, as ``torch.load`` does, and no time for copying them.
        """
        self.check({name: list(t.shape) for name, t in tensors.items()})
        copied: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, new in tensors.items():
                path, _, leaf = name.rpartition(".")
                module = self._modules[path]
                own = module._parameters.get(leaf)
                if own is None:
                    own = module._buffers.get(leaf)
                if _plain_loading(module) and own is not None and _takes(own, new):
                    own.data = new
                else:
                    copied[name] = new
        if copied:
            self.load(copied)


def _plain_loading(module: nn.Module) -> bool:
    """Whether ``module`` loads its state with nn.Module's own code and no hooks (so a tensor
    taking a new storage is what loading would have done)."""
    return (
        type(module)._load_from_state_dict is nn.Module._load_from_state_dict
        and not module._load_state_dict_pre_hooks
    )


def _held_by_it_alone(tensor: torch.Tensor) -> bool:
    """Whether nothing but ``tensor`` holds its storage: no view, ``.data`` alias, tied tensor
    or user buffer would keep seeing the old values if it took another storage."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return False
    storage = tensor.untyped_storage()  # this wrapper holds one reference itself
    return int(count(storage._cdata)) <= 2


def _takes(own: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether ``own`` can take ``new``'s storage and stay what it was: a plain CPU tensor of
    the same dtype, shape and strides, the whole of a storage that nothing else holds."""
    return (
        type(own) in (nn.Parameter, torch.Tensor)
        and own.device.type == "cpu"
        and new.device == own.device
        and own.dtype == new.dtype
        and own.shape == new.shape
        and own.stride() == new.stride()  # the same layout (channels_last stays so)
        and own.storage_offset() == 0
        and own.untyped_storage().nbytes() == own.nbytes
        and new.is_contiguous()
        and _held_by_it_alone(own)
    )


def adoptable(target: nn.Module) -> bool:
    """Whether loading ``target`` from a checkpoint is best done by reading each tensor into a
    fresh storage for :meth:`ModuleLoader.adopt` (every tensor on the CPU): else the weights go
    from the page cache straight into the model's tensors (on a GPU, say)."""
    return all(t.device.type == "cpu" for t in (*target.parameters(), *target.buffers()))


def _some(names: list[str]) -> str:
    return f"{names[:5]}{' ...' if len(names) > 5 else ''}"


def part_of(
    target: nn.Module, model_sd: dict[str, Any] | None, optim_sd: dict[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The full states of a whole model cut to what ``target`` (a pipeline stage, holding some of
    its layers under their original names) holds: its tensors, its parameters' optimizer state,
    each optimizer group with its parameters only (a group may become empty)."""
    own = set(get_model_state_dict(target))
    params = {name for name, _ in target.named_parameters()}
    model_part = None if model_sd is None else {k: v for k, v in model_sd.items() if k in own}
    groups = [
        {**group, "params": [n for n in group.get("params", []) if n in params]}
        for group in optim_sd.get("param_groups", [])
    ]
    state = {k: v for k, v in optim_sd.get("state", {}).items() if k in params}
    return model_part, {**optim_sd, "state": state, "param_groups": groups}


def _load_optimizers_by_name(
    target: nn.Module, optimizers: list[Optimizer], optim_sd: dict[str, Any]
) -> bool:
    """Load a full, FQN-keyed optimizer state with each optimizer's own ``load_state_dict``.

    Saved tensors already on the parameters' device and dtype are adopted, not copied, and no
    optimizer step is simulated to create the state first (which ``set_optimizer_state_dict``
    does). The state of a sharded parameter (a DTensor sharded or replicated over its mesh) is
    cut into the same shards, locally: every rank holds the full state. Returns False, loading
    nothing, when a name or group does not match or a parameter is laid out otherwise: the
    caller then takes torch's general path.
    """
    params = dict(target.named_parameters())  # a tied one by its first name
    if not all(_can_shard_like(p) for p in params.values()):
        return False
    names = {id(p): n for n, p in params.items()}
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
            found = [names.get(id(p)) for p in group["params"]]
            fqns = [f for f in found if f is not None]
            if len(fqns) != len(found) or list(saved.get("params", [])) != fqns:
                return False
            ids = list(range(index, index + len(fqns)))
            index += len(fqns)
            state.update(
                {
                    i: _shard_like(params[f], saved_state[f])
                    for i, f in zip(ids, fqns, strict=True)
                    if f in saved_state
                }
            )
            plain_groups.append({**saved, "params": ids})
        plans.append((optimizer, {"state": state, "param_groups": plain_groups}))
    if position != len(saved_groups):
        return False
    for optimizer, plain in plans:
        optimizer.load_state_dict(plain)
    return True


def _can_shard_like(param: torch.Tensor) -> bool:
    """A plain tensor, or a DTensor whose placements :func:`_shard_like` can reproduce."""
    if not isinstance(param, DTensor):
        return True
    return all(type(p) in (Shard, Replicate) for p in param.placements)


def _shard_like(param: torch.Tensor, entries: dict[str, Any]) -> dict[str, Any]:
    """A parameter's full optimizer state, with each tensor of the parameter's shape cut into
    the parameter's shards (Adam's moments, SGD's momentum; a scalar ``step`` stays whole)."""
    if not isinstance(param, DTensor):
        return entries
    return {
        key: distribute_tensor(
            value.to(param.device), param.device_mesh, param.placements, src_data_rank=None
        )
        if isinstance(value, torch.Tensor) and value.shape == param.shape
        else value
        for key, value in entries.items()
    }


def _drop_unsaved_state(
    target: nn.Module, optimizers: list[Optimizer], saved_state: dict[str, Any]
) -> None:
    """Remove the state torch created for parameters the checkpoint holds no state for."""
    names: dict[int, set[str]] = {}
    for name, param in target.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), set()).add(name)  # a tied parameter has several
    if not any(n in saved_state for group in names.values() for n in group):
        return  # names not comparable (wrapper prefixes): leave torch's result as it is
    for optimizer in optimizers:
        for held in list(optimizer.state):
            own = names.get(id(held))
            if own is not None and own.isdisjoint(saved_state):
                del optimizer.state[held]


def _has_tensors(tree: Any) -> bool:
    if isinstance(tree, torch.Tensor):
        return tree.dim() > 0
    if isinstance(tree, dict):
        return any(_has_tensors(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(_has_tensors(v) for v in tree)
    return False


def flatten_optimizer(
    optim_sd: dict[str, Any], *, tensor: Callable[[Any], bool] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split an FQN-keyed optimizer state into tensors and plain data (``tensor(value)``: what
    counts as a tensor, by default a torch.Tensor)."""
    tensors: dict[str, Any] = {}
    plain: dict[str, dict[str, Any]] = {}
    for fqn, entries in optim_sd.get("state", {}).items():
        for key, value in entries.items():
            if tensor(value) if tensor is not None else isinstance(value, torch.Tensor):
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
