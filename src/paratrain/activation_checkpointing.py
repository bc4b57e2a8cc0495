"""Recompute the activations of chosen submodules in backward instead of storing them.

    apply_activation_checkpointing(model, (nn.TransformerEncoderLayer,))

The submodule's ``forward`` is replaced on the instance by a checkpointed call, so the module tree
and the state-dict keys stay exactly as they were (no ``_checkpoint_wrapped_module.`` prefix).
"""

from __future__ import annotations

import functools
from typing import Any

import torch.utils.checkpoint
from torch import nn

from paratrain.module_policy import ModulePolicy, selected


def apply_activation_checkpointing(model: nn.Module, policy: ModulePolicy) -> int:
    """Checkpoint every submodule chosen by ``policy``; return how many were."""
    modules = selected(model, policy)
    for module in modules:
        if getattr(module, "_paratrain_checkpointed", False):
            continue
        original = module.forward

        @functools.wraps(original)
        def forward(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            return torch.utils.checkpoint.checkpoint(
                _original, *args, use_reentrant=False, **kwargs
            )

        module.forward = forward
        module._paratrain_checkpointed = True  # type: ignore[assignment]
    return len(modules)
