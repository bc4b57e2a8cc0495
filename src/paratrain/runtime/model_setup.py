"""What :meth:`paratrain.Run.setup` does to a model besides wrapping it.

- :func:`prepare_model` does all of it for ``run.setup``: check, checkpoint activations, wrap
  (leaving a model split over devices where it is, or refusing), autocast the forward.
- :func:`check_model` refuses models that cannot train (no parameters, already wrapped).
- :func:`forward_in_autocast` runs the model's forward under autocast, so a ``bf16`` run never
  silently computes in fp32 because the user forgot a context manager, and hands floating-point
  outputs back in fp32 (as Fabric and Accelerate do), so a loss computed after the forward runs
  in fp32 as in torch's recipe (``with autocast(): loss = criterion(model(x), y)``). It uses
  forward hooks, so ``copy.deepcopy(model)`` and ``AveragedModel(model)`` (EMA, SWA, teachers)
  run their *own* forward under autocast, not the original's.
- :func:`attach_loss` makes ``model(x, target=y)`` return the loss (``run.setup(loss_fn=)``),
  under loss parallel too.
- :func:`model_devices` finds models the user already split over several devices.
- :func:`rebind_optimizer` points an optimizer built on the plain model at the parameters the
  strategy created (FSDP replaces every parameter by a sharded one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_map_only

from paratrain.errors import ModelError
from paratrain.plans.activation_checkpointing import apply_activation_checkpointing
from paratrain.plans.module_policy import ModulePolicy
from paratrain.runtime.precision import Precision
from paratrain.strategies import Strategy

_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def check_model(model: nn.Module) -> None:
    """Raise :class:`ModelError` for a model that ``Run.setup`` cannot train."""
    if not isinstance(model, nn.Module):
        raise ModelError(f"run.setup expects a torch.nn.Module, got {type(model).__name__}.")
    if getattr(model, "_paratrain_setup", False):
        raise ModelError(
            f"This {type(model).__name__} was already given to run.setup. Call run.setup once "
            "per model and train the model it returned (model, opt = run.setup(model, opt))."
        )
    if type(model).__name__ in _WRAPPERS:
        raise ModelError(
            f"The model is already wrapped ({type(model).__name__}). Pass the plain module to "
            "run.setup; it wraps it for the chosen strategy."
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError(
            f"{type(model).__name__} has no trainable parameters (nothing for the optimizer to "
            "update, nothing for DDP/FSDP to synchronise). Check that layers are registered as "
            "attributes or in nn.ModuleList (not a plain list), and that requires_grad is True."
        )


def forward_in_autocast(model: nn.Module, precision: Precision) -> None:
    """Make ``model(...)`` run under ``precision.autocast()``; state-dict keys are unchanged."""
    contexts = threading.local()  # DataParallel runs replicas' forwards in threads

    def enter(module: nn.Module, args: Any) -> None:
        stack = contexts.__dict__.setdefault("stack", [])
        context = precision.autocast()
        context.__enter__()
        stack.append(context)

    def leave(module: nn.Module, args: Any, output: Any) -> Any:
        stack = contexts.__dict__.get("stack")
        if stack:
            stack.pop().__exit__(None, None, None)
        if stack:  # an inner module of an autocast model: the outer one converts at the end
            return output
        return tree_map_only(torch.Tensor, _to_fp32, output)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.float()
    return tensor


def model_devices(model: nn.Module) -> set[torch.device]:
    """Devices holding the model's parameters and buffers."""
    tensors = [*model.parameters(), *model.buffers()]
    return {t.device for t in tensors}


def check_disjoint(optimizers: tuple[Optimizer, ...], names: dict[int, str]) -> None:
    """Refuse a parameter given to two optimizers: checkpoints key optimizer state by parameter
    name, so the two states would collide on save and resume."""
    owner: dict[int, int] = {}
    for index, optimizer in enumerate(optimizers):
        if not isinstance(getattr(optimizer, "param_groups", None), list):
            raise ModelError(
                f"run.setup got {type(optimizer).__name__} as optimizer {index + 1}; only "
                "optimizers go after the model (a scheduler goes in scheduler=). Without an "
                "optimizer, call run.setup(model) alone."
            )
        for group in optimizer.param_groups:
            for p in group["params"]:
                first = owner.setdefault(id(p), index)
                if first != index:
                    raise ModelError(
                        f"Parameter {names.get(id(p), '(unnamed)')!r} is in optimizer {first + 1} "
                        f"and optimizer {index + 1}. Each step would update it twice, and their "
                        "states cannot both be saved under its name. Give every parameter to one "
                        "optimizer, e.g. opt2 over model.head.parameters() and opt1 over the rest."
                    )


