"""Recompute the activations of chosen submodules in backward instead of storing them.

    apply_activation_checkpointing(model, (nn.TransformerEncoderLayer,))

Each chosen submodule gets a subclass of its own class whose ``forward`` is checkpointed, so the
module tree and the state-dict keys stay exactly as they were (no ``_checkpoint_wrapped_module.``
prefix), and a ``copy.deepcopy`` of the model (EMA, SWA) checkpoints *its own* forward.
"""

from __future__ import annotations

from typing import Any

import torch.utils.checkpoint
from torch import nn

from paratrain.plans.module_policy import ModulePolicy, selected

_CLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def _checkpointed_class(cls: type[nn.Module]) -> type[nn.Module]:
    if cls not in _CLASSES:

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            original = cls.forward.__get__(self)
            return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)

        checkpointed = type(cls.__name__, (cls,), {"forward": forward, "_paratrain_ac": True})
        checkpointed.__qualname__ = cls.__qualname__
        checkpointed.__module__ = cls.__module__
        _CLASSES[cls] = checkpointed
    return _CLASSES[cls]


def apply_activation_checkpointing(model: nn.Module, policy: ModulePolicy) -> int:
    """Checkpoint every submodule chosen by ``policy``; return how many were."""
    modules = selected(model, policy)
    for module in modules:
        if getattr(type(module), "_paratrain_ac", False):
            continue
        module.__class__ = _checkpointed_class(type(module))
    return len(modules)
