"""A sharded model's own methods, called outside ``forward``, see whole parameters.

    fully_shard(model)
    gather_for_methods(model)          # done by the fsdp strategy's wrap
    hidden = model.init_hidden(bsz)    # word_language_model: next(self.parameters()).new_zeros(...)

Between forwards, FSDP2 holds each parameter as this rank's shard (a DTensor). A method of the
user's class that reads parameters there (``init_hidden``, ``generate``, ``num_params``) would
compute on shards, or fail with torch's "mixed torch.Tensor and DTensor". Every public method the
user's class defines (not ``forward``, nothing of ``nn.Module``) therefore gathers the parameters
(every FSDP unit: a collective, so every rank calls the method, as in SPMD scripts) when it is
called while the model is idle, and shards them again afterwards. Called from inside ``forward``
(or backward), it runs as it is: FSDP's own hooks have gathered what it needs. Gradients do not
flow through parameters gathered this way: call such methods for inference, not for the loss.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

_MODULE_NAMES = frozenset(dir(nn.Module))


def gather_for_methods(model: nn.Module) -> None:
    """Make the public methods of ``model``'s own class gather its parameters when idle."""
    user_class = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    names = sorted(
        {
            name
            for cls in user_class.__mro__
            if cls.__module__.split(".")[0] != "torch" and cls is not object
            for name, value in vars(cls).items()
            if inspect.isfunction(value)
            and not name.startswith("_")
            and name != "forward"
            and name not in _MODULE_NAMES
        }
    )
    if not names:
        return
    methods = {name: _gathering(getattr(type(model), name)) for name in names}
    model.__class__ = type(type(model).__name__, (type(model),), methods)


def _gathering(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not _idle(self) or not any(isinstance(p, DTensor) for p in self.parameters()):
            return method(self, *args, **kwargs)
        units = [m for m in self.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.unshard()
        try:
            return method(self, *args, **kwargs)
        finally:
            for unit in units:
                unit.reshard()

    return call


def _idle(model: nn.Module) -> bool:
    """True outside forward and backward (FSDP's state says so)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        state = model._get_fsdp_state()  # type: ignore[operator]
        return bool(state._training_state == TrainingState.IDLE)
    except (ImportError, AttributeError):  # another torch: assume idle, as at the loop's top
        return True
