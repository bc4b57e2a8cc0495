"""Pick submodules by type or predicate, for FSDP wrapping and activation checkpointing.

selected(model, (nn.TransformerEncoderLayer,))   # every encoder layer, in post-order
selected(model, lambda m: m.weight.numel() > 1e6 if hasattr(m, "weight") else False)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

ModulePolicy = tuple[type[nn.Module], ...] | Callable[[nn.Module], bool]


def selected(
    model: nn.Module, policy: ModulePolicy, *, include_root: bool = False
) -> list[nn.Module]:
    """Submodules matching ``policy``, children before parents (the order sharding needs)."""
    if isinstance(policy, tuple):
        if not policy:
            return []
        types = policy

        def by_type(module: nn.Module) -> bool:
            return isinstance(module, types)

        match: Callable[[nn.Module], bool] = by_type
    else:
        match = policy
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            visit(child)
        if (include_root or module is not model) and match(module):
            found.append(module)

    visit(model)
    return found
