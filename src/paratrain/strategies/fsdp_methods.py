"""A sharded model's own methods outside ``forward``: an error that names the fix, and the fix.

    fully_shard(model)
    check_methods(model)                   # done by the fsdp strategy's wrap
    n = model.get_num_params()             # works as before: numel of a shard is the global one
    hidden = model.init_hidden(bsz)        # ConfigError: the result is built from shards
    with pt.gathered(model):               # on every rank (it is a collective)
        hidden = model.init_hidden(bsz)    # whole parameters: a plain tensor

Between forwards, FSDP2 holds each parameter as this rank's shard (a DTensor). A method of the
user's class that computes from parameters there (word_language_model's ``init_hidden``:
``next(self.parameters()).new_zeros(...)``) hands back a DTensor, which fails later in forward
with torch's "mixed torch.Tensor and DTensor", or fails inside with that message. Every public
method of the user's class is therefore checked when called while the model is idle: such a
result or failure becomes a :class:`~paratrain.errors.ConfigError` naming the method and the fix.
Nothing is gathered behind the user's back: a gather is a collective, and a method called on the
main process alone (a parameter count for a log line) would hang the job.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves

from paratrain.errors import ConfigError

_MODULE_NAMES = frozenset(dir(nn.Module))


def check_methods(model: nn.Module) -> None:
    """Make the public methods of ``model``'s own class explain a result built from shards."""
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
    if names:
        methods = {name: _checked(getattr(type(model), name), name) for name in names}
        model.__class__ = type(type(model).__name__, (type(model),), methods)


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[nn.Module]:
    """Whole parameters in every FSDP unit of ``model`` inside the block (a collective: enter it
    on every rank); a no-op for a model that is not sharded. No gradients flow through them."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()


def _checked(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not _idle(self):
            return method(self, *args, **kwargs)
        try:
            result = method(self, *args, **kwargs)
        except RuntimeError as err:
            if "DTensor" not in str(err):
                raise
            raise ConfigError(_message(type(self).__name__, name, "failed on them")) from err
        if any(isinstance(leaf, DTensor) for leaf in tree_leaves(result)):
            raise ConfigError(_message(type(self).__name__, name, "returned a sharded tensor"))
        return result

    return call


def _message(model: str, name: str, what: str) -> str:
    return (
        f"{model}.{name}() was called outside forward, where FSDP holds only this rank's shard "
        f"of each parameter, and {what}. Call it on every rank inside `with "
        f"pt.gathered(model): ...` (whole parameters, a collective), or build the value from "
        f"plain tensors (e.g. torch.zeros(..., device=run.device) instead of "
        f"weight.new_zeros(...))."
    )


def _idle(model: nn.Module) -> bool:
    """True outside forward and backward (FSDP's state says so)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        state = model._get_fsdp_state()  # type: ignore[operator]
        return bool(state._training_state == TrainingState.IDLE)
    except (ImportError, AttributeError):  # another torch: assume idle, as at the loop's top
        return True