def rebind_optimizer(
    optimizer: Optimizer,
    names: dict[int, str],
    params: dict[str, nn.Parameter],
    *,
    partial: bool = False,
) -> None:
    """Replace each parameter in ``optimizer`` that the strategy swapped, matched by name.

    ``partial``: the rank holds some layers only (pipeline stages); the others' parameters
    leave the optimizer (a group may become empty: its settings stay for the checkpoint)."""
    current = {id(p) for p in params.values()}
    for group in optimizer.param_groups:
        rebound: list[torch.Tensor] = []
        for p in group["params"]:
            if id(p) in current:
                rebound.append(p)
                continue
            name = names.get(id(p))
            if partial and name is not None and name not in params:
                continue  # a layer of another stage
            if name is None or name not in params:
                raise ModelError(
                    "The optimizer holds a parameter that is not in the model given to run.setup. "
                    "Build the optimizer from model.parameters() of that same model."
                )
            if optimizer.state.get(p):
                raise ModelError(
                    "The optimizer already has state (it has stepped) and the strategy replaces "
                    "the parameters. Call run.setup(model, optimizer) before the first step."
                )
            rebound.append(params[name])
        group["params"] = rebound


def attach_loss(
    model: nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    accum: Callable[[], int],
    strategy: Strategy,
) -> None:
    """Make ``model(x, target=y)`` return ``loss_fn(model(x), y)``; ``model(x)`` is unchanged.

    A pipeline computes the loss inside its schedule (and divides by ``accum()``, the
    micro-batches per step); any other model gets forward hooks on its outermost wrapper, so
    DataParallel computes the loss once on the gathered output. With loss parallel (split
    logits) the forward and the loss run inside ``strategy.loss_context()`` and what goes back
    to the caller is whole tensors."""
    check_loss_fn(loss_fn)
    use_loss = getattr(model, "use_loss", None)
    if use_loss is not None:
        if loss_fn is not None:
            use_loss(loss_fn, accum)
        return
    if loss_fn is None and not strategy.loss_parallel:
        return
    calls = threading.local()

    def before(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        stack = calls.__dict__.setdefault("stack", [])
        target = kwargs.pop("target", _NO_TARGET) if loss_fn is not None else _NO_TARGET
        context = strategy.loss_context()
        context.__enter__()
        stack.append((target, context))
        return args, kwargs

    def after(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        stack = calls.__dict__.get("stack")
        if not stack:
            return output
        target, context = stack.pop()
        try:
            if target is not _NO_TARGET and output is not None:  # None: the forward raised
                assert loss_fn is not None
                output = loss_fn(output, target)
        finally:
            context.__exit__(None, None, None)
        return _whole(output) if strategy.loss_parallel else output

    # First of the pre-hooks: FSDP's own would cast a float target to bf16 with the inputs.
    model.register_forward_pre_hook(before, with_kwargs=True, prepend=True)
    model.register_forward_hook(after, with_kwargs=True, always_call=True)


def check_loss_fn(loss_fn: object) -> None:
    """Refuse a ``loss_fn`` that cannot be called (before anything is wrapped)."""
    if loss_fn is not None and not callable(loss_fn):
        raise ModelError(
            f"run.setup(loss_fn=...) must be a function (output, target) -> loss, e.g. "
            f"torch.nn.functional.cross_entropy; got {type(loss_fn).__name__}."
        )


def _whole(output: Any) -> Any:
    """DTensors in ``output`` as whole plain tensors (split logits gathered)."""
    from torch.distributed.tensor import DTensor

    return tree_map_only(DTensor, lambda t: t.full_tensor(), output)


_NO_TARGET = object()


def prepare_model(
    model: nn.Module, strategy: Strategy, precision: Precision, ac_policy: ModulePolicy
) -> nn.Module:
    """Check, checkpoint activations, wrap for ``strategy`` and autocast ``model``."""
    check_model(model)
    devices = model_devices(model)
    if ac_policy:
        apply_activation_checkpointing(model, ac_policy)
    wrapped = strategy.wrap_split(model, devices) if len(devices) > 1 else strategy.wrap(model)
    if precision.dtype is not None:
        forward_in_autocast(strategy.unwrap(wrapped), precision)
    wrapped._paratrain_setup = True  # type: ignore[assignment]
    strategy.unwrap(wrapped)._paratrain_setup = True  # type: ignore[assignment]
    return wrapped
